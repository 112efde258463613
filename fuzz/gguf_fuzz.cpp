// The GGUF reader (io/gguf_file.h) and the metadata -> config mapping (io/gguf_model.h): any input must either be
// rejected with mambacpp::Error or yield tensors whose every byte lies inside the buffer (read here, so ASan flags a
// range the checks let through). Run: ./gguf_fuzz -max_len=8192 fuzz/corpus/gguf
#include <vector>

#include "fuzz_target.h"
#include "io/gguf_file.h"
#include "io/gguf_model.h"
#include "mambacpp/error.h"

MAMBACPP_FUZZ_TARGET(gguf) {
  const auto f = mambacpp::GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
  for (const mambacpp::GgufTensor& t : f->tensors()) {
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
  }
  for (const std::string& k : f->keys()) MAMBACPP_FUZZ_CHECK(f->find(k) != nullptr);
  (void)mambacpp::gguf_model_config(*f);  // throws mambacpp::Error on anything inconsistent
}
