// Encoding speed of a tokenizer.json on a text file, single thread (docs/tokenizers.md, "Encoding speed"). Built
// with the tests but not run by ctest: timing is a benchmark's business, not a unit test's.
//
//   tokenizer_bench TOKENIZER_JSON TEXT_FILE [--repeat-to BYTES] [--rounds N] [--ids-out FILE]
//
// --repeat-to repeats the text until it has BYTES bytes and cuts it there (dropping a character cut in half), as
// scripts/make_tokenizer_fixtures.py builds its bench text; --ids-out writes the ids as little-endian int32, whose
// sha256 the fixture manifest records for HF's run on the same text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mambacpp/error.h"
#include "mambacpp/tokenizer.h"
#include "tokenizer/utf8.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [--repeat-to BYTES] [--rounds N] [--ids-out FILE]\n",
                 argv[0]);
    return 2;
  }
  size_t repeat_to = 0;
  int rounds = 5;
  std::string ids_out;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--repeat-to") {
      repeat_to = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--ids-out") {
      ids_out = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    auto tok = mambacpp::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) mambacpp::fail("cannot open '", argv[2], "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (repeat_to > 0 && !text.empty()) {
      const std::string once = text;
      while (text.size() < repeat_to) text += once;
      text.resize(repeat_to);
      // Drop a character cut in half at the end.
      while (!text.empty() && mambacpp::tok::first_invalid_utf8(text) != text.size()) text.pop_back();
    }
    double best = 1e30;
    std::vector<int32_t> ids;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      ids = tok->encode(text);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
    }
    std::printf("%zu bytes -> %zu tokens; best of %d: %.4f s = %.3f M tokens/s, %.2f MB/s\n", text.size(), ids.size(),
                rounds, best, ids.size() / best / 1e6, text.size() / best / 1e6);
    if (!ids_out.empty()) {
      std::ofstream out(ids_out, std::ios::binary);
      for (int32_t id : ids) {
        unsigned char b[4] = {static_cast<unsigned char>(id), static_cast<unsigned char>(id >> 8),
                              static_cast<unsigned char>(id >> 16), static_cast<unsigned char>(id >> 24)};
        out.write(reinterpret_cast<const char*>(b), 4);
      }
    }
  } catch (const mambacpp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
