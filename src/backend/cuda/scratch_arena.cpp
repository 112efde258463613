#include "backend/cuda/scratch_arena.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fused_ops.h"

namespace mambacpp::cuda {

ScratchArena::~ScratchArena() {
  // No throwing here: errors at teardown are ignored (the process may be exiting after a device fault).
  for (void* p : retired_) cudaFree(p);
  for (Buffer& b : buffers_)
    if (b.ptr) cudaFree(b.ptr);
  if (pinned_) cudaFreeHost(pinned_);
  cudaGetLastError();
}

void* ScratchArena::grow(Slot s, size_t bytes, cudaStream_t stream) {
  Buffer& b = buffers_[s];
  if (bytes <= b.cap) return b.ptr;
  if (b.ptr) {
    // Retired buffers live as long as the backend: a captured graph may write one on every replay.
    MAMBACPP_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (captured_)
      retired_.push_back(b.ptr);
    else
      MAMBACPP_CUDA_CHECK(cudaFree(b.ptr));
    b.ptr = nullptr;
    b.cap = 0;
  }
  const size_t cap = align(bytes);
  MAMBACPP_CUDA_CHECK(cudaMalloc(&b.ptr, cap));
  b.cap = cap;
  return b.ptr;
}

void* ScratchArena::grow_decode(Slot s, int64_t rows, int64_t width, size_t elem, cudaStream_t stream) {
  return grow(s, static_cast<size_t>(std::max(rows, kFastMaxRows) * std::max<int64_t>(width, 1)) * elem, stream);
}

void* ScratchArena::grow_pinned(size_t bytes) {
  if (bytes <= pinned_cap_) return pinned_;
  if (pinned_) MAMBACPP_CUDA_CHECK(cudaFreeHost(pinned_));
  pinned_ = nullptr;
  pinned_cap_ = 0;
  const size_t cap = align(std::max(bytes, size_t(64) << 10));
  MAMBACPP_CUDA_CHECK(cudaMallocHost(&pinned_, cap));
  pinned_cap_ = cap;
  return pinned_;
}

}  // namespace mambacpp::cuda
