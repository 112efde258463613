// Tensor parallelism's arithmetic: which part of every layer each of N ranks owns (the plan), and the slices of a
// layer's weights a rank holds (the shards). Sharded as mamba_ssm's and vLLM's tensor-parallel layers are:
// - Mamba-2: in_proj column-parallel by heads and groups (a rank's z, x and dt for its heads, its groups' B and C;
//   a rank owns whole groups and the heads of its groups), conv1d, A_log, D, dt_bias and the gated norm's weight for
//   its channels and heads, out_proj row-parallel (each rank's output is a partial sum, summed by one all-reduce).
//   One group (n_groups = 1) is replicated on every rank, as vLLM does. A gated norm over the whole d_inner (one
//   norm group: mamba2-2.7b's, Granite-4.0-H's, Bamba's) takes the all-reduced sum of squares of every rank's
//   channels; other norm groups must lie within a rank.
// - Mamba-1: d_inner channels split (in_proj x and z rows, conv1d, A_log, D, dt_proj rows); x_proj and out_proj are
//   row-parallel (two partial sums per layer).
// - Attention by KV heads (query heads follow their KV head), o_proj row-parallel. With fewer KV heads than ranks
//   (MQA, small GQA), each KV head is replicated on N / n_kv_heads ranks that split its query heads (vLLM's rule).
// - MLPs column-parallel (up and gate rows) then row-parallel (down columns). MoE by expert: every rank routes over
//   all experts (the router replicated) and runs the chosen experts it holds; the shared expert as an MLP.
// - Embeddings and lm_head vocab-parallel over the vocabulary padded to a multiple of kVocabPadPerRank per rank: a
//   rank embeds the tokens of its rows (zeros elsewhere; summed) and computes its rows' logits (gathered).
// A row-parallel projection's bias belongs to rank 0 alone, so that the sum over ranks adds it once.
// Pure arithmetic on host memory: the NCCL runtime (docs/tensor_parallel.md) and the simulated forward
// (tests/support/tensor_parallel_reference.h) consume it.
#pragma once

#include <cstdint>
#include <vector>

#include "mambacpp/config.h"
#include "model/weights.h"

namespace mambacpp {

// Vocabulary rows per rank are a multiple of this (vLLM's padding), so every rank's lm_head slice has equal rows.
constexpr int64_t kVocabPadPerRank = 64;

struct TpRange {
  int64_t begin = 0, count = 0;
  int64_t end() const { return begin + count; }
  bool operator==(const TpRange&) const = default;
};

// What one rank owns, as ranges of the full model's indices.
struct TpRankPlan {
  int64_t rank = 0;
  TpRange heads;     // Mamba-2 heads of [0, n_heads)
  TpRange groups;    // Mamba-2 groups of [0, n_groups) ([0, 1) on every rank when the one group is replicated)
  TpRange channels;  // d_inner channels (Mamba-2: heads * head_dim; Mamba-1: its split of d_inner)
  TpRange kv_heads;  // attention KV heads of [0, n_kv_heads) (one, shared with other ranks, when replicated)
  TpRange q_heads;   // attention query heads: those of its KV heads
  TpRange mlp;       // intermediate channels of [0, mlp_size)
  TpRange experts;   // routed experts of [0, moe.n_experts)
  TpRange shared;    // the MoE shared expert's channels of [0, moe.shared_size)
  TpRange vocab;     // rows of the padded vocabulary; those past vocab_size are padding (zero rows)
};

struct TpPlan {
  int64_t n_ranks = 1;
  int64_t padded_vocab = 0;          // n_ranks * rows per rank >= vocab_size
  bool groups_replicated = false;    // n_groups = 1 held whole by every rank
  bool kv_heads_replicated = false;  // n_kv_heads < n_ranks: each rank holds one KV head and some of its query heads
  // The Mamba-2 gated norm is one group over the whole d_inner, split across ranks: each rank normalises its
  // channels of y * silu(z) by the root mean square of the whole row, from the per-row sums of squares all-reduced
  // over the ranks (one more all-reduce of T floats per Mamba-2 layer, as vLLM's Mixer2RMSNormGated). rank_config's
  // gated norm (one group of the rank's channels) is then not the layer's: the rank runs the norm itself.
  bool norm_all_reduce = false;
  std::vector<TpRankPlan> ranks;

  // The config one rank's layers run with: the Mamba heads, groups and channels, attention heads (one KV head when
  // replicated), MLP and shared-expert widths divided by n_ranks (d_model, vocab_size, moe.n_experts, the layer
  // pattern and everything else unchanged).
  ModelConfig rank_config(const ModelConfig& full) const;
};

// The plan for `n_ranks` ranks, or an Error naming the config field, what was expected and what was found (a head,
// group, channel or expert count the ranks do not divide; gated norm groups, more than one, spanning ranks).
TpPlan plan_tensor_parallel(const ModelConfig& c, int64_t n_ranks);

// One rank's slice of a layer: LayerWeights of the rank's shapes, as views into host memory the shard owns (the
// full weights may go after slicing). The full weights must be host memory (the CPU backend's, or a checkpoint's).
// Dense weights are sliced by elements; block formats by whole blocks (a column range that splits a block is an
// error naming the tensor).
struct LayerShard {
  LayerWeights w;
  std::vector<std::vector<char>> storage;

  // Move-only: w's views point into storage's buffers (which a move keeps, and a copy would not).
  LayerShard() = default;
  LayerShard(LayerShard&&) = default;
  LayerShard& operator=(LayerShard&&) = default;
  LayerShard(const LayerShard&) = delete;
  LayerShard& operator=(const LayerShard&) = delete;
};
LayerShard shard_layer(const ModelConfig& c, const TpPlan& plan, int64_t rank, int64_t layer, const LayerWeights& full);

// The rank's rows of the padded vocabulary of an [vocab, d_model] embedding or lm_head (any format), padding rows
// zero.
struct VocabShard {
  Weight w;  // [plan.ranks[rank].vocab.count, d_model]
  std::vector<char> storage;

  VocabShard() = default;  // move-only, as LayerShard
  VocabShard(VocabShard&&) = default;
  VocabShard& operator=(VocabShard&&) = default;
  VocabShard(const VocabShard&) = delete;
  VocabShard& operator=(const VocabShard&) = delete;
};
VocabShard shard_vocab(const ModelConfig& c, const TpPlan& plan, int64_t rank, const Weight& full, const char* what);

}  // namespace mambacpp
