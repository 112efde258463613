// A weight as it is stored: its format and its logical shape. Dense formats (f32, f16, bf16) are a tensor of that
// dtype; block formats (ggml's Q8_0, Q4_K, ...) hold each row as a run of fixed-size blocks, every block carrying its
// own scales; FP8 holds one byte per element beside f32 scales (per output channel or per tensor). The backends'
// linear and embedding ops take a Weight, and each backend states the formats it runs (Backend::supports_weight_format),
// so a new format adds kernels and a case in the backends, never a new op signature.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mambacpp/dtype.h"
#include "mambacpp/tensor.h"

namespace mambacpp {

enum class WeightFormat : uint8_t { F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, FP8_E4M3 };

struct WeightFormatInfo {
  const char* name;     // "f32", "q4_k", ... (llama.cpp's spelling, lower case)
  int64_t block_elems;  // elements per block (1 for dense and FP8)
  int64_t block_bytes;  // bytes per block
};
const WeightFormatInfo& weight_format_info(WeightFormat f);
inline const char* weight_format_name(WeightFormat f) { return weight_format_info(f).name; }
// The format for a name as weight_format_info spells it (case-insensitive); throws naming the accepted names.
WeightFormat parse_weight_format(const std::string& name);

// Dense formats are exactly the float dtypes; their Weight::data is a tensor of that dtype.
bool is_dense(WeightFormat f);
DType dense_dtype(WeightFormat f);       // throws for a format that is not dense
WeightFormat dense_format(DType t);      // throws for a dtype that is not f32, f16 or bf16
// Bytes of one row of `cols` elements; throws (naming `what`) when cols is not a multiple of the block.
int64_t weight_row_bytes(WeightFormat f, int64_t cols, const std::string& what = "weight");

struct Weight {
  WeightFormat format = WeightFormat::F32;
  // Dense: the stored tensor in its dtype, of the logical shape. Other formats: the bytes as a U8 view
  // [rows, row_bytes] (rows: the product of every logical dim but the last).
  TensorView data;
  int ndim = 0;
  std::array<int64_t, 4> shape{};  // logical shape, e.g. [out, in] of a linear, [vocab, d_model] of an embedding
  TensorView scale;                // FP8: f32 [rows] (per channel) or [1] (per tensor) on data's device; else empty

  Weight() = default;
  // A dense tensor is a weight of its dtype's format (implicit: every view the ops took before is such a weight).
  Weight(const TensorView& dense);  // NOLINT(google-explicit-constructor)
  // A block-format or FP8 weight over `bytes` (rows of weight_row_bytes each), of the given logical shape.
  static Weight packed(WeightFormat f, void* bytes, std::initializer_list<int64_t> logical_shape,
                       Device device = Device::CPU, TensorView scale = {});

  bool empty() const { return data.empty(); }
  bool dense() const { return is_dense(format); }
  Device device() const { return data.device; }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const;
  size_t nbytes() const;        // bytes of data (scales not counted)
  std::string shape_string() const;  // "[4096, 2048]" (logical)
  std::string describe() const;      // "q4_k [4096, 2048]"
  // The dense tensor; throws naming `op` when the weight is not dense.
  const TensorView& dense_view(const char* op) const;
  // Rows [begin, begin + count) of dim 0 (e.g. one expert of an [E, out, in] weight, or a vocabulary slice).
  Weight rows(int64_t begin, int64_t count) const;
};

}  // namespace mambacpp
