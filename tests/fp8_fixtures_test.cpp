// FP8 checkpoints made outside mamba.cpp (scripts/make_fp8_checkpoint_fixtures.py: torch's float8_e4m3fn cast, a
// ModelOpt FP8_PER_CHANNEL_PER_TOKEN directory) against transformers' float64 logits of the dequantized model.
// Tolerance: 1e-4 of the largest logit, as hybrid_model_test.cpp allows its fixtures (measured ~1e-6 there): the CPU
// computes in f32 from weights dequantized in f32 (one rounding of e4m3 x scale, 2^-24 relative), the reference in
// f64 from the exact products; a scale on the wrong row or an unquantized module read as quantized moves the logits
// by 1e-2 or more (FP8's own error, measured by the script, is a few percent of the largest logit).
// Also: `quantize --type fp8` of the same source gives torch's bytes and scales exactly (the same f32 division and
// round-to-nearest-even cast in two implementations).
#include <gtest/gtest.h>

#include <filesystem>

#include "io/checkpoint.h"
#include "mambacpp/fp8_checkpoint.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

const std::pair<const char*, const char*> kFixtures[] = {{"nemotron_h_fp8", "hybrid/nemotron_h_f32"},
                                                         {"mamba1_fp8", "models/mamba1_f32_untied_bias"}};

std::string fixture(const char* name) { return test::fixture_dir() + "/fp8/" + name; }

TEST(Fp8Fixtures, ArePresent) {
  for (const auto& [name, source] : kFixtures)
    EXPECT_TRUE(fs::exists(fixture(name) + "/logits.npy"))
        << "run python3 scripts/make_fp8_checkpoint_fixtures.py fixtures/fp8 (torch + transformers)";
}

TEST(Fp8Fixtures, LogitsMatchTransformersOnTheDequantizedModel) {
  for (const auto& [name, source] : kFixtures) {
    SCOPED_TRACE(name);
    const std::string dir = fixture(name);
    ASSERT_EQ(Checkpoint(dir).quant().method, QuantMethod::ModelOpt);
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    auto model = Model::load(dir, lo);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    auto st = model->create_state(1);
    Sequence s = Sequence::tokens(ids);
    const std::vector<float> got = model->forward(*st, {&s, 1}, Output::AllLogits).values;
    const NpyArray ref = read_npy(dir + "/logits.npy");
    ASSERT_EQ(ref.values.size(), got.size());
    const std::vector<double> ours(got.begin(), got.end());
    const double d = test::max_rel_diff(ours, ref.values);
    std::printf("[fp8 fixtures] %-16s max |diff| / max |ref| = %.2e\n", name, d);
    EXPECT_LE(d, 1e-4);
  }
}

TEST(Fp8Fixtures, QuantizeMakesTorchsBytesAndScales) {
  test::TempDir tmp("fp8_fixture_quantize");
  for (const auto& [name, source] : kFixtures) {
    SCOPED_TRACE(name);
    const std::string out = tmp.file(name);
    quantize_to_fp8_checkpoint(test::fixture_dir() + "/" + source, out);
    const Checkpoint ours(out), torch(fixture(name));
    int64_t compared = 0;
    for (const std::string& n : torch.weight_names()) {
      const std::optional<Weight> a = ours.weight(n), b = torch.weight(n);
      ASSERT_TRUE(a.has_value()) << n;
      ASSERT_EQ(a->format, b->format) << n;
      if (b->format != WeightFormat::FP8_E4M3) continue;
      ASSERT_EQ(a->nbytes(), b->nbytes()) << n;
      EXPECT_EQ(0, std::memcmp(a->data.data, b->data.data, b->nbytes())) << n << ": e4m3 bytes differ";
      EXPECT_EQ(0, std::memcmp(a->scale.data, b->scale.data, b->scale.nbytes())) << n << ": scales differ";
      ++compared;
    }
    EXPECT_GT(compared, 0);
  }
}

}  // namespace
}  // namespace mambacpp
