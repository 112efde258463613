// The command-line contract: `mambacpp logits ... --out FILE.npy` reproduces the fixtures with and without --chunks,
// and every bad input ends with a non-zero exit and a message that says what was wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/test_support.h"
#include "mambacpp/npy.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using test::CliResult;
using test::run_cli;

std::string fixture(const std::string& name) { return test::fixture_dir() + "/models/" + name; }

class LogitsCommand : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsCommand, ReproducesFixtureWithAndWithoutChunks) {
  const std::string dir = fixture(GetParam());
  ASSERT_TRUE(std::filesystem::exists(dir + "/logits.npy")) << dir;
  NpyArray ref = read_npy(dir + "/logits.npy");
  std::vector<float> expected(ref.values.begin(), ref.values.end());
  test::TempDir tmp;
  const int64_t L = ref.shape[0];
  for (std::string chunks : {std::string(), std::string("1,2,3,") + std::to_string(L - 6)}) {
    std::string args = "logits --device cpu --model " + dir + " --tokens-file " + dir + "/tokens.txt --out " + tmp.file("l.npy");
    if (!chunks.empty()) args += " --chunks " + chunks;
    CliResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.output();
    NpyArray got = read_npy(tmp.file("l.npy"));
    EXPECT_EQ(got.shape, ref.shape);
    std::vector<float> g(got.values.begin(), got.values.end());
    EXPECT_LE(test::max_rel_diff(g, expected), 1e-5) << "chunks '" << chunks << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LogitsCommand,
                         ::testing::Values("mamba1_f32_untied_bias", "mamba2_f32_groups_bias", "mamba2_bf16_sharded"));

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_random_model(model_.path(), test::tiny_mamba2_config(), 5);
    std::ofstream(tmp_.file("ok.txt")) << "1, 2 3\n4";
  }
  std::string logits(const std::string& extra) {
    return "logits --device cpu --model " + model_.path() + " --out " + tmp_.file("o.npy") + " " + extra;
  }
  test::TempDir model_, tmp_;
};

TEST_F(CliErrors, WorkingCallSucceeds) {
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("ok.txt")));
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_EQ(read_npy(tmp_.file("o.npy")).shape, (std::vector<int64_t>{4, 47}));
}

TEST_F(CliErrors, ChunksThatDoNotSumToL) {
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("ok.txt") + " --chunks 1,2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("--chunks"), HasSubstr("sum to 3"), HasSubstr("L = 4")));
  r = run_cli(logits("--tokens-file " + tmp_.file("ok.txt") + " --chunks 9223372036854775807,9223372036854775807,4"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), HasSubstr("sum to more than 4"));
  r = run_cli(logits("--tokens-file " + tmp_.file("ok.txt") + " --chunks 2,x"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), HasSubstr("found 'x'"));
}

TEST_F(CliErrors, TokenOutOfRange) {
  std::ofstream(tmp_.file("big.txt")) << "1 2 47";
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("big.txt")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("token id 47"), HasSubstr("[0, 47)")));
}

TEST_F(CliErrors, EmptyTokenFile) {
  std::ofstream(tmp_.file("empty.txt")) << "  \n";
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("empty.txt")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), HasSubstr("L == 0"));
}

TEST_F(CliErrors, NotATokenFile) {
  std::ofstream(tmp_.file("words.txt")) << "1 2 hello";
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("words.txt")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("found 'hello'"), HasSubstr("integer token ids")));
}

TEST_F(CliErrors, MissingModelDirectory) {
  CliResult r = run_cli("logits --device cpu --model " + tmp_.file("nope") + " --tokens-file " + tmp_.file("ok.txt") +
                        " --out " + tmp_.file("o.npy"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("nope"), HasSubstr("not a directory")));
}

TEST_F(CliErrors, EmbeddingsOfTheWrongWidth) {
  std::vector<float> e(3 * 17, 0.1f);
  write_npy_f32(tmp_.file("e.npy"), e.data(), {3, 17});
  CliResult r = run_cli(logits("--embeddings-file " + tmp_.file("e.npy")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("[L, 18]"), HasSubstr("[3, 17]")));
}

TEST_F(CliErrors, UnknownOptionAndDevice) {
  CliResult r = run_cli(logits("--tokens-file " + tmp_.file("ok.txt") + " --frobnicate"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), HasSubstr("frobnicate"));
  r = run_cli("logits --device tpu --model " + model_.path() + " --tokens-file x --out y");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output(), HasSubstr("--device"));
}

}  // namespace
}  // namespace mambacpp
