// Running requests on the serving engine in tests: a batch on one engine, or a request alone on a fresh engine
// without a prefix cache (the reference every batched or cached run must match).
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mambacpp/engine.h"
#include "mambacpp/model.h"

namespace mambacpp::test {

// The logits of every position of `ids` fed to `slot` in one forward call.
inline std::vector<float> all_logits(const Model& model, StateCache& st, std::span<const int32_t> ids,
                                     int64_t slot = 0) {
  Sequence s = Sequence::tokens(ids, slot);
  return model.forward(st, {&s, 1}, Output::AllLogits).values;
}

// A fixture directory's greedy.json (written by the fixture scripts from transformers): its greedy request (prompt,
// max_new_tokens, temperature 0, EOS ignored) and the tokens transformers' full passes chose.
struct GreedyFixture {
  GenerateRequest request;
  std::vector<int32_t> tokens;
};
inline GreedyFixture greedy_fixture(const std::string& dir) {
  std::ifstream f(dir + "/greedy.json");
  const auto g = nlohmann::json::parse(f);
  GreedyFixture out;
  out.request.prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  out.request.max_new_tokens = g["max_new_tokens"].get<int>();
  out.request.sampling.temperature = 0.0f;
  out.request.ignore_eos = true;
  out.tokens = g["full_pass_ids"].get<std::vector<int32_t>>();
  return out;
}

// `max_seqs` 0: one slot per request.
inline std::vector<GenerateResult> run_batch(const Model& model, std::vector<GenerateRequest> requests,
                                             const Tokenizer* tokenizer = nullptr, EngineOptions options = {},
                                             int64_t max_seqs = 0) {
  options.max_seqs = max_seqs > 0 ? max_seqs : std::max<int64_t>(1, static_cast<int64_t>(requests.size()));
  Engine engine(model, tokenizer, options);
  return engine.run(std::move(requests));
}

inline GenerateResult run_alone(const Model& model, GenerateRequest request, const Tokenizer* tokenizer = nullptr,
                                EngineOptions options = {}) {
  options.state_cache_mb = 0;
  std::vector<GenerateRequest> one;
  one.push_back(std::move(request));
  return std::move(run_batch(model, std::move(one), tokenizer, options, 1).front());
}

// The text pieces a request streams, concatenated.
struct TextPieces {
  std::vector<std::string> pieces;
  std::string joined() const {
    std::string s;
    for (const std::string& p : pieces) s += p;
    return s;
  }
  void attach(GenerateRequest& r) {
    r.on_event = [this](const RequestEvent& e) {
      if (!e.text.empty()) pieces.emplace_back(e.text);
    };
  }
};

}  // namespace mambacpp::test
