// Device helpers shared by the attention kernels (attention.cu: f32 arithmetic; attention_mma.cu: bf16 tensor
// cores): where a cached row lives in the pages, and which sequence a block works on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace mambacpp::cuda {

// Position pos of a sequence's cache: the K row (value = false) or the V row of KV head g.
// Positions and page sizes fit 32 bits (a context of 2^32 rows would be terabytes of pages): the page division in
// 32 bits costs a fraction of a 64-bit one, and decode computes it for every row it stages.
template <class P>
__device__ __forceinline__ const P* kv_at(void* const* pages, const AttnSeq& s, int64_t pos, int64_t page_tokens,
                                          int64_t kv_dim, int64_t g, int64_t hd, bool value) {
  const uint32_t pos32 = static_cast<uint32_t>(pos), pt = static_cast<uint32_t>(page_tokens);
  const uint32_t pg = pos32 / pt, row = pos32 - pg * pt;
  const P* page = static_cast<const P*>(pages[s.page0 + pg]);
  return page + ((value ? page_tokens : 0) + row) * kv_dim + g * hd;
}

// Sequence k of the call, from the uploaded table or (device-resident mode) from the prepared spans and lengths.
__device__ __forceinline__ AttnSeq seq_of(const AttentionLaunch& p, int64_t k) {
  if (!p.spans) return p.seqs[k];
  const SeqSpan sp = p.spans[k];
  AttnSeq s;
  s.start = sp.start;
  s.len = sp.len;
  s.past = p.lengths[sp.slot];
  s.page0 = sp.slot * p.max_pages;
  return s;
}

// The tensor-core kernel (attention_mma.cu) for launches with AttentionLaunch::mma; writes the output or, with
// n_splits > 1, the partials that launch_attention then combines.
void launch_attention_mma(const AttentionLaunch& p, cudaStream_t stream);

}  // namespace mambacpp::cuda
