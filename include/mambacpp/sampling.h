// Sampling parameters of one request, as llama.cpp names them, plus OpenAI's presence and frequency penalties.
// The chain that applies them is documented in src/engine/sampler.h.
#pragma once

#include <cstdint>

namespace mambacpp {

struct SamplingParams {
  float temperature = 0.8f;       // <= 0: greedy
  int top_k = 40;                 // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.05f;            // <= 0: off
  float repeat_penalty = 1.0f;    // 1: off; over the last repeat_last_n tokens, prompt included (llama.cpp)
  int repeat_last_n = 64;         // window of the repetition penalty, in tokens; 0: off
  // OpenAI's penalties, in [-2, 2], over the tokens generated so far (not the prompt): each distinct generated
  // token's logit is lowered by presence_penalty, and by frequency_penalty times the number of times it was
  // generated. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;              // used when seed_given; otherwise a random seed is drawn
  bool seed_given = false;

  bool greedy() const { return temperature <= 0.0f; }
  // How many top candidates the chain looks at: 1 for greedy, top_k when 1 <= top_k <= kMaxTopK; 0 when it needs
  // the whole row (top-k off or wider than a selection gives, or presence/frequency penalties on).
  int candidates_needed() const;
  // Throws Error naming the parameter when a value is NaN or out of range.
  void validate() const;
};

}  // namespace mambacpp
