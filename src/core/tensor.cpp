#include "mambacpp/tensor.h"

#include <sstream>

#include "mambacpp/error.h"

namespace mambacpp {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> dims, Device dev)
    : data(d), dtype(t), device(dev) {
  MAMBACPP_ASSERT(dims.size() <= 4);
  for (int64_t x : dims) shape[static_cast<size_t>(ndim++)] = x;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

int64_t TensorView::row_size() const {
  int64_t n = 1;
  for (int i = 1; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << ']';
  return os.str();
}

TensorView TensorView::rows(int64_t begin, int64_t count) const {
  MAMBACPP_ASSERT(ndim >= 1 && begin >= 0 && begin + count <= shape[0]);
  TensorView v = *this;
  v.data = static_cast<char*>(data) + static_cast<size_t>(begin * stride0()) * dtype_size(dtype);
  v.shape[0] = count;
  return v;
}

TensorView TensorView::cols(int64_t begin, int64_t count) const {
  MAMBACPP_ASSERT(ndim == 2 && begin >= 0 && begin + count <= shape[1]);
  TensorView v = *this;
  v.data = static_cast<char*>(data) + static_cast<size_t>(begin) * dtype_size(dtype);
  v.row_stride = stride0();
  v.shape[1] = count;
  return v;
}

TensorView TensorView::reshaped(std::initializer_list<int64_t> dims) const {
  MAMBACPP_ASSERT(contiguous());
  TensorView v(data, dtype, dims, device);
  MAMBACPP_ASSERT(v.numel() == numel());
  return v;
}

}  // namespace mambacpp
