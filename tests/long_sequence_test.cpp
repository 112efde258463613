// L is limited by nothing but time: a 100,000-token sequence runs through a tiny model in one call, in bounded
// internal pieces, and the process's peak memory does not grow with L.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

int64_t peak_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(LongSequence, HundredThousandTokensInFlatMemory) {
  test::TempDir dir;
  ModelConfig c = test::tiny_mamba2_config();
  test::write_random_model(dir.path(), c, 9);
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.max_batch_tokens = 1024;
  auto model = Model::load(dir.path(), lo);
  auto state = model->create_state(1);

  // Warm up with one full piece, so the workspace has its final size.
  auto warm = test::random_tokens(4096, c.vocab_size, 1);
  Sequence w = Sequence::tokens(warm);
  model->forward(*state, {&w, 1}, Output::LastLogits);
  const int64_t before = peak_rss_kb();

  auto ids = test::random_tokens(100000, c.vocab_size, 2);  // 400 KB of ids: the only O(L) allocation
  Sequence s = Sequence::tokens(ids);
  ForwardResult r = model->forward(*state, {&s, 1}, Output::LastLogits);
  const int64_t growth_kb = peak_rss_kb() - before;

  ASSERT_EQ(r.rows, 1);
  for (float v : r.values) ASSERT_TRUE(std::isfinite(v));
  // A workspace proportional to L would need 100000 tokens x ~250 floats x 4 B = 100 MB; allow 8 MB of noise.
  EXPECT_LT(growth_kb, 8 * 1024) << "peak RSS grew by " << growth_kb << " KB over 100,000 tokens";
}

}  // namespace
}  // namespace mambacpp
