// Text normalisers of tokenizer.json that we reproduce exactly: the Unicode forms NFC/NFD/NFKC/NFKD (through
// utf8proc), Lowercase, Strip, Prepend and Replace. A "Sequence" of normalisers flattens into this list of steps.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/split_pattern.h"

namespace mambacpp::tok {

struct NormalizerStep {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace } kind;
  explicit NormalizerStep(Kind k) : kind(k) {}
  bool strip_left = false, strip_right = false;  // Strip
  std::string text;                              // Prepend: what goes in front; Replace: the replacement
  std::shared_ptr<const SplitPattern> pattern;   // Replace: what is replaced (every non-overlapping match)
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}
  bool empty() const { return steps_.empty(); }
  // `text` must be valid UTF-8; so is the result.
  std::string apply(std::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

// Unicode Normalization Form C of valid UTF-8 text.
std::string nfc(std::string_view text);

}  // namespace mambacpp::tok
