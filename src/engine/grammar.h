// GBNF grammars (llama.cpp's grammar format) compiled to byte-level rules, and a matcher that follows every way the
// text so far can continue.
//
// A grammar is rules `name ::= alternatives`; an alternative is a sequence of "literals" (escapes \n \r \t \\ \"
// \xHH \uHHHH \UHHHHHHHH), character classes [a-z] / [^"\\], `.` (any character), rule names and ( groups ), each
// optionally followed by *, +, ?, {m}, {m,} or {m,n}; `#` starts a comment. `root` is where the text starts.
//
// Compiled form: characters become bytes. A class of code points becomes alternatives of UTF-8 byte sequences, each
// element a set of bytes, so that the matcher, and a vocabulary walk over token bytes, advance one byte at a time
// and a token may end inside a character. Groups and repetitions become rules of their own; a repetition is
// right-recursive, and the matcher drops a rule's frame when it reaches the rule's last element (a tail call), so
// long repetitions do not deepen the stacks.
//
// The matcher holds a set of stacks, each one way of reading the text so far; a stack's top is the byte set the next
// byte must be in, the frames below are where each enclosing rule continues. Stacks are persistent linked lists
// interned in an arena (equal stacks share one id), so advancing by a byte allocates at most a few nodes and
// duplicate readings merge.
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mambacpp {

struct GrammarLimits {
  size_t max_source_bytes = size_t{1} << 20;
  int max_nesting = 128;          // nested groups while parsing
  size_t max_elements = 1 << 20;  // compiled elements (repetition counts multiply)
  size_t max_stacks = 4096;       // ways of reading the text kept at once (an ambiguous grammar stops here)
};

class Grammar {
 public:
  // The compiled elements: one flat array; each alternative is a run of elements ending with End.
  enum class Kind : uint8_t { Bytes, Rule, End };
  struct Element {
    Kind kind = Kind::End;
    uint32_t value = 0;  // Bytes: index into byte_sets(); Rule: rule id
  };

  // Parses and compiles `source`. Throws Error "grammar line L, column C: ..." for a syntax error, an undefined
  // rule (naming it), a missing root, left recursion (naming the rule) or a limit passed.
  static std::shared_ptr<const Grammar> parse(std::string_view source, const GrammarLimits& limits = {});

  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<std::bitset<256>>& byte_sets() const { return byte_sets_; }
  // Start positions (into elements()) of rule r's alternatives.
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  uint32_t root() const { return root_; }
  const GrammarLimits& limits() const { return limits_; }

 private:
  friend class GrammarCompiler;
  std::vector<Element> elements_;
  std::vector<std::bitset<256>> byte_sets_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
  GrammarLimits limits_;
};

// Where a grammar's text stands: the set of stacks, over an arena of stack nodes that only grows as text is accepted.
class GrammarMatcher {
 public:
  using StackId = uint32_t;
  static constexpr StackId kAccepted = 0;  // the empty stack: root is complete

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Advances by the bytes; false (and nothing changed) when the grammar rejects them. Throws Error when the
  // reading becomes more ambiguous than GrammarLimits::max_stacks.
  bool accept(std::string_view bytes);
  bool accepting() const;  // the text so far is a complete sentence of the grammar
  const std::vector<StackId>& stacks() const { return stacks_; }

  // The low-level steps the vocabulary walk uses: the stacks after one byte (empty: rejected), and the bytes any of
  // `stacks` can take next.
  void advance(const std::vector<StackId>& stacks, uint8_t byte, std::vector<StackId>& out);
  std::bitset<256> next_bytes(const std::vector<StackId>& stacks) const;
  // Arena nodes made after mark() are dropped by release(mark) (the walk's scratch stacks); `stacks()` must not
  // refer to them.
  size_t mark() const { return nodes_.size(); }
  void release(size_t mark);
  const Grammar& grammar() const { return *grammar_; }

 private:
  struct Node {
    uint32_t pos;    // element to match next (a Bytes element once expanded)
    StackId parent;  // where the enclosing rule continues; kAccepted at the bottom
  };
  StackId intern(uint32_t pos, StackId parent);
  // Adds to `out` the terminal stacks (top is Bytes, or kAccepted) that (pos, parent) expands to.
  void expand(uint32_t pos, StackId parent, std::vector<StackId>& out, int depth);
  static void normalize(std::vector<StackId>& stacks);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, StackId> index_;
  std::vector<StackId> stacks_;
};

}  // namespace mambacpp
