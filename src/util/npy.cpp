#include "mambacpp/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

namespace mambacpp {

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict << ' ';
    n *= shape[i];
  }
  dict << "), }";
  std::string header = dict.str();
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot open '", path, "' for writing");
  const char magic[] = "\x93NUMPY\x01\x00";
  out.write(magic, 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  if (!out) fail("failed writing '", path, "'");
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '", path, "'");
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("'", path, "' is not a .npy file");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t l = 0;
    in.read(reinterpret_cast<char*>(&l), 2);
    header_len = l;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in) fail("'", path, "': truncated .npy header");
  auto field = [&](const std::string& key) {
    size_t p = header.find("'" + key + "'");
    if (p == std::string::npos) fail("'", path, "': .npy header lacks ", key);
    return header.substr(header.find(':', p) + 1);
  };
  std::string descr = field("descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  if (field("fortran_order").find("True") < field("fortran_order").find(',')) fail("'", path, "': Fortran order");
  std::string shape_text = field("shape");
  shape_text = shape_text.substr(shape_text.find('(') + 1, shape_text.find(')') - shape_text.find('(') - 1);
  NpyArray arr;
  std::istringstream ss(shape_text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.find_first_of("0123456789") != std::string::npos) arr.shape.push_back(std::stoll(tok));
  }
  int64_t n = arr.numel();
  arr.values.resize(static_cast<size_t>(n));
  auto read_as = [&](auto sample) {
    using T = decltype(sample);
    std::vector<T> raw(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(n * sizeof(T)));
    if (!in) fail("'", path, "': truncated .npy data");
    for (int64_t i = 0; i < n; ++i) arr.values[i] = static_cast<double>(raw[i]);
  };
  if (descr == "<f4") read_as(float{});
  else if (descr == "<f8") read_as(double{});
  else if (descr == "<i4") read_as(int32_t{});
  else if (descr == "<i8") read_as(int64_t{});
  else if (descr == "<f2") {
    std::vector<uint16_t> raw(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(n * 2));
    if (!in) fail("'", path, "': truncated .npy data");
    for (int64_t i = 0; i < n; ++i) arr.values[i] = f16_to_f32(raw[i]);
  } else {
    fail("'", path, "': unsupported .npy dtype ", descr, " (expected <f4, <f8, <i4, <i8 or <f2)");
  }
  return arr;
}

}  // namespace mambacpp
