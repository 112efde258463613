// Attention ops of the CUDA backend (attention.cu, hybrid_elementwise.cu): attention over the paged KV cache, with
// the pages given per call from the host or kept on the device for captured decode steps, and rope.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace mambacpp {

using namespace cuda;

// The call's sequences, tiles and page pointers go up in one copy (stream-ordered, so reusing the buffer for the
// next layer is safe), then the append kernel, the attention kernel and, for split keys, the combine.
void CudaBackend::attention(const AttentionArgs& a, const BatchLayout& batch) {
  const char* op = "attention";
  const int64_t NH = a.n_heads, KV = a.n_kv_heads, HD = a.head_dim;
  need(NH > 0 && KV > 0 && HD > 0 && NH % KV == 0 && a.page_tokens > 0, op, ": bad sizes n_heads ", NH, ", n_kv_heads ",
       KV, ", head_dim ", HD, ", page_tokens ", a.page_tokens, " (all positive, n_kv_heads dividing n_heads)");
  need(HD <= 256, op, ": head_dim ", HD, " is above the GPU kernel's limit of 256");
  need(a.kv_dtype == DType::F32 || a.kv_dtype == DType::BF16, op, ": KV pages must be f32 or bf16, found ",
       dtype_name(a.kv_dtype));
  for (const TensorView* v : {&a.q, &a.k, &a.v, &a.out}) check_f32_2d(*v, "attention: q/k/v/out");
  const int64_t T = a.q.dim(0);
  need(a.q.dim(1) == NH * HD && a.out.dim(0) == T && a.out.dim(1) == NH * HD, op, ": q ", a.q.shape_string(),
       " and out ", a.out.shape_string(), " must be [", T, ", ", NH * HD, "]");
  need(a.k.dim(0) == T && a.v.dim(0) == T && a.k.dim(1) == KV * HD && a.v.dim(1) == KV * HD, op, ": k ",
       a.k.shape_string(), " and v ", a.v.shape_string(), " must be [", T, ", ", KV * HD, "]");
  AttentionLaunch p;
  p.token_seq = token_seq_;
  const SeqSpan* spans = device_seqs(batch, INT64_MAX, T, op);
  need(n_mapped_tokens_ >= T, op, ": the batch maps ", n_mapped_tokens_, " rows, expected ", T);
  const int64_t rep = NH / KV;
  p.q = crows(a.q);
  p.k = crows(a.k);
  p.v = crows(a.v);
  p.out = rows(a.out);
  p.T = T;
  p.n_heads = NH;
  p.n_kv_heads = KV;
  p.head_dim = HD;
  p.page_tokens = a.page_tokens;
  p.scale = a.scale;
  p.kv_bf16 = a.kv_dtype == DType::BF16;
  const int64_t elem = static_cast<int64_t>(dtype_size(a.kv_dtype));
  // Fast precision computes attention on the tensor cores (attention_mma.cu, faster than the f32 kernel on decode and
  // prefill: docs/perf-log/attention-tensor-cores-2026-12-07.md); exact precision keeps the f32 kernel. Fast precision
  // covers 16-bit weights only (as Mamba2Launch::fast). The tensor-core kernel stages rows in 16-byte chunks of 8
  // channels (pages cudaMalloc'd: 256-byte aligned).
  p.mma = fast_ && weight_dtype_ != DType::F32 && HD % 8 == 0;
  const int64_t tile_items = p.mma ? kAttnMmaTileItems : kAttnTileItems;
  if (a.device_pages) {
    need(a.device_lengths && a.max_pages > 0, op, ": device_pages needs device_lengths and max_pages > 0");
    int64_t max_len = 0;
    for (const SeqSpan& sp : batch.seqs) max_len = std::max(max_len, sp.len);
    p.spans = spans;
    p.lengths = a.device_lengths;
    p.pages = a.device_pages;
    p.max_pages = a.max_pages;
    p.tiles_per_seq = (max_len * rep + tile_items - 1) / tile_items;
    const bool decode_shaped = max_len * rep <= kAttnTileItems;
    p.pipelined = decode_shaped && HD * elem % 16 == 0;
    p.n_tiles = static_cast<int64_t>(batch.seqs.size()) * p.tiles_per_seq;
    need(p.n_tiles <= INT32_MAX, op, ": too many query tiles in one call");
    if (p.n_tiles == 0) return;
    set_splits(p, a.max_pages * a.page_tokens, decode_shaped);
    launch_kv_append(p, stream());
    launch_attention(p, stream());
    return;
  }
  need(a.cache.size() == batch.seqs.size(), op, ": ", a.cache.size(), " KV caches for ", batch.seqs.size(),
       " sequences");
  std::vector<AttnSeq> seqs(batch.seqs.size());
  std::vector<AttnTile> tiles;
  std::vector<void*> pages;
  int64_t max_keys = 0, max_len = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const KvSequence& c = a.cache[i];
    const SeqSpan& sp = batch.seqs[i];
    const int64_t keys = c.past + sp.len;
    need(c.past >= 0 && static_cast<int64_t>(c.pages.size()) * a.page_tokens >= keys, op, ": sequence ", i, " has ",
         c.pages.size(), " pages of ", a.page_tokens, " rows for ", keys, " positions");
    seqs[i] = {sp.start, sp.len, c.past, static_cast<int64_t>(pages.size())};
    pages.insert(pages.end(), c.pages.begin(), c.pages.end());
    const size_t first_tile = tiles.size();
    for (int64_t it = 0; it < sp.len * rep; it += tile_items) {
      need(it <= INT32_MAX, op, ": sequence ", i, " has too many rows for one call (", sp.len, ")");
      tiles.push_back({static_cast<int32_t>(i), static_cast<int32_t>(it)});
    }
    // The tensor-core kernel's tiles last first (the most keys start first, the short ones fill the tail).
    if (p.mma) std::reverse(tiles.begin() + static_cast<std::ptrdiff_t>(first_tile), tiles.end());
    max_keys = std::max(max_keys, keys);
    max_len = std::max(max_len, sp.len);
  }
  // One tile per sequence (decode steps, short pieces): the block's compute is short against its key loads. The
  // pipelined staging moves 16-byte chunks: rows of whole chunks, pages 16-byte aligned (cudaMalloc'd: 256).
  const bool decode_shaped = max_len * rep <= kAttnTileItems;
  bool aligned = HD * elem % 16 == 0;
  for (void* pg : pages) aligned = aligned && reinterpret_cast<uintptr_t>(pg) % 16 == 0;
  p.pipelined = decode_shaped && aligned;
  p.mma = p.mma && aligned;
  if (!p.mma && tile_items != kAttnTileItems) {  // unaligned pages: the f32 kernel's tiles
    tiles.clear();
    for (size_t i = 0; i < seqs.size(); ++i)
      for (int64_t it = 0; it < batch.seqs[i].len * rep; it += kAttnTileItems)
        tiles.push_back({static_cast<int32_t>(i), static_cast<int32_t>(it)});
  }
  need(tiles.size() <= INT32_MAX, op, ": too many query tiles in one call");
  if (tiles.empty()) return;

  const size_t tiles_at = align(seqs.size() * sizeof(AttnSeq));
  const size_t pages_at = tiles_at + align(tiles.size() * sizeof(AttnTile));
  std::vector<unsigned char> host(pages_at + pages.size() * sizeof(void*));
  std::memcpy(host.data(), seqs.data(), seqs.size() * sizeof(AttnSeq));
  std::memcpy(host.data() + tiles_at, tiles.data(), tiles.size() * sizeof(AttnTile));
  if (!pages.empty()) std::memcpy(host.data() + pages_at, pages.data(), pages.size() * sizeof(void*));
  auto* meta = static_cast<unsigned char*>(grow(Slot::kAttnMeta, host.size()));
  copy_from_host(meta, host.data(), host.size());
  p.seqs = reinterpret_cast<const AttnSeq*>(meta);
  p.tiles = reinterpret_cast<const AttnTile*>(meta + tiles_at);
  p.n_tiles = static_cast<int64_t>(tiles.size());
  p.pages = reinterpret_cast<void* const*>(meta + pages_at);
  set_splits(p, max_keys, decode_shaped);
  launch_kv_append(p, stream());
  launch_attention(p, stream());
}

// Splits the keys (up to max_keys per sequence) over grid.z when the blocks would not fill the GPU twice over
// (decode-shaped calls: kDecodeBlocksPerSm times over, as such a block streams its keys with little compute and an
// SM needs many of them to keep enough loads in flight; prefill-sized calls never split) and the contexts are
// long: at least 256 keys per split (a split costs its partial row and a share of the combine). The partials'
// buffer grows here, so a captured step finds it sized by its eager first run.
constexpr int64_t kDecodeBlocksPerSm = 16;

void CudaBackend::set_splits(AttentionLaunch& p, int64_t max_keys, bool decode_shaped) {
  const int64_t blocks = p.n_tiles * p.n_kv_heads;
  const int64_t target = (decode_shaped ? kDecodeBlocksPerSm : 2) * sm_count_;
  int64_t splits = 1;
  if (blocks < target && max_keys > 512) splits = std::min((target + blocks - 1) / blocks, (max_keys + 255) / 256);
  const int64_t split_keys = ((max_keys + splits - 1) / splits + 31) / 32 * 32;
  splits = (max_keys + split_keys - 1) / split_keys;
  p.n_splits = static_cast<int>(splits);
  p.split_keys = splits > 1 ? split_keys : std::max<int64_t>(max_keys, 1);
  if (splits > 1)
    p.partial = static_cast<float*>(
        grow(Slot::kAttnPartial, static_cast<size_t>(splits * p.T * p.n_heads * (p.head_dim + 2)) * sizeof(float)));
}

void CudaBackend::rope_at_lengths(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                                  const int64_t* device_lengths, const BatchLayout& batch) {
  const char* op = "rope_at_lengths";
  need(n_heads > 0 && head_dim > 0 && rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= head_dim && theta > 0, op,
       ": bad sizes n_heads ", n_heads, ", head_dim ", head_dim, ", rope_dim ", rope_dim, ", theta ", theta,
       " (rope_dim even in [2, head_dim], theta > 0)");
  check_f32_2d(x, "rope_at_lengths: x");
  need(x.dim(1) == n_heads * head_dim, op, ": x ", x.shape_string(), " must be [T, ", n_heads * head_dim, "]");
  need(device_lengths != nullptr, op, ": no device lengths");
  const SeqSpan* spans = device_seqs(batch, INT64_MAX, x.dim(0), op);
  need(n_mapped_tokens_ >= x.dim(0), op, ": the batch maps ", n_mapped_tokens_, " rows, expected ", x.dim(0));
  launch_rope_at_lengths(rows(x), x.dim(0), n_heads, head_dim, rope_dim, theta, spans, token_seq_, device_lengths,
                         stream());
}

void CudaBackend::rope(TensorView x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, double theta,
                       const std::vector<int64_t>& start_positions, const BatchLayout& batch) {
  const char* op = "rope";
  need(n_heads > 0 && head_dim > 0 && rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= head_dim && theta > 0, op,
       ": bad sizes n_heads ", n_heads, ", head_dim ", head_dim, ", rope_dim ", rope_dim, ", theta ", theta,
       " (rope_dim even in [2, head_dim], theta > 0)");
  check_f32_2d(x, "rope: x");
  const int64_t T = x.dim(0), half = rope_dim / 2;
  need(x.dim(1) == n_heads * head_dim, op, ": x ", x.shape_string(), " must be [T, ", n_heads * head_dim, "]");
  need(start_positions.size() == batch.seqs.size(), op, ": ", start_positions.size(), " start positions for ",
       batch.seqs.size(), " sequences");
  std::vector<int64_t> pos(static_cast<size_t>(T), -1);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqSpan& sp = batch.seqs[s];
    need(sp.start >= 0 && sp.len >= 0 && sp.start + sp.len <= T && start_positions[s] >= 0, op, ": sequence ", s,
         " (start ", sp.start, ", len ", sp.len, ", position ", start_positions[s], ") outside ", T, " rows");
    for (int64_t i = 0; i < sp.len; ++i) pos[static_cast<size_t>(sp.start + i)] = start_positions[s] + i;
  }
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(rope_dim));
  const size_t freq_at = align(pos.size() * sizeof(int64_t));
  std::vector<unsigned char> host(freq_at + inv_freq.size() * sizeof(double));
  if (!pos.empty()) std::memcpy(host.data(), pos.data(), pos.size() * sizeof(int64_t));
  std::memcpy(host.data() + freq_at, inv_freq.data(), inv_freq.size() * sizeof(double));
  auto* meta = static_cast<unsigned char*>(grow(Slot::kRopeMeta, host.size()));
  copy_from_host(meta, host.data(), host.size());
  launch_rope(rows(x), T, n_heads, head_dim, rope_dim, reinterpret_cast<const int64_t*>(meta),
              reinterpret_cast<const double*>(meta + freq_at), stream());
}

}  // namespace mambacpp
