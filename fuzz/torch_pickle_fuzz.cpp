// The restricted unpickler alone (no zip layer around it): any input must either be rejected with mambacpp::Error or
// give tensors whose storage index, size and offset are consistent. Run:
//   ./torch_pickle_fuzz -max_len=4096 ../fuzz/corpus/torch_pickle
#include "fuzz_target.h"
#include "io/torch_pickle.h"

MAMBACPP_FUZZ_TARGET(torch_pickle) {
  const mambacpp::TorchPickle p = mambacpp::read_torch_pickle(data, size, "fuzz");
  for (const mambacpp::PickledTensor& t : p.tensors) {
    MAMBACPP_FUZZ_CHECK(t.storage < p.storages.size() && t.shape.size() == t.stride.size());
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    MAMBACPP_FUZZ_CHECK(numel == 0 || t.offset + numel <= p.storages[t.storage].numel);
  }
}
