// The decoders of tokenizer.json: they turn the token strings of an id sequence back into text, each step
// rewriting the list of strings the previous one left (a "Sequence" is this list of steps), as HF's decode_chain.
// Without any decoder HF joins the token strings with spaces.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/split_pattern.h"

namespace mambacpp::tok {

struct DecoderStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  explicit DecoderStep(Kind k) : kind(k) {}
  std::shared_ptr<const SplitPattern> pattern;  // Replace: what is replaced
  std::string content;                          // Replace: the replacement; Strip, Metaspace: the character
  size_t start = 0, stop = 0;                   // Strip: at most this many characters off each end
  bool prepend = true;                          // Metaspace: prepend_scheme is not "never"
};

class Decoder {
 public:
  Decoder() = default;  // no decoder: tokens joined by spaces
  explicit Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)), present_(true) {}

  // The text of a whole sequence of token strings (added tokens included, as HF passes them too).
  std::string decode(std::vector<std::string> tokens) const;
  // What one token adds in the middle of a text, as raw bytes (a byte-fallback or byte-level token may hold part
  // of a character): the steps applied to it alone, minus what only happens at the edges of a whole text (the
  // first token's prefix in Metaspace, a Strip after Fuse, the lossy UTF-8 repair).
  std::string piece(const std::string& token) const;

 private:
  std::vector<DecoderStep> steps_;
  bool present_ = false;
};

}  // namespace mambacpp::tok
