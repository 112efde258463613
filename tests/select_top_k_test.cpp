// Backend::select_top_k on the CPU against the plain reference of support/top_k_reference.h (exact: ids and
// bitwise logits), over ties, -0/+0, -inf holes, all -inf, NaN and +inf rows, k above the number of considered
// entries, limits below the row length, penalties and strided rows; and the request checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "mambacpp/error.h"
#include "support/test_support.h"
#include "support/top_k_reference.h"

namespace mambacpp {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_same(const TopKCandidates& got, const TopKCandidates& want, const std::string& what) {
  EXPECT_EQ(got.bad_id, want.bad_id) << what;
  if (want.bad_id >= 0) {
    EXPECT_TRUE(std::memcmp(&got.bad_value, &want.bad_value, sizeof(float)) == 0)
        << what << ": bad value " << got.bad_value << " vs " << want.bad_value;
  }
  EXPECT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  EXPECT_TRUE(got.logits.empty() ||
              std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)) == 0)
      << what << ": logits differ bitwise";
}

// Runs the op on rows (copied into a [n, V] view with row stride `stride` >= V) and checks every row.
void check_rows(Backend& be, const std::vector<std::vector<float>>& rows, const std::vector<TopKRequest>& reqs,
                int64_t stride, const std::string& what) {
  const int64_t n = static_cast<int64_t>(rows.size()), V = static_cast<int64_t>(rows.front().size());
  std::vector<float> buf(static_cast<size_t>(n * stride), std::nanf(""));  // NaN between rows: must not be read
  for (int64_t r = 0; r < n; ++r) std::copy(rows[r].begin(), rows[r].end(), buf.begin() + r * stride);
  TensorView wide(buf.data(), DType::F32, {n, stride});
  std::vector<TopKCandidates> got;
  be.select_top_k(wide.cols(0, V), reqs, got);
  ASSERT_EQ(got.size(), rows.size());
  for (int64_t r = 0; r < n; ++r)
    expect_same(got[r], test::reference_top_k(rows[r], reqs[r]), what + " row " + std::to_string(r));
}

TEST(SelectTopK, RandomRowsMatchTheReference) {
  auto be = make_cpu_backend(2);
  std::mt19937_64 rng(5);
  int checked = 0;
  for (int64_t V : {1, 2, 7, 50, 1000}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<std::vector<float>> rows;
      std::vector<TopKRequest> reqs;
      for (int k : {1, 2, 3, 40, 256}) {
        TopKRequest q;
        q.k = k;
        q.limit = (k % 2 == 0 && V > 1) ? V - V / 3 : 0;  // some rows cut padding off
        if (k != 3) {
          q.repeat_penalty = k == 40 ? 0.5f : 1.3f;  // < 1 too: the penalty may raise a logit
          q.penalized = test::random_distinct_ids(V, 20, rng);
        }
        rows.push_back(test::random_row(V, kind, rng));
        reqs.push_back(q);
      }
      check_rows(*be, rows, reqs, V + 3, "V " + std::to_string(V) + " kind " + std::to_string(kind));
      checked += static_cast<int>(rows.size());
    }
  }
  EXPECT_EQ(checked, 100);
}

TEST(SelectTopK, TiesGoToTheLowestIdsAndZerosTie) {
  auto be = make_cpu_backend(1);
  // Ids 1, 3, 4 hold the top value; -0 (id 5) and +0 (id 2) compare equal, so id 2 comes first.
  const std::vector<float> row = {-1.0f, 2.0f, 0.0f, 2.0f, 2.0f, -0.0f, -kInf};
  TopKRequest q;
  q.k = 5;
  std::vector<TopKCandidates> got;
  std::vector<float> copy = row;
  be->select_top_k(TensorView(copy.data(), DType::F32, {1, 7}), {q}, got);
  EXPECT_EQ(got[0].ids, (std::vector<int32_t>{1, 3, 4, 2, 5}));
  EXPECT_TRUE(std::signbit(got[0].logits[4]));  // the value itself, not a canonical zero
  q.k = 2;
  copy = row;
  be->select_top_k(TensorView(copy.data(), DType::F32, {1, 7}), {q}, got);
  EXPECT_EQ(got[0].ids, (std::vector<int32_t>{1, 3}));
}

TEST(SelectTopK, KAboveTheConsideredCountReturnsThemAllAndAllMinusInfReturnsNone) {
  auto be = make_cpu_backend(1);
  std::vector<float> rows = {-kInf, 3.0f,  -kInf, 1.0f,  // two considered
                             -kInf, -kInf, -kInf, -kInf};
  TopKRequest q;
  q.k = 40;
  std::vector<TopKCandidates> got;
  be->select_top_k(TensorView(rows.data(), DType::F32, {2, 4}), {q, q}, got);
  EXPECT_EQ(got[0].ids, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(got[0].logits, (std::vector<float>{3.0f, 1.0f}));
  EXPECT_TRUE(got[1].ids.empty());
  EXPECT_EQ(got[1].bad_id, -1);
}

TEST(SelectTopK, NanAndPlusInfBelowTheLimitMakeTheRowBad) {
  auto be = make_cpu_backend(1);
  for (int k : {1, 4}) {
    std::vector<float> rows = {1.0f, kInf, 2.0f, std::nanf(""), 0.0f,   // lowest bad id: 1
                               1.0f, 2.0f, 3.0f, std::nanf(""), kInf};  // bad ids >= limit 3: ignored
    TopKRequest q;
    q.k = k;
    TopKRequest cut = q;
    cut.limit = 3;
    std::vector<TopKCandidates> got;
    be->select_top_k(TensorView(rows.data(), DType::F32, {2, 5}), {q, cut}, got);
    EXPECT_EQ(got[0].bad_id, 1) << "k " << k;
    EXPECT_EQ(got[0].bad_value, kInf);
    EXPECT_TRUE(got[0].ids.empty());
    EXPECT_EQ(got[1].bad_id, -1) << "k " << k;
    EXPECT_EQ(got[1].ids.front(), 2);
  }
}

TEST(SelectTopK, PenaltyDividesPositiveAndMultipliesNonPositiveLogits) {
  auto be = make_cpu_backend(1);
  std::vector<float> row = {4.0f, 3.0f, -1.0f, -0.5f, 2.5f};
  TopKRequest q;
  q.k = 5;
  q.repeat_penalty = 2.0f;
  q.penalized = {0, 3};  // 4 -> 2, -0.5 -> -1
  std::vector<TopKCandidates> got;
  be->select_top_k(TensorView(row.data(), DType::F32, {1, 5}), {q}, got);
  EXPECT_EQ(got[0].ids, (std::vector<int32_t>{1, 4, 0, 2, 3}));
  EXPECT_EQ(got[0].logits, (std::vector<float>{3.0f, 2.5f, 2.0f, -1.0f, -1.0f}));
}

TEST(SelectTopK, RejectsBadRequests) {
  auto be = make_cpu_backend(1);
  std::vector<float> row(10, 0.0f);
  const TensorView v(row.data(), DType::F32, {1, 10});
  std::vector<TopKCandidates> got;
  auto error_for = [&](TopKRequest q) { return test::error_of([&] { be->select_top_k(v, {q}, got); }); };
  TopKRequest q;
  q.k = 0;
  EXPECT_NE(error_for(q).find("k must be in [1, 256], found 0"), std::string::npos) << error_for(q);
  q.k = kMaxTopK + 1;
  EXPECT_NE(error_for(q).find("found 257"), std::string::npos);
  q.k = 1;
  q.limit = 11;
  EXPECT_NE(error_for(q).find("limit must be in [0, 10], found 11"), std::string::npos) << error_for(q);
  q.limit = 0;
  q.repeat_penalty = 1.1f;
  q.penalized = {3, 4, 3};
  EXPECT_NE(error_for(q).find("penalized id 3 appears twice"), std::string::npos) << error_for(q);
  q.penalized = {10};
  EXPECT_NE(error_for(q).find("penalized id 10 outside [0, 10)"), std::string::npos) << error_for(q);
  q.penalized = {};
  q.repeat_penalty = 0.0f;
  EXPECT_NE(error_for(q).find("repeat_penalty must be a finite number > 0"), std::string::npos) << error_for(q);
  EXPECT_NE(test::error_of([&] {
              be->select_top_k(v, {TopKRequest{}, TopKRequest{}}, got);
            }).find("expected one request per logits row (1), found 2"),
            std::string::npos);
}

}  // namespace
}  // namespace mambacpp
