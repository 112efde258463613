// NFC through utf8proc (see normalizer.h): a small Debian library, where ICU would bring 30 MB of data for this one
// function. ASCII text is already in every normal form, which makes the common case a single scan.
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "mambacpp/error.h"

namespace mambacpp::tok {

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("tokenizer: the text is not valid UTF-8 (", utf8proc_errmsg(n), ")");
  std::string out(reinterpret_cast<const char*>(composed), static_cast<size_t>(n));
  std::free(composed);
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
