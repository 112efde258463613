// The BPE model of tokenizer.json: a vocabulary (token string -> id) and ranked merges. One word (already in the
// byte-level alphabet) becomes ids by repeatedly merging the adjacent pair of lowest rank, leftmost first, which
// is the order HF tokenizers' Word::merge_all applies.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace mambacpp::tok {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens of their UTF-8 bytes when all exist
  bool ignore_merges = false;  // a word that is itself in the vocabulary is taken whole
  // Word-piece style markers: every character but a word's first is looked up with the prefix in front, its last
  // with the suffix behind (and a merge's right part loses the prefix when the two join).
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // merges: (left, right) token strings in rank order. Throws Error (prefixed with `where`) when a merge names a
  // token missing from the vocabulary, or its concatenation is missing.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options, const std::string& where);

  // Appends the ids of one word, given as alphabet characters (UTF-8).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t char_pair_key(char32_t a, char32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // A long word (a SentencePiece-style text with no pre-tokenizer is one word) cut where no merge can ever join
  // the two sides, so that the pieces go through the cache: see bpe_model.cpp.
  bool tokenize_in_pieces(std::string_view word, std::vector<int32_t>& out) const;
  // The BPE of one word, through the cache.
  void tokenize_word(std::string_view word, std::vector<int32_t>& out) const;
  // The initial symbols of a word (one per character, or unk / byte-fallback replacements).
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge_all(std::vector<int32_t>& symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and id of the merged token
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  std::vector<int32_t> byte_fallback_ids_;  // <0xNN> ids, or -1; empty unless byte_fallback
  // Id of each one-character token below U+0400 (covers the byte-level alphabet), or -1: avoids hashing a string
  // per character for the common case.
  std::vector<int32_t> small_char_ids_;
  bool markers_ = false;  // a prefix or suffix is set, so characters are looked up with it
  // (last character of a merge's left part, first character of its right part) for every merge: two adjacent
  // characters not listed here are never inside one token.
  std::unordered_set<uint64_t> joinable_;

  // Words seen before -> their ids. Bounded: once full, new words are computed but not stored.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace mambacpp::tok
