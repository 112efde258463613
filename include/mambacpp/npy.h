// Minimal .npy (NumPy format 1.0) reading and writing for little-endian f32/f64/i32/i64 C-order arrays: the
// logits interface writes it, and the tests read reference fixtures with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // every element, converted to double
  int64_t numel() const;
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads '<f4', '<f8', '<i4', '<i8' (and '<f2'); throws Error naming the file on anything else.
// Every size in the file is checked against the file's length before anything is allocated.
NpyArray read_npy(const std::string& path);
// The same from bytes in memory; `source` names them in messages.
NpyArray parse_npy(std::string_view bytes, const std::string& source);

}  // namespace mambacpp
