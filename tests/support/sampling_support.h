// Test helpers for the sampling paths (CPU and GPU test binaries): a tokenizer that only has a vocabulary size
// (smaller than the model's: the rows above it are padding that must never be sampled) and token bytes, and a
// one-line way to spell a sampling chain.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"

namespace mambacpp::test {

class PaddedTokenizer : public Tokenizer {
 public:
  explicit PaddedTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view) const override { fail("PaddedTokenizer::encode is not used"); }
  std::string decode(std::span<const int32_t> ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override { return "<" + std::to_string(id) + ">"; }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int32_t) const override { return false; }

 private:
  int64_t vocab_;
};

inline SamplingParams sampling_chain(float temperature, int top_k, float top_p, float min_p, float penalty,
                                     int repeat_last_n = 64) {
  SamplingParams s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  s.repeat_penalty = penalty;
  s.repeat_last_n = repeat_last_n;
  return s;
}

}  // namespace mambacpp::test
