// SentencePiece-style encode/decode of a GGUF "llama" vocabulary, as llama.cpp does it (see spm_tokenizer.h).
#include "tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp::tok {

namespace {

constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// The byte length of a UTF-8 sequence from its first byte (the text was validated before).
size_t utf8_len(unsigned char lead) {
  static const uint8_t lengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lengths[lead >> 4];
}

struct Symbol {
  size_t start = 0, n = 0;  // bytes of the text; n == 0 once merged into its left neighbour
  int prev = -1, next = -1;
};

struct Bigram {
  int left, right;
  float score;
  size_t size;
};

// llama.cpp's order: highest score first, then the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab vocab, const std::string& source) : v_(std::move(vocab)), source_(source) {
  const size_t n = v_.tokens.size();
  if (n == 0) fail(source_, ": the vocabulary has no tokens");
  if (n > (size_t(1) << 22)) fail(source_, ": ", n, " tokens; at most 2^22 are supported");
  if (!v_.scores.empty() && v_.scores.size() != n)
    fail(source_, ": tokenizer.ggml.scores has ", v_.scores.size(), " entries for ", n, " tokens");
  if (!v_.token_types.empty() && v_.token_types.size() != n)
    fail(source_, ": tokenizer.ggml.token_type has ", v_.token_types.size(), " entries for ", n, " tokens");
  if (v_.scores.empty()) v_.scores.assign(n, 0.0f);
  // A NaN score would break the merge queue's ordering; a file cannot mean anything by it.
  for (size_t i = 0; i < n; ++i)
    if (std::isnan(v_.scores[i])) fail(source_, ": tokenizer.ggml.scores[", i, "] is NaN");
  if (v_.token_types.empty()) v_.token_types.assign(n, kNormal);
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp renames empty tokens so that every text names one token; it refuses a vocabulary that repeats one.
    if (v_.tokens[i].empty()) v_.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
    if (!ids_.emplace(v_.tokens[i], static_cast<int32_t>(i)).second)
      fail(source_, ": token ", i, " (\"", v_.tokens[i], "\") repeats token ", ids_[v_.tokens[i]],
           "; a SentencePiece vocabulary holds each text once");
    const int64_t t = v_.token_types[i];
    if (t == kControl || t == kUserDefined || t == kUnknown) specials_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(specials_.begin(), specials_.end(), [this](int32_t a, int32_t b) {
    return v_.tokens[static_cast<size_t>(a)].size() > v_.tokens[static_cast<size_t>(b)].size();
  });
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
    int32_t id = find(name);
    if (id < 0) id = find(std::string(1, static_cast<char>(b)));  // llama.cpp's second choice: the byte itself
    byte_ids_[b] = id;
  }
  for (int64_t* id : {&v_.bos_id, &v_.eos_id, &v_.unk_id})
    if (*id >= static_cast<int64_t>(n)) *id = -1;
}

int32_t SpmTokenizer::find(std::string_view text) const {
  const auto it = ids_.find(std::string(text));
  return it == ids_.end() ? -1 : it->second;
}

void SpmTokenizer::encode_fragment(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  for (size_t off = 0; off < text.size();) {
    Symbol s;
    s.start = off;
    s.n = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    off += s.n;
    s.prev = static_cast<int>(symbols.size()) - 1;
    s.next = off == text.size() ? -1 : static_cast<int>(symbols.size()) + 1;
    symbols.push_back(s);
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = find(std::string_view(text).substr(symbols[left].start, size));
    if (id < 0) return;
    queue.push(Bigram{left, right, v_.scores[static_cast<size_t>(id)], size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // one side was merged since: stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = std::string_view(text).substr(symbols[i].start, symbols[i].n);
    // A merged symbol is always a token (merges only form tokens); a lone character may not be one.
    if (const int32_t id = find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char byte : piece) {
      int32_t id = byte_ids_[byte];
      if (id < 0) id = static_cast<int32_t>(v_.unk_id);
      if (id < 0)
        fail(source_, ": the character \"", std::string(piece), "\" is no token, the vocabulary has no byte token <0x",
             "0123456789ABCDEF"[byte >> 4], "0123456789ABCDEF"[byte & 15], "> and no unknown token");
      out.push_back(id);
    }
  }
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text) const {
  const size_t bad = first_invalid_utf8(text);
  if (bad != text.size()) fail("tokenizer: encode input is not valid UTF-8 (byte offset ", bad, ")");
  // 1. Fragments: text, or a special token cut out of it (each special token over every text fragment, longest
  // token first, as llama.cpp partitions).
  struct Fragment {
    int32_t id;  // -1: text
    size_t begin, end;
  };
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t special : specials_) {
    const std::string& s = v_.tokens[static_cast<size_t>(special)];
    bool found = false;
    for (const Fragment& f : fragments)
      if (f.id < 0 && text.substr(f.begin, f.end - f.begin).find(s) != std::string_view::npos) found = true;
    if (!found) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (pos < f.end) {
        const size_t m = text.substr(0, f.end).find(s, pos);
        if (m == std::string_view::npos) break;
        if (m > pos) next.push_back({-1, pos, m});
        next.push_back({special, m, m + s.size()});
        pos = m + s.size();
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    fragments.swap(next);
  }
  // 2-4. Each text fragment, with a space before it where it starts the text or follows a special token.
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  bool prev_special = true;
  std::string escaped;
  for (const Fragment& f : fragments) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      prev_special = true;
      continue;
    }
    escaped.clear();
    if (v_.add_space_prefix && prev_special) escaped += kSpaceMark;
    for (char c : text.substr(f.begin, f.end - f.begin)) {
      if (c == ' ') escaped += kSpaceMark;
      else escaped += c;
    }
    encode_fragment(escaped, ids);
    prev_special = false;
  }
  return ids;
}

PostProcessing SpmTokenizer::post_processing() const {
  PostProcessing p;
  if (v_.add_bos && v_.bos_id >= 0) p.before.push_back(static_cast<int32_t>(v_.bos_id));
  if (v_.add_eos && v_.eos_id >= 0) p.after.push_back(static_cast<int32_t>(v_.eos_id));
  return p;
}

std::string SpmTokenizer::piece(int32_t id, bool skip_special) const {
  if (id < 0 || static_cast<size_t>(id) >= v_.tokens.size()) return {};
  const std::string& text = v_.tokens[static_cast<size_t>(id)];
  switch (v_.token_types[static_cast<size_t>(id)]) {
    case kControl:
    case kUnknown:
      return skip_special ? std::string() : text;
    case kUserDefined:
      return text;
    case kNormal: {
      std::string out;
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
          out += ' ';
          i += kSpaceMark.size();
        } else {
          out += text[i++];
        }
      }
      return out;
    }
    case kByte: {
      // "<0xNN>"; llama.cpp's fallback byte tokens are the byte itself. Anything else decodes to nothing.
      auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' && hex(text[3]) >= 0 && hex(text[4]) >= 0)
        return std::string(1, static_cast<char>(hex(text[3]) * 16 + hex(text[4])));
      return text.size() == 1 ? text : std::string();
    }
    default:
      return {};  // unused and undefined types decode to nothing, as in llama.cpp
  }
}

std::string SpmTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  // llama.cpp's detokenize: with skip_special a leading BOS (trailing EOS) added by post-processing goes, and then
  // the first token keeps its space (it was not added by step 2); otherwise the first token loses one leading space.
  size_t begin = 0, end = ids.size();
  bool remove_space = v_.add_space_prefix;
  if (skip_special && v_.add_bos && end > 0 && ids[0] == v_.bos_id) {
    remove_space = false;
    begin = 1;
  }
  if (skip_special && v_.add_eos && end > begin && ids[end - 1] == v_.eos_id) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    std::string p = piece(ids[i], skip_special);
    if (remove_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
    remove_space = false;
    out += p;
  }
  return out;
}

std::string SpmTokenizer::token_bytes(int32_t id) const { return piece(id, /*skip_special=*/false); }

std::optional<int32_t> SpmTokenizer::token_to_id(std::string_view token) const {
  const int32_t id = find(token);
  if (id < 0) return std::nullopt;
  return id;
}

bool SpmTokenizer::is_special(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= v_.token_types.size()) return false;
  const int64_t t = v_.token_types[static_cast<size_t>(id)];
  return t == kControl || t == kUnknown;
}

}  // namespace mambacpp::tok
