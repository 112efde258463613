// Which tokens of a vocabulary a grammar allows next: the tokens' bytes in a trie, walked once per step with the
// matcher's stacks. Tokens sharing a prefix share its bytes' work, and a branch ends at the first byte the grammar
// rejects, so a step costs the allowed prefixes, not V full checks.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/grammar.h"

namespace mambacpp {

class Tokenizer;

class TokenTrie {
 public:
  // token_bytes[id]: the bytes of token id; empty ones are never allowed (special tokens are passed as empty).
  explicit TokenTrie(const std::vector<std::string>& token_bytes);
  // The ids below `limit` of `tokenizer`, its special tokens left out.
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tokenizer, int64_t limit);

  struct Node {
    uint32_t first_child = 0, n_children = 0;  // children are contiguous in nodes(), by byte ascending
    uint32_t first_token = 0, n_tokens = 0;    // ids whose bytes end here: tokens()[first_token, +n_tokens)
    uint8_t byte = 0;                          // the byte that leads here from the parent
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes()[0] is the root (the empty prefix)
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t vocab() const { return vocab_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }

 private:
  void build(uint32_t node, std::vector<int32_t>::iterator lo, std::vector<int32_t>::iterator hi, size_t depth);
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  std::vector<std::string> bytes_;
  int64_t vocab_ = 0;
};

// allowed[id] = 1 for every token whose bytes the matcher can take from where it stands, else 0 (resized to the
// trie's vocabulary). The matcher's stacks do not change.
void allowed_tokens(GrammarMatcher& matcher, const TokenTrie& trie, std::vector<uint8_t>& allowed);

// A request's grammar as the engine applies it: mask a row of logits, then advance by the sampled token.
class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);
  // Sets to -inf every logit of `row` whose token the grammar rejects; the stop tokens keep theirs only where the
  // grammar is complete. Throws Error when nothing is left to sample.
  void mask(std::span<float> row, const std::set<int32_t>& stop_tokens);
  // Advances by a generated token (not a stop token). Throws Error when the grammar rejects it (a token sampled
  // from a masked row never is).
  void accept(int32_t token);
  bool complete() const { return matcher_.accepting(); }

 private:
  GrammarMatcher matcher_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<uint8_t> allowed_;
};

}  // namespace mambacpp
