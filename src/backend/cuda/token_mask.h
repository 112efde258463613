// A grammar's allowed-token mask applied to rows of logits on the device (the first step of select_top_k,
// mambacpp/top_k.h): every id whose bit is clear is set to -inf in place, so that the selection that follows sees the
// row a host would have masked, and only the candidates leave the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mambacpp::cuda {

struct TokenMaskLaunch {
  float* logits = nullptr;           // rows of `V` entries, `stride` floats apart
  int64_t stride = 0;
  int32_t V = 0;                     // ids a mask covers: the whole row
  int32_t n_masked = 0;              // rows with a mask (<= 65535: one grid row each)
  const int32_t* rows = nullptr;     // device, [n_masked]: the logits row of mask i
  const uint32_t* words = nullptr;   // device, [n_masked, words_per_row]: bit id % 32 of word id / 32 = allowed
  int32_t words_per_row = 0;         // ceil(V / 32)
};
void launch_token_mask(const TokenMaskLaunch& p, cudaStream_t stream);

}  // namespace mambacpp::cuda
