// StateCache: slots of per-layer conv and SSM state on the model's backend, snapshots of slots, and state files.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "mambacpp/error.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {
constexpr char kMagic[16] = "MAMBACPP-STATE";
constexpr uint32_t kVersion = 4;
// Version 3 held KV rows in f32 whatever the state dtype; it is otherwise version 4 and is still read (its KV rows
// rounded to bf16 for a bf16 state).
constexpr uint32_t kOldestVersion = 3;
}  // namespace

TensorView slot_view(const TensorView& t, int64_t slot) { return t.rows(slot, 1); }

StateCache::Impl& state_impl(StateCache& s) { return *s.impl_; }

StateCache::StateCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateCache::~StateCache() = default;

int64_t StateCache::n_slots() const { return impl_->n_slots; }
DType StateCache::dtype() const { return impl_->dtype; }
const std::vector<LayerCache>& StateCache::layers() const { return impl_->layers; }

void StateCache::check_slot(int64_t slot, const char* what) const {
  if (slot < 0 || slot >= impl_->n_slots)
    fail(what, " ", slot, " out of range: this state cache has slots [0, ", impl_->n_slots, ")");
}

void StateCache::Impl::fit_kv(int64_t slot, int64_t tokens) {
  const size_t need = static_cast<size_t>((tokens + page_tokens - 1) / page_tokens);
  for (size_t li = 0; li < layers.size(); ++li) {
    if (layers[li].kind != LayerCacheKind::Kv) continue;
    std::vector<DeviceBuffer>& pages = kv_pages[li][static_cast<size_t>(slot)];
    if (pages.size() > need) pages.resize(need);
    while (pages.size() < need) pages.emplace_back(*backend, page_bytes(layers[li]));
  }
}

KvSequence StateCache::Impl::kv_sequence(size_t li, int64_t slot) const {
  KvSequence s;
  for (const DeviceBuffer& b : kv_pages[li][static_cast<size_t>(slot)]) s.pages.push_back(b.data());
  s.past = positions[static_cast<size_t>(slot)];
  return s;
}

void StateCache::Impl::sync_device_kv(const std::vector<SeqSpan>& seqs) {
  if (kv_table_index.empty()) {
    kv_table_index.assign(layers.size(), -1);
    int64_t n = 0;
    for (size_t li = 0; li < layers.size(); ++li)
      if (layers[li].kind == LayerCacheKind::Kv) kv_table_index[li] = n++;
  }
  const int64_t n_tables = *std::max_element(kv_table_index.begin(), kv_table_index.end()) + 1;
  if (n_tables <= 0) return;
  int64_t need = 1;
  for (const SeqSpan& sp : seqs)
    for (size_t li = 0; li < layers.size(); ++li)
      if (kv_table_index[li] >= 0) need = std::max(need, static_cast<int64_t>(kv_pages[li][static_cast<size_t>(sp.slot)].size()));
  if (need > table_pages || !kv_lengths.data()) {
    int64_t pages = std::max<int64_t>(table_pages, 16);
    while (pages < need) pages *= 2;
    table_pages = pages;
    kv_table = DeviceBuffer(*backend, static_cast<size_t>(n_tables * n_slots * table_pages) * sizeof(void*));
    kv_table_host.assign(static_cast<size_t>(n_tables * n_slots * table_pages), nullptr);
    backend->fill_zero(kv_table.data(), kv_table.size());
    if (!kv_lengths.data()) kv_lengths = DeviceBuffer(*backend, static_cast<size_t>(n_slots) * sizeof(int64_t));
  }
  // Rows of the batch's slots whose pages changed since the last upload.
  std::vector<void*> row;
  for (const SeqSpan& sp : seqs)
    for (size_t li = 0; li < layers.size(); ++li) {
      if (kv_table_index[li] < 0) continue;
      const auto& pages = kv_pages[li][static_cast<size_t>(sp.slot)];
      const size_t at = static_cast<size_t>((kv_table_index[li] * n_slots + sp.slot) * table_pages);
      row.clear();
      for (const DeviceBuffer& b : pages) row.push_back(b.data());
      if (std::equal(row.begin(), row.end(), kv_table_host.begin() + static_cast<std::ptrdiff_t>(at))) continue;
      std::copy(row.begin(), row.end(), kv_table_host.begin() + static_cast<std::ptrdiff_t>(at));
      backend->copy_from_host(static_cast<void**>(kv_table.data()) + at, row.data(), row.size() * sizeof(void*));
    }
  backend->copy_from_host(kv_lengths.data(), positions.data(), positions.size() * sizeof(int64_t));
}

void* const* StateCache::Impl::device_pages(size_t li) const {
  return static_cast<void* const*>(kv_table.data()) + kv_table_index[li] * n_slots * table_pages;
}

namespace {

// Copies `rows` KV rows (keys or values) between a slot's pages and a packed [rows, kv_dim] buffer, page by page.
// The packed buffer is the backend's memory, or host memory when `host` (read_slot; pages to host only). Elements
// are `elem` bytes (the state dtype's) on both sides.
void copy_kv_rows(Backend& be, const std::vector<DeviceBuffer>& pages, int64_t page_tokens, int64_t kv_dim,
                  size_t elem, bool values, int64_t rows, char* packed, bool to_pages, bool host = false) {
  const size_t row_bytes = static_cast<size_t>(kv_dim) * elem;
  for (int64_t r0 = 0; r0 < rows; r0 += page_tokens) {
    const int64_t n = std::min(page_tokens, rows - r0);
    char* page = static_cast<char*>(pages[static_cast<size_t>(r0 / page_tokens)].data()) +
                 static_cast<size_t>(values ? page_tokens : 0) * row_bytes;
    char* flat = packed + static_cast<size_t>(r0) * row_bytes;
    if (to_pages) be.copy(page, flat, static_cast<size_t>(n) * row_bytes);
    else if (host) be.copy_to_host(flat, page, static_cast<size_t>(n) * row_bytes);
    else be.copy(flat, page, static_cast<size_t>(n) * row_bytes);
  }
}

}  // namespace

int64_t StateCache::tokens_held(int64_t slot) const {
  check_slot(slot);
  return impl_->has_kv() ? impl_->positions[static_cast<size_t>(slot)] : 0;
}

int64_t StateCache::kv_page_tokens() const { return impl_->page_tokens; }

size_t StateCache::kv_bytes_per_token() const {
  size_t n = 0;
  for (const LayerCache& l : impl_->layers)
    if (l.kind == LayerCacheKind::Kv) n += static_cast<size_t>(2 * l.kv_dim) * impl_->kv_elem_bytes();
  return n;
}

void StateCache::reset(int64_t slot) {
  check_slot(slot);
  for (const LayerCache& l : impl_->layers) {
    if (l.kind != LayerCacheKind::Ssm) continue;
    TensorView conv = slot_view(l.conv, slot), ssm = slot_view(l.ssm, slot);
    impl_->backend->fill_zero(conv.data, conv.nbytes());
    impl_->backend->fill_zero(ssm.data, ssm.nbytes());
  }
  if (impl_->has_kv()) {
    impl_->fit_kv(slot, 0);  // a fresh sequence holds no tokens: its pages go back
    impl_->positions[static_cast<size_t>(slot)] = 0;
  }
}

void StateCache::reset_all() {
  for (const LayerCache& l : impl_->layers) {
    if (l.kind != LayerCacheKind::Ssm) continue;
    impl_->backend->fill_zero(l.conv.data, l.conv.nbytes());
    impl_->backend->fill_zero(l.ssm.data, l.ssm.nbytes());
  }
  for (int64_t s = 0; impl_->has_kv() && s < impl_->n_slots; ++s) {
    impl_->fit_kv(s, 0);
    impl_->positions[static_cast<size_t>(s)] = 0;
  }
}

void StateCache::copy(int64_t src_slot, int64_t dst_slot) {
  check_slot(src_slot, "source slot");
  check_slot(dst_slot, "destination slot");
  if (src_slot == dst_slot) return;
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    if (l.kind != LayerCacheKind::Ssm) continue;
    for (const TensorView* t : {&l.conv, &l.ssm}) {
      TensorView s = slot_view(*t, src_slot), d = slot_view(*t, dst_slot);
      impl_->backend->copy(d.data, s.data, s.nbytes());
    }
  }
  if (impl_->has_kv()) {
    const int64_t n = impl_->positions[static_cast<size_t>(src_slot)];
    impl_->fit_kv(dst_slot, n);
    impl_->positions[static_cast<size_t>(dst_slot)] = n;
    for (size_t li = 0; li < impl_->layers.size(); ++li) {
      if (impl_->layers[li].kind != LayerCacheKind::Kv) continue;
      const auto& src = impl_->kv_pages[li][static_cast<size_t>(src_slot)];
      const auto& dst = impl_->kv_pages[li][static_cast<size_t>(dst_slot)];
      for (size_t p = 0; p < src.size(); ++p) impl_->backend->copy(dst[p].data(), src[p].data(), src[p].size());
    }
  }
}

std::vector<float> StateCache::read_slot(int64_t slot) const {
  check_slot(slot);
  std::vector<float> out;
  std::vector<char> bytes;
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    if (l.kind == LayerCacheKind::Kv) {
      const int64_t n = impl_->positions[static_cast<size_t>(slot)];
      for (bool values : {false, true}) {
        bytes.resize(static_cast<size_t>(n * l.kv_dim) * impl_->kv_elem_bytes());
        copy_kv_rows(*impl_->backend, impl_->kv_pages[li][static_cast<size_t>(slot)], impl_->page_tokens, l.kv_dim,
                     impl_->kv_elem_bytes(), values, n, bytes.data(), false, /*host=*/true);
        const size_t at = out.size();
        out.resize(at + static_cast<size_t>(n * l.kv_dim));
        convert_to_f32(bytes.data(), impl_->dtype, out.data() + at, n * l.kv_dim);
      }
      continue;
    }
    if (l.kind != LayerCacheKind::Ssm) continue;
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

namespace {

// The fixed-size tensors of one layer's cache entry, in file order (KV entries have none: their rows are sized by
// the tokens held).
std::vector<const TensorView*> entry_tensors(const LayerCache& l) {
  if (l.kind != LayerCacheKind::Ssm) return {};
  return {&l.conv, &l.ssm};
}

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

struct SlotSnapshot::Impl {
  DeviceBuffer buffer;  // every layer's tensors of one slot, back to back, in file order
  int64_t kv_tokens = 0;  // rows of each KV entry (keys [kv_tokens, kv_dim], then values, per attention layer)
};

SlotSnapshot::SlotSnapshot(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SlotSnapshot::~SlotSnapshot() = default;
SlotSnapshot::SlotSnapshot(SlotSnapshot&&) noexcept = default;
SlotSnapshot& SlotSnapshot::operator=(SlotSnapshot&&) noexcept = default;
size_t SlotSnapshot::bytes() const { return impl_ ? impl_->buffer.size() : 0; }

size_t StateCache::slot_bytes() const {
  size_t n = 0;
  for (const LayerCache& l : impl_->layers)
    for (const TensorView* t : entry_tensors(l)) n += slot_view(*t, 0).nbytes();
  return n;
}

SlotSnapshot StateCache::snapshot(int64_t slot) const {
  check_slot(slot);
  auto impl = std::make_unique<SlotSnapshot::Impl>();
  impl->kv_tokens = tokens_held(slot);
  impl->buffer = DeviceBuffer(*impl_->backend, slot_bytes() + static_cast<size_t>(impl->kv_tokens) * kv_bytes_per_token());
  char* at = static_cast<char*>(impl->buffer.data());
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    for (const TensorView* t : entry_tensors(l)) {
      const TensorView s = slot_view(*t, slot);
      impl_->backend->copy(at, s.data, s.nbytes());
      at += s.nbytes();
    }
    if (l.kind != LayerCacheKind::Kv) continue;
    for (bool values : {false, true}) {
      copy_kv_rows(*impl_->backend, impl_->kv_pages[li][static_cast<size_t>(slot)], impl_->page_tokens, l.kv_dim,
                   impl_->kv_elem_bytes(), values, impl->kv_tokens, at, false);
      at += static_cast<size_t>(impl->kv_tokens * l.kv_dim) * impl_->kv_elem_bytes();
    }
  }
  return SlotSnapshot(std::move(impl));
}

void StateCache::restore(int64_t slot, const SlotSnapshot& snap) {
  check_slot(slot);
  const int64_t n = snap.impl_ ? snap.impl_->kv_tokens : 0;
  const size_t expected = slot_bytes() + static_cast<size_t>(n) * kv_bytes_per_token();
  if (snap.bytes() != expected || (n > 0 && !impl_->has_kv()))
    fail("restore: the snapshot holds ", snap.bytes(), " bytes, a slot of this state cache ", expected);
  const char* at = static_cast<const char*>(snap.impl_->buffer.data());
  if (impl_->has_kv()) {
    impl_->fit_kv(slot, n);
    impl_->positions[static_cast<size_t>(slot)] = n;
  }
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    for (const TensorView* t : entry_tensors(l)) {
      const TensorView d = slot_view(*t, slot);
      impl_->backend->copy(d.data, at, d.nbytes());
      at += d.nbytes();
    }
    if (l.kind != LayerCacheKind::Kv) continue;
    for (bool values : {false, true}) {
      copy_kv_rows(*impl_->backend, impl_->kv_pages[li][static_cast<size_t>(slot)], impl_->page_tokens, l.kv_dim,
                   impl_->kv_elem_bytes(), values, n, const_cast<char*>(at), true);
      at += static_cast<size_t>(n * l.kv_dim) * impl_->kv_elem_bytes();
    }
  }
}

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
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot open state file '", path, "' for writing");
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) fail("failed writing state file '", path, "'");
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
