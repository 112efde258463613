// The CLI's list parsers: the token ids of --tokens-file (first input byte even) and the lengths of --chunks (odd).
// Either the text is refused with mambacpp::Error or every value is in range.
#include <string>

#include "cli_common.h"
#include "fuzz_target.h"

MAMBACPP_FUZZ_TARGET(token_lists) {
  if (size == 0) return;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    for (int32_t id : mambacpp::cli::parse_token_ids(text, "fuzz")) MAMBACPP_FUZZ_CHECK(id >= 0);
  } else {
    for (int64_t n : mambacpp::cli::parse_chunks(text, "--chunks")) MAMBACPP_FUZZ_CHECK(n > 0);
  }
}
