// The pytorch_model.bin reader (zip layer, restricted unpickler, storage checks): any input must either be rejected
// with mambacpp::Error or yield tensors whose every byte lies in memory the reader owns (read here, so that ASan
// flags a range the checks let through). The libFuzzer build defines FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which
// skips the zip CRC check so that mutations reach the pickle (the replay in the test suite checks CRCs).
// Run: ./torch_checkpoint_fuzz -max_len=8192 ../fuzz/corpus/torch_checkpoint
#include <vector>

#include "fuzz_target.h"
#include "io/torch_checkpoint.h"

MAMBACPP_FUZZ_TARGET(torch_checkpoint) {
  auto f = mambacpp::TorchCheckpointFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
  volatile uint8_t sink = 0;
  for (const mambacpp::TorchCheckpointFile::Tensor& t : f->tensors()) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    MAMBACPP_FUZZ_CHECK(t.nbytes == numel * mambacpp::dtype_size(t.dtype));
    for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    if (t.shape.size() <= 4) MAMBACPP_FUZZ_CHECK(f->view(t).nbytes() == t.nbytes);
  }
}
