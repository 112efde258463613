// How 16-bit weights meet the activations in the GPU's matrix products (LoadOptions::precision, --precision).
//   Fast:  activations rounded to the weight dtype (2^-9 relative for bf16) entering one tensor-core product with
//          f32 accumulation, as mamba_ssm and vLLM compute; recurrences, norms and the state stay f32 (or the bf16
//          state when chosen). The products use one fixed algorithm for every batch size, so a sequence's results
//          do not depend on its batch-mates or the batch size (batch invariance).
//   Exact: products as accurate as f32 arithmetic over the stored weights (the activations split into two 16-bit
//          halves, two products), for verification.
// f32 weights and the CPU compute in f32 either way.
#pragma once

#include <cstdint>
#include <string>

#include "mambacpp/error.h"

namespace mambacpp {

enum class Precision : uint8_t { Fast, Exact };

// "fast" | "exact"; throws otherwise.
inline Precision parse_precision(const std::string& s) {
  if (s == "fast") return Precision::Fast;
  if (s == "exact") return Precision::Exact;
  fail("--precision: expected fast or exact, found '", s, "'");
}
inline const char* precision_name(Precision p) { return p == Precision::Exact ? "exact" : "fast"; }

}  // namespace mambacpp
