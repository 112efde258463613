// StateCache: slots of per-layer conv and SSM state (and of KV rows, kv_cache.cpp) on the model's backend: reset,
// copy, read, and snapshots of one slot. The state-file format is state_file.cpp's.
#include "model/state_slots.h"

#include "mambacpp/error.h"

namespace mambacpp {

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

SlotSnapshot::SlotSnapshot() = default;
SlotSnapshot::SlotSnapshot(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SlotSnapshot::~SlotSnapshot() = default;
SlotSnapshot::SlotSnapshot(SlotSnapshot&&) noexcept = default;
SlotSnapshot& SlotSnapshot::operator=(SlotSnapshot&&) noexcept = default;
size_t SlotSnapshot::bytes() const { return impl_ ? impl_->bytes : 0; }

size_t StateCache::slot_bytes() const {
  size_t n = 0;
  for (const LayerCache& l : impl_->layers)
    for (const TensorView* t : entry_tensors(l)) n += slot_view(*t, 0).nbytes();
  return n;
}

SlotSnapshot StateCache::snapshot(int64_t slot) const {
  SlotSnapshot snap;
  snapshot_into(slot, snap);
  return snap;
}

void StateCache::snapshot_into(int64_t slot, SlotSnapshot& into) const {
  check_slot(slot);
  if (!into.impl_) into.impl_ = std::make_unique<SlotSnapshot::Impl>();
  SlotSnapshot::Impl& impl = *into.impl_;
  impl.kv_tokens = tokens_held(slot);
  impl.bytes = slot_bytes() + static_cast<size_t>(impl.kv_tokens) * kv_bytes_per_token();
  if (impl.buffer.size() < impl.bytes) {
    impl.buffer = DeviceBuffer();  // the old one goes first: two at once may not fit
    impl.buffer = DeviceBuffer(*impl_->backend, impl.bytes);
  }
  std::vector<Backend::CopyRegion> regions;
  char* at = static_cast<char*>(impl.buffer.data());
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    for (const TensorView* t : entry_tensors(l)) {
      const TensorView s = slot_view(*t, slot);
      regions.push_back({at, s.data, s.nbytes()});
      at += s.nbytes();
    }
    if (l.kind != LayerCacheKind::Kv) continue;
    for (bool values : {false, true}) {
      copy_kv_rows(*impl_->backend, impl_->kv_pages[li][static_cast<size_t>(slot)], impl_->page_tokens, l.kv_dim,
                   impl_->kv_elem_bytes(), values, impl.kv_tokens, at, false);
      at += static_cast<size_t>(impl.kv_tokens * l.kv_dim) * impl_->kv_elem_bytes();
    }
  }
  impl_->backend->copy_many(regions);
}

void StateCache::restore(int64_t slot, const SlotSnapshot& snap) {
  check_slot(slot);
  const int64_t n = snap.impl_ ? snap.impl_->kv_tokens : 0;
  const size_t expected = slot_bytes() + static_cast<size_t>(n) * kv_bytes_per_token();
  if (!snap.impl_ || snap.bytes() != expected || (n > 0 && !impl_->has_kv()))
    fail("restore: the snapshot holds ", snap.bytes(), " bytes, a slot of this state cache ", expected);
  const char* at = static_cast<const char*>(snap.impl_->buffer.data());
  if (impl_->has_kv()) {
    impl_->fit_kv(slot, n);
    impl_->positions[static_cast<size_t>(slot)] = n;
  }
  std::vector<Backend::CopyRegion> regions;
  for (size_t li = 0; li < impl_->layers.size(); ++li) {
    const LayerCache& l = impl_->layers[li];
    for (const TensorView* t : entry_tensors(l)) {
      const TensorView d = slot_view(*t, slot);
      regions.push_back({d.data, at, d.nbytes()});
      at += d.nbytes();
    }
    if (l.kind != LayerCacheKind::Kv) continue;
    for (bool values : {false, true}) {
      copy_kv_rows(*impl_->backend, impl_->kv_pages[li][static_cast<size_t>(slot)], impl_->page_tokens, l.kv_dim,
                   impl_->kv_elem_bytes(), values, n, const_cast<char*>(at), true);
      at += static_cast<size_t>(n * l.kv_dim) * impl_->kv_elem_bytes();
    }
  }
  impl_->backend->copy_many(regions);
}

}  // namespace mambacpp
