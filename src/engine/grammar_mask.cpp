// The vocabulary trie and the per-step token mask (grammar_mask.h).
#include "engine/grammar_mask.h"

#include <algorithm>
#include <limits>

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
    if (!tokenizer.is_special(static_cast<int32_t>(id))) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(static_cast<int32_t>(id));
  return std::make_shared<const TokenTrie>(bytes);
}

namespace {

struct Walk {
  GrammarMatcher& m;
  const TokenTrie& trie;
  std::vector<uint8_t>& allowed;
  std::vector<std::vector<GrammarMatcher::StackId>> level;  // the stacks after each depth's byte

  void visit(uint32_t node, size_t depth) {
    const TokenTrie::Node& n = trie.nodes()[node];
    if (level.size() <= depth + 1) level.resize(depth + 2);
    const std::bitset<256> next = m.next_bytes(level[depth]);
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      const TokenTrie::Node& child = trie.nodes()[c];
      if (!next.test(child.byte)) continue;
      m.advance(level[depth], child.byte, level[depth + 1]);
      if (level[depth + 1].empty()) continue;
      for (uint32_t t = child.first_token; t < child.first_token + child.n_tokens; ++t)
        allowed[static_cast<size_t>(trie.tokens()[t])] = 1;
      if (child.n_children > 0) visit(c, depth + 1);
    }
  }
};

}  // namespace

void allowed_tokens(GrammarMatcher& matcher, const TokenTrie& trie, std::vector<uint8_t>& allowed) {
  allowed.assign(static_cast<size_t>(trie.vocab()), 0);
  const size_t mark = matcher.mark();
  Walk w{matcher, trie, allowed, {}};
  w.level.resize(1);
  w.level[0] = matcher.stacks();
  try {
    w.visit(0, 0);
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
    if (!allowed_[i]) row[i] = -std::numeric_limits<float>::infinity();
    else any = any || row[i] != -std::numeric_limits<float>::infinity();
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
