// libFuzzer target for config.json parsing (relaxed JSON + every dialect): any input must either parse into a
// config that passes validate() or be rejected with mambacpp::Error; any other exception or a crash is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mambacpp/config.h"
#include "mambacpp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mambacpp::ModelConfig c =
        mambacpp::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    // What parses must survive its own canonical round trip.
    const mambacpp::ModelConfig again = mambacpp::parse_model_config(c.to_json(), "fuzz-canonical");
    if (again.to_json() != c.to_json()) __builtin_trap();
  } catch (const mambacpp::Error&) {
  }
  return 0;
}
