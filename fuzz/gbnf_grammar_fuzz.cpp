// The GBNF grammar parser and matcher (src/engine/grammar.h): any text is parsed as a grammar and, when it parses,
// the matcher reads a few texts byte by byte (the input itself, JSON, UTF-8) through it. Any input is a grammar or a
// mambacpp::Error; a crash, a sanitizer report, a hang or another exception is a bug.
#include <string>

#include "engine/grammar.h"
#include "fuzz_target.h"

MAMBACPP_FUZZ_TARGET(gbnf_grammar) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  mambacpp::GrammarLimits limits;
  limits.max_elements = 1 << 16;  // small budgets: a huge repetition is refused quickly
  limits.max_stacks = 256;
  const auto grammar = mambacpp::Grammar::parse(source, limits);
  for (const std::string& text : {source, std::string("{\"a\": [1, true, null, \"\xC3\xA9\"]}"), std::string("yes."),
                                  std::string("\xF0\x9F\x98\x80 abc 123")}) {
    mambacpp::GrammarMatcher m(grammar);
    for (size_t i = 0; i < text.size() && i < 512; ++i) {
      const bool was_accepting = m.accepting();
      if (!m.accept(text.substr(i, 1))) break;
      MAMBACPP_FUZZ_CHECK(!m.stacks().empty());
      (void)was_accepting;
    }
  }
}
