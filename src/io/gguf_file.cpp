#include "io/gguf_file.h"

#include <cstring>
#include <limits>

#include "mambacpp/error.h"

namespace mambacpp {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

// A cursor over the file's bytes; every read is checked against the end first.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size, const std::string& source) : p_(base), size_(size), src_(source) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail(src_, ": truncated file: ", what, " needs ", n, " bytes at offset ", pos_, ", only ", left(), " left");
  }
  template <typename T>
  T scalar(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(uint64_t max_len, const std::string& what) {
    const uint64_t n = scalar<uint64_t>(what + " (length)");
    if (n > max_len) fail(src_, ": ", what, " has length ", n, ", above the limit of ", max_len);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& src_;
};

// Bytes one element of a scalar type occupies in the file (0 for string and array).
uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

// Reads one element of scalar or string type `t` into v.
void read_element(Reader& r, GgufType t, GgufValue& v, const std::string& src, const std::string& what) {
  switch (t) {
    case GgufType::U8: v.ints.push_back(r.scalar<uint8_t>(what)); break;
    case GgufType::I8: v.ints.push_back(r.scalar<int8_t>(what)); break;
    case GgufType::U16: v.ints.push_back(r.scalar<uint16_t>(what)); break;
    case GgufType::I16: v.ints.push_back(r.scalar<int16_t>(what)); break;
    case GgufType::U32: v.ints.push_back(r.scalar<uint32_t>(what)); break;
    case GgufType::I32: v.ints.push_back(r.scalar<int32_t>(what)); break;
    case GgufType::I64: v.ints.push_back(r.scalar<int64_t>(what)); break;
    case GgufType::U64: {
      const uint64_t u = r.scalar<uint64_t>(what);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(src, ": ", what, ": u64 value ", u, " is out of range");
      v.ints.push_back(static_cast<int64_t>(u));
      break;
    }
    case GgufType::BOOL: {
      const uint8_t b = r.scalar<uint8_t>(what);
      if (b > 1) fail(src, ": ", what, ": a bool must be 0 or 1, found ", static_cast<int>(b));
      v.ints.push_back(b);
      break;
    }
    case GgufType::F32: v.floats.push_back(r.scalar<float>(what)); break;
    case GgufType::F64: v.floats.push_back(r.scalar<double>(what)); break;
    case GgufType::STRING: v.strings.push_back(r.string(kGgufMaxString, what)); break;
    default: fail(src, ": ", what, ": unexpected value type ", static_cast<uint32_t>(t));
  }
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "unknown";
}

size_t GgufValue::size() const { return ints.size() + floats.size() + strings.size(); }
bool GgufValue::is_int() const { return scalar_size(type) != 0 && type != GgufType::F32 && type != GgufType::F64; }
bool GgufValue::is_float() const { return type == GgufType::F32 || type == GgufType::F64; }

const char* gguf_ggml_type_name(uint32_t t) {
  static const char* const names[] = {
      "f32",     "f16",   "q4_0",  "q4_1",  "q4_2 (removed)", "q4_3 (removed)", "q5_0", "q5_1", "q8_0", "q8_1",
      "q2_k",    "q3_k",  "q4_k",  "q5_k",  "q6_k",  "q8_k",    "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
      "iq4_nl",  "iq3_s", "iq2_s", "iq4_xs", "i8",   "i16",     "i32",     "i64",    "f64",     "iq1_m",
      "bf16",    "q4_0_4_4 (removed)", "q4_0_4_8 (removed)", "q4_0_8_8 (removed)", "tq1_0", "tq2_0",
      "iq4_nl_4_4 (removed)", "iq4_nl_4_8 (removed)", "iq4_nl_8_8 (removed)", "mxfp4"};
  return t < sizeof(names) / sizeof(names[0]) ? names[t] : "unknown";
}

std::optional<WeightFormat> weight_format_of_ggml(uint32_t t) {
  switch (t) {
    case kGgmlF32: return WeightFormat::F32;
    case kGgmlF16: return WeightFormat::F16;
    case kGgmlBF16: return WeightFormat::BF16;
    case kGgmlQ8_0: return WeightFormat::Q8_0;
    case kGgmlQ4_0: return WeightFormat::Q4_0;
    case kGgmlQ5_0: return WeightFormat::Q5_0;
    case kGgmlQ5_1: return WeightFormat::Q5_1;
    case kGgmlQ4_K: return WeightFormat::Q4_K;
    case kGgmlQ5_K: return WeightFormat::Q5_K;
    case kGgmlQ6_K: return WeightFormat::Q6_K;
    default: return std::nullopt;
  }
}

uint32_t ggml_type_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return kGgmlF32;
    case WeightFormat::F16: return kGgmlF16;
    case WeightFormat::BF16: return kGgmlBF16;
    case WeightFormat::Q8_0: return kGgmlQ8_0;
    case WeightFormat::Q4_0: return kGgmlQ4_0;
    case WeightFormat::Q5_0: return kGgmlQ5_0;
    case WeightFormat::Q5_1: return kGgmlQ5_1;
    case WeightFormat::Q4_K: return kGgmlQ4_K;
    case WeightFormat::Q5_K: return kGgmlQ5_K;
    case WeightFormat::Q6_K: return kGgmlQ6_K;
    default: fail("GGUF has no tensor type for weight format ", weight_format_name(f));
  }
}

std::vector<int64_t> GgufTensor::shape() const {
  std::vector<int64_t> s;
  for (int i = n_dims - 1; i >= 0; --i) s.push_back(ne[static_cast<size_t>(i)]);
  return s;
}

std::string GgufTensor::shape_string() const {
  std::string s = "[";
  const std::vector<int64_t> sh = shape();
  for (size_t i = 0; i < sh.size(); ++i) s += (i ? ", " : "") + std::to_string(sh[i]);
  return s + "]";
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  map_ = std::make_unique<MappedFile>(path);
  base_ = map_->data();
  size_ = map_->size();
  parse();
}

std::unique_ptr<GgufFile> GgufFile::from_bytes(std::vector<uint8_t> bytes, const std::string& source) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = source;
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

void GgufFile::parse() {
  const std::string& src = path_;
  Reader r(base_, size_, src);
  const uint32_t magic = r.scalar<uint32_t>("the magic");
  if (magic != kMagic) fail(src, ": not a GGUF file (the first four bytes are not \"GGUF\")");
  version_ = r.scalar<uint32_t>("the version");
  if (version_ == 1) fail(src, ": GGUF version 1 (32-bit counts) is not supported; expected version 2 or 3");
  if (version_ != 2 && version_ != 3) fail(src, ": unsupported GGUF version ", version_, "; expected 2 or 3");
  const uint64_t n_tensors = r.scalar<uint64_t>("the tensor count");
  const uint64_t n_kv = r.scalar<uint64_t>("the key count");
  // Each key takes at least 12 bytes (an empty name and a type), each tensor 24: counts beyond that are corrupt
  // (checked before anything is reserved, so a hostile count cannot ask for memory).
  if (n_kv > r.left() / 12) fail(src, ": key count ", n_kv, " is more than the file can hold");
  if (n_tensors > r.left() / 24) fail(src, ": tensor count ", n_tensors, " is more than the file can hold");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = r.string(kGgufMaxString, "key " + std::to_string(k));
    if (kv_.count(key)) fail(src, ": key '", key, "' appears twice");
    const std::string what = "key '" + key + "'";
    const uint32_t t = r.scalar<uint32_t>(what + " (type)");
    if (!known_type(t)) fail(src, ": ", what, " has unknown value type ", t);
    GgufValue v;
    if (static_cast<GgufType>(t) == GgufType::ARRAY) {
      const uint32_t et = r.scalar<uint32_t>(what + " (array element type)");
      if (!known_type(et)) fail(src, ": ", what, " is an array of unknown value type ", et);
      if (static_cast<GgufType>(et) == GgufType::ARRAY)
        fail(src, ": ", what, " is an array of arrays, which no model metadata uses");
      const uint64_t n = r.scalar<uint64_t>(what + " (array length)");
      const uint64_t elem = static_cast<GgufType>(et) == GgufType::STRING ? 8 : scalar_size(static_cast<GgufType>(et));
      if (n > r.left() / elem) fail(src, ": ", what, " has array length ", n, ", more than the file can hold");
      v.type = static_cast<GgufType>(et);
      v.is_array = true;
      if (v.type == GgufType::STRING) v.strings.reserve(static_cast<size_t>(n));
      else if (v.is_float()) v.floats.reserve(static_cast<size_t>(n));
      else v.ints.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) read_element(r, v.type, v, src, what);
    } else {
      v.type = static_cast<GgufType>(t);
      read_element(r, v.type, v, src, what);
    }
    key_order_.push_back(key);
    kv_.emplace(key, std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->is_array || !a->is_int() || a->type == GgufType::BOOL)
      fail(src, ": key 'general.alignment' must be an integer, found ", a->is_array ? "an array" : gguf_type_name(a->type));
    const int64_t al = a->ints[0];
    if (al < 8 || al > static_cast<int64_t>(kGgufMaxAlignment) || (al & (al - 1)) != 0)
      fail(src, ": key 'general.alignment' is ", al, "; expected a power of two from 8 to ", kGgufMaxAlignment);
    alignment_ = static_cast<uint64_t>(al);
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor ti;
    ti.name = r.string(kGgufMaxName, "tensor " + std::to_string(t) + " name");
    const std::string what = "tensor '" + ti.name + "'";
    if (tensor_index_.count(ti.name)) fail(src, ": ", what, " appears twice");
    const uint32_t nd = r.scalar<uint32_t>(what + " (dimension count)");
    if (nd < 1 || nd > 4) fail(src, ": ", what, " has ", nd, " dimensions; expected 1 to 4");
    ti.n_dims = static_cast<int>(nd);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = r.scalar<uint64_t>(what + " (dimension)");
      if (ne < 1 || ne > (uint64_t(1) << 40)) fail(src, ": ", what, " has dimension ", d, " of ", ne, " elements");
      if (numel > (uint64_t(1) << 50) / ne) fail(src, ": ", what, ": its element count overflows");
      numel *= ne;
      ti.ne[d] = static_cast<int64_t>(ne);
    }
    const uint32_t gt = r.scalar<uint32_t>(what + " (type)");
    const std::optional<WeightFormat> fmt = weight_format_of_ggml(gt);
    if (!fmt)
      fail(src, ": ", what, " has tensor type ", gguf_ggml_type_name(gt), " (", gt,
           "), which mambacpp does not read; supported: f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k, q5_k, q6_k");
    ti.format = *fmt;
    const WeightFormatInfo& info = weight_format_info(ti.format);
    if (ti.ne[0] % info.block_elems != 0)
      fail(src, ": ", what, " is ", info.name, " with rows of ", ti.ne[0], " elements, not a multiple of its block of ",
           info.block_elems);
    ti.nbytes = numel / static_cast<uint64_t>(info.block_elems) * static_cast<uint64_t>(info.block_bytes);
    ti.offset = r.scalar<uint64_t>(what + " (offset)");
    if (ti.offset % alignment_ != 0)
      fail(src, ": ", what, " has offset ", ti.offset, ", not a multiple of the alignment ", alignment_);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  const uint64_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
  for (GgufTensor& ti : tensors_) {
    if (ti.offset > data_size || ti.nbytes > data_size - ti.offset)
      fail(src, ": tensor '", ti.name, "' (", ti.nbytes, " bytes at data offset ", ti.offset,
           ") extends past the end of the file (data section of ", data_size, " bytes)");
    ti.data = base_ + data_start + ti.offset;
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail(path_, ": missing key '", key, "'");
  if (v->is_array || v->type != GgufType::STRING)
    fail(path_, ": key '", key, "' must be a string, found ", v->is_array ? "an array" : gguf_type_name(v->type));
  return v->strings[0];
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return find(key) ? get_string(key) : fallback;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail(path_, ": missing key '", key, "'");
  if (v->is_array || !v->is_int() || v->type == GgufType::BOOL)
    fail(path_, ": key '", key, "' must be an integer, found ", v->is_array ? "an array" : gguf_type_name(v->type));
  return v->ints[0];
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return find(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_array && v->is_float()) return v->floats[0];
  if (!v->is_array && v->is_int() && v->type != GgufType::BOOL) return static_cast<double>(v->ints[0]);
  fail(path_, ": key '", key, "' must be a number, found ", v->is_array ? "an array" : gguf_type_name(v->type));
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->is_array || v->type != GgufType::BOOL)
    fail(path_, ": key '", key, "' must be a bool, found ", v->is_array ? "an array" : gguf_type_name(v->type));
  return v->ints[0] != 0;
}

}  // namespace mambacpp
