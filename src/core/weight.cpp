#include "core/weight.h"

#include <algorithm>
#include <sstream>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {
// Block layouts as ggml defines them (ggml-common.h): Q8_0 = f16 scale + 32 int8; Q4_0 = f16 + 16 bytes of nibbles;
// Q5_0 = f16 + 4 bytes of high bits + 16; Q5_1 = two f16 + 4 + 16; the K-quants' super-blocks of 256 elements:
// Q4_K 144 bytes, Q5_K 176, Q6_K 210.
constexpr WeightFormatInfo kInfo[] = {
    {"f32", 1, 4},   {"f16", 1, 2},    {"bf16", 1, 2},   {"q8_0", 32, 34},  {"q4_0", 32, 18}, {"q5_0", 32, 22},
    {"q5_1", 32, 24}, {"q4_k", 256, 144}, {"q5_k", 256, 176}, {"q6_k", 256, 210}, {"fp8_e4m3", 1, 1},
};
constexpr size_t kFormats = sizeof(kInfo) / sizeof(kInfo[0]);
}  // namespace

const WeightFormatInfo& weight_format_info(WeightFormat f) {
  const size_t i = static_cast<size_t>(f);
  MAMBACPP_ASSERT(i < kFormats);
  return kInfo[i];
}

WeightFormat parse_weight_format(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (size_t i = 0; i < kFormats; ++i)
    if (s == kInfo[i].name) return static_cast<WeightFormat>(i);
  std::string names;
  for (size_t i = 0; i < kFormats; ++i) names += std::string(i ? ", " : "") + kInfo[i].name;
  fail("unknown weight format '", name, "': expected one of ", names);
}

bool is_dense(WeightFormat f) { return f == WeightFormat::F32 || f == WeightFormat::F16 || f == WeightFormat::BF16; }

DType dense_dtype(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return DType::F32;
    case WeightFormat::F16: return DType::F16;
    case WeightFormat::BF16: return DType::BF16;
    default: fail("weight format ", weight_format_name(f), " is not a dense dtype");
  }
}

WeightFormat dense_format(DType t) {
  switch (t) {
    case DType::F32: return WeightFormat::F32;
    case DType::F16: return WeightFormat::F16;
    case DType::BF16: return WeightFormat::BF16;
    default: fail("a weight's dtype must be f32, f16 or bf16, found ", dtype_name(t));
  }
}

int64_t weight_row_bytes(WeightFormat f, int64_t cols, const std::string& what) {
  const WeightFormatInfo& info = weight_format_info(f);
  if (cols < 0 || cols % info.block_elems != 0)
    fail(what, ": rows of ", info.name, " hold whole blocks of ", info.block_elems, " elements, found ", cols,
         " columns");
  return cols / info.block_elems * info.block_bytes;
}

Weight::Weight(const TensorView& t) : format(dense_format(t.dtype)), data(t), ndim(t.ndim), shape(t.shape) {}

Weight Weight::packed(WeightFormat f, void* bytes, std::initializer_list<int64_t> logical_shape, Device device,
                      TensorView scale) {
  MAMBACPP_ASSERT(!is_dense(f) && logical_shape.size() >= 1 && logical_shape.size() <= 4);
  Weight w;
  w.format = f;
  for (int64_t d : logical_shape) w.shape[static_cast<size_t>(w.ndim++)] = d;
  const int64_t cols = w.shape[static_cast<size_t>(w.ndim - 1)];
  const int64_t rows = w.numel() / std::max<int64_t>(cols, 1);
  w.data = TensorView(bytes, DType::U8, {rows, weight_row_bytes(f, cols)}, device);
  w.scale = scale;
  return w;
}

int64_t Weight::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

size_t Weight::nbytes() const { return data.nbytes(); }

std::string Weight::shape_string() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << ']';
  return os.str();
}

std::string Weight::describe() const { return std::string(weight_format_name(format)) + " " + shape_string(); }

const TensorView& Weight::dense_view(const char* op) const {
  if (!dense()) fail(op, ": this backend has no kernel for ", describe(), " weights");
  return data;
}

Weight Weight::rows(int64_t begin, int64_t count) const {
  MAMBACPP_ASSERT(ndim >= 1 && begin >= 0 && begin + count <= shape[0]);
  Weight w = *this;
  w.shape[0] = count;
  const int64_t per = data.dim(0) / std::max<int64_t>(shape[0], 1);  // storage rows per logical index of dim 0
  w.data = data.rows(begin * per, count * per);
  if (!scale.empty() && scale.numel() > 1) w.scale = scale.rows(begin * per, count * per);
  return w;
}

}  // namespace mambacpp
