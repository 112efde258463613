// State files (`generate --save-state` / StateCache::save), read by the format's one home, src/model/state_file.cpp
// (versions 3 and 4). The first input byte picks the model (a Mamba-2 fixture: conv and SSM entries; a Nemotron-H
// fixture: KV entries too), the rest is the file. Any input is refused with mambacpp::Error, or restores a slot
// holding only tokens of the vocabulary (and, with KV entries, one position per recorded token).
// Seeds: fuzz/corpus/state_file (files the CLI wrote, prefixed with the model byte; see docs/reliability.md).
#include <memory>
#include <vector>

#include "fuzz_files.h"
#include "fuzz_target.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"

namespace {

struct Loaded {
  std::unique_ptr<mambacpp::Model> model;
  std::unique_ptr<mambacpp::StateCache> state;
};

std::vector<Loaded>& models() {
  static std::vector<Loaded> all = [] {
    std::vector<Loaded> out;
    mambacpp::LoadOptions lo;
    lo.device = mambacpp::DeviceChoice::CPU;
    lo.threads = 1;
    for (const char* dir : {"/fixtures/models/mamba2_f32_groups_bias", "/fixtures/hybrid/nemotron_h_f32"}) {
      Loaded l;
      l.model = mambacpp::Model::load(mambacpp::fuzz::source_dir() + dir, lo);
      l.state = l.model->create_state(1);
      out.push_back(std::move(l));
    }
    return out;
  }();
  return all;
}

}  // namespace

MAMBACPP_FUZZ_TARGET(state_file) {
  if (size == 0) return;
  static mambacpp::fuzz::MemFile file;
  Loaded& m = models()[data[0] % models().size()];
  const std::vector<int32_t> tokens = m.state->load(0, file.write(data + 1, size - 1));
  for (int32_t t : tokens) MAMBACPP_FUZZ_CHECK(t >= 0 && t < m.model->config().vocab_size);
  // A state that records tokens holds one KV position per token (the engine keys the state by them).
  if (!tokens.empty() && m.model->config().has_attention())
    MAMBACPP_FUZZ_CHECK(m.state->tokens_held(0) == static_cast<int64_t>(tokens.size()));
}
