#include "engine/request_rules.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/speculative.h"
#include "mambacpp/error.h"
#include "mambacpp/grammar.h"

namespace mambacpp {

void validate_request(const GenerateRequest& r, const RequestLimits& lim) {
  if (r.prompt.empty()) {
    if (lim.bos_token_id >= 0)
      fail("request: the prompt is empty; Mamba needs at least one token to start from (use the BOS token ",
           lim.bos_token_id, " as the prompt)");
    fail("request: the prompt is empty; Mamba needs at least one token to start from (use a BOS token as the "
         "prompt)");
  }
  if (static_cast<int64_t>(r.prompt.size()) > lim.max_prompt)
    fail("request: the prompt has ", r.prompt.size(), " tokens, more than the limit of ", lim.max_prompt,
         " (--max-prompt)");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= lim.vocab)
      fail("request: prompt token ", i, " is ", r.prompt[i], ", outside the vocabulary [0, ", lim.vocab, ")");
  if (r.max_new_tokens < 0 || r.max_new_tokens > lim.max_new_tokens)
    fail("request: max_new_tokens must be in [0, ", lim.max_new_tokens, "], found ", r.max_new_tokens);
  if (r.logprobs < -1 || r.logprobs > kMaxLogprobs)
    fail("request: logprobs must be in [0, ", kMaxLogprobs, "] (or -1 for none), found ", r.logprobs);
  if (!r.stop_strings.empty() && !lim.has_tokenizer)
    fail("request: stop strings need a tokenizer to turn tokens into text (this model has none); use stop "
         "tokens instead");
  for (const std::string& s : r.stop_strings)
    if (s.empty()) fail("request: a stop string is empty");
  for (int32_t t : r.stop_tokens)
    if (t < 0 || t >= lim.vocab) fail("request: stop token ", t, " outside the vocabulary [0, ", lim.vocab, ")");
  r.sampling.validate();
  const SpeculativeParams& sp = r.speculative;
  if (sp.draft_ngram < 0 || sp.draft_ngram > kMaxDraftNgram)
    fail("request: draft_ngram must be in [0, ", kMaxDraftNgram, "] (0: no prompt lookup), found ", sp.draft_ngram);
  if (sp.draft_max < 0 || sp.draft_max > kMaxDraftTokens)
    fail("request: draft_max must be in [0, ", kMaxDraftTokens, "] (0: the default ", kDefaultDraftMax,
         "), found ", sp.draft_max);
  if (sp.draft_model && sp.draft_ngram > 0)
    fail("request: drafts come from the draft model or from prompt lookup (draft_ngram), not both");
  if (sp.draft_model && !lim.has_draft_model)
    fail("request: draft_model asks for the engine's draft model, but none was loaded (--draft-model DIR)");
  if (sp.draft_mtp && (sp.draft_model || sp.draft_ngram > 0))
    fail("request: drafts come from one source: draft_mtp (the model's MTP block), draft_model or draft_ngram");
  if (sp.draft_mtp && !lim.has_draft_mtp)
    fail("request: draft_mtp asks for the model's multi-token-prediction block, but the engine did not load it "
         "(--draft-mtp)");
  if (!r.grammar.empty()) {
    if (!lim.has_tokenizer)
      fail("request: a grammar needs a tokenizer to know each token's bytes (this model has none)");
    check_grammar(r.grammar);
  }
}

size_t stop_prefix_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

size_t find_stop(std::string_view text, size_t from, const std::vector<std::string>& stops) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stops) best = std::min(best, text.find(s, from));
  return best;
}

void host_logprobs(std::span<const float> row, int n, GeneratedToken& tok) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : row) mx = std::max(mx, v);
  float sum = 0.0f;
  for (float v : row) sum += std::exp(v - mx);
  const float lse = mx + std::log(sum);
  tok.logprob = row[static_cast<size_t>(tok.id)] - lse;
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t k = std::min(ids.size(), static_cast<size_t>(n));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
    return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)] ||
           (row[static_cast<size_t>(a)] == row[static_cast<size_t>(b)] && a < b);
  });
  for (size_t j = 0; j < k; ++j) tok.top.push_back({ids[j], row[static_cast<size_t>(ids[j])] - lse});
}

}  // namespace mambacpp
