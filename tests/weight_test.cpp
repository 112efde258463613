// Typed weights (core/weight.h): the block table, row sizes, packed shapes and views, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/weight.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WeightFormat, BlocksAreGgmlsLayouts) {
  // Bytes per block as ggml lays them out: scales and quants of 32 elements, or super-blocks of 256.
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q8_0, 64), 2 * 34);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q4_0, 32), 18);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q5_0, 32), 22);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q5_1, 32), 24);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q4_K, 512), 2 * 144);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q5_K, 256), 176);
  EXPECT_EQ(weight_row_bytes(WeightFormat::Q6_K, 256), 210);
  EXPECT_EQ(weight_row_bytes(WeightFormat::BF16, 7), 14);
  EXPECT_EQ(weight_row_bytes(WeightFormat::FP8_E4M3, 7), 7);
  EXPECT_THAT(error_of([] { weight_row_bytes(WeightFormat::Q4_K, 300, "blk.0.ssm_in"); }),
              AllOf(HasSubstr("blk.0.ssm_in"), HasSubstr("256"), HasSubstr("300")));
}

TEST(WeightFormat, NamesRoundTrip) {
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::Q8_0, WeightFormat::Q6_K,
                         WeightFormat::FP8_E4M3})
    EXPECT_EQ(parse_weight_format(weight_format_name(f)), f);
  EXPECT_EQ(parse_weight_format("Q4_K"), WeightFormat::Q4_K);
  EXPECT_THAT(error_of([] { parse_weight_format("q3_k"); }), AllOf(HasSubstr("q3_k"), HasSubstr("q4_k")));
  EXPECT_TRUE(is_dense(WeightFormat::F16));
  EXPECT_FALSE(is_dense(WeightFormat::Q8_0));
  EXPECT_EQ(dense_format(DType::BF16), WeightFormat::BF16);
  EXPECT_THAT(error_of([] { dense_format(DType::I32); }), HasSubstr("i32"));
}

TEST(Weight, ADenseViewIsAWeightOfItsDtype) {
  std::vector<float> data(12);
  const Weight w = TensorView(data.data(), DType::F32, {3, 4});
  EXPECT_EQ(w.format, WeightFormat::F32);
  EXPECT_TRUE(w.dense());
  EXPECT_EQ(w.dim(0), 3);
  EXPECT_EQ(w.dim(1), 4);
  EXPECT_EQ(w.nbytes(), 48u);
  EXPECT_EQ(w.describe(), "f32 [3, 4]");
  EXPECT_EQ(w.rows(1, 2).data.data, static_cast<void*>(data.data() + 4));
}

TEST(Weight, PackedRowsAreBlocksAndViewsFollowTheLogicalShape) {
  // Two experts of [3 rows, 64 columns] in Q8_0: 6 storage rows of 68 bytes.
  std::vector<uint8_t> bytes(6 * 68);
  const Weight w = Weight::packed(WeightFormat::Q8_0, bytes.data(), {2, 3, 64});
  EXPECT_FALSE(w.dense());
  EXPECT_EQ(w.data.dtype, DType::U8);
  EXPECT_EQ(w.data.dim(0), 6);
  EXPECT_EQ(w.data.dim(1), 68);
  EXPECT_EQ(w.numel(), 2 * 3 * 64);
  EXPECT_EQ(w.nbytes(), bytes.size());
  const Weight e1 = w.rows(1, 1);  // the second expert
  EXPECT_EQ(e1.data.data, static_cast<void*>(bytes.data() + 3 * 68));
  EXPECT_EQ(e1.data.dim(0), 3);
  EXPECT_EQ(e1.dim(0), 1);
  EXPECT_EQ(e1.describe(), "q8_0 [1, 3, 64]");
  EXPECT_THAT(error_of([&] { w.dense_view("linear"); }), AllOf(HasSubstr("linear"), HasSubstr("q8_0")));
}

}  // namespace
}  // namespace mambacpp
