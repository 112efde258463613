// StateCache: slots of per-layer conv and SSM state on the model's backend, and state files.
//
// State file layout (little-endian):
//   "MAMBACPP-STATE\0\0" (16 bytes) | u32 version | u32 dtype | u64 weights hash | u64 config length | config JSON
//   | i64 first layer | i64 layer count | for each layer: conv bytes, ssm bytes (one slot, in the state dtype)
#include <cstring>
#include <fstream>

#include "mambacpp/error.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {
constexpr char kMagic[16] = "MAMBACPP-STATE";
constexpr uint32_t kVersion = 2;
}  // namespace

TensorView slot_view(const TensorView& t, int64_t slot) { return t.rows(slot, 1); }

StateCache::StateCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateCache::~StateCache() = default;

int64_t StateCache::n_slots() const { return impl_->n_slots; }
DType StateCache::dtype() const { return impl_->dtype; }
const std::vector<LayerCache>& StateCache::layers() const { return impl_->layers; }

void StateCache::check_slot(int64_t slot, const char* what) const {
  if (slot < 0 || slot >= impl_->n_slots)
    fail(what, " ", slot, " out of range: this state cache has slots [0, ", impl_->n_slots, ")");
}

void StateCache::reset(int64_t slot) {
  check_slot(slot);
  for (const LayerCache& l : impl_->layers) {
    TensorView conv = slot_view(l.conv, slot), ssm = slot_view(l.ssm, slot);
    impl_->backend->fill_zero(conv.data, conv.nbytes());
    impl_->backend->fill_zero(ssm.data, ssm.nbytes());
  }
}

void StateCache::reset_all() {
  for (const LayerCache& l : impl_->layers) {
    impl_->backend->fill_zero(l.conv.data, l.conv.nbytes());
    impl_->backend->fill_zero(l.ssm.data, l.ssm.nbytes());
  }
}

void StateCache::copy(int64_t src_slot, int64_t dst_slot) {
  check_slot(src_slot, "source slot");
  check_slot(dst_slot, "destination slot");
  if (src_slot == dst_slot) return;
  for (const LayerCache& l : impl_->layers) {
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      TensorView s = slot_view(*t, src_slot), d = slot_view(*t, dst_slot);
      impl_->backend->copy(d.data, s.data, s.nbytes());
    }
  }
}

std::vector<float> StateCache::read_slot(int64_t slot) const {
  check_slot(slot);
  std::vector<float> out;
  std::vector<char> bytes;
  for (const LayerCache& l : impl_->layers) {
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      TensorView s = slot_view(*t, slot);
      bytes.resize(s.nbytes());
      impl_->backend->copy_to_host(bytes.data(), s.data, bytes.size());
      size_t at = out.size();
      out.resize(at + static_cast<size_t>(s.numel()));
      convert_to_f32(bytes.data(), s.dtype, out.data() + at, s.numel());
    }
  }
  return out;
}

void StateCache::save(int64_t slot, const std::string& path) const {
  check_slot(slot);
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot open state file '", path, "' for writing");
  const std::string config = impl_->model->config().to_json();
  const uint32_t version = kVersion, dtype = static_cast<uint32_t>(impl_->dtype);
  const uint64_t hash = impl_->model->weights_hash(), config_len = config.size();
  out.write(kMagic, 16);
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&dtype), 4);
  out.write(reinterpret_cast<const char*>(&hash), 8);
  out.write(reinterpret_cast<const char*>(&config_len), 8);
  out.write(config.data(), static_cast<std::streamsize>(config.size()));
  const int64_t layer_range[2] = {impl_->first_layer, static_cast<int64_t>(impl_->layers.size())};
  out.write(reinterpret_cast<const char*>(layer_range), sizeof(layer_range));
  std::vector<char> bytes;
  for (const LayerCache& l : impl_->layers) {
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      TensorView s = slot_view(*t, slot);
      bytes.resize(s.nbytes());
      impl_->backend->copy_to_host(bytes.data(), s.data, bytes.size());
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
  }
  if (!out) fail("failed writing state file '", path, "'");
}

void StateCache::load(int64_t slot, const std::string& path) {
  check_slot(slot);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open state file '", path, "'");
  char magic[16] = {};
  uint32_t version = 0, dtype = 0;
  uint64_t hash = 0, config_len = 0;
  in.read(magic, 16);
  if (!in || std::memcmp(magic, kMagic, 16) != 0) fail("'", path, "' is not a mambacpp state file (bad magic)");
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&dtype), 4);
  in.read(reinterpret_cast<char*>(&hash), 8);
  in.read(reinterpret_cast<char*>(&config_len), 8);
  if (!in) fail("state file '", path, "' is truncated (header)");
  if (version != kVersion) fail("state file '", path, "': version ", version, ", expected ", kVersion);
  if (config_len > (1u << 20)) fail("state file '", path, "': config length ", config_len, " is implausible");
  std::string config(config_len, '\0');
  in.read(config.data(), static_cast<std::streamsize>(config_len));
  if (!in) fail("state file '", path, "' is truncated (config)");
  const std::string mine = impl_->model->config().to_json();
  if (config != mine)
    fail("state file '", path, "' was written by another model: its config is ", config, ", this model's is ", mine);
  if (hash != impl_->model->weights_hash())
    fail("state file '", path, "' was written by another model: weights hash ", std::hex, hash, ", this model's is ",
         impl_->model->weights_hash());
  int64_t layer_range[2] = {};
  in.read(reinterpret_cast<char*>(layer_range), sizeof(layer_range));
  if (!in) fail("state file '", path, "' is truncated (header)");
  if (layer_range[0] != impl_->first_layer || layer_range[1] != static_cast<int64_t>(impl_->layers.size()))
    fail("state file '", path, "' holds layers [", layer_range[0], ", ", layer_range[0] + layer_range[1],
         "); this state cache holds layers [", impl_->first_layer, ", ",
         impl_->first_layer + static_cast<int64_t>(impl_->layers.size()), ")");
  if (dtype != static_cast<uint32_t>(impl_->dtype))
    fail("state file '", path, "' holds ", dtype_name(static_cast<DType>(dtype)), " state; this state cache is ",
         dtype_name(impl_->dtype));
  // Read everything before touching the slot, so that a truncated file leaves the state as it was.
  std::vector<std::vector<char>> parts;
  for (const LayerCache& l : impl_->layers) {
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      std::vector<char> bytes(slot_view(*t, slot).nbytes());
      in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!in) fail("state file '", path, "' is truncated (state data)");
      parts.push_back(std::move(bytes));
    }
  }
  if (in.peek() != std::char_traits<char>::eof()) fail("state file '", path, "' has trailing bytes");
  size_t k = 0;
  for (const LayerCache& l : impl_->layers)
    for (const TensorView* t : {&l.conv, &l.ssm})
      impl_->backend->copy_from_host(slot_view(*t, slot).data, parts[k].data(), parts[k].size()), ++k;
}

}  // namespace mambacpp
