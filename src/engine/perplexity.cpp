// Perplexity: feed windows of the text through the model (AllLogits, in pieces that carry the state) and sum
// -log p(next token) in double.
#include "mambacpp/perplexity.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/state.h"

namespace mambacpp {

double token_nll(std::span<const float> logits, int32_t target) {
  MAMBACPP_ASSERT(target >= 0 && static_cast<size_t>(target) < logits.size());
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return max + std::log(sum) - static_cast<double>(logits[static_cast<size_t>(target)]);
}

void log_softmax(std::span<const float> logits, std::span<double> out) {
  MAMBACPP_ASSERT(out.size() == logits.size());
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t vocab = model.config().vocab_size;
  if (n < 2) fail("perplexity: need at least 2 tokens (the first is never predicted), found ", n);
  if (options.context < 0 || options.context == 1)
    fail("perplexity: context must be 0 (whole text) or >= 2 tokens, found ", options.context);
  if (options.batch_tokens < 1) fail("perplexity: batch_tokens must be >= 1, found ", options.batch_tokens);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      fail("perplexity: token ", tokens[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")");

  // Windows [begin, end); a last window of one token predicts nothing and is dropped.
  const int64_t window = options.context == 0 ? n : options.context;
  struct Span { int64_t begin, end; };
  std::vector<Span> windows;
  for (int64_t b = 0; b < n; b += window)
    if (std::min(n, b + window) - b >= 2) windows.push_back({b, std::min(n, b + window)});
  const int64_t total = windows.back().end - windows.front().begin;

  // Each call feeds `piece` tokens of up to `parallel` windows, one slot each: at most batch_tokens rows of logits.
  const int64_t piece = std::min(window, options.batch_tokens);
  const int64_t parallel = std::max<int64_t>(1, options.batch_tokens / piece);
  const int64_t n_slots = std::min<int64_t>(parallel, static_cast<int64_t>(windows.size()));
  std::unique_ptr<StateCache> state = model.create_state(n_slots, options.state_dtype);

  double nll_sum = 0.0;
  int64_t predicted = 0;
  int64_t done = 0;
  std::vector<Sequence> seqs;
  for (size_t first = 0; first < windows.size(); first += static_cast<size_t>(state->n_slots())) {
    const size_t last = std::min(windows.size(), first + static_cast<size_t>(state->n_slots()));
    state->reset_all();
    const int64_t longest = windows[first].end - windows[first].begin;  // windows only shrink at the very end
    for (int64_t off = 0; off < longest; off += piece) {
      seqs.clear();
      std::vector<Span> fed;  // global positions fed in this call, in the order of the logits rows
      for (size_t w = first; w < last; ++w) {
        const int64_t b = windows[w].begin + off;
        const int64_t e = std::min(windows[w].end, b + piece);
        if (b >= e) continue;
        seqs.push_back(Sequence::tokens(tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)),
                                        static_cast<int64_t>(w - first)));
        fed.push_back({b, e});
      }
      const ForwardResult out = model.forward(*state, seqs, Output::AllLogits);
      int64_t row = 0;
      for (size_t k = 0; k < fed.size(); ++k) {
        const int64_t window_end = windows[first + (seqs[k].slot)].end;
        for (int64_t pos = fed[k].begin; pos < fed[k].end; ++pos, ++row) {
          if (pos + 1 >= window_end) continue;  // the window's last position predicts nothing inside it
          nll_sum += token_nll(out.row(row), tokens[static_cast<size_t>(pos + 1)]);
          if (options.on_logits) options.on_logits(pos, out.row(row));
          ++predicted;
        }
        done += fed[k].end - fed[k].begin;
      }
      MAMBACPP_ASSERT(row == out.rows);
      if (options.on_progress) options.on_progress(done, total);
    }
  }
  MAMBACPP_ASSERT(predicted == total - static_cast<int64_t>(windows.size()));
  PerplexityResult r;
  r.n_predicted = predicted;
  r.nll = nll_sum / static_cast<double>(predicted);
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace mambacpp
