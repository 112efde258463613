// .npy reading and writing. The reader trusts nothing in the file: the header is parsed as the small Python dict
// literal it is ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }), the element count is computed without
// overflow, and the data size it implies is compared with the bytes actually there before anything is allocated.
#include "mambacpp/npy.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "mambacpp/dtype.h"
#include "mambacpp/error.h"
#include "core/atomic_file.h"
#include "core/file_bytes.h"

namespace mambacpp {
namespace {

// The header dict: a cursor over its text with the few token kinds a .npy header holds.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& source) : t_(text), source_(source) {}

  void skip_space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!eat(c)) bad(std::string("expected ") + what);
  }
  std::string quoted() {
    skip_space();
    if (i_ >= t_.size() || (t_[i_] != '\'' && t_[i_] != '"')) bad("expected a quoted string");
    const char q = t_[i_++];
    const size_t end = t_.find(q, i_);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string s(t_.substr(i_, end - i_));
    i_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    if (t_.substr(i_, 4) == "True") return i_ += 4, true;
    if (t_.substr(i_, 5) == "False") return i_ += 5, false;
    bad("expected True or False");
  }
  // "(2, 3)", "(5,)" or "()": non-negative dimensions.
  std::vector<int64_t> shape() {
    expect('(', "'(' starting the shape");
    std::vector<int64_t> dims;
    while (!eat(')')) {
      if (!dims.empty()) expect(',', "',' between dimensions");
      if (eat(')')) break;  // the trailing comma of "(5,)"
      skip_space();
      if (i_ >= t_.size() || t_[i_] < '0' || t_[i_] > '9') bad("expected a non-negative dimension");
      int64_t d = 0;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
        if (d > (INT64_MAX - 9) / 10) bad("dimension too large");
        d = d * 10 + (t_[i_++] - '0');
      }
      if (dims.size() == 32) bad("more than 32 dimensions (numpy's limit)");
      dims.push_back(d);
    }
    return dims;
  }
  bool at_end() {
    skip_space();
    return i_ == t_.size();
  }
  [[noreturn]] void bad(const std::string& why) const {
    fail(source_, ": .npy header at byte ", i_, ": ", why, "; header: ", std::string(t_.substr(0, 200)));
  }

 private:
  std::string_view t_;
  const std::string& source_;
  size_t i_ = 0;
};

template <class T>
void convert(const uint8_t* src, int64_t n, std::vector<double>& out) {
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, src + i * sizeof(T), sizeof(T));  // the data need not be aligned
    out[static_cast<size_t>(i)] = static_cast<double>(x);
  }
}

}  // namespace

int64_t NpyArray::numel() const {
  // A zero dimension means no elements whatever the others are (parse_npy accepts huge ones beside a zero).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) fail("npy array: shape overflows 64 bits");
  return n;
}

NpyF32Writer::NpyF32Writer(const std::string& path, const std::vector<int64_t>& shape) {
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) fail("npy writer '", path, "': dimension ", i, " is negative (", shape[i], ")");
    dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict << ' ';
    if (__builtin_mul_overflow(n, shape[i], &n)) fail("npy writer '", path, "': the shape overflows 64 bits");
  }
  dict << "), }";
  std::string header = dict.str();
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  expected_ = n;
  file_ = std::make_unique<AtomicFile>(path, ".npy file");
  file_->write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  file_->write(&len, 2);
  file_->write(header);
}

NpyF32Writer::~NpyF32Writer() = default;

void NpyF32Writer::append(const float* data, int64_t n) {
  if (n < 0 || n > expected_ - appended_)
    fail("npy writer '", file_->path(), "': appending ", n, " elements to the ", appended_, " written, more than the ",
         expected_, " of its shape");
  file_->write(data, static_cast<size_t>(n) * sizeof(float));
  appended_ += n;
}

void NpyF32Writer::commit() {
  if (appended_ != expected_)
    fail("npy writer '", file_->path(), "': ", appended_, " elements written, the shape holds ", expected_);
  file_->commit();
}

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  NpyF32Writer w(path, shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked by the writer
  w.append(data, n);
  w.commit();
}

NpyArray parse_npy(std::string_view bytes, const std::string& source) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0)
    fail(source, ": not a .npy file (expected the magic \\x93NUMPY and a version)");
  const int major = b[6];
  if (major < 1 || major > 3) fail(source, ": .npy version ", major, ".", int{b[7]}, ", expected 1.x, 2.x or 3.x");
  size_t header_at = 10;
  uint64_t header_len = b[8] | (uint64_t{b[9]} << 8);
  if (major >= 2) {
    if (bytes.size() < 12) fail(source, ": truncated .npy header length");
    header_at = 12;
    header_len |= (uint64_t{b[10]} << 16) | (uint64_t{b[11]} << 24);
  }
  if (header_len > bytes.size() - header_at)
    fail(source, ": .npy header length ", header_len, " runs past the end of the file (", bytes.size() - header_at,
         " bytes left)");

  HeaderParser p(bytes.substr(header_at, header_len), source);
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  NpyArray arr;
  p.expect('{', "'{' starting the header dict");
  while (!p.eat('}')) {
    const std::string key = p.quoted();
    p.expect(':', "':' after a key");
    if (key == "descr") descr = p.quoted(), have_descr = true;
    else if (key == "fortran_order") fortran = p.boolean(), have_order = true;
    else if (key == "shape") arr.shape = p.shape(), have_shape = true;
    else p.bad("unknown key '" + key + "' (expected descr, fortran_order, shape)");
    if (!p.eat(',')) {
      p.expect('}', "',' or '}'");
      break;
    }
  }
  if (!p.at_end()) p.bad("unexpected text after the dict");
  if (!have_descr || !have_order || !have_shape) p.bad("expected the keys descr, fortran_order and shape");
  if (fortran) fail(source, ": Fortran-order .npy arrays are not supported (expected fortran_order False)");

  size_t item = 0;
  if (descr == "<f4" || descr == "<i4") item = 4;
  else if (descr == "<f8" || descr == "<i8") item = 8;
  else if (descr == "<f2") item = 2;
  else fail(source, ": unsupported .npy dtype '", descr, "' (expected <f4, <f8, <i4, <i8 or <f2)");

  // Element count and byte size, overflow-checked, against the bytes the file really holds.
  uint64_t n = 1, nbytes = 0;
  const bool empty = std::find(arr.shape.begin(), arr.shape.end(), 0) != arr.shape.end();
  for (int64_t d : arr.shape)
    if (!empty && __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) fail(source, ": .npy shape overflows 64 bits");
  if (empty) n = 0;
  const uint64_t have = bytes.size() - header_at - header_len;
  if (__builtin_mul_overflow(n, uint64_t{item}, &nbytes) || nbytes != have)
    fail(source, ": .npy data holds ", have, " bytes, expected ", n, " elements of ", item, " bytes",
         __builtin_mul_overflow(n, uint64_t{item}, &nbytes) ? "" : " = " + std::to_string(nbytes) + " bytes");

  const uint8_t* data = b + header_at + header_len;
  const auto count = static_cast<int64_t>(n);
  arr.values.resize(n);
  if (descr == "<f4") convert<float>(data, count, arr.values);
  else if (descr == "<f8") convert<double>(data, count, arr.values);
  else if (descr == "<i4") convert<int32_t>(data, count, arr.values);
  else if (descr == "<i8") convert<int64_t>(data, count, arr.values);
  else
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      arr.values[static_cast<size_t>(i)] = f16_to_f32(h);
    }
  return arr;
}

NpyArray read_npy(const std::string& path) {
  return parse_npy(read_file_bytes(path, ".npy file", UINT64_MAX), "'" + path + "'");
}

}  // namespace mambacpp
