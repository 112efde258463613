// libFuzzer target for the pytorch_model.bin reader (zip layer, restricted unpickler, storage checks): any input must
// either be rejected with mambacpp::Error or yield tensors whose every byte lies in memory the reader owns (read
// here, so that ASan flags a range the checks let through). Any other exception, a crash or a hang is a bug.
// Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which skips the zip CRC check so that mutations reach the
// pickle. Run: ./torch_checkpoint_fuzz -max_len=8192 ../fuzz/corpus/torch_checkpoint
#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/torch_checkpoint.h"
#include "mambacpp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = mambacpp::TorchCheckpointFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    volatile uint8_t sink = 0;
    for (const mambacpp::TorchCheckpointFile::Tensor& t : f->tensors()) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      if (t.nbytes != numel * mambacpp::dtype_size(t.dtype)) __builtin_trap();
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
      if (t.shape.size() <= 4 && f->view(t).nbytes() != t.nbytes) __builtin_trap();
    }
  } catch (const mambacpp::Error&) {
  }
  return 0;
}
