// NFC through ICU's Normalizer2 (see normalizer.h). ASCII text is already in every normal form, which makes the
// common case a single scan.
#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "mambacpp/error.h"

namespace mambacpp::tok {

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) fail("tokenizer: ICU NFC normaliser unavailable: ", u_errorName(status));
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  normalizer->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr,
                            status);
  if (U_FAILURE(status)) fail("tokenizer: NFC normalisation failed: ", u_errorName(status));
  return out;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (NormalizerKind step : steps_) {
    switch (step) {
      case NormalizerKind::NFC:
        out = nfc(out);
        break;
    }
  }
  return out;
}

}  // namespace mambacpp::tok
