// The pre-tokenizers of tokenizer.json: they cut normalised text into the pieces the BPE model sees, one after
// the other (a "Sequence" is this list of steps), each step cutting every piece the previous one left. ByteLevel
// and Metaspace also rewrite the text of their pieces (bytes -> alphabet characters, spaces -> the replacement).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/split_pattern.h"

namespace mambacpp::tok {

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the input text (Metaspace's prepend_scheme "first" asks)
};

struct PreTokenizerStep {
  enum Kind { Split, ByteLevel, Metaspace } kind;
  explicit PreTokenizerStep(Kind k) : kind(k) {}
  // Split (also Digits, Punctuation, Whitespace, WhitespaceSplit, which are splits with fixed patterns); for
  // Metaspace the replacement character, where its split cuts
  std::shared_ptr<const SplitPattern> pattern;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // ByteLevel
  ByteLevelOptions byte_level;
  std::shared_ptr<const ByteLevelSplitter> byte_level_splitter;
  // Metaspace
  std::string replacement;  // one character, UTF-8
  enum Prepend { Always, First, Never } prepend = Always;
  bool metaspace_split = true;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}
  bool empty() const { return steps_.empty(); }
  // Cuts one piece of normalised text (valid UTF-8) and appends the words to `out`.
  void split(Piece piece, std::vector<Piece>& out) const;

 private:
  void apply(const PreTokenizerStep& step, std::vector<Piece>& pieces) const;
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace mambacpp::tok
