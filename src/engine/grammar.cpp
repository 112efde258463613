// GBNF parsing, compilation to byte-level rules, and the stack-set matcher (grammar.h).
#include "engine/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

#include "mambacpp/error.h"
#include "tokenizer/utf8.h"

namespace mambacpp {

namespace {

using Elements = std::vector<Grammar::Element>;

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct CodeRange {
  uint32_t lo, hi;
};

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// The UTF-8 encodings of the code points [lo, hi] (no surrogates, one encoded length) as sequences of byte ranges:
// each sequence's i-th byte lies in its i-th range, and the sequences cover exactly the range's encodings.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  const auto length = [](uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; };
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = length(lo);
  // Split until, for every trailing byte, lo's and hi's encodings either agree on the bytes before it or span the
  // whole continuation range: then the product of per-byte ranges is exactly the set.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  tok::append_utf8(a, lo);
  tok::append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i) seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  out.push_back(std::move(seq));
}

}  // namespace

// Parses GBNF text into Grammar's rules (generated rules for groups, repetitions and non-ASCII classes).
class GrammarCompiler {
 public:
  GrammarCompiler(std::string_view src, const GrammarLimits& limits) : src_(src), limits_(limits) {}

  std::shared_ptr<const Grammar> run() {
    if (src_.size() > limits_.max_source_bytes)
      fail("grammar: the text is ", src_.size(), " bytes, more than the limit of ", limits_.max_source_bytes);
    skip_space();
    if (at_end()) error("the grammar is empty; expected rules such as 'root ::= \"yes\" | \"no\"'");
    while (!at_end()) {
      const size_t name_pos = pos_;
      const std::string name = parse_name();
      skip_space();
      if (src_.substr(pos_, 3) != "::=") error("expected '::=' after the rule name '" + name + "'");
      pos_ += 3;
      const uint32_t id = rule_id(name, name_pos);
      if (defined_[id]) error_at(name_pos, "the rule '" + name + "' is defined twice");
      defined_[id] = true;
      alts_[id] = parse_alternatives(0);
      skip_space();
    }
    for (uint32_t r = 0; r < names_.size(); ++r)
      if (!defined_[r]) error_at(first_use_[r], "the rule '" + names_[r] + "' is used but never defined");
    const auto root = ids_.find("root");
    if (root == ids_.end()) fail("grammar: no rule named 'root' (where the text starts)");
    check_left_recursion();

    auto g = std::make_shared<Grammar>();
    g->limits_ = limits_;
    g->byte_sets_ = std::move(sets_);
    g->rule_names_ = names_;
    g->root_ = root->second;
    g->rules_.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r) {
      for (const Elements& alt : alts_[r]) {
        g->rules_[r].push_back(static_cast<uint32_t>(g->elements_.size()));
        g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
        g->elements_.push_back({Grammar::Kind::End, 0});
      }
    }
    return g;
  }

 private:
  using Alternatives = std::vector<Elements>;

  // ---- Errors and position --------------------------------------------------------------------------------------
  [[noreturn]] void error_at(size_t pos, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < src_.size(); ++i) {
      if (src_[i] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    fail("grammar line ", line, ", column ", col, ": ", what);
  }
  [[noreturn]] void error(const std::string& what) const { error_at(pos_, what); }
  bool at_end() const { return pos_ >= src_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0'; }

  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  // ---- Rules ----------------------------------------------------------------------------------------------------
  uint32_t rule_id(const std::string& name, size_t used_at) {
    const auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    return new_rule(name, used_at);
  }
  uint32_t new_rule(const std::string& name, size_t used_at) {
    const uint32_t id = static_cast<uint32_t>(names_.size());
    ids_[name] = id;
    names_.push_back(name);
    alts_.emplace_back();
    defined_.push_back(false);
    first_use_.push_back(used_at);
    return id;
  }
  // A rule made by the compiler (a group, a repetition, a class with non-ASCII members).
  uint32_t generated_rule(Alternatives alts) {
    const uint32_t id = new_rule("(generated " + std::to_string(names_.size()) + ")", pos_);
    defined_[id] = true;
    count(alts);
    alts_[id] = std::move(alts);
    return id;
  }
  void count(const Alternatives& alts) {
    for (const Elements& a : alts) n_elements_ += a.size() + 1;
    if (n_elements_ > limits_.max_elements)
      error("the grammar compiles to more than " + std::to_string(limits_.max_elements) +
            " elements (repetition counts multiply; use * or + instead of large {m,n})");
  }
  Grammar::Element byte_set(const std::bitset<256>& set) {
    const auto it = set_ids_.find(set.to_string());
    if (it != set_ids_.end()) return {Grammar::Kind::Bytes, it->second};
    const uint32_t id = static_cast<uint32_t>(sets_.size());
    sets_.push_back(set);
    set_ids_[set.to_string()] = id;
    return {Grammar::Kind::Bytes, id};
  }
  Grammar::Element single_byte(uint8_t b) {
    std::bitset<256> s;
    s.set(b);
    return byte_set(s);
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_word_char(peek())) ++pos_;
    if (pos_ == start) error("expected a rule name (letters, digits, '-' or '_')");
    return std::string(src_.substr(start, pos_ - start));
  }

  // Whether the text at pos_ starts the next rule: `name ::=`.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < src_.size() && is_word_char(src_[p])) ++p;
    if (p == pos_) return false;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r')) ++p;
    return src_.substr(p, 3) == "::=";
  }

  Alternatives parse_alternatives(int depth) {
    if (depth > limits_.max_nesting) error("groups nested deeper than " + std::to_string(limits_.max_nesting));
    Alternatives alts;
    alts.push_back(parse_sequence(depth));
    skip_space();
    while (peek() == '|') {
      ++pos_;
      alts.push_back(parse_sequence(depth));
      skip_space();
    }
    count(alts);
    return alts;
  }

  Elements parse_sequence(int depth) {
    Elements seq;
    for (;;) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) return seq;
      const size_t item_pos = pos_;
      Elements item = parse_item(depth);
      skip_space();
      item = parse_repetition(std::move(item), item_pos);
      seq.insert(seq.end(), item.begin(), item.end());
    }
  }

  Elements parse_item(int depth) {
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return class_elements({{0, kMaxCodePoint}});
    }
    if (c == '(') {
      const size_t open = pos_++;
      Alternatives alts = parse_alternatives(depth + 1);
      skip_space();
      if (peek() != ')') error_at(open, "this '(' is never closed");
      ++pos_;
      if (alts.size() == 1) return alts[0];
      return {{Grammar::Kind::Rule, generated_rule(std::move(alts))}};
    }
    if (is_word_char(c)) {
      const size_t at = pos_;
      return {{Grammar::Kind::Rule, rule_id(parse_name(), at)}};
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') error(std::string("'") + c + "' repeats nothing");
    error(std::string("unexpected character '") + c + "'");
  }

  // One character of a literal or class: a UTF-8 sequence or an escape.
  uint32_t parse_char() {
    if (at_end()) error("unexpected end of the grammar");
    const auto byte = [&] { return static_cast<uint8_t>(src_[pos_]); };
    if (peek() == '\\') {
      const size_t esc = pos_++;
      if (at_end()) error_at(esc, "an escape at the end of the grammar");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint8_t>(e);
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int i = 0; i < digits; ++i) {
            const char h = peek();
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0) error_at(esc, std::string("\\") + e + " needs " + std::to_string(digits) + " hex digits");
            v = v * 16 + static_cast<uint32_t>(d);
            ++pos_;
          }
          if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
            error_at(esc, "the escape is not a Unicode scalar value");
          return v;
        }
        default:
          error_at(esc, std::string("unknown escape '\\") + e + "'");
      }
    }
    const uint8_t b0 = byte();
    const int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > src_.size()) error("invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < n; ++i) {
      const uint8_t b = static_cast<uint8_t>(src_[pos_ + static_cast<size_t>(i)]);
      if ((b & 0xC0) != 0x80) error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += static_cast<size_t>(n);
    return cp;
  }

  Elements parse_literal() {
    const size_t open = pos_++;
    std::string bytes;
    for (;;) {
      if (at_end()) error_at(open, "this string literal is never closed");
      if (peek() == '"') break;
      if (peek() == '\n') error_at(open, "a string literal ends at the end of its line; escape newlines as \\n");
      tok::append_utf8(bytes, parse_char());
    }
    ++pos_;
    Elements out;
    for (char c : bytes) out.push_back(single_byte(static_cast<uint8_t>(c)));
    return out;
  }

  Elements parse_class() {
    const size_t open = pos_++;
    bool negated = false;
    if (peek() == '^') negated = true, ++pos_;
    std::vector<CodeRange> ranges;
    for (;;) {
      if (at_end()) error_at(open, "this character class is never closed");
      if (peek() == ']') break;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("a class range whose end comes before its start");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (negated) ranges = complement(std::move(ranges));
    if (ranges.empty()) error_at(open, "this character class matches no character");
    return class_elements(std::move(ranges));
  }

  static std::vector<CodeRange> complement(std::vector<CodeRange> ranges) {
    std::sort(ranges.begin(), ranges.end(), [](CodeRange a, CodeRange b) { return a.lo < b.lo; });
    std::vector<CodeRange> out;
    uint32_t next = 0;
    for (const CodeRange& r : ranges) {
      if (r.lo > next) out.push_back({next, r.lo - 1});
      next = std::max(next, r.hi + 1);
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
  }

  // A class of code points as elements: one byte set when every member is ASCII, else a rule whose alternatives
  // are UTF-8 byte-range sequences (surrogates excluded).
  Elements class_elements(std::vector<CodeRange> ranges) {
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (const CodeRange& r : ranges) {
      if (r.hi < 0xD800 || r.lo > 0xDFFF) {
        utf8_sequences(r.lo, r.hi, seqs);
      } else {
        if (r.lo < 0xD800) utf8_sequences(r.lo, 0xD7FF, seqs);
        if (r.hi > 0xDFFF) utf8_sequences(0xE000, r.hi, seqs);
      }
    }
    std::bitset<256> ascii;
    Alternatives alts;
    for (const auto& seq : seqs) {
      if (seq.size() == 1) {
        for (int b = seq[0].first; b <= seq[0].second; ++b) ascii.set(static_cast<size_t>(b));
        continue;
      }
      Elements alt;
      for (const auto& [lo, hi] : seq) {
        std::bitset<256> s;
        for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
        alt.push_back(byte_set(s));
      }
      alts.push_back(std::move(alt));
    }
    if (ascii.any()) alts.insert(alts.begin(), Elements{byte_set(ascii)});
    if (alts.size() == 1) return alts[0];
    return {{Grammar::Kind::Rule, generated_rule(std::move(alts))}};
  }

  size_t parse_count() {
    const size_t start = pos_;
    size_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<size_t>(peek() - '0');
      if (v > limits_.max_elements) error("a repetition count above " + std::to_string(limits_.max_elements));
      ++pos_;
    }
    if (pos_ == start) error("expected a number in the repetition {m,n}");
    return v;
  }

  Elements parse_repetition(Elements item, size_t item_pos) {
    const char c = peek();
    size_t min = 0, max = 0;
    bool unbounded = false;
    if (c == '*') {
      ++pos_, unbounded = true;
    } else if (c == '+') {
      ++pos_, min = 1, unbounded = true;
    } else if (c == '?') {
      ++pos_, max = 1;
    } else if (c == '{') {
      ++pos_;
      skip_space();
      min = max = parse_count();
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
        if (peek() == '}')
          unbounded = true;
        else
          max = parse_count();
        skip_space();
      }
      if (peek() != '}') error("expected '}' to close the repetition {m,n}");
      ++pos_;
      if (!unbounded && max < min) error_at(item_pos, "a repetition {m,n} with n < m");
    } else {
      return item;
    }
    if (item.empty()) error_at(item_pos, "a repetition of an empty group");
    Elements out;
    for (size_t i = 0; i < min; ++i) {
      out.insert(out.end(), item.begin(), item.end());
      n_elements_ += item.size();
      if (n_elements_ > limits_.max_elements) count({});
    }
    if (unbounded) {  // R ::= item R | ε
      const uint32_t r = generated_rule({});
      Elements loop = item;
      loop.push_back({Grammar::Kind::Rule, r});
      alts_[r] = {loop, {}};
      count(alts_[r]);
      out.push_back({Grammar::Kind::Rule, r});
    } else if (max > min) {  // O_1 ::= item O_2 | ε ... O_k ::= item | ε
      uint32_t inner = 0;
      bool have_inner = false;
      for (size_t k = 0; k < max - min; ++k) {
        Elements alt = item;
        if (have_inner) alt.push_back({Grammar::Kind::Rule, inner});
        inner = generated_rule({alt, {}});
        have_inner = true;
      }
      out.push_back({Grammar::Kind::Rule, inner});
    }
    return out;
  }

  // ---- Left recursion -------------------------------------------------------------------------------------------
  // A rule that can reach itself without consuming a byte would make the matcher expand forever.
  void check_left_recursion() {
    const size_t n = alts_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Elements& alt : alts_[r]) {
          bool all = true;
          for (const Grammar::Element& e : alt)
            if (e.kind == Grammar::Kind::Bytes || !nullable[e.value]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Rules each rule can start with (through nullable prefixes).
    std::vector<std::vector<uint32_t>> starts(n);
    for (size_t r = 0; r < n; ++r)
      for (const Elements& alt : alts_[r])
        for (const Grammar::Element& e : alt) {
          if (e.kind == Grammar::Kind::Bytes) break;
          starts[r].push_back(e.value);
          if (!nullable[e.value]) break;
        }
    // Depth-first search for a cycle.
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (size_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{static_cast<uint32_t>(s), 0}};
      color[s] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i == starts[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t next = starts[r][i++];
        if (color[next] == 1) {
          std::string name = names_[next];
          for (const auto& [p, unused] : path)
            if (names_[p].rfind("(generated", 0) != 0) name = names_[p];
          fail("grammar: the rule '", name,
               "' is left-recursive (it can reach itself before matching any "
               "character); rewrite it with repetition, e.g. 'list ::= item (\",\" item)*'");
        }
        if (color[next] == 0) color[next] = 1, path.emplace_back(next, 0);
      }
    }
  }

  std::string_view src_;
  GrammarLimits limits_;
  size_t pos_ = 0;
  size_t n_elements_ = 0;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<Alternatives> alts_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::vector<std::bitset<256>> sets_;
  std::map<std::string, uint32_t> set_ids_;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view source, const GrammarLimits& limits) {
  return GrammarCompiler(source, limits).run();
}

// ---- The matcher --------------------------------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  nodes_.push_back({0, 0});  // kAccepted
  for (uint32_t alt : grammar_->alternatives(grammar_->root())) expand(alt, kAccepted, stacks_, 0);
  normalize(stacks_);
}

GrammarMatcher::StackId GrammarMatcher::intern(uint32_t pos, StackId parent) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  const auto [it, added] = index_.try_emplace(key, static_cast<StackId>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarMatcher::expand(uint32_t pos, StackId parent, std::vector<StackId>& out, int depth) {
  if (depth > 10000) fail("grammar: the text nests deeper than 10000 rules");
  const std::vector<Grammar::Element>& el = grammar_->elements();
  const Grammar::Element& e = el[pos];
  switch (e.kind) {
    case Grammar::Kind::Bytes:
      out.push_back(intern(pos, parent));
      break;
    case Grammar::Kind::End:
      if (parent == kAccepted) {
        out.push_back(kAccepted);
      } else {
        const Node p = nodes_[parent];
        expand(p.pos, p.parent, out, depth + 1);
      }
      break;
    case Grammar::Kind::Rule: {
      // A rule in last position returns straight to the parent (a tail call): repetitions stay shallow.
      const StackId cont = el[pos + 1].kind == Grammar::Kind::End ? parent : intern(pos + 1, parent);
      for (uint32_t alt : grammar_->alternatives(e.value)) expand(alt, cont, out, depth + 1);
      break;
    }
  }
  if (out.size() > grammar_->limits().max_stacks) normalize(out);  // duplicates do not count
  if (out.size() > grammar_->limits().max_stacks)
    fail("grammar: the text has more than ", grammar_->limits().max_stacks,
         " readings at once; the grammar is too ambiguous");
}

void GrammarMatcher::normalize(std::vector<StackId>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

void GrammarMatcher::advance(const std::vector<StackId>& stacks, uint8_t byte, std::vector<StackId>& out) {
  out.clear();
  const auto& el = grammar_->elements();
  const auto& sets = grammar_->byte_sets();
  for (StackId s : stacks) {
    if (s == kAccepted) continue;
    const Node n = nodes_[s];
    if (!sets[el[n.pos].value].test(byte)) continue;
    expand(n.pos + 1, n.parent, out, 0);
  }
  normalize(out);
}

std::bitset<256> GrammarMatcher::next_bytes(const std::vector<StackId>& stacks) const {
  std::bitset<256> bytes;
  const auto& el = grammar_->elements();
  for (StackId s : stacks)
    if (s != kAccepted) bytes |= grammar_->byte_sets()[el[nodes_[s].pos].value];
  return bytes;
}

bool GrammarMatcher::accept(std::string_view bytes) {
  std::vector<StackId> cur = stacks_, next;
  for (char c : bytes) {
    advance(cur, static_cast<uint8_t>(c), next);
    if (next.empty()) return false;
    cur.swap(next);
  }
  stacks_ = std::move(cur);
  return true;
}

bool GrammarMatcher::accepting() const {
  return !stacks_.empty() && stacks_.front() == kAccepted;  // sorted: kAccepted (0) comes first
}

void GrammarMatcher::release(size_t mark) {
  for (size_t i = mark; i < nodes_.size(); ++i) index_.erase((uint64_t{nodes_[i].pos} << 32) | nodes_[i].parent);
  nodes_.resize(std::max<size_t>(mark, 1));
}

}  // namespace mambacpp
