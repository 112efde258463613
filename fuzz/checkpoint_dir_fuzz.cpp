// A checkpoint directory: config.json and the four shards of fixtures/models/mamba2_bf16_sharded, plus the input as
// (first byte % 3) 0: model.safetensors.index.json, 1: model.safetensors, 2: one more *.safetensors file beside the
// shards (the directory scan, duplicate names across files). Any input is refused with mambacpp::Error, or opens a
// checkpoint whose every tensor is found in the file it is said to be in.
#include "fuzz_files.h"
#include "fuzz_target.h"
#include "io/checkpoint.h"

namespace {

const mambacpp::fuzz::ScratchDir& dir() {
  static const mambacpp::fuzz::ScratchDir d = [] {
    mambacpp::fuzz::ScratchDir s;
    const std::string from = mambacpp::fuzz::source_dir() + "/fixtures/models/mamba2_bf16_sharded/";
    for (const char* f : {"config.json", "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}) {
      const std::string bytes = mambacpp::fuzz::read_all(from + f);
      s.write(f, bytes.data(), bytes.size());
    }
    return s;
  }();
  return d;
}

}  // namespace

MAMBACPP_FUZZ_TARGET(checkpoint_dir) {
  if (size == 0) return;
  const auto& d = dir();
  static const char* const kNames[] = {"model.safetensors.index.json", "model.safetensors", "extra.safetensors"};
  for (const char* n : kNames) d.remove(n);
  d.write(kNames[data[0] % 3], data + 1, size - 1);
  const mambacpp::Checkpoint c(d.path());
  for (const std::string& name : c.names()) {
    MAMBACPP_FUZZ_CHECK(c.find(name) != nullptr && !c.file_of(name).empty());
  }
  (void)c.content_hash();
}
