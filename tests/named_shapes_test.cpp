// The named shapes `bench --shape` builds random models of: every one is a valid config, and the hybrid ones have
// the structure the benchmark's floor assumes (Mamba-2 layers with a whole-d_inner gated norm, a few attention
// layers, an MLP after every mixer).
#include <gtest/gtest.h>

#include <algorithm>

#include "mambacpp/error.h"
#include "mambacpp/shapes.h"

namespace mambacpp {
namespace {

TEST(NamedShapes, EveryShapeIsAValidConfig) {
  const std::vector<std::string> names = named_shapes();
  ASSERT_GE(names.size(), 10u);
  for (const std::string& n : names) EXPECT_NO_THROW(named_shape(n).validate()) << n;
  EXPECT_THROW(named_shape("granite-4.0-h-2b"), Error);
}

TEST(NamedShapes, GraniteHybrids) {
  for (const char* n : {"granite-4.0-h-1b", "granite-4.0-h-350m"}) {
    const ModelConfig c = named_shape(n);
    EXPECT_EQ(c.family, Family::GraniteHybrid) << n;
    ASSERT_EQ(static_cast<int64_t>(c.layers.size()), c.n_layer) << n;
    EXPECT_EQ(std::count(c.layers.begin(), c.layers.end(), LayerKind::Attention), 4) << n;
    EXPECT_EQ(c.d_inner, c.n_heads * c.head_dim) << n;
    EXPECT_EQ(c.norm_groups(), 1) << n;
    EXPECT_TRUE(c.mlp_after_mixer) << n;
    EXPECT_EQ(c.rope_theta, 0.0) << n;  // NoPE
    EXPECT_EQ(c.q_dim(), c.d_model) << n;
  }
}

}  // namespace
}  // namespace mambacpp
