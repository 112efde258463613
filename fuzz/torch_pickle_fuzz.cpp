// libFuzzer target for the restricted unpickler alone (no zip layer around it): any input must either be rejected
// with mambacpp::Error or give tensors whose storage index, size and offset are consistent. Run:
//   ./torch_pickle_fuzz -max_len=4096 ../fuzz/corpus/torch_pickle
#include <cstddef>
#include <cstdint>

#include "io/torch_pickle.h"
#include "mambacpp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mambacpp::TorchPickle p = mambacpp::read_torch_pickle(data, size, "fuzz");
    for (const mambacpp::PickledTensor& t : p.tensors) {
      if (t.storage >= p.storages.size() || t.shape.size() != t.stride.size()) __builtin_trap();
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      if (numel > 0 && t.offset + numel > p.storages[t.storage].numel) __builtin_trap();
    }
  } catch (const mambacpp::Error&) {
  }
  return 0;
}
