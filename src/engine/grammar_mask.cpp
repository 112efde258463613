// The vocabulary trie and the per-step token mask (grammar_mask.h).
#include "engine/grammar_mask.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"

namespace mambacpp {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes)
    : bytes_(token_bytes), vocab_(static_cast<int64_t>(token_bytes.size())) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty()) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string& x = bytes_[static_cast<size_t>(a)];
    const std::string& y = bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  nodes_.emplace_back();
  build(0, ids.begin(), ids.end(), 0);
}

// [lo, hi): sorted ids sharing the node's prefix of `depth` bytes. Those that end here come first.
void TokenTrie::build(uint32_t node, std::vector<int32_t>::iterator lo, std::vector<int32_t>::iterator hi,
                      size_t depth) {
  const auto len = [&](int32_t id) { return bytes_[static_cast<size_t>(id)].size(); };
  const auto at = [&](int32_t id) { return static_cast<uint8_t>(bytes_[static_cast<size_t>(id)][depth]); };
  nodes_[node].first_token = static_cast<uint32_t>(tokens_.size());
  while (lo != hi && len(*lo) == depth) tokens_.push_back(*lo++);
  nodes_[node].n_tokens = static_cast<uint32_t>(tokens_.size()) - nodes_[node].first_token;
  std::vector<std::pair<std::vector<int32_t>::iterator, std::vector<int32_t>::iterator>> groups;
  for (auto it = lo; it != hi;) {
    auto end = it;
    while (end != hi && at(*end) == at(*it)) ++end;
    groups.emplace_back(it, end);
    it = end;
  }
  const uint32_t first = static_cast<uint32_t>(nodes_.size());
  nodes_[node].first_child = first;
  nodes_[node].n_children = static_cast<uint32_t>(groups.size());
  for (const auto& g : groups) {
    Node child;
    child.byte = at(*g.first);
    nodes_.push_back(child);
  }
  for (size_t i = 0; i < groups.size(); ++i)
    build(first + static_cast<uint32_t>(i), groups[i].first, groups[i].second, depth + 1);
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tokenizer, int64_t limit) {
  std::vector<std::string> bytes(static_cast<size_t>(limit));
  for (int64_t id = 0; id < limit; ++id)
    if (!tokenizer.is_special(static_cast<int32_t>(id)))
      bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(static_cast<int32_t>(id));
  return std::make_shared<const TokenTrie>(bytes);
}

namespace {

// The walk over the trie. Stack sets are interned too: many prefixes lead to the same set (inside a JSON string,
// every ordinary character does), so advancing a set by a byte is computed once per walk and then looked up.
struct Walk {
  static constexpr uint32_t kRejected = UINT32_MAX;
  GrammarMatcher& m;
  const TokenTrie& trie;
  std::vector<uint8_t>& allowed;
  std::vector<std::vector<GrammarMatcher::StackId>> sets;  // set id -> its stacks
  std::vector<std::bitset<256>> next;                      // set id -> the bytes it can take
  std::unordered_map<std::string, uint32_t> set_ids;
  std::unordered_map<uint64_t, uint32_t> step;  // (set id, byte) -> set id or kRejected
  std::vector<GrammarMatcher::StackId> scratch;

  uint32_t intern(const std::vector<GrammarMatcher::StackId>& stacks) {
    std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(GrammarMatcher::StackId));
    const auto [it, added] = set_ids.try_emplace(std::move(key), static_cast<uint32_t>(sets.size()));
    if (added) sets.push_back(stacks), next.push_back(m.next_bytes(stacks));
    return it->second;
  }

  uint32_t advance(uint32_t set, uint8_t byte) {
    const uint64_t key = (uint64_t{set} << 8) | byte;
    const auto found = step.find(key);
    if (found != step.end()) return found->second;
    m.advance(sets[set], byte, scratch);
    const uint32_t out = scratch.empty() ? kRejected : intern(scratch);
    step.emplace(key, out);
    return out;
  }

  void visit(uint32_t node, uint32_t set) {
    const TokenTrie::Node& n = trie.nodes()[node];
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      const TokenTrie::Node& child = trie.nodes()[c];
      if (!next[set].test(child.byte)) continue;
      const uint32_t after = advance(set, child.byte);
      if (after == kRejected) continue;
      for (uint32_t t = child.first_token; t < child.first_token + child.n_tokens; ++t)
        allowed[static_cast<size_t>(trie.tokens()[t])] = 1;
      if (child.n_children > 0) visit(c, after);
    }
  }
};

}  // namespace

void allowed_tokens(GrammarMatcher& matcher, const TokenTrie& trie, std::vector<uint8_t>& allowed) {
  allowed.assign(static_cast<size_t>(trie.vocab()), 0);
  const size_t mark = matcher.mark();
  try {
    Walk w{matcher, trie, allowed, {}, {}, {}, {}, {}};
    w.visit(0, w.intern(matcher.stacks()));
  } catch (...) {
    matcher.release(mark);
    throw;
  }
  matcher.release(mark);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie)
    : matcher_(std::move(grammar)), trie_(std::move(trie)) {}

void TokenConstraint::mask(std::span<float> row, const std::set<int32_t>& stop_tokens) {
  allowed_tokens(matcher_, *trie_, allowed_);
  const bool complete = matcher_.accepting();
  for (int32_t s : stop_tokens)
    if (s >= 0 && static_cast<size_t>(s) < allowed_.size()) allowed_[static_cast<size_t>(s)] = complete;
  bool any = false;
  const size_t n = std::min(row.size(), allowed_.size());
  for (size_t i = 0; i < n; ++i) {
    if (!allowed_[i])
      row[i] = -std::numeric_limits<float>::infinity();
    else
      any = any || row[i] != -std::numeric_limits<float>::infinity();
  }
  for (size_t i = n; i < row.size(); ++i) row[i] = -std::numeric_limits<float>::infinity();
  if (!any)
    fail(complete ? "grammar: the text is complete but no stop token can end it (ignore_eos without stop tokens?)"
                  : "grammar: no token of the vocabulary can continue the text the grammar requires");
}

void TokenConstraint::accept(int32_t token) {
  if (token < 0 || token >= trie_->vocab() || trie_->bytes(token).empty() || !matcher_.accept(trie_->bytes(token)))
    fail("grammar: token ", token, " does not continue the text the grammar allows");
}

}  // namespace mambacpp
