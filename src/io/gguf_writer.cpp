#include "io/gguf_writer.h"

#include <set>

#include "core/atomic_file.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

constexpr uint64_t kAlignment = 32;

class Out {
 public:
  explicit Out(std::vector<uint8_t>& buf) : buf_(buf) {}
  template <typename T>
  void scalar(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
  }

 private:
  std::vector<uint8_t>& buf_;
};

void write_element(Out& o, GgufType t, const GgufValue& v, size_t i) {
  switch (t) {
    case GgufType::U8: o.scalar<uint8_t>(static_cast<uint8_t>(v.ints[i])); break;
    case GgufType::I8: o.scalar<int8_t>(static_cast<int8_t>(v.ints[i])); break;
    case GgufType::U16: o.scalar<uint16_t>(static_cast<uint16_t>(v.ints[i])); break;
    case GgufType::I16: o.scalar<int16_t>(static_cast<int16_t>(v.ints[i])); break;
    case GgufType::U32: o.scalar<uint32_t>(static_cast<uint32_t>(v.ints[i])); break;
    case GgufType::I32: o.scalar<int32_t>(static_cast<int32_t>(v.ints[i])); break;
    case GgufType::U64: o.scalar<uint64_t>(static_cast<uint64_t>(v.ints[i])); break;
    case GgufType::I64: o.scalar<int64_t>(v.ints[i]); break;
    case GgufType::BOOL: o.scalar<uint8_t>(v.ints[i] ? 1 : 0); break;
    case GgufType::F32: o.scalar<float>(static_cast<float>(v.floats[i])); break;
    case GgufType::F64: o.scalar<double>(v.floats[i]); break;
    case GgufType::STRING: o.string(v.strings[i]); break;
    default: fail("gguf writer: cannot write a value of type ", gguf_type_name(t));
  }
}

GgufValue scalar_value(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(key, std::move(value));
}

bool GgufWriter::has(const std::string& key) const {
  for (const auto& kv : kv_)
    if (kv.first == key) return true;
  return false;
}

void GgufWriter::set_string(const std::string& key, const std::string& s) {
  GgufValue v = scalar_value(GgufType::STRING);
  v.strings.push_back(s);
  set(key, std::move(v));
}
void GgufWriter::set_u32(const std::string& key, uint32_t x) {
  GgufValue v = scalar_value(GgufType::U32);
  v.ints.push_back(x);
  set(key, std::move(v));
}
void GgufWriter::set_i32(const std::string& key, int32_t x) {
  GgufValue v = scalar_value(GgufType::I32);
  v.ints.push_back(x);
  set(key, std::move(v));
}
void GgufWriter::set_f32(const std::string& key, float x) {
  GgufValue v = scalar_value(GgufType::F32);
  v.floats.push_back(x);
  set(key, std::move(v));
}
void GgufWriter::set_bool(const std::string& key, bool x) {
  GgufValue v = scalar_value(GgufType::BOOL);
  v.ints.push_back(x ? 1 : 0);
  set(key, std::move(v));
}
void GgufWriter::set_strings(const std::string& key, std::vector<std::string> s) {
  GgufValue v = scalar_value(GgufType::STRING);
  v.is_array = true;
  v.strings = std::move(s);
  set(key, std::move(v));
}
void GgufWriter::set_ints(const std::string& key, GgufType type, std::vector<int64_t> x) {
  GgufValue v = scalar_value(type);
  v.is_array = true;
  v.ints = std::move(x);
  set(key, std::move(v));
}
void GgufWriter::set_floats(const std::string& key, std::vector<double> x) {
  GgufValue v = scalar_value(GgufType::F32);
  v.is_array = true;
  v.floats = std::move(x);
  set(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, WeightFormat f, const std::vector<int64_t>& shape,
                            Producer produce) {
  if (shape.empty() || shape.size() > 4) fail("gguf writer: tensor '", name, "' must have 1 to 4 dimensions");
  for (const Tensor& t : tensors_)
    if (t.name == name) fail("gguf writer: tensor '", name, "' added twice");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  const uint64_t nbytes = static_cast<uint64_t>(rows * weight_row_bytes(f, shape.back(), "tensor '" + name + "'"));
  tensors_.push_back({name, f, shape, nbytes, std::move(produce)});
}

void GgufWriter::write(const std::string& path) const {
  std::vector<uint8_t> head;
  Out o(head);
  o.scalar<uint32_t>(0x46554747);
  o.scalar<uint32_t>(3);
  o.scalar<uint64_t>(tensors_.size());
  o.scalar<uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    o.string(key);
    if (v.is_array) {
      o.scalar<uint32_t>(static_cast<uint32_t>(GgufType::ARRAY));
      o.scalar<uint32_t>(static_cast<uint32_t>(v.type));
      o.scalar<uint64_t>(v.size());
      for (size_t i = 0; i < v.size(); ++i) write_element(o, v.type, v, i);
    } else {
      if (v.size() != 1) fail("gguf writer: key '", key, "' is a scalar without exactly one value");
      o.scalar<uint32_t>(static_cast<uint32_t>(v.type));
      write_element(o, v.type, v, 0);
    }
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    o.string(t.name);
    o.scalar<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (size_t i = t.shape.size(); i-- > 0;) o.scalar<uint64_t>(static_cast<uint64_t>(t.shape[i]));
    o.scalar<uint32_t>(ggml_type_of(t.format));
    o.scalar<uint64_t>(offset);
    offsets.push_back(offset);
    offset = (offset + t.nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  head.resize((head.size() + kAlignment - 1) / kAlignment * kAlignment, 0);

  // Replaced whole or not at all (core/atomic_file.h): quantizing over an older output keeps it until the end.
  AtomicFile out(path, "GGUF file");
  out.write(head.data(), head.size());
  std::vector<uint8_t> buf;
  static const uint8_t zeros[kAlignment] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    buf.assign(static_cast<size_t>(t.nbytes), 0);
    t.produce(buf.data());
    out.write(buf.data(), buf.size());
    const uint64_t end = offsets[i] + t.nbytes;
    if (i + 1 < tensors_.size()) out.write(zeros, static_cast<size_t>(offsets[i + 1] - end));
  }
  out.commit();
}

}  // namespace mambacpp
