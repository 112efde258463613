// Minimal .npy (NumPy format 1.0) reading and writing for little-endian f32/f64/i32/i64 C-order arrays: the
// logits interface writes it, and the tests read reference fixtures with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mambacpp {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // every element, converted to double
  int64_t numel() const;
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads '<f4', '<f8', '<i4', '<i8' (and '<f2'); throws Error naming the file on anything else.
NpyArray read_npy(const std::string& path);

}  // namespace mambacpp
