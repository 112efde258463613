// causal-conv1d's backward launchers as errors, so that the package's own binding (its csrc/causal_conv1d.cpp, whose
// causal_conv1d_bwd refers to them) links without compiling causal_conv1d_bwd.cu, the slowest file of its build: the
// mamba_ssm anchors only run inference (dev/mamba_ssm_anchor_common.py builds this file with the package's binding,
// causal_conv1d_fwd.cu and causal_conv1d_update.cu). The declarations and the nine (input, weight) type pairs are the
// ones causal_conv1d.cpp dispatches over and causal_conv1d_bwd.cu instantiates.
#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <cuda_runtime_api.h>

#include "causal_conv1d.h"

template <typename input_t, typename weight_t>
void causal_conv1d_bwd_cuda(ConvParamsBwd&, cudaStream_t) {
  TORCH_CHECK(false, "causal_conv1d_bwd: not built here (the mamba_ssm anchors build the forward and update kernels only)");
}

template <typename input_t, typename weight_t>
void causal_conv1d_channellast_bwd_cuda(ConvParamsBwd&, cudaStream_t) {
  TORCH_CHECK(false, "causal_conv1d_bwd: not built here (the mamba_ssm anchors build the forward and update kernels only)");
}

#define MAMBACPP_NO_BWD(I, W)                                                        \
  template void causal_conv1d_bwd_cuda<I, W>(ConvParamsBwd&, cudaStream_t);          \
  template void causal_conv1d_channellast_bwd_cuda<I, W>(ConvParamsBwd&, cudaStream_t);

MAMBACPP_NO_BWD(float, float)
MAMBACPP_NO_BWD(c10::Half, float)
MAMBACPP_NO_BWD(c10::BFloat16, float)
MAMBACPP_NO_BWD(float, c10::Half)
MAMBACPP_NO_BWD(c10::Half, c10::Half)
MAMBACPP_NO_BWD(c10::BFloat16, c10::Half)
MAMBACPP_NO_BWD(float, c10::BFloat16)
MAMBACPP_NO_BWD(c10::Half, c10::BFloat16)
MAMBACPP_NO_BWD(c10::BFloat16, c10::BFloat16)
