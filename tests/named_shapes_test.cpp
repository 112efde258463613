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

// Nemotron-H-8B and Bamba-9B as docs/benchmarks.md states their configs.
TEST(NamedShapes, NemotronH8bAndBamba9b) {
  const ModelConfig n = named_shape("nemotron-h-8b");
  EXPECT_EQ(n.family, Family::NemotronH);
  EXPECT_EQ(n.n_layer, 52);
  EXPECT_EQ(std::count(n.layers.begin(), n.layers.end(), LayerKind::Attention), 4);
  EXPECT_EQ(std::count(n.layers.begin(), n.layers.end(), LayerKind::MLP), 24);
  EXPECT_EQ(n.norm_groups(), 8);
  EXPECT_EQ(n.kv_dim(), 1024);
  EXPECT_FALSE(n.mlp_after_mixer);
  const ModelConfig b = named_shape("bamba-9b");
  EXPECT_EQ(b.family, Family::Bamba);
  EXPECT_EQ(b.n_layer, 32);
  EXPECT_EQ(std::count(b.layers.begin(), b.layers.end(), LayerKind::Attention), 3);
  EXPECT_EQ(b.layer_kind(9), LayerKind::Attention);
  EXPECT_EQ(b.norm_groups(), 1);
  EXPECT_EQ(b.rope_dim, b.attn_head_dim / 2);  // partial_rotary_factor 0.5
  EXPECT_TRUE(b.mlp_after_mixer);
}

}  // namespace
}  // namespace mambacpp
