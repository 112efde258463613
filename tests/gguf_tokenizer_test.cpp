// The tokenizer from a GGUF file's vocabulary: `quantize` writes the shipped model's tokenizer.json as llama.cpp's
// gpt2 vocabulary, and the tokenizer built back from the file encodes and decodes a text exactly as the
// tokenizer.json does (llama.cpp's own tokenization of the same file agrees too: docs/gguf.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/gguf_file.h"
#include "mambacpp/gguf.h"
#include "mambacpp/model_tokenizer.h"
#include "mambacpp/tokenizer.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(GgufTokenizer, EncodesAsTheTokenizerJsonItWasWrittenFrom) {
  const fs::path d = fs::temp_directory_path() / "mambacpp_gguf_tokenizer_test";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string model = test::source_dir() + "/models/default";
  const std::string out = (d / "m.gguf").string();
  quantize_to_gguf(model, "q8_0", out);
  GgufFile f(out);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  auto from_json = Tokenizer::load(model + "/tokenizer.json");
  auto from_gguf = load_model_tokenizer(out);
  ASSERT_NE(from_gguf, nullptr);
  const std::string text = read_text(test::source_dir() + "/fixtures/heldout.txt");
  ASSERT_GT(text.size(), 10000u);
  const std::vector<int32_t> a = from_json->encode(text), b = from_gguf->encode(text);
  EXPECT_EQ(a, b);
  EXPECT_EQ(from_gguf->decode(b), from_json->decode(a));
  for (const char* s : {"Hello, world!  <|endoftext|> 123 ümlaut 日本語\n\n\tend", " leading space", ""})
    EXPECT_EQ(from_gguf->encode(s), from_json->encode(s)) << s;
  // Written again from the GGUF (its tokenizer.* keys copied), the vocabulary is the same.
  quantize_to_gguf(out, "f16", (d / "m2.gguf").string());
  EXPECT_EQ(load_model_tokenizer((d / "m2.gguf").string())->encode(text), a);
  fs::remove_all(d);
}

TEST(GgufTokenizer, AFileWithoutAVocabularyHasNoTokenizer) {
  const fs::path d = fs::temp_directory_path() / "mambacpp_gguf_tokenizer_test2";
  fs::remove_all(d);
  test::write_random_model((d / "m").string(), test::tiny_mamba2_config(), 1);
  quantize_to_gguf((d / "m").string(), "f32", (d / "m.gguf").string());
  EXPECT_EQ(load_model_tokenizer((d / "m.gguf").string()), nullptr);
  EXPECT_EQ(load_model_tokenizer((d / "m").string()), nullptr);  // a directory without tokenizer.json
  fs::remove_all(d);
}

}  // namespace
}  // namespace mambacpp
