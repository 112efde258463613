// safetensors reading: the file mapped (io/mapped_file.h), then a strict check of the header against the file: every
// tensor's dtype, shape and offsets are validated (byte size = dtype size * prod(shape), computed without overflow; ranges
// inside the data section; no two tensors sharing bytes) before a view of any tensor can be taken.
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/json_limits.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

bool parse_safetensors_dtype(const std::string& s, DType& out, bool& fp8) {
  fp8 = s == "F8_E4M3";
  if (fp8) out = DType::U8;  // bytes; the checkpoint pairs them with their scales (io/checkpoint.h)
  else if (s == "F32") out = DType::F32;
  else if (s == "F16") out = DType::F16;
  else if (s == "BF16") out = DType::BF16;
  else if (s == "F64") out = DType::F64;
  else if (s == "I32") out = DType::I32;
  else if (s == "I64") out = DType::I64;
  else return false;
  return true;
}

// A non-negative integer that fits in 63 bits (so it also fits int64_t shapes).
bool as_u63(const nlohmann::json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    if (v.get<int64_t>() < 0) return false;
    out = static_cast<uint64_t>(v.get<int64_t>());
  } else {
    return false;
  }
  return out <= static_cast<uint64_t>(INT64_MAX);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : path_(path), map_(std::make_unique<MappedFile>(path)), base_(map_->data()), size_(map_->size()) {
  parse_header();  // an empty file maps to no memory: the length check reports it
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, const std::string& source) {
  SafetensorsFile f;
  f.path_ = source;
  f.owned_ = std::move(bytes);
  f.base_ = f.owned_.data();
  f.size_ = f.owned_.size();
  f.parse_header();
  return f;
}

void SafetensorsFile::parse_header() {
  if (size_ < 8) fail(path_, ": file is ", size_, " bytes, too short for a safetensors file (at least 8)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // little-endian u64
  if (header_len > kMaxSafetensorsHeader)
    fail(path_, ": header length ", header_len, " is absurd (limit ", kMaxSafetensorsHeader, " bytes): corrupt file?");
  if (header_len > size_ - 8)
    fail(path_, ": header length ", header_len, " runs past the end of the file (", size_ - 8,
         " bytes after the length field)");
  data_start_ = 8 + header_len;
  const uint64_t data_size = size_ - data_start_;

  const nlohmann::json header = parse_json_bounded(
      std::string_view(reinterpret_cast<const char*>(base_ + 8), header_len), path_ + ": header");
  if (!header.is_object()) fail(path_, ": header must be a JSON object, found ", header.type_name());

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path_, ": __metadata__ must be an object of strings, found ", entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path_, ": __metadata__[\"", k, "\"] must be a string, found ", json_excerpt(v));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail(path_, ": tensor '", name, "': expected an object, found ", json_excerpt(entry));
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(key)) fail(path_, ": tensor '", name, "': missing \"", key, "\"");

    SafetensorInfo info;
    info.name = name;
    const nlohmann::json& dt = entry["dtype"];
    if (!dt.is_string() || !parse_safetensors_dtype(dt.get<std::string>(), info.dtype, info.fp8_e4m3))
      fail(path_, ": tensor '", name, "': dtype ", json_excerpt(dt),
           " is not supported (supported: F32, F16, BF16, F64, I32, I64, F8_E4M3)");

    const nlohmann::json& shape = entry["shape"];
    if (!shape.is_array()) fail(path_, ": tensor '", name, "': shape must be a list, found ", json_excerpt(shape));
    // Byte size = dtype size * prod(shape), each step checked for overflow.
    uint64_t nbytes = dtype_size(info.dtype);
    bool overflow = false;
    for (const auto& d : shape) {
      uint64_t dim = 0;
      if (!as_u63(d, dim)) fail(path_, ": tensor '", name, "': shape ", json_excerpt(shape), " has an invalid dimension");
      info.shape.push_back(static_cast<int64_t>(dim));
      overflow = overflow || __builtin_mul_overflow(nbytes, dim, &nbytes);
    }
    if (overflow) fail(path_, ": tensor '", name, "': shape ", json_excerpt(shape), " overflows 64-bit byte counts");

    const nlohmann::json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !as_u63(off[0], info.begin) || !as_u63(off[1], info.end))
      fail(path_, ": tensor '", name, "': data_offsets must be [begin, end] with non-negative integers, found ",
           json_excerpt(off));
    if (info.begin > info.end)
      fail(path_, ": tensor '", name, "': data_offsets [", info.begin, ", ", info.end, "] has begin > end");
    if (info.end > data_size)
      fail(path_, ": tensor '", name, "': data_offsets [", info.begin, ", ", info.end,
           "] end past the data section (", data_size, " bytes)");
    if (info.end - info.begin != nbytes)
      fail(path_, ": tensor '", name, "': data_offsets [", info.begin, ", ", info.end, "] hold ", info.end - info.begin,
           " bytes, expected ", nbytes, " (", dt.get<std::string>(), " x shape ", json_excerpt(shape), ")");
    tensors_.push_back(std::move(info));
  }

  // No two tensors may share a byte: sorted by start, each must end before the next non-empty one begins.
  std::vector<const SafetensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.nbytes() > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorInfo* a, const SafetensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorInfo& a = *by_offset[i - 1];
    const SafetensorInfo& b = *by_offset[i];
    if (b.begin < a.end)
      fail(path_, ": tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name, "' [", b.begin, ", ", b.end,
           ") overlap");
  }
  for (SafetensorInfo& t : tensors_) {
    const uint8_t* at = base_ + data_start_ + t.begin;
    if (t.nbytes() == 0 || reinterpret_cast<uintptr_t>(at) % dtype_size(t.dtype) == 0) continue;
    auto copy = std::make_unique<uint64_t[]>((t.nbytes() + 7) / 8);
    std::memcpy(copy.get(), at, t.nbytes());
    t.copy = static_cast<int64_t>(aligned_copies_.size());
    aligned_copies_.push_back(std::move(copy));
  }
  // nlohmann's objects iterate in key order, so tensors_ is already sorted by name.
  MAMBACPP_ASSERT(std::is_sorted(tensors_.begin(), tensors_.end(),
                                 [](const SafetensorInfo& a, const SafetensorInfo& b) { return a.name < b.name; }));
}

const SafetensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorInfo& t, const std::string& n) { return t.name < n; });
  return (it != tensors_.end() && it->name == name) ? &*it : nullptr;
}

TensorView SafetensorsFile::view(const SafetensorInfo& info) const {
  if (info.shape.size() > 4)
    fail(path_, ": tensor '", info.name, "' has ", info.shape.size(), " dimensions; at most 4 are supported");
  TensorView v;
  v.data = info.copy >= 0 ? static_cast<void*>(aligned_copies_[info.copy].get())
                         : const_cast<uint8_t*>(base_ + data_start_ + info.begin);  // read-only: TensorView has no const
  v.dtype = info.dtype;
  v.device = Device::CPU;
  v.ndim = static_cast<int>(info.shape.size());
  for (size_t i = 0; i < info.shape.size(); ++i) v.shape[i] = info.shape[i];
  return v;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const SafetensorInfo* info = find(name);
  if (!info) fail(path_, ": no tensor named '", name, "'");
  return view(*info);
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

void write_safetensors_file(const std::string& path, std::vector<SafetensorsOut> tensors,
                            const std::map<std::string, std::string>& metadata) {
  // The data section has no holes (readers check), so alignment comes from the order: wider elements first, as the
  // reference writer does, then by name.
  auto width = [&path](const SafetensorsOut& t) -> size_t {
    DType dt;
    bool fp8 = false;
    if (t.dtype == "U8") return 1;
    if (!parse_safetensors_dtype(t.dtype, dt, fp8)) fail(path, ": tensor '", t.name, "': cannot write dtype ", t.dtype);
    return dtype_size(dt);
  };
  std::sort(tensors.begin(), tensors.end(), [&](const SafetensorsOut& a, const SafetensorsOut& b) {
    const size_t wa = width(a), wb = width(b);
    return wa != wb ? wa > wb : a.name < b.name;
  });
  std::set<std::string> seen;
  for (const SafetensorsOut& t : tensors)
    if (!seen.insert(t.name).second) fail(path, ": tensor '", t.name, "' given twice");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsOut& t = tensors[i];
    uint64_t n = width(t);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (n != t.nbytes) fail(path, ": tensor '", t.name, "': ", t.nbytes, " bytes given, ", t.dtype, " x shape need ", n);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  AtomicFile f(path, "safetensors file");
  f.write(len, 8);
  f.write(text);
  for (const SafetensorsOut& t : tensors) f.write(t.data, t.nbytes);
  f.commit();
}

}  // namespace mambacpp
