// A non-owning view of a tensor: pointer, element type, up to 4 dimensions, device.
// The innermost dimensions are contiguous; the outermost may have a row stride (in elements) so that a column
// slice of a packed activation (e.g. the x part of in_proj's output) is a view, not a copy.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mambacpp/dtype.h"

namespace mambacpp {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  int64_t row_stride = 0;  // elements between consecutive indices of dim 0; 0 means contiguous

  TensorView() = default;
  TensorView(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU);

  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const;
  // Elements in one index of dim 0 (product of the inner dims).
  int64_t row_size() const;
  int64_t stride0() const { return row_stride ? row_stride : row_size(); }
  bool contiguous() const { return row_stride == 0 || row_stride == row_size(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  std::string shape_string() const;  // "[2, 3, 4]"

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // Rows [begin, begin + count) of dim 0, as a view with the same stride.
  TensorView rows(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of a 2-D view, as a strided view.
  TensorView cols(int64_t begin, int64_t count) const;
  // Same data, new shape (contiguous views only).
  TensorView reshaped(std::initializer_list<int64_t> dims) const;
};

}  // namespace mambacpp
