// The hybrid-layer ops for backends that do not have them: the GPU backend has no attention, RoPE or MLP kernels
// yet (Model::load refuses hybrid models there first; this is the backstop for direct callers).
#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

void Backend::no_hybrid_ops(const char* what) const {
  fail(description(), ": ", what,
       ": attention layers are not implemented on the GPU yet; run hybrid models with --device cpu");
}

void Backend::attention(const AttentionArgs&, const BatchLayout&) { no_hybrid_ops("attention"); }
void Backend::rope(TensorView, int64_t, int64_t, int64_t, double, const std::vector<int64_t>&, const BatchLayout&) {
  no_hybrid_ops("rope");
}
void Backend::relu2(TensorView) { no_hybrid_ops("relu2"); }
void Backend::silu_mul(const TensorView&, const TensorView&, TensorView) { no_hybrid_ops("silu_mul"); }
void Backend::scale(TensorView, float) { no_hybrid_ops("scale"); }

}  // namespace mambacpp
