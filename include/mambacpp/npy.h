// Minimal .npy (NumPy format 1.0) reading and writing for little-endian f32/f64/i32/i64 C-order arrays: the
// logits interface writes it, and the tests read reference fixtures with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mambacpp {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // every element, converted to double
  int64_t numel() const;
};

class AtomicFile;

// Writes `path` whole or not at all (a temporary file renamed over it): a failure leaves the previous file as it
// was and throws Error naming the path and the reason (ENOSPC, EFBIG, EACCES...).
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

// A float32 C-order .npy written in pieces as they are produced (the shape is known up front), with
// write_npy_f32's guarantees: the file appears at commit(), holding every element, or not at all.
class NpyF32Writer {
 public:
  NpyF32Writer(const std::string& path, const std::vector<int64_t>& shape);
  ~NpyF32Writer();  // without commit(): the previous file stays
  NpyF32Writer(const NpyF32Writer&) = delete;
  NpyF32Writer& operator=(const NpyF32Writer&) = delete;
  // The next `n` elements in C order; more than the shape holds is an error.
  void append(const float* data, int64_t n);
  // Throws unless every element of the shape was appended.
  void commit();

 private:
  std::unique_ptr<AtomicFile> file_;
  int64_t expected_ = 0, appended_ = 0;
};
// Reads '<f4', '<f8', '<i4', '<i8' (and '<f2'); throws Error naming the file on anything else.
// Every size in the file is checked against the file's length before anything is allocated.
NpyArray read_npy(const std::string& path);
// The same from bytes in memory; `source` names them in messages.
NpyArray parse_npy(std::string_view bytes, const std::string& source);

}  // namespace mambacpp
