// Reading a whole input file with the checks every reader needs: a directory or a device is named as such (not
// "cannot open" or an empty parse), and the size is bounded before anything is allocated.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "mambacpp/error.h"

namespace mambacpp {

// Text files (JSON, token lists) larger than this are refused: the largest real tokenizer.json is about 20 MB.
constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 30;

// The bytes of the regular file `path`; `what` names its role in messages ("tokenizer", "config").
inline std::string read_file_bytes(const std::string& path, const std::string& what,
                                   uint64_t max_bytes = kMaxTextFileBytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) fail(what, ": cannot open '", path, "': no such file");
  if (std::filesystem::is_directory(status)) fail(what, ": '", path, "' is a directory, expected a file");
  if (!std::filesystem::is_regular_file(status)) fail(what, ": '", path, "' is not a regular file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(what, ": cannot read the size of '", path, "': ", ec.message());
  if (size > max_bytes) fail(what, ": '", path, "' is ", size, " bytes, more than the limit of ", max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(what, ": cannot open '", path, "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size) fail(what, ": cannot read '", path, "' (", size, " bytes expected)");
  return bytes;
}

}  // namespace mambacpp
