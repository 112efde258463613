#include "model/step_pieces.h"

#include <algorithm>

#include "model/decode_step.h"

namespace mambacpp {

namespace {

bool is_short(const Sequence& s) {
  return !s.token_ids.empty() && s.embeddings.ndim == 0 && static_cast<int64_t>(s.token_ids.size()) <= kStepPieceMaxLen;
}

// Dense 16-bit weights: the fast fused decode kernels take them, row by row (a quantized or f32 projection would
// take kernels whose bits depend on the row count).
bool fast_dense(const Weight& w) { return w.empty() || (w.dense() && w.data.dtype != DType::F32); }

}  // namespace

bool step_pieces_one_forward(const Model::Impl& m, std::span<const Sequence> seqs, Output output) {
  const ModelConfig& c = m.config;
  if (m.backend->device() != Device::CUDA) return false;
  if (output != Output::None && output != Output::LastLogits && output != Output::AllLogits) return false;
  if (c.hybrid() || c.moe.n_experts != 0) return false;
  // Mamba-1: its scan loops over each sequence's tokens too (mamba1_scan.cu); FalconMamba's dt/B/C norms (and
  // Jamba's) take another decode recipe, which keeps the successive forwards.
  const bool mamba1 = c.arch == Arch::Mamba1;
  if (c.arch != Arch::Mamba2 && !(mamba1 && c.mixer_rms_eps == 0)) return false;
  if (m.options.precision != Precision::Fast || !m.options.batch_invariant || !m.options.fused_decode) return false;
  int64_t rows = 0;
  bool multi = false;
  for (const Sequence& s : seqs) {
    if (!is_short(s)) return false;
    rows += static_cast<int64_t>(s.token_ids.size());
    multi = multi || s.token_ids.size() > 1;
  }
  if (!multi || rows > std::min<int64_t>(kStepPieceMaxRows, std::max<int64_t>(1, m.options.max_batch_tokens)))
    return false;
  if (!fast_dense(m.weights.lm_head)) return false;
  for (const LayerWeights& w : m.weights.layers) {
    if (!fast_dense(w.in_proj) || !fast_dense(w.out_proj)) return false;
    // Mamba-1's x_proj (a fused_linear of its own) and dt_proj (the pinned GEMM before the scan): row by row.
    if (mamba1 && (!fast_dense(w.x_proj) || !fast_dense(w.dt_proj))) return false;
  }
  return true;
}

bool step_pieces_apply(const Model::Impl& m, std::span<const Sequence> seqs, Output output) {
  if (m.backend->device() != Device::CUDA) return false;
  if (step_pieces_one_forward(m, seqs, output)) return false;  // the decode step takes the call as it is
  if (output != Output::None && output != Output::LastLogits && output != Output::AllLogits) return false;
  std::vector<Sequence> round;  // the first round: one token of every short sequence (the largest round)
  bool multi = false, long_ones = false;
  for (const Sequence& s : seqs) {
    if (!is_short(s)) {
      long_ones = true;
      continue;
    }
    multi = multi || s.token_ids.size() > 1;
    round.push_back(Sequence::tokens(s.token_ids.first(1), s.slot));
  }
  if (round.empty() || (!multi && !long_ones)) return false;  // nothing short, or already a decode step
  return decode_step_applies(m, round, output == Output::None ? Output::None : Output::LastLogits);
}

ForwardResult step_pieces(const Model::Impl& m, std::span<const Sequence> seqs, Output output,
                          const std::vector<TopKRequest>* top_k, const ForwardFn& forward) {
  const int64_t V = m.config.vocab_size;
  const size_t n = seqs.size();
  std::vector<int64_t> first_row(n);  // AllLogits: each sequence's first row in the result
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) first_row[i] = total, total += seqs[i].length();

  ForwardResult result;
  result.cols = output == Output::None || top_k ? 0 : V;
  result.rows = output == Output::None ? 0 : output == Output::LastLogits ? static_cast<int64_t>(n) : total;
  result.values.resize(static_cast<size_t>(result.rows * result.cols));
  if (top_k) result.candidates.resize(n), result.logprobs.resize(n);
  // Row `row` of the call's result <- row `from` of a partial result.
  auto put = [&](ForwardResult& part, int64_t from, size_t seq, int64_t row) {
    if (top_k) {
      result.candidates[seq] = std::move(part.candidates[static_cast<size_t>(from)]);
      result.logprobs[seq] = std::move(part.logprobs[static_cast<size_t>(from)]);
      return;
    }
    std::copy_n(part.values.begin() + from * V, V, result.values.begin() + row * V);
  };

  // The long sequences: the prefill forward, alone.
  std::vector<size_t> long_idx, short_idx;
  for (size_t i = 0; i < n; ++i) (is_short(seqs[i]) ? short_idx : long_idx).push_back(i);
  if (!long_idx.empty()) {
    std::vector<Sequence> sub;
    std::vector<TopKRequest> sub_k;
    for (size_t i : long_idx) {
      sub.push_back(seqs[i]);
      if (top_k) sub_k.push_back((*top_k)[i]);
    }
    ForwardResult part = forward(sub, output, top_k ? &sub_k : nullptr);
    int64_t row = 0;
    for (size_t j = 0; j < long_idx.size(); ++j) {
      const size_t i = long_idx[j];
      const int64_t len = seqs[i].length();
      if (output == Output::LastLogits) {
        put(part, static_cast<int64_t>(j), i, static_cast<int64_t>(i));
      } else if (output == Output::AllLogits) {
        std::copy_n(part.values.begin() + row * V, len * V, result.values.begin() + first_row[i] * V);
      }
      row += len;
    }
  }

  // The short ones: one decode forward of them all where it can (step_pieces_one_forward), else round r is one
  // decode step over token r of every sequence that long.
  std::vector<Sequence> shorts;
  std::vector<TopKRequest> shorts_k;
  for (size_t i : short_idx) {
    shorts.push_back(seqs[i]);
    if (top_k) shorts_k.push_back((*top_k)[i]);
  }
  if (!shorts.empty() && step_pieces_one_forward(m, shorts, output)) {
    ForwardResult part = forward(shorts, output, top_k ? &shorts_k : nullptr);
    int64_t row = 0;
    for (size_t j = 0; j < short_idx.size(); ++j) {
      const size_t i = short_idx[j];
      const int64_t len = seqs[i].length();
      if (output == Output::LastLogits)
        put(part, static_cast<int64_t>(j), i, static_cast<int64_t>(i));
      else if (output == Output::AllLogits)
        std::copy_n(part.values.begin() + row * V, len * V, result.values.begin() + first_row[i] * V);
      row += len;
    }
    return result;
  }
  int64_t rounds = 0;
  for (size_t i : short_idx) rounds = std::max<int64_t>(rounds, seqs[i].length());
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<Sequence> step;
    std::vector<size_t> who;
    std::vector<TopKRequest> step_k;
    bool any_last = false;
    for (size_t i : short_idx) {
      const int64_t len = seqs[i].length();
      if (r >= len) continue;
      step.push_back(Sequence::tokens(seqs[i].token_ids.subspan(static_cast<size_t>(r), 1), seqs[i].slot));
      who.push_back(i);
      if (top_k) step_k.push_back((*top_k)[i]);  // rows that do not end here are computed and dropped
      any_last = any_last || r == len - 1;
    }
    const bool logits = output == Output::AllLogits || (output == Output::LastLogits && any_last);
    ForwardResult part = forward(step, logits ? Output::LastLogits : Output::None, top_k && logits ? &step_k : nullptr);
    if (!logits) continue;
    for (size_t j = 0; j < who.size(); ++j) {
      const size_t i = who[j];
      if (output == Output::AllLogits)
        put(part, static_cast<int64_t>(j), i, first_row[i] + r);
      else if (r == seqs[i].length() - 1)
        put(part, static_cast<int64_t>(j), i, static_cast<int64_t>(i));
    }
  }
  return result;
}

}  // namespace mambacpp
