// The hybrid-layer ops for backends that do not have them (both of today's backends have them: this is the default
// a new backend starts from).
#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

void Backend::no_hybrid_ops(const char* what) const {
  fail(description(), ": ", what,
       ": this backend has no attention, RoPE or MLP ops; run hybrid models with --device cpu");
}

void Backend::attention(const AttentionArgs&, const BatchLayout&) { no_hybrid_ops("attention"); }
void Backend::rope(TensorView, int64_t, int64_t, int64_t, double, const std::vector<int64_t>&, const BatchLayout&) {
  no_hybrid_ops("rope");
}
void Backend::rope_at_lengths(TensorView, int64_t, int64_t, int64_t, double, const int64_t*, const BatchLayout&) {
  no_hybrid_ops("rope_at_lengths");
}
void Backend::relu2(TensorView) { no_hybrid_ops("relu2"); }
void Backend::silu_mul(const TensorView&, const TensorView&, TensorView) { no_hybrid_ops("silu_mul"); }
void Backend::scale(TensorView, float) { no_hybrid_ops("scale"); }

}  // namespace mambacpp
