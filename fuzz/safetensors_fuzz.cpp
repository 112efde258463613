// libFuzzer target for the safetensors validator: any input must either be rejected with mambacpp::Error or yield
// tensors whose every byte lies inside the buffer (read here, so that ASan flags a range the checks let through).
// Any other exception or a crash is a bug. Build with clang (see fuzz/CMakeLists.txt), run: ./safetensors_fuzz -max_len=4096
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/safetensors.h"
#include "mambacpp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mambacpp::SafetensorsFile f =
        mambacpp::SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    for (const mambacpp::SafetensorInfo& t : f.tensors()) {
      if (t.shape.size() > 4) continue;  // view() refuses these, by design
      const mambacpp::TensorView v = f.view(t);
      if (v.nbytes() != t.nbytes()) __builtin_trap();  // the view must cover exactly the validated range
      const auto* p = static_cast<const uint8_t*>(v.data);
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < v.nbytes(); ++i) sink = sink ^ p[i];
    }
  } catch (const mambacpp::Error&) {
  }
  return 0;
}
