// The paged KV cache of a state cache's attention layers, and its device mirror. A slot's keys and values grow by
// pages of `page_tokens` rows, so a long context costs memory as it grows and copying a slot copies only its pages.
// StateCache::Impl is a KvCache (the layer recipes read its positions and page tables as members of the state).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "mambacpp/state.h"

namespace mambacpp {

struct KvCache {
  // kv_pages[l][slot] are layer l's pages for a slot (empty for layers of other kinds); one page holds keys
  // [page_tokens, kv_dim] then values [page_tokens, kv_dim]. positions[slot] is the number of tokens the slot holds
  // (every attention layer holds them all). Empty for models without attention.
  int64_t page_tokens = 64;
  std::vector<std::vector<std::vector<DeviceBuffer>>> kv_pages;
  std::vector<int64_t> positions;

  // Device mirror of the page lists and positions, for decode steps that read them on the device (backends with
  // supports_device_kv; what lets a captured step replay as contexts grow): per attention layer a [n_slots,
  // table_pages] array of page pointers, and positions [n_slots] as int64. table_pages only grows, by doubling (a
  // new buffer: graphs keyed on it are captured again, a handful of times over a context's growth).
  int64_t table_pages = 0;
  DeviceBuffer kv_table, kv_lengths;
  std::vector<int64_t> kv_table_index;  // per layer: its table among the attention layers, or -1
  std::vector<void*> kv_table_host;     // what kv_table holds

  bool has_kv() const { return !positions.empty(); }
  int64_t kv_slots() const { return static_cast<int64_t>(positions.size()); }
  // Bytes of one page of a layer with `kv_dim` channels, in elements of `elem` bytes.
  size_t kv_page_bytes(int64_t kv_dim, size_t elem) const {
    return static_cast<size_t>(2 * page_tokens * kv_dim) * elem;
  }
  // Grows (or shrinks) every KV layer's pages of `slot` to hold exactly enough pages for `tokens` positions.
  void fit_pages(Backend& be, const std::vector<LayerCache>& layers, size_t elem, int64_t slot, int64_t tokens);
  // Layer li's cache of `slot` as the attention op takes it (past = positions[slot]).
  KvSequence kv_sequence(size_t li, int64_t slot) const;
  // Brings the device mirror up to date for the slots of `seqs` (the caller has fitted their pages).
  void sync_device(Backend& be, const std::vector<LayerCache>& layers, const std::vector<SeqSpan>& seqs);
  // Layer li's [n_slots, table_pages] page table on the device.
  void* const* device_pages(size_t li) const;
};

// Copies `rows` KV rows (keys, or values when `values`) between a slot's pages and a packed [rows, kv_dim] buffer,
// page by page. The packed buffer is the backend's memory, or host memory when `host` (pages to host only).
// Elements are `elem` bytes (the state dtype's) on both sides.
void copy_kv_rows(Backend& be, const std::vector<DeviceBuffer>& pages, int64_t page_tokens, int64_t kv_dim,
                  size_t elem, bool values, int64_t rows, char* packed, bool to_pages, bool host = false);

}  // namespace mambacpp
