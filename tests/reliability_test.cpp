// Hostile and careless inputs (issue 20): one regression test per class found, through the C++ API (the library must
// throw mambacpp::Error, never abort: a server and the bindings depend on it) and through the CLI (exit 1 with a
// one-line message naming the file or option, never 0, never a signal).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "io/checkpoint.h"
#include "io/json_relaxed.h"
#include "io/safetensors.h"
#include "mambacpp/config.h"
#include "mambacpp/engine.h"
#include "mambacpp/error.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "mambacpp/state.h"
#include "mambacpp/tokenizer.h"
#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/completion_request.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using test::error_of;

std::string deep(int n) { return std::string(n, '[') + std::string(n, ']'); }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors image: the header as given (no padding), then `data`.
std::vector<uint8_t> safetensors_image(const std::string& header, const std::string& data = "") {
  const std::string all = u64le(header.size()) + header + data;
  return std::vector<uint8_t>(all.begin(), all.end());
}

const char* kSmallTokenizer = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": ID}, "merges": ["a b"]},
  "normalizer": NORMALIZER, "pre_tokenizer": null, "decoder": null})";

std::string small_tokenizer(const std::string& id, const std::string& normalizer = "null") {
  std::string s = kSmallTokenizer;
  s.replace(s.find("ID"), 2, id);
  s.replace(s.find("NORMALIZER"), 10, normalizer);
  return s;
}

// ---- Deep nesting: every JSON reader bounds the depth before anything recurses over it ----------------------------

TEST(Reliability, JsonDepthLimitIsExactlyTheStatedOne) {
  EXPECT_NO_THROW(parse_json_relaxed(deep(256), "x.json"));
  EXPECT_THAT(error_of([] { parse_json_relaxed(deep(257), "x.json"); }),
              AllOf(HasSubstr("x.json"), HasSubstr("nested deeper than 256"), HasSubstr("at byte 256")));
  // Brackets inside strings do not count, escaped quotes included.
  EXPECT_NO_THROW(parse_json_relaxed("[\"\\\"" + std::string(1000, '[') + "\"]", "x.json"));
}

TEST(Reliability, DeepNestingIsAnErrorInEveryJsonFile) {
  const std::string nested = deep(200000);
  EXPECT_THAT(error_of([&] { parse_model_config("{\"d_model\": " + nested + "}", "m/config.json"); }),
              AllOf(HasSubstr("m/config.json"), HasSubstr("nested deeper than 256")));
  EXPECT_THAT(error_of([&] { SafetensorsFile::from_bytes(safetensors_image("{\"__metadata__\": " + nested + "}"), "w.st"); }),
              AllOf(HasSubstr("w.st"), HasSubstr("nested deeper than 256")));
  test::TempDir tmp;
  write_file(tmp.file("tokenizer.json"), "{\"model\": " + nested + "}");
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("tokenizer.json")); }),
              AllOf(HasSubstr("tokenizer.json"), HasSubstr("nested deeper than 256")));
  // The index of a sharded checkpoint.
  const std::string model = test::fixture_dir() + "/models/mamba2_bf16_sharded";
  write_file(tmp.file("config.json"), read_file(model + "/config.json"));
  write_file(tmp.file("model.safetensors.index.json"), "{\"weight_map\": " + nested + "}");
  EXPECT_THAT(error_of([&] { Checkpoint c(tmp.path()); }),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("nested deeper than 256")));
  // A server request body: a 400, not a crash.
  try {
    server::parse_json_body("{\"prompt\": " + nested + "}");
    ADD_FAILURE() << "a deep body was accepted";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_THAT(e.what(), HasSubstr("deeper than 64"));
  }
}

TEST(Reliability, DeepTokenizerNormalizerNestingIsBounded) {
  test::TempDir tmp;
  auto nested_normalizer = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += R"({"type": "Sequence", "normalizers": [)";
    s += R"({"type": "Lowercase"})";
    for (int i = 0; i < n; ++i) s += "]}";
    return s;
  };
  // 120 levels (240 JSON levels) is inside the limit: it loads, and quickly (the paths in messages grew
  // quadratically before).
  write_file(tmp.file("ok.json"), small_tokenizer("2", nested_normalizer(120)));
  const auto start = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(tmp.file("ok.json"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(tok->encode("AB"), (std::vector<int32_t>{2}));
  write_file(tmp.file("deep.json"), small_tokenizer("2", nested_normalizer(3000)));
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("deep.json")); }), HasSubstr("nested deeper than 256"));
}

// ---- Numbers that overflow a double, non-finite values in messages -------------------------------------------------

TEST(Reliability, NumberOverflowIsAnErrorNamingTheFile) {
  EXPECT_THAT(error_of([] { parse_model_config(R"({"d_model": 1e705, "n_layer": 1, "vocab_size": 8})", "c.json"); }),
              AllOf(HasSubstr("c.json"), HasSubstr("invalid JSON"), HasSubstr("1e705")));
  EXPECT_THAT(error_of([] {
                SafetensorsFile::from_bytes(
                    safetensors_image(R"({"a": {"dtype": "F32", "shape": [1e705], "data_offsets": [0, 4]}})", "abcd"),
                    "w.st");
              }),
              AllOf(HasSubstr("w.st"), HasSubstr("1e705")));
  test::TempDir tmp;
  write_file(tmp.file("t.json"), small_tokenizer("1e705"));
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("t.json")); }), AllOf(HasSubstr("t.json"), HasSubstr("1e705")));
  EXPECT_THROW(server::parse_json_body(R"({"prompt": "a", "max_tokens": 1e705})"), server::ApiError);
}

TEST(Reliability, NonFiniteValuesAreNamedAsSuch) {
  const std::string msg = error_of([] {
    parse_model_config(R"({"model_type": "mamba", "hidden_size": NaN, "num_hidden_layers": 1, "vocab_size": 8})",
                       "c.json");
  });
  EXPECT_THAT(msg, AllOf(HasSubstr("hidden_size = NaN"), Not(HasSubstr("null"))));
}

// Ids past vocab_size index nothing (published configs carry them: a GPT-2 with vocab_size = eos_token_id = 52000),
// so they load; what cannot be an int32 token id is refused, naming the key.
TEST(Reliability, ConfigTokenIdsMustBeTokenIdsButMayLiePastTheVocabulary) {
  ModelConfig c = test::tiny_mamba2_config();
  c.eos_token_id = c.vocab_size;
  c.bos_token_id = 100000000;
  const ModelConfig parsed = parse_model_config(c.to_json(), "c.json");
  EXPECT_EQ(parsed.eos_token_id, c.vocab_size);
  EXPECT_EQ(parsed.bos_token_id, 100000000);
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    for (const int64_t bad : {int64_t{1} << 31, int64_t{-2}}) {
      nlohmann::json j = nlohmann::json::parse(test::tiny_mamba2_config().to_json());
      j[key] = bad;
      EXPECT_THAT(error_of([&] { parse_model_config(j.dump(), "c.json"); }),
                  AllOf(HasSubstr("c.json"), HasSubstr(std::string(key) + " = " + std::to_string(bad)),
                        HasSubstr("[0, 2^31)")))
          << key << " = " << bad;
    }
  }
}

TEST(Reliability, AnEosPastTheVocabularyNeverStopsAndNeverIndexes) {
  test::TempDir tmp;
  const std::string from = test::fixture_dir() + "/models/mamba2_f32_groups_bias";
  nlohmann::json config = nlohmann::json::parse(read_file(from + "/config.json"));
  const int64_t vocab = config["vocab_size"].get<int64_t>();
  config["eos_token_id"] = vocab + 5;
  config["bos_token_id"] = vocab;
  write_file(tmp.file("config.json"), config.dump());
  fs::copy(from + "/model.safetensors", tmp.file("model.safetensors"));
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto model = Model::load(tmp.path(), lo);
  EXPECT_EQ(model->config().eos_token_id, vocab + 5);
  Engine engine(*model, nullptr, {});
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 4;
  std::vector<GenerateRequest> requests;
  requests.push_back(r);
  const std::vector<GenerateResult> out = engine.run(std::move(requests));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens.size(), 4u);  // the whole budget: nothing sampled can be that eos
  for (int32_t t : out[0].tokens) EXPECT_LT(t, vocab);
  // That bos as a prompt is refused by the prompt's vocabulary check, with an error, not an out-of-bounds read.
  GenerateRequest b;
  b.prompt = {static_cast<int32_t>(vocab)};
  EXPECT_THAT(error_of([&] { engine.submit(b); }), HasSubstr("outside the vocabulary"));
}

// ---- Sizes trusted before reading ----------------------------------------------------------------------------------

std::string npy_bytes(const std::string& dict, const std::string& data, int version = 1) {
  std::string h = dict;
  const size_t prefix = version == 1 ? 10 : 12;
  h.append((64 - (prefix + h.size() + 1) % 64) % 64, ' ');
  h.push_back('\n');
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(version) + '\0';
  for (size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out.push_back(static_cast<char>(h.size() >> (8 * i)));
  return out + h + data;
}

TEST(Reliability, NpySizesAreCheckedAgainstTheFileBeforeAllocating) {
  EXPECT_THAT(error_of([] {
                parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }",
                                    ""),
                          "e.npy");
              }),
              AllOf(HasSubstr("e.npy"), HasSubstr("holds 0 bytes")));
  EXPECT_THAT(error_of([] {
                parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, "
                                    "4611686018427387904, 16), }", ""),
                          "e.npy");
              }),
              HasSubstr("overflows 64 bits"));
  EXPECT_THAT(error_of([] { parse_npy(std::string("\x93NUMPY\x02\x00\xf0\xff\xff\xff{", 13), "e.npy"); }),
              HasSubstr("runs past the end of the file"));
  EXPECT_THAT(error_of([] { parse_npy(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (268435456,), }",
                                                std::string(8, '\0')), "e.npy"); }),
              HasSubstr("holds 8 bytes, expected 268435456 elements"));
  EXPECT_THAT(error_of([] { parse_npy(npy_bytes("{'descr': '<f4', 'shape': (1,), }", "abcd"), "e.npy"); }),
              HasSubstr("expected the keys"));
  EXPECT_THAT(error_of([] { parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", ""),
                                      "e.npy"); }),
              HasSubstr("non-negative dimension"));
  // Found by the npy fuzzer: huge dimensions beside a zero are an empty array, and counting it must not overflow.
  const NpyArray empty = parse_npy(
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905, 3, 0, 16), }", ""), "e.npy");
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.values.empty());
}

TEST(Reliability, NpyReadsUnalignedDataAndEveryVersion) {
  float v[3] = {1.5f, -2.0f, 3.25f};
  const std::string data(reinterpret_cast<const char*>(v), sizeof v);
  for (int version : {1, 2}) {
    // One byte in front: the data is not 4-byte aligned in memory (read by memcpy, no UB).
    const std::string bytes = "x" + npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data, version);
    const NpyArray a = parse_npy(std::string_view(bytes).substr(1), "e.npy");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(a.values, (std::vector<double>{1.5, -2.0, 3.25}));
  }
  const NpyArray scalar = parse_npy(npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
                                              std::string("\x07\0\0\0\0\0\0\0", 8)), "s.npy");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.values, (std::vector<double>{7}));
}

TEST(Reliability, TokenizerIdsAreBoundedBeforeTheTablesAreSized) {
  test::TempDir tmp;
  write_file(tmp.file("t.json"), small_tokenizer("130000000"));
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("t.json")); }),
              AllOf(HasSubstr("t.json"), HasSubstr(".vocab['ab']"), HasSubstr("[0, 2^22)"), HasSubstr("130000000")));
  write_file(tmp.file("ok.json"), small_tokenizer("4194303"));  // the largest id allowed
  EXPECT_EQ(Tokenizer::load(tmp.file("ok.json"))->vocab_size(), 4194304);
}

// ---- Undefined behaviour: unaligned safetensors data ---------------------------------------------------------------

TEST(Reliability, UnalignedSafetensorsAreViewedThroughAlignedCopies) {
  // A 2-byte f16 first and no header padding: the f32 and f64 tensors start at odd addresses in the file.
  const float f[2] = {1.0f, -3.5f};
  const double d = 0.25;
  std::string data("\0\0", 2);
  data.append(reinterpret_cast<const char*>(f), sizeof f);
  data.append(reinterpret_cast<const char*>(&d), sizeof d);
  const std::string header = R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
                             R"("y":{"dtype":"F32","shape":[2],"data_offsets":[2,10]},)"
                             R"("z":{"dtype":"F64","shape":[1],"data_offsets":[10,18]}})";
  const SafetensorsFile file = SafetensorsFile::from_bytes(safetensors_image(header, data), "u.st");
  const TensorView y = file.view("y"), z = file.view("z");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data) % 4, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data) % 8, 0u);
  EXPECT_EQ(static_cast<const float*>(y.data)[1], -3.5f);
  EXPECT_EQ(*static_cast<const double*>(z.data), 0.25);
}

// ---- Tokens files and chunk lists ---------------------------------------------------------------------------------

TEST(Reliability, TokenListsAreStrict) {
  using cli::parse_token_ids;
  EXPECT_EQ(parse_token_ids("1 2,3, 4\n5\t6", "f"), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(parse_token_ids("  \n", "f"), (std::vector<int32_t>{}));
  EXPECT_EQ(parse_token_ids("2147483647", "f"), (std::vector<int32_t>{2147483647}));
  EXPECT_THAT(error_of([] { parse_token_ids("1,,2", "f"); }), AllOf(HasSubstr("f:"), HasSubstr("empty entry")));
  EXPECT_THAT(error_of([] { parse_token_ids("1,2,", "f"); }), HasSubstr("trailing ','"));
  EXPECT_THAT(error_of([] { parse_token_ids(",1", "f"); }), HasSubstr("empty entry"));
  EXPECT_THAT(error_of([] { parse_token_ids("1 -5", "f"); }), AllOf(HasSubstr("'-5'"), HasSubstr("token 1")));
  EXPECT_THAT(error_of([] { parse_token_ids("2147483648", "f"); }), HasSubstr("above 2^31 - 1"));
  EXPECT_THAT(error_of([] { parse_token_ids("12abc", "f"); }), HasSubstr("'12abc'"));
  EXPECT_THAT(error_of([] { cli::parse_chunks("1,,2", "--chunks"); }), HasSubstr("--chunks"));
}

TEST(Reliability, DirectoriesWhereFilesBelongAreNamedAsSuch) {
  test::TempDir tmp;
  fs::create_directory(tmp.file("config.json"));
  EXPECT_THAT(error_of([&] { Checkpoint c(tmp.path()); }), AllOf(HasSubstr("config.json"), HasSubstr("is a directory")));
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("config.json")); }), HasSubstr("is a directory"));
  EXPECT_THAT(error_of([&] { read_npy(tmp.file("config.json")); }), HasSubstr("is a directory"));
  EXPECT_THAT(error_of([&] { read_npy(tmp.file("missing.npy")); }), HasSubstr("no such file"));
}

// ---- The CLI: ranges of options, files that are directories, exit codes -------------------------------------------

class ReliabilityCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string from = test::fixture_dir() + "/models/mamba2_f32_groups_bias";
    fs::copy(from + "/config.json", tmp_.file("config.json"));
    fs::copy(from + "/model.safetensors", tmp_.file("model.safetensors"));
    write_file(tmp_.file("t.txt"), "1 2 3");
  }
  std::string model() const { return " --device cpu --model " + tmp_.path(); }
  test::TempDir tmp_;
};

TEST_F(ReliabilityCli, OptionRangesAreCheckedBeforeAnythingRuns) {
  const std::string gen = "generate" + model() + " --tokens-file " + tmp_.file("t.txt") + " -n 1 ";
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {"--threads 100000", "--threads"}, {"--threads -5", "--threads"}, {"--top-p 2", "--top-p"},
           {"--top-p nan", "--top-p"}, {"--temp -1", "--temp"}, {"--temp inf", "--temp"}, {"--top-k -1", "--top-k"},
           {"--min-p 2", "--min-p"}, {"--repeat-penalty 0", "--repeat-penalty"},
           {"--repeat-last-n -1", "--repeat-last-n"}, {"--seed -3", "--seed"}, {"--max-prompt 0", "--max-prompt"}}) {
    const test::CliResult r = test::run_cli(gen + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output();
    EXPECT_THAT(r.output(), HasSubstr(option)) << args;
  }
  const test::CliResult r = test::run_cli("perplexity" + model() + " -f " + tmp_.file("t.txt") + " --context -1");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.output(), HasSubstr("--context"));
}

TEST_F(ReliabilityCli, BadFilesExitOneNamingTheFile) {
  write_file(tmp_.file("bad.txt"), "1,,2");
  test::CliResult r = test::run_cli("logits" + model() + " --tokens-file " + tmp_.file("bad.txt") + " --out " + tmp_.file("o.npy"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("bad.txt"), HasSubstr("empty entry")));
  fs::create_directory(tmp_.file("adir"));
  r = test::run_cli("logits" + model() + " --tokens-file " + tmp_.file("adir") + " --out " + tmp_.file("o.npy"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("--tokens-file"), HasSubstr("is a directory")));
  fs::copy(test::fixture_dir() + "/tokenizer/tokenizer.json", tmp_.file("tokenizer.json"));
  r = test::run_cli("generate" + model() + " --prompts-file " + tmp_.file("adir"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("--prompts-file"), HasSubstr("is a directory")));
  r = test::run_cli("generate" + model() + " --tokens-file " + tmp_.file("t.txt") + " -n 1 --load-state " + tmp_.file("adir"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("adir"), HasSubstr("is a directory")));
  // A config.json nested too deeply, and one with a number too large for a double.
  write_file(tmp_.file("config.json"), "{\"d_model\": " + deep(100000) + "}");
  r = test::run_cli("logits" + model() + " --tokens-file " + tmp_.file("t.txt") + " --out " + tmp_.file("o.npy"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("config.json"), HasSubstr("nested deeper than 256")));
  write_file(tmp_.file("config.json"), R"({"d_model": 1e705})");
  r = test::run_cli("logits" + model() + " --tokens-file " + tmp_.file("t.txt") + " --out " + tmp_.file("o.npy"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("config.json"), HasSubstr("1e705")));
}

TEST_F(ReliabilityCli, LogitsOutputIsBoundedWithAFlagToRaiseIt) {
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "1 ";
  write_file(tmp_.file("many.txt"), many);
  const std::string args = "logits" + model() + " --tokens-file " + tmp_.file("many.txt") + " --out " + tmp_.file("o.npy");
  const test::CliResult r = test::run_cli(args + " --max-out-mb 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output(), AllOf(HasSubstr("20000 tokens"), HasSubstr("--max-out-mb 1")));
}

// ---- Options the library reads itself: checked there, not only by the CLI -------------------------------------------

TEST(Reliability, ThreadsAreCheckedWhereTheLibraryReadsThem) {
  const std::string dir = test::fixture_dir() + "/models/mamba2_f32_groups_bias";
  for (const int threads : {100000, kMaxThreads + 1, -5}) {
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    lo.threads = threads;
    EXPECT_THAT(error_of([&] { Model::load(dir, lo); }),
                AllOf(HasSubstr("threads"), HasSubstr(std::to_string(kMaxThreads)), HasSubstr(std::to_string(threads))));
    EXPECT_THAT(error_of([&] { Model::random(test::tiny_mamba2_config(), lo, 1); }),
                AllOf(HasSubstr("threads"), HasSubstr(std::to_string(threads))));
  }
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = kMaxThreads;  // the limit itself loads (the backend starts its threads only when it runs)
  EXPECT_NO_THROW(Model::load(dir, lo));
}

// ---- State slots allocated up front: bounded by the prompts, a default and the memory ------------------------------

TEST(Reliability, GenerateSlotsAreBoundedByThePromptsAndADefault) {
  EXPECT_EQ(cli::running_slots(5000, 0), cli::kDefaultMaxSeqs);  // a prompts file of 5000 lines: 64 run, the rest wait
  EXPECT_EQ(cli::running_slots(3, 0), 3);
  EXPECT_EQ(cli::running_slots(5000, 100), 100);                 // --max-seqs raises it
  EXPECT_EQ(cli::running_slots(1, int64_t{1} << 40), 1);          // never more slots than prompts
}

TEST(Reliability, StateSlotsThatCannotFitInMemoryAreRefusedNamingTheFlag) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto model = Model::load(test::fixture_dir() + "/models/mamba2_f32_groups_bias", lo);
  EXPECT_THAT(error_of([&] { cli::check_state_slots(*model, int64_t{1} << 40, DType::F32, "--parallel"); }),
              AllOf(HasSubstr("--parallel 1099511627776"), HasSubstr("GiB"), HasSubstr("memory")));
  EXPECT_NO_THROW(cli::check_state_slots(*model, 64, DType::F32, "--parallel"));
}

TEST(Reliability, TheLibraryRefusesStateSlotsThatCannotFitBeforeAllocating) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto model = Model::load(test::fixture_dir() + "/models/mamba2_f32_groups_bias", lo);
  for (int64_t n : {int64_t{1} << 40, int64_t{1} << 62})  // the second overflows a byte count in int64
    EXPECT_THAT(error_of([&] { model->create_state(n); }),
                AllOf(HasSubstr("create_state: " + std::to_string(n) + " state slots"), HasSubstr("GiB of memory")));
  EngineOptions eo;
  eo.max_seqs = int64_t{1} << 40;  // the engine allocates its slots through create_state
  auto tokenizer = Tokenizer::load(test::fixture_dir() + "/tokenizer/tokenizer.json");
  EXPECT_THAT(error_of([&] { Engine engine(*model, tokenizer.get(), eo); }), HasSubstr("state slots"));
  EXPECT_EQ(model->create_state(3)->n_slots(), 3);
  EngineOptions big_cache;
  big_cache.state_cache_mb = INT64_MAX;  // its byte count would overflow int64
  EXPECT_THAT(error_of([&] { Engine engine(*model, tokenizer.get(), big_cache); }),
              HasSubstr("state_cache_mb must be in [0, 2^32]"));
}

TEST_F(ReliabilityCli, PromptsFileOfThousandsOfLinesRunsInBoundedSlots) {
  fs::copy(test::fixture_dir() + "/tokenizer/tokenizer.json", tmp_.file("tokenizer.json"));
  std::string lines;
  for (int i = 0; i < 3000; ++i) lines += "a\n";  // one token, inside the fixture model's 89-entry vocabulary
  write_file(tmp_.file("many.txt"), lines);
  const std::string gen = "generate" + model() + " --threads 1 --prompts-file " + tmp_.file("many.txt") + " -n 1 --json";
  test::CliResult r = test::run_cli(gen);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3000);  // one result per line, every one finished
  // --max-seqs far past the prompts: as many slots as prompts (it allocated 10^12 states before).
  r = test::run_cli("generate" + model() + " --tokens-file " + tmp_.file("t.txt") + " -n 1 --max-seqs 1000000000000");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(ReliabilityCli, ServeBoundsItsSlotsAndThreadsBeforeAllocating) {
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {"--parallel 100000", "--parallel"}, {"--parallel 0", "--parallel"}, {"--max-queue 100000", "--max-queue"},
           {"--http-threads 5000", "--http-threads"}, {"--max-tokens 4294967297", "--max-tokens"},
           {"--max-body-mb 100000000000000", "--max-body-mb"},
           // 4000 + 256 + 8 worker threads by default: past the limit, the message says what to change.
           {"--parallel 4000", "--http-threads"}}) {
    const test::CliResult r = test::run_cli("serve" + model() + " --port 0 " + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output();
    EXPECT_THAT(r.output(), HasSubstr(option)) << args;
  }
}

// ---- The server's other inputs: tokenizer_config.json (the chat template), request bodies ---------------------------

TEST(Reliability, ChatTemplateDetectionIsBoundedAndTypeSafe) {
  test::TempDir tmp;
  write_file(tmp.file("tokenizer_config.json"),
             R"({"chat_template": [{"name": 1, "template": "x"}, {"name": "default", "template": "<|im_start|>"}]})");
  const auto chatml = server::select_chat_template("auto", tmp.path());  // nlohmann's value("name", "") threw on 1
  ASSERT_NE(chatml, nullptr);
  EXPECT_EQ(chatml->name, "model");  // the "default" entry, the model's own template
  fs::resize_file(tmp.file("tokenizer_config.json"), (uintmax_t{64} << 20) + 1);  // sparse: no 64 MiB written
  EXPECT_THAT(error_of([&] { server::select_chat_template("auto", tmp.path()); }),
              AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("64 MiB")));
}

TEST(Reliability, RequestFieldsOfTheWrongTypeAreABadRequest) {
  const auto tokenizer = Tokenizer::load(test::fixture_dir() + "/tokenizer/tokenizer.json");
  const auto chat = server::select_chat_template("chatml", "");
  server::RequestLimits limits;
  limits.vocab_size = tokenizer->vocab_size();
  for (const char* body : {R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "a"}]}]})",
                           R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": 2}})"}) {
    try {
      server::parse_chat_completion(server::parse_json_body(body), tokenizer.get(), chat.get(), limits);
      ADD_FAILURE() << body << ": accepted";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
    }  // anything else (nlohmann's type_error was) escapes and fails the test
  }
}

// ---- State files: the reader refuses what is not a state file of this model, and the slot stays as it was ----------

TEST(Reliability, StateFileReaderRefusesHostileFilesWithoutChangingTheSlot) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  auto model = Model::load(test::fixture_dir() + "/models/mamba2_f32_groups_bias", lo);
  auto state = model->create_state(1);
  test::TempDir tmp;
  state->save(0, tmp.file("good.state"), {1, 2});
  const std::string good = read_file(tmp.file("good.state"));
  const std::vector<float> before = state->read_slot(0);
  fs::create_directory(tmp.file("dir"));
  EXPECT_THAT(error_of([&] { state->load(0, tmp.file("dir")); }), HasSubstr("is a directory"));
  // A token count claiming far more tokens than the file holds, and a config length claiming gigabytes.
  std::string bad = good;
  const size_t config_len_at = 16 + 4 + 4 + 8;
  bad.replace(config_len_at, 8, u64le(uint64_t{1} << 40));
  write_file(tmp.file("bad.state"), bad);
  EXPECT_THAT(error_of([&] { state->load(0, tmp.file("bad.state")); }), HasSubstr("implausible"));
  write_file(tmp.file("short.state"), good.substr(0, good.size() - 1));
  EXPECT_THAT(error_of([&] { state->load(0, tmp.file("short.state")); }), HasSubstr("truncated"));
  EXPECT_EQ(state->read_slot(0), before);
  EXPECT_EQ(state->load(0, tmp.file("good.state")), (std::vector<int32_t>{1, 2}));
}


// ---- Third sweep: the hybrid surfaces (ctx size, KV state files, layer counts) and the CLI's integer options ---------

std::string hybrid_dir(const std::string& name) { return test::fixture_dir() + "/hybrid/" + name; }

std::unique_ptr<Model> load_hybrid(int64_t ctx_size = 0) {
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  lo.threads = 1;
  lo.ctx_size = ctx_size;
  return Model::load(hybrid_dir("nemotron_h_f32"), lo);
}

// A state file's KV rows are positions the slot will hold: past the context limit, or not one per recorded token
// (the engine would continue a prompt from a state it does not stand for), it is refused and the slot is unchanged.
TEST(Reliability, StateFileKvRowsMustFitTheContextAndBeTheTokens) {
  auto model = load_hybrid();
  const std::vector<int32_t> ids = test::read_token_ids(hybrid_dir("nemotron_h_f32") + "/tokens.txt");
  ASSERT_GT(ids.size(), 10u);
  auto state = model->create_state(1);
  std::vector<Sequence> seqs{Sequence::tokens(ids, 0)};
  model->forward(*state, seqs, Output::LastLogits);
  test::TempDir tmp;
  state->save(0, tmp.file("good.state"), ids);
  state->save(0, tmp.file("fewer_tokens.state"), std::vector<int32_t>(ids.begin(), ids.end() - 1));
  state->save(0, tmp.file("no_tokens.state"));  // no tokens recorded: nothing to compare, it loads

  auto small = load_hybrid(/*ctx_size=*/10);
  auto small_state = small->create_state(1);
  EXPECT_THAT(error_of([&] { small_state->load(0, tmp.file("good.state")); }),
              AllOf(HasSubstr("good.state"), HasSubstr(std::to_string(ids.size()) + " KV positions"),
                    HasSubstr("context limit of 10"), HasSubstr("--ctx-size")));
  EXPECT_EQ(small_state->tokens_held(0), 0);

  auto fresh = model->create_state(1);
  const std::vector<float> before = fresh->read_slot(0);
  EXPECT_THAT(error_of([&] { fresh->load(0, tmp.file("fewer_tokens.state")); }),
              AllOf(HasSubstr("fewer_tokens.state"), HasSubstr("one position per token")));
  EXPECT_EQ(fresh->read_slot(0), before);
  EXPECT_EQ(fresh->tokens_held(0), 0);
  EXPECT_TRUE(fresh->load(0, tmp.file("no_tokens.state")).empty());
  EXPECT_EQ(fresh->tokens_held(0), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(fresh->load(0, tmp.file("good.state")), ids);
}

// Per-layer tables are sized by the layer count before any weight is looked at: a 1 KB config.json claiming 2^30
// layers took 2 GB and 4 s before the first missing tensor was reported.
TEST(Reliability, LayerCountsAreBoundedBeforeTablesAreSized) {
  const std::string bamba = read_file(hybrid_dir("bamba_f32") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(bamba);
  j["num_hidden_layers"] = 1 << 30;
  j["attn_layer_indices"] = nlohmann::json::array();
  EXPECT_THAT(error_of([&] { parse_model_config(j.dump(), "c.json"); }),
              AllOf(HasSubstr("c.json"), HasSubstr("num_hidden_layers = 1073741824"), HasSubstr("[1, 65536]")));
  nlohmann::json nemo = nlohmann::json::parse(read_file(hybrid_dir("nemotron_h_f32") + "/config.json"));
  nemo.erase("num_hidden_layers");
  nemo["layers_block_type"] = std::vector<std::string>(70000, "mamba");
  EXPECT_THAT(error_of([&] { parse_model_config(nemo.dump(), "n.json"); }),
              AllOf(HasSubstr("n.json"), HasSubstr("layers_block_type"), HasSubstr("70000 layers")));
  nemo["num_hidden_layers"] = 65536;
  nemo["layers_block_type"] = std::vector<std::string>(65536, "mamba");
  EXPECT_NO_THROW(parse_model_config(nemo.dump(), "n.json"));  // the limit itself parses
}

// The library checks the sizes it reads from LoadOptions where every loader passes (the bindings and the C++ API as
// well as the CLI): a negative batch-token count ran as 1, a negative ctx_size as none, a page of 2^40 tokens asked for
// terabytes at the first token.
TEST(Reliability, LoadOptionsSizesAreCheckedByTheLibrary) {
  const std::string dir = hybrid_dir("nemotron_h_f32");
  for (const auto& [set, name] : std::vector<std::pair<std::function<void(LoadOptions&)>, std::string>>{
           {[](LoadOptions& o) { o.max_batch_tokens = -1; }, "max_batch_tokens"},
           {[](LoadOptions& o) { o.max_batch_tokens = int64_t{1} << 40; }, "max_batch_tokens"},
           {[](LoadOptions& o) { o.ctx_size = -1; }, "ctx_size"},
           {[](LoadOptions& o) { o.ctx_size = int64_t{1} << 40; }, "ctx_size"},
           {[](LoadOptions& o) { o.kv_page_tokens = 0; }, "kv_page_tokens"},
           {[](LoadOptions& o) { o.kv_page_tokens = int64_t{1} << 40; }, "kv_page_tokens"}}) {
    LoadOptions lo;
    lo.device = DeviceChoice::CPU;
    set(lo);
    EXPECT_THAT(error_of([&] { Model::load(dir, lo); }), AllOf(HasSubstr(name), HasSubstr("found"))) << name;
  }
}

// max_batch_tokens 0 (the default) is the device's piece size, which the loaded model reports; a given one is kept.
TEST(Reliability, BatchTokensDefaultIsTheDevicesPieceSize) {
  const std::string dir = hybrid_dir("nemotron_h_f32");
  LoadOptions lo;
  lo.device = DeviceChoice::CPU;
  EXPECT_EQ(Model::load(dir, lo)->load_options().max_batch_tokens, kCpuPieceTokens);
  lo.max_batch_tokens = 7;
  EXPECT_EQ(Model::load(dir, lo)->load_options().max_batch_tokens, 7);
}

class ReliabilityHybridCli : public ::testing::Test {
 protected:
  std::string gen() const {
    return "generate --device cpu --threads 1 -m " + hybrid_dir("nemotron_h_f32") + " --tokens-file " +
           hybrid_dir("nemotron_h_f32") + "/tokens.txt ";
  }
  test::TempDir tmp_;
};

// A request that failed while running ended as "cancelled" with its error dropped: generate printed nothing and
// exited 0 (a prompt past --ctx-size, a --save-state that could not be written). A generation that reaches the
// context limit is no failure: it stops there with finish reason "length", as a server's context does.
TEST_F(ReliabilityHybridCli, GenerateFailsWhenARequestFails) {
  test::CliResult r = test::run_cli(gen() + "-n 2 --ctx-size 3");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, AllOf(HasSubstr("error: "), HasSubstr("context limit of 3")));
  r = test::run_cli(gen() + "-n 100 --ignore-eos --temp 0 --ctx-size 50 --json");  // 45 prompt tokens: 45..49 left
  EXPECT_EQ(r.exit_code, 0) << r.output();
  const nlohmann::json limited = nlohmann::json::parse(r.out);
  EXPECT_EQ(limited["stop_reason"], "length");
  EXPECT_FALSE(limited.contains("error"));
  const test::CliResult free_run = test::run_cli(gen() + "-n 6 --ignore-eos --temp 0 --json");
  EXPECT_EQ(free_run.exit_code, 0) << free_run.output();
  // the 6 tokens that fit (the 6th is sampled from position 49's logits) are those of an unlimited run
  EXPECT_EQ(limited["tokens"], nlohmann::json::parse(free_run.out)["tokens"]);
  EXPECT_EQ(limited["tokens"].size(), 6u);
  fs::create_directory(tmp_.file("adir"));
  r = test::run_cli(gen() + "-n 1 --save-state " + tmp_.file("adir"));
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, HasSubstr(tmp_.file("adir")));
  r = test::run_cli(gen() + "-n 2 --json");  // a request that runs through has no "error" key
  EXPECT_EQ(r.exit_code, 0) << r.output();
  EXPECT_THAT(r.out, Not(HasSubstr("\"error\"")));
}

// CLI11 clamps an integer past int64 to INT64_MAX and parsed 2^64 as a seed; its ranges print the bounds as doubles
// of 300 digits. Every integer option is now strictly an integer within a stated range.
TEST_F(ReliabilityHybridCli, IntegerOptionsAreStrictIntegersInStatedRanges) {
  for (const auto& [args, option] : std::vector<std::pair<std::string, std::string>>{
           {"-n 1 --ctx-size 99999999999999999999", "--ctx-size"}, {"-n 1 --seed 18446744073709551616", "--seed"},
           {"-n 1e9", "--n-predict"}, {"-n 2147483648", "--n-predict"}, {"-n 1 --batch-tokens 1e3", "--batch-tokens"},
           {"-n 1 --state-cache-mb 9223372036854775807", "--state-cache-mb"}, {"-n 1 --top-k 2147483648", "--top-k"},
           {"-n 1 --threads 1025", "--threads"}, {"-n 1 --max-prompt 0", "--max-prompt"}}) {
    const test::CliResult r = test::run_cli(gen() + args);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output();
    EXPECT_THAT(r.output(), AllOf(HasSubstr(option), HasSubstr("expected an integer in ["))) << args;
    EXPECT_LT(r.output().size(), 400u) << args;
  }
}

// bench drew its prompts up front: -p 9223372036854775807 ended in "vector::_M_default_append".
TEST_F(ReliabilityHybridCli, BenchBoundsItsPromptsBeforeDrawingThem) {
  const std::string bench = "bench --device cpu --threads 1 -m " + hybrid_dir("nemotron_h_f32") + " -r 1 -g 1 ";
  test::CliResult r = test::run_cli(bench + "-p 9223372036854775807");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.output(), AllOf(HasSubstr("--prompt"), HasSubstr("expected an integer")));
  r = test::run_cli(bench + "-b 65536 -p 65536");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, AllOf(HasSubstr("--batch x --prompt = 4294967296"), HasSubstr("268435456")));
  r = test::run_cli(bench + "--serve --requests 1000000 --max-prompt 1000000");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, HasSubstr("--requests x --max-prompt"));
  // Requests past the context limit ended in errors that --chat-turn and --serve timed as if they had run (exit 0).
  const std::string bamba = "bench --device cpu --threads 1 -m " + hybrid_dir("bamba_f32") + " -r 1 ";  // 4096 positions
  r = test::run_cli(bamba + "--chat-turn -p 4090 -g 8");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, AllOf(HasSubstr("--chat-turn"), HasSubstr("context limit of 4096")));
  // (a generation that reaches the limit stops there as a length stop, so the prompts themselves exceed it here)
  r = test::run_cli(bamba + "--serve --requests 2 --min-prompt 4097 --max-prompt 4098 -g 4 --max-seqs 2");
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, AllOf(HasSubstr("--serve request"), HasSubstr("context limit of 4096")));
  r = test::run_cli(bench + "-p 4 --weights f32");  // --weights without --shape changed nothing before
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, HasSubstr("--weights f32 applies to --shape only"));
}

// serve starts listening before it loads the model; a model that failed to load right away stopped the HTTP server
// before its loop ran, and ~Server then waited forever (7 runs in 20 hung here). Each run must exit 1 (a hang fails
// through the test's time-out).
TEST_F(ReliabilityHybridCli, ServeExitsWhenTheModelFailsToLoad) {
  for (int i = 0; i < 10; ++i) {
    const test::CliResult r = test::run_cli("serve --device cpu --threads 1 --port 0 --shape bogus");
    ASSERT_EQ(r.exit_code, 1) << r.output();
    EXPECT_THAT(r.err, HasSubstr("unknown shape 'bogus'"));
  }
}

TEST_F(ReliabilityHybridCli, PerplexityNamesADirectoryAsSuch) {
  const test::CliResult r =
      test::run_cli("perplexity --device cpu -f " + tmp_.path());  // the shipped model (it has a tokenizer)
  EXPECT_EQ(r.exit_code, 1) << r.output();
  EXPECT_THAT(r.err, AllOf(HasSubstr("--file"), HasSubstr("is a directory")));
}

}  // namespace
}  // namespace mambacpp
