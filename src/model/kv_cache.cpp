// KvCache: the attention layers' keys and values in pages per slot, and the device mirror of the page tables.
#include "model/kv_cache.h"

#include <algorithm>

namespace mambacpp {

void KvCache::fit_pages(Backend& be, const std::vector<LayerCache>& layers, size_t elem, int64_t slot,
                        int64_t tokens) {
  const size_t need = static_cast<size_t>((tokens + page_tokens - 1) / page_tokens);
  for (size_t li = 0; li < layers.size(); ++li) {
    if (layers[li].kind != LayerCacheKind::Kv) continue;
    std::vector<DeviceBuffer>& pages = kv_pages[li][static_cast<size_t>(slot)];
    if (pages.size() > need) pages.resize(need);
    while (pages.size() < need) pages.emplace_back(be, kv_page_bytes(layers[li].kv_dim, elem));
  }
}

KvSequence KvCache::kv_sequence(size_t li, int64_t slot) const {
  KvSequence s;
  for (const DeviceBuffer& b : kv_pages[li][static_cast<size_t>(slot)]) s.pages.push_back(b.data());
  s.past = positions[static_cast<size_t>(slot)];
  return s;
}

void KvCache::sync_device(Backend& be, const std::vector<LayerCache>& layers, const std::vector<SeqSpan>& seqs) {
  const int64_t n_slots = kv_slots();
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
    kv_table = DeviceBuffer(be, static_cast<size_t>(n_tables * n_slots * table_pages) * sizeof(void*));
    kv_table_host.assign(static_cast<size_t>(n_tables * n_slots * table_pages), nullptr);
    be.fill_zero(kv_table.data(), kv_table.size());
    if (!kv_lengths.data()) kv_lengths = DeviceBuffer(be, static_cast<size_t>(n_slots) * sizeof(int64_t));
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
      be.copy_from_host(static_cast<void**>(kv_table.data()) + at, row.data(), row.size() * sizeof(void*));
    }
  be.copy_from_host(kv_lengths.data(), positions.data(), positions.size() * sizeof(int64_t));
}

void* const* KvCache::device_pages(size_t li) const {
  return static_cast<void* const*>(kv_table.data()) + kv_table_index[li] * kv_slots() * table_pages;
}

void copy_kv_rows(Backend& be, const std::vector<DeviceBuffer>& pages, int64_t page_tokens, int64_t kv_dim,
                  size_t elem, bool values, int64_t rows, char* packed, bool to_pages, bool host) {
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

}  // namespace mambacpp
