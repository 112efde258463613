// Text normalisers of tokenizer.json that we reproduce exactly: NFC (Unicode canonical composition, through
// utf8proc), or none. A "Sequence" of normalisers flattens into this list.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mambacpp::tok {

enum class NormalizerKind { NFC };

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerKind> steps) : steps_(std::move(steps)) {}
  bool empty() const { return steps_.empty(); }
  // `text` must be valid UTF-8; so is the result.
  std::string apply(std::string_view text) const;

 private:
  std::vector<NormalizerKind> steps_;
};

// Unicode Normalization Form C of valid UTF-8 text.
std::string nfc(std::string_view text);

}  // namespace mambacpp::tok
