// BPE merging of one word (see bpe_model.h).
#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  merges_.reserve(merges.size());
  const std::string& prefix = options_.continuing_subword_prefix;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // Named references, not a structured binding: clang 14 cannot capture bindings in the lambda below.
    const std::string& left = merges[rank].first;
    const std::string& right = merges[rank].second;
    if (right.compare(0, prefix.size(), prefix) != 0) {
      fail(where, ".merges[", rank, "] (\"", left, " ", right, "\"): the right part does not start with the ",
           "continuing_subword_prefix '", prefix, "'");
    }
    auto a = vocab_.find(left), b = vocab_.find(right), m = vocab_.find(left + right.substr(prefix.size()));
    auto missing = [&](const std::string& what) {
      fail(where, ".merges[", rank, "] (\"", left, " ", right, "\"): ", what, " is not in the vocab");
    };
    if (a == vocab_.end()) missing("'" + left + "'");
    if (b == vocab_.end()) missing("'" + right + "'");
    if (m == vocab_.end()) missing("the merged token '" + left + right.substr(prefix.size()) + "'");
    // A repeated pair keeps its later rank, as a map filled in file order would.
    merges_[pair_key(a->second, b->second)] = Merge{static_cast<int32_t>(rank), m->second};
    // The two characters that meet when this merge joins its parts.
    if (!left.empty() && right.size() > prefix.size()) {
      size_t l = prev_code_point_start(left, left.size()), r = prefix.size();
      joinable_.insert(char_pair_key(next_code_point(left, l), next_code_point(right, r)));
    }
  }
  small_char_ids_.assign(0x400, -1);
  markers_ = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  for (const auto& [token, id] : vocab_) {
    size_t i = 0;
    if (token.empty() || first_invalid_utf8(token) != token.size()) continue;
    char32_t cp = next_code_point(token, i);
    if (i == token.size() && cp < small_char_ids_.size()) small_char_ids_[cp] = id;
  }
  // An unk token missing from the vocab is only an error once an unknown character needs it (as in HF).
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  if (options_.byte_fallback) {
    byte_fallback_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab_.find(name);
      if (it != vocab_.end()) byte_fallback_ids_[b] = it->second;
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  // An unknown character leaves a pending unk symbol that is written out when the next known character arrives
  // (or at the end), exactly where the HF model writes it. With fuse_unk a run of unknown characters shares one
  // pending unk; byte-fallback pieces do not end the run. Without an unk token unknown characters vanish, as in HF.
  bool unk_pending = false;
  std::string ch;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    char32_t cp = next_code_point(word, i);
    int32_t id = !markers_ && cp < small_char_ids_.size() ? small_char_ids_[cp] : -1;
    if (id < 0) {
      ch.clear();
      if (start > 0) ch += options_.continuing_subword_prefix;
      ch.append(word.substr(start, i - start));
      if (i == word.size()) ch += options_.end_of_word_suffix;
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (unk_pending) symbols.push_back(*unk_id_);
      unk_pending = false;
      symbols.push_back(id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_found = true;
      for (char c : ch) all_found = all_found && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_found) {
        for (char c : ch) symbols.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (options_.unk_token) {
      if (!unk_id_) fail("tokenizer: unk_token '", *options_.unk_token, "' is needed but is not in the vocab");
      if (unk_pending && !options_.fuse_unk) symbols.push_back(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) symbols.push_back(*unk_id_);
}

void BpeModel::merge_all(std::vector<int32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  // Doubly linked list over the symbols; a merged-away symbol gets alive=false.
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    // priority_queue pops the largest: invert so that the lowest rank, then the lowest position, comes first.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate> queue;
  auto push_pair = [&](int left) {
    int right = next[left];
    if (right < 0) return;
    auto it = merges_.find(pair_key(ids[left], ids[right]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    // Stale entries: the left symbol was merged away, has no right neighbour any more, or changed so that the
    // pair now merges into something else.
    if (!alive[top.pos]) continue;
    int right = next[top.pos];
    if (right < 0) continue;
    auto it = merges_.find(pair_key(ids[top.pos], ids[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    ids[top.pos] = top.new_id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) push_pair(prev[top.pos]);
    push_pair(top.pos);
  }
  int w = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) ids[w++] = ids[i];
  }
  ids.resize(static_cast<size_t>(w));
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes && tokenize_in_pieces(word, out)) return;
  tokenize_word(word, out);
}

// Between two adjacent characters a and b that are both vocabulary tokens, the symbol on the left always ends
// with a and the one on the right starts with b, so only a merge whose parts meet as (a, b) could ever join them.
// Where no merge does, the word can be cut: the merges on either side never interact, and the ids are the same
// as for the whole word. Characters without a token of their own are never cut at, so that unk fusion and byte
// fallback see the same runs. Markers (prefix/suffix) depend on the word's ends, so such models are not cut.
bool BpeModel::tokenize_in_pieces(std::string_view word, std::vector<int32_t>& out) const {
  if (markers_) return false;
  auto known = [&](std::string_view ch, char32_t cp) {
    if (cp < small_char_ids_.size() && small_char_ids_[cp] >= 0) return true;
    return vocab_.find(std::string(ch)) != vocab_.end();
  };
  size_t piece_start = 0, i = 0;
  char32_t prev = 0;
  bool prev_known = false;
  bool cut_any = false;
  while (i < word.size()) {
    size_t start = i;
    char32_t cp = next_code_point(word, i);
    bool is_known = known(word.substr(start, i - start), cp);
    if (start > 0 && prev_known && is_known && !joinable_.count(char_pair_key(prev, cp))) {
      tokenize_word(word.substr(piece_start, start - piece_start), out);
      piece_start = start;
      cut_any = true;
    }
    prev = cp;
    prev_known = is_known;
  }
  if (!cut_any) return false;
  tokenize_word(word.substr(piece_start), out);
  return true;
}

void BpeModel::tokenize_word(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, ids);
  merge_all(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace mambacpp::tok
