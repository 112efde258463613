// The safetensors validator: any input must either be rejected with mambacpp::Error or yield tensors whose every
// byte lies inside the buffer (read here, so that ASan flags a range the checks let through), with views aligned to
// their dtype (the format allows any offset; unaligned tensors are copied). Run: ./safetensors_fuzz -max_len=4096
#include <vector>

#include "fuzz_target.h"
#include "io/safetensors.h"

MAMBACPP_FUZZ_TARGET(safetensors) {
  const mambacpp::SafetensorsFile f = mambacpp::SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
  for (const mambacpp::SafetensorInfo& t : f.tensors()) {
    if (t.shape.size() > 4) continue;  // view() refuses these, by design
    const mambacpp::TensorView v = f.view(t);
    MAMBACPP_FUZZ_CHECK(v.nbytes() == t.nbytes());  // the view covers exactly the validated range
    MAMBACPP_FUZZ_CHECK(v.nbytes() == 0 || reinterpret_cast<uintptr_t>(v.data) % mambacpp::dtype_size(t.dtype) == 0);
    const auto* p = static_cast<const uint8_t*>(v.data);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < v.nbytes(); ++i) sink = sink ^ p[i];
  }
}
