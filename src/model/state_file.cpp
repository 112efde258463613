// The versioned state-file format (StateCache::save / load, `generate --save-state`): the one place that writes
// and reads it. fuzz/state_file_fuzz.cpp feeds it arbitrary bytes.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "mambacpp/error.h"
#include "model/state_slots.h"

namespace mambacpp {

namespace {
constexpr char kMagic[16] = "MAMBACPP-STATE";
constexpr uint32_t kVersion = 4;
// Version 3 held KV rows in f32 whatever the state dtype; it is otherwise version 4 and is still read (its KV rows
// rounded to bf16 for a bf16 state).
constexpr uint32_t kOldestVersion = 3;

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Reads exactly `n` bytes or fails naming what was being read.
void read_exact(std::ifstream& in, void* dst, size_t n, const std::string& path, const char* what) {
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in) fail("state file '", path, "' is truncated (", what, ")");
}
template <class T>
T get(std::ifstream& in, const std::string& path, const char* what) {
  T v{};
  read_exact(in, &v, sizeof(T), path, what);
  return v;
}

}  // namespace

// State file layout (little-endian), version 4:
//   "MAMBACPP-STATE\0\0" (16 bytes) | u32 version | u32 dtype | u64 weights hash | u64 config length | config JSON
//   | i64 first layer | i64 layer count
//   | per layer: u32 cache-entry kind, u32 tensor count, per tensor: u32 ndim, i64 dims[ndim] (one slot's shape)
//   | u64 token count | i32 tokens[count] (the tokens the state stands for)
//   | per layer, per tensor: its bytes (one slot, in the state dtype)
// Kinds: 0 Ssm (conv [C, K-1], ssm [...]), 1 Kv (keys and values, each [tokens held, kv_dim], in the state dtype;
// f32 in version 3), 2 Stateless (MLP layers: no tensors). A reader refuses kinds and shapes it does not hold, and
// a state dtype other than its state cache's.
void StateCache::save_snapshot(const SlotSnapshot& snap, const std::string& path,
                               const std::vector<int32_t>& tokens) const {
  const int64_t n_kv = snap.impl_ ? snap.impl_->kv_tokens : 0;
  if (snap.bytes() != slot_bytes() + static_cast<size_t>(n_kv) * kv_bytes_per_token())
    fail("save state: the snapshot holds ", snap.bytes(), " bytes, a slot of this state cache ",
         slot_bytes() + static_cast<size_t>(n_kv) * kv_bytes_per_token());
  std::string header(kMagic, 16);
  const std::string config = impl_->model->config().to_json();
  put(header, kVersion);
  put(header, static_cast<uint32_t>(impl_->dtype));
  put(header, impl_->model->weights_hash());
  put(header, static_cast<uint64_t>(config.size()));
  header += config;
  put(header, impl_->first_layer);
  put(header, static_cast<int64_t>(impl_->layers.size()));
  for (const LayerCache& l : impl_->layers) {
    const auto tensors = entry_tensors(l);
    put(header, static_cast<uint32_t>(l.kind));
    if (l.kind == LayerCacheKind::Kv) {  // keys and values, each [tokens held, kv_dim]
      put(header, uint32_t{2});
      for (int i = 0; i < 2; ++i) {
        put(header, uint32_t{2});
        put(header, n_kv);
        put(header, l.kv_dim);
      }
      continue;
    }
    put(header, static_cast<uint32_t>(tensors.size()));
    for (const TensorView* t : tensors) {
      put(header, static_cast<uint32_t>(t->ndim - 1));
      for (int d = 1; d < t->ndim; ++d) put(header, t->dim(d));
    }
  }
  put(header, static_cast<uint64_t>(tokens.size()));
  header.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t));

  std::vector<char> data(snap.bytes());
  impl_->backend->copy_to_host(data.data(), snap.impl_->buffer.data(), data.size());
  // Replaced whole or not at all: a save that fails (full disk, file-size limit, a kill) keeps the previous state.
  AtomicFile out(path, "state file");
  out.write(header);
  out.write(data.data(), data.size());
  out.commit();
}

SlotSnapshot StateCache::load_snapshot(const std::string& path, std::vector<int32_t>* tokens) const {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("state file '", path, "' is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open state file '", path, "'");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) fail("state file '", path, "': cannot find its size (not a regular file?)");
  const uint64_t file_size = static_cast<uint64_t>(end);  // every count below is checked against it
  in.seekg(0);
  char magic[16] = {};
  in.read(magic, 16);
  if (!in || std::memcmp(magic, kMagic, 16) != 0) fail("'", path, "' is not a mambacpp state file (bad magic)");
  const auto version = get<uint32_t>(in, path, "header");
  if (version < kOldestVersion)
    fail("state file '", path, "' has version ", version, ", which records neither the layers' cache-entry kinds nor ",
         "the tokens it stands for; this mambacpp reads versions ", kOldestVersion, " to ", kVersion,
         ". Rerun the prompt to make a new one");
  if (version > kVersion)
    fail("state file '", path, "': version ", version, " is newer than this mambacpp reads (", kOldestVersion, " to ",
         kVersion, ")");
  const auto dtype = get<uint32_t>(in, path, "header");
  const auto hash = get<uint64_t>(in, path, "header");
  const auto config_len = get<uint64_t>(in, path, "header");
  if (config_len > (1u << 20) || config_len > file_size)
    fail("state file '", path, "': config length ", config_len, " is implausible");
  std::string config(config_len, '\0');
  read_exact(in, config.data(), config_len, path, "config");
  const std::string mine = impl_->model->config().to_json();
  if (config != mine)  // the file's config may be anything up to 1 MiB: quote its start only
    fail("state file '", path, "' was written by another model: its config is ",
         config.size() > 400 ? config.substr(0, 400) + "..." : config, ", this model's is ", mine);
  if (hash != impl_->model->weights_hash())
    fail("state file '", path, "' was written by another model: weights hash ", std::hex, hash, ", this model's is ",
         impl_->model->weights_hash());
  const auto first_layer = get<int64_t>(in, path, "header");
  const auto n_layers = get<int64_t>(in, path, "header");
  int64_t last_layer = 0;  // both are raw file values: their sum may overflow
  const bool range_fits = !__builtin_add_overflow(first_layer, n_layers, &last_layer);
  if (first_layer != impl_->first_layer || n_layers != static_cast<int64_t>(impl_->layers.size()))
    fail("state file '", path, "' holds layers [", first_layer, ", ",
         range_fits ? std::to_string(last_layer) : std::string("overflow"), "); this state cache holds layers [",
         impl_->first_layer, ", ", impl_->first_layer + static_cast<int64_t>(impl_->layers.size()), ")");
  if (dtype != static_cast<uint32_t>(impl_->dtype))  // only a known value is named (and cast to DType)
    fail("state file '", path, "' holds ",
         dtype == static_cast<uint32_t>(DType::F32) || dtype == static_cast<uint32_t>(DType::BF16)
             ? dtype_name(static_cast<DType>(dtype))
             : "dtype code " + std::to_string(dtype),
         " state; this state cache is ", dtype_name(impl_->dtype));
  int64_t kv_tokens = -1;
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    const auto tensors = entry_tensors(l);
    const size_t n_tensors = l.kind == LayerCacheKind::Kv ? 2 : tensors.size();
    const auto kind = get<uint32_t>(in, path, "layer table");
    const auto count = get<uint32_t>(in, path, "layer table");
    if (kind != static_cast<uint32_t>(l.kind) || count != n_tensors)
      fail("state file '", path, "': layer ", li, " has cache-entry kind ", kind, " with ", count,
           " tensors; this model's layer has kind ", static_cast<uint32_t>(l.kind), " with ", n_tensors);
    if (l.kind == LayerCacheKind::Kv) {
      for (int i = 0; i < 2; ++i) {
        const auto ndim = get<uint32_t>(in, path, "layer table");
        const auto rows = ndim == 2 ? get<int64_t>(in, path, "layer table") : -1;
        const auto cols = ndim == 2 ? get<int64_t>(in, path, "layer table") : -1;
        if (ndim != 2 || cols != l.kv_dim || rows < 0 || rows > static_cast<int64_t>(file_size) ||
            (kv_tokens >= 0 && rows != kv_tokens))
          fail("state file '", path, "': layer ", li, " holds KV rows of another shape than [tokens, ", l.kv_dim,
               "] with one token count for every attention layer");
        kv_tokens = rows;
      }
      continue;
    }
    for (const TensorView* t : tensors) {
      const auto ndim = get<uint32_t>(in, path, "layer table");
      if (ndim != static_cast<uint32_t>(t->ndim - 1))
        fail("state file '", path, "': layer ", li, " holds a ", ndim, "-d tensor where this model has ", t->ndim - 1);
      for (int d = 1; d < t->ndim; ++d)
        if (get<int64_t>(in, path, "layer table") != t->dim(d))
          fail("state file '", path, "': layer ", li, " holds a tensor of another shape than this model's ",
               slot_view(*t, 0).shape_string());
    }
  }
  const auto n_tokens = get<uint64_t>(in, path, "token count");
  if (n_tokens > file_size / sizeof(int32_t))
    fail("state file '", path, "': token count ", n_tokens, " is larger than the file");
  std::vector<int32_t> toks(n_tokens);
  read_exact(in, toks.data(), n_tokens * sizeof(int32_t), path, "tokens");
  for (int32_t t : toks)
    if (t < 0 || t >= impl_->model->config().vocab_size)
      fail("state file '", path, "': token ", t, " outside [0, ", impl_->model->config().vocab_size, ")");
  const int64_t n_kv = std::max<int64_t>(kv_tokens, 0);
  // The KV rows are the positions the slot will hold: past the context limit the next forward call would refuse the
  // slot, and rows that are not the recorded tokens would have a prompt continue from a state it does not stand for
  // (the engine keys the state by those tokens). An empty token list records nothing to compare.
  const ModelConfig& mc = impl_->model->config();
  const int64_t ctx = impl_->model->load_options().ctx_size > 0 ? impl_->model->load_options().ctx_size : mc.max_position;
  if (impl_->has_kv() && ctx > 0 && n_kv > ctx)
    fail("state file '", path, "' holds ", n_kv, " KV positions, more than the context limit of ", ctx, " (",
         impl_->model->load_options().ctx_size > 0 ? "ctx_size, --ctx-size" : "the config's max_position_embeddings", ")");
  if (impl_->has_kv() && n_tokens > 0 && static_cast<uint64_t>(n_kv) != n_tokens)
    fail("state file '", path, "' holds ", n_kv, " KV positions for the ", n_tokens,
         " tokens it records; expected one position per token");
  // KV rows as the file holds them (version 3: f32), converted to the state dtype.
  const DType file_kv = version == 3 ? DType::F32 : impl_->dtype;
  const size_t per_token = kv_bytes_per_token() / impl_->kv_elem_bytes() * dtype_size(file_kv);
  const size_t file_bytes = slot_bytes() + static_cast<size_t>(n_kv) * per_token;
  if (file_bytes > file_size) fail("state file '", path, "' is truncated (state data)");
  std::vector<char> data(file_bytes);
  read_exact(in, data.data(), data.size(), path, "state data");
  if (in.peek() != std::char_traits<char>::eof()) fail("state file '", path, "' has trailing bytes");
  if (file_kv != impl_->dtype && n_kv > 0) {
    std::vector<char> converted;
    converted.reserve(slot_bytes() + static_cast<size_t>(n_kv) * kv_bytes_per_token());
    const char* at = data.data();
    std::vector<float> rows;
    for (const LayerCache& l : impl_->layers) {
      for (const TensorView* t : entry_tensors(l)) {
        const size_t nb = slot_view(*t, 0).nbytes();
        converted.insert(converted.end(), at, at + nb);
        at += nb;
      }
      if (l.kind != LayerCacheKind::Kv) continue;
      const int64_t n = 2 * n_kv * l.kv_dim;  // keys then values
      rows.resize(static_cast<size_t>(n));
      convert_to_f32(at, file_kv, rows.data(), n);
      at += static_cast<size_t>(n) * dtype_size(file_kv);
      const size_t was = converted.size();
      converted.resize(was + static_cast<size_t>(n) * impl_->kv_elem_bytes());
      convert_from_f32(rows.data(), converted.data() + was, impl_->dtype, n);
    }
    data = std::move(converted);
  }
  auto impl = std::make_unique<SlotSnapshot::Impl>();
  impl->kv_tokens = n_kv;
  impl->buffer = DeviceBuffer(*impl_->backend, data.size());
  impl->bytes = data.size();
  impl_->backend->copy_from_host(impl->buffer.data(), data.data(), data.size());
  if (tokens) *tokens = std::move(toks);
  return SlotSnapshot(std::move(impl));
}

void StateCache::save(int64_t slot, const std::string& path, const std::vector<int32_t>& tokens) const {
  save_snapshot(snapshot(slot), path, tokens);
}

std::vector<int32_t> StateCache::load(int64_t slot, const std::string& path) {
  check_slot(slot);
  std::vector<int32_t> tokens;
  const SlotSnapshot snap = load_snapshot(path, &tokens);  // everything checked before the slot changes
  restore(slot, snap);
  return tokens;
}

}  // namespace mambacpp
