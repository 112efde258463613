// `mambacpp generate` and `mambacpp perplexity` through the command line, on the shipped model: the --json contract,
// streaming, batches of prompts, and the errors a user meets first.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using test::CliResult;

const std::string kModel = " --device cpu --model " + test::source_dir() + "/models/default ";

TEST(GenerateCommand, JsonHasTheContractedFields) {
  CliResult r = test::run_cli("generate" + kModel + "-p 'def parse_args(' -n 12 --temp 0 --json");
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
  CliResult json = test::run_cli("generate" + kModel + "-p 'import os' -n 40 --temp 0.7 --seed 3 --json");
  CliResult text = test::run_cli("generate" + kModel + "-p 'import os' -n 40 --temp 0.7 --seed 3");
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
  CliResult batch = test::run_cli("generate" + kModel + "--prompts-file " + tmp.file("prompts.txt") + " -n 16 --temp 0.8 --seed 11 --json");
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  std::istringstream lines(batch.out);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::ofstream(tmp.file("one.txt")) << prompts[i] << "\n";
    CliResult alone = test::run_cli("generate" + kModel + "--prompts-file " + tmp.file("one.txt") + " -n 16 --temp 0.8 --seed " +
                              std::to_string(11 + i) + " --json");
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(nlohmann::json::parse(line)["tokens"], nlohmann::json::parse(alone.out)["tokens"]) << "prompt " << i;
  }
}

TEST(GenerateCommand, ClearErrors) {
  test::TempDir tmp;
  CliResult r = test::run_cli("generate" + kModel + "-p 'def f(' --max-prompt 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--max-prompt 2"), HasSubstr("has 3 tokens")));

  r = test::run_cli("generate" + kModel + "-p x --frobnicate");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("frobnicate"));

  test::write_random_model(tmp.file("m"), test::tiny_mamba2_config(), 1);  // no tokenizer.json
  r = test::run_cli("generate --device cpu --model " + tmp.file("m") + " -p hello");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, AllOf(HasSubstr("has no tokenizer (tokenizer.json"), HasSubstr("--tokens-file")));

  r = test::run_cli("generate --device cpu --model " + tmp.file("nothing") + " -p hello");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("nothing"));
}

TEST(GenerateCommand, TokenIdsWithoutATokenizer) {
  test::TempDir tmp;
  test::write_random_model(tmp.file("m"), test::tiny_mamba2_config(), 1);
  std::ofstream(tmp.file("ids.txt")) << "1 2 3";
  CliResult r = test::run_cli("generate --device cpu --model " + tmp.file("m") + " --tokens-file " + tmp.file("ids.txt") +
                        " -n 5 --temp 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"].size(), 5u);
  EXPECT_EQ(j["text"], "");
}

// Repeated --tokens-file: one prompt per file, run as one batch; each prompt's tokens equal its run alone (greedy).
TEST(GenerateCommand, RepeatedTokenFilesRunAsOneBatch) {
  test::TempDir tmp;
  test::write_random_model(tmp.file("m"), test::tiny_mamba2_config(), 1);
  std::ofstream(tmp.file("a.txt")) << "1 2 3";
  std::ofstream(tmp.file("b.txt")) << "4,5,6,7";
  const std::string base = "generate --device cpu --model " + tmp.file("m") + " -n 6 --temp 0 --json --tokens-file ";
  CliResult both = test::run_cli(base + tmp.file("a.txt") + " --tokens-file " + tmp.file("b.txt"));
  ASSERT_EQ(both.exit_code, 0) << both.err;
  std::istringstream lines(both.out);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["prompt_tokens"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(rows[1]["prompt_tokens"], nlohmann::json({4, 5, 6, 7}));
  for (int i = 0; i < 2; ++i) {
    CliResult alone = test::run_cli(base + tmp.file(i == 0 ? "a.txt" : "b.txt"));
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(rows[i]["tokens"], nlohmann::json::parse(alone.out)["tokens"]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace mambacpp

namespace mambacpp {
namespace {

// --save-logprobs then --kl-base: a model against its own log-probabilities is at KL ~0 with the same top token
// everywhere; the logprobs of the tokens the text holds give back its perplexity; a run on other text or another
// --context is refused.
std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(PerplexityCommand, KlDivergenceFromASavedRun) {
  test::TempDir tmp("kl");
  {
    std::ofstream f(tmp.file("t.txt"));
    f << "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    return parser.parse_args(argv)\n";
  }
  const std::string text = " -f " + tmp.file("t.txt") + " --json";
  CliResult base = test::run_cli("perplexity" + kModel + text + " --save-logprobs " + tmp.file("base.lp"));
  ASSERT_EQ(base.exit_code, 0) << base.output();
  CliResult again = test::run_cli("perplexity" + kModel + text + " --kl-base " + tmp.file("base.lp"));
  ASSERT_EQ(again.exit_code, 0) << again.output();
  const auto b = nlohmann::json::parse(base.out), a = nlohmann::json::parse(again.out);
  // The file keeps f32 log-probabilities: each term p_i (lp_i rounded - lp_i) is within 2^-24 p_i |lp_i|, so a token's
  // KL is within 2^-24 max|lp| (< 1e-6 for log-probabilities above -16).
  EXPECT_LT(std::fabs(a["kl"]["mean"].get<double>()), 1e-6);
  EXPECT_LT(std::fabs(a["kl"]["max"].get<double>()), 1e-6);
  EXPECT_EQ(a["kl"]["same_top"].get<double>(), 1.0);
  EXPECT_EQ(a["nll"].get<double>(), b["nll"].get<double>());
  CliResult other = test::run_cli("perplexity" + kModel + text + " -c 8 --kl-base " + tmp.file("base.lp"));
  EXPECT_NE(other.exit_code, 0);
  EXPECT_THAT(other.output(), HasSubstr("the same text and --context are needed"));
  // A run that fails leaves a file it was to replace byte for byte (the writer's temporary file is dropped).
  const std::string before = bytes_of(tmp.file("base.lp"));
  CliResult failed = test::run_cli("perplexity" + kModel + text + " -c 8 --save-logprobs " + tmp.file("base.lp") +
                                   " --kl-base " + tmp.file("base.lp"));
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_EQ(bytes_of(tmp.file("base.lp")), before);
  // Windows finish in any order: a file saved with -c 8 is that run's own base.
  CliResult w = test::run_cli("perplexity" + kModel + text + " -c 8 --save-logprobs " + tmp.file("w.lp"));
  ASSERT_EQ(w.exit_code, 0) << w.output();
  CliResult w2 = test::run_cli("perplexity" + kModel + text + " -c 8 --kl-base " + tmp.file("w.lp"));
  ASSERT_EQ(w2.exit_code, 0) << w2.output();
  EXPECT_LT(std::fabs(nlohmann::json::parse(w2.out)["kl"]["max"].get<double>()), 1e-6);
}

}  // namespace
}  // namespace mambacpp
