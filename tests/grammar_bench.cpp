// The cost of a grammar's token mask per generated token (docs/perf-log/json-mode-2026-12-07.md): the shipped
// model's vocabulary in the trie, the matcher at every token boundary of a JSON text as the tokenizer splits it,
// allowed_tokens() timed there (plus the advance by the token), for json_object and for a JSON schema.
//   grammar_bench [MODEL_DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/grammar.h"
#include "engine/grammar_mask.h"
#include "mambacpp/grammar.h"
#include "mambacpp/tokenizer.h"

using namespace mambacpp;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : MAMBACPP_SOURCE_DIR "/models/default";
  const auto tok = Tokenizer::load(dir + "/tokenizer.json");
  const auto t0 = std::chrono::steady_clock::now();
  const auto trie = TokenTrie::from_tokenizer(*tok, tok->vocab_size());
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("vocabulary %lld tokens, trie %zu nodes, built in %.1f ms\n", static_cast<long long>(tok->vocab_size()),
              trie->nodes().size(), build_ms);
  const std::string text =
      "{\"name\": \"Ada Lovelace\", \"age\": 36, \"languages\": [\"English\", \"French\"], \"active\": true, "
      "\"score\": -12.5e2, \"notes\": \"wrote the first program \\u00e9\\n\", \"id\": 123456}";
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
    "languages":{"type":"array","items":{"type":"string"}},"active":{"type":"boolean"},"score":{"type":"number"},
    "notes":{"type":"string"},"id":{"type":"integer"}},"required":["name","age"],"additionalProperties":false})";
  const std::vector<int32_t> ids = tok->encode(text, false);
  std::printf("%-12s %8s %10s %10s %10s %10s\n", "grammar", "tokens", "mean_us", "p50_us", "max_us", "allowed_avg");
  for (const auto& [name, gbnf] :
       {std::pair<std::string, std::string>{"json_object", json_object_grammar()},
        std::pair<std::string, std::string>{"json_schema", json_schema_to_grammar(schema)}}) {
    for (int rep = 0; rep < 2; ++rep) {  // the first pass warms caches; the second is reported
      TokenConstraint c(Grammar::parse(gbnf), trie);
      std::vector<double> us;
      std::vector<float> row(static_cast<size_t>(tok->vocab_size()), 0.0f);
      double allowed = 0;
      for (int32_t id : ids) {
        std::fill(row.begin(), row.end(), 0.0f);
        const auto a = std::chrono::steady_clock::now();
        c.mask(row, {0});
        c.accept(id);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
        allowed += static_cast<double>(std::count(row.begin(), row.end(), 0.0f));
      }
      if (rep == 0) continue;
      std::vector<double> sorted = us;
      std::sort(sorted.begin(), sorted.end());
      double sum = 0;
      for (double u : us) sum += u;
      std::printf("%-12s %8zu %10.1f %10.1f %10.1f %10.0f\n", name.c_str(), us.size(), sum / us.size(),
                  sorted[sorted.size() / 2], sorted.back(), allowed / us.size());
    }
  }
}
