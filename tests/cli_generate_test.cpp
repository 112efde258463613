// `mambacpp generate` and `mambacpp perplexity` through the command line, on the shipped model: the --json contract,
// streaming, batches of prompts, and the errors a user meets first.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct CliResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliResult run(const std::string& args, const test::TempDir& tmp) {
  const std::string err_file = tmp.file("stderr.txt");
  const std::string cmd = std::string(MAMBACPP_BINARY) + " " + args + " 2>" + err_file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  std::ifstream e(err_file);
  std::string err((std::istreambuf_iterator<char>(e)), {});
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err};
}

const std::string kModel = " --device cpu --model " + test::source_dir() + "/models/default ";

TEST(GenerateCommand, JsonHasTheContractedFields) {
  test::TempDir tmp;
  CliResult r = run("generate" + kModel + "-p 'def parse_args(' -n 12 --temp 0 --json", tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json({472, 1794, 64, 577, 9}));
  EXPECT_EQ(j["tokens"].size(), 12u);
  EXPECT_EQ(j["stop_reason"], "length");
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  for (const char* k : {"prompt_ms", "generate_ms", "prompt_tokens_per_s", "generate_tokens_per_s"})
    EXPECT_TRUE(j["timings"].contains(k)) << k;
}

TEST(GenerateCommand, StreamedTextEqualsTheJsonText) {
  test::TempDir tmp;
  CliResult json = run("generate" + kModel + "-p 'import os' -n 40 --temp 0.7 --seed 3 --json", tmp);
  CliResult text = run("generate" + kModel + "-p 'import os' -n 40 --temp 0.7 --seed 3", tmp);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, nlohmann::json::parse(json.out)["text"].get<std::string>() + "\n");
  EXPECT_THAT(text.err, AllOf(HasSubstr("prompt:"), HasSubstr("tokens/s")));
}

TEST(GenerateCommand, PromptsFileGivesEachPromptWhatItGetsAlone) {
  test::TempDir tmp;
  const std::vector<std::string> prompts = {"def main(", "class Config(object):", "x"};
  {
    std::ofstream f(tmp.file("prompts.txt"));
    for (const auto& p : prompts) f << p << "\n";
  }
  CliResult batch = run("generate" + kModel + "--prompts-file " + tmp.file("prompts.txt") + " -n 16 --temp 0.8 --seed 11 --json", tmp);
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  std::istringstream lines(batch.out);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::ofstream(tmp.file("one.txt")) << prompts[i] << "\n";
    CliResult alone = run("generate" + kModel + "--prompts-file " + tmp.file("one.txt") + " -n 16 --temp 0.8 --seed " +
                              std::to_string(11 + i) + " --json", tmp);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(nlohmann::json::parse(line)["tokens"], nlohmann::json::parse(alone.out)["tokens"]) << "prompt " << i;
  }
}

TEST(GenerateCommand, ClearErrors) {
  test::TempDir tmp;
  CliResult r = run("generate" + kModel + "-p 'def f(' --max-prompt 2", tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--max-prompt 2"), HasSubstr("has 3 tokens")));

  r = run("generate" + kModel + "-p x --frobnicate", tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("frobnicate"));

  test::write_random_model(tmp.file("m"), test::tiny_mamba2_config(), 1);  // no tokenizer.json
  r = run("generate --device cpu --model " + tmp.file("m") + " -p hello", tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, AllOf(HasSubstr("no tokenizer.json"), HasSubstr("--tokens-file")));

  r = run("generate --device cpu --model " + tmp.file("nothing") + " -p hello", tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("nothing"));
}

TEST(GenerateCommand, TokenIdsWithoutATokenizer) {
  test::TempDir tmp;
  test::write_random_model(tmp.file("m"), test::tiny_mamba2_config(), 1);
  std::ofstream(tmp.file("ids.txt")) << "1 2 3";
  CliResult r = run("generate --device cpu --model " + tmp.file("m") + " --tokens-file " + tmp.file("ids.txt") +
                        " -n 5 --temp 0 --json",
                    tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"].size(), 5u);
  EXPECT_EQ(j["text"], "");
}

}  // namespace
}  // namespace mambacpp
