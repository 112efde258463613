// Every fuzz target (fuzz/*_fuzz.cpp, built here in replay mode) on every committed seed (fuzz/corpus/<target>/) and
// every regression input a fuzz run found (fuzz/regressions/<target>/): the input must be accepted or refused with
// mambacpp::Error, never crash, never throw anything else, never fail a target's own check. Under the sanitizer
// job (.ci/run) ASan and UBSan watch the same replay. Each target must have a seed corpus.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "mambacpp/error.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

// The targets that must exist (a target dropped from the build fails here instead of silently not being replayed).
const char* const kTargets[] = {"chat_template", "checkpoint_dir", "completion_request", "config", "gguf",
                                "jinja_template", "npy", "safetensors", "state_file", "token_lists", "tokenizer_encode", "tokenizer_json", "torch_checkpoint",
                                "torch_pickle", "spm_tokenizer"};

const fuzz::Target* find_target(const std::string& name) {
  for (const fuzz::Target& t : fuzz::registry())
    if (name == t.name) return &t;
  return nullptr;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzCorpusReplay : public ::testing::TestWithParam<const char*> {};

TEST_P(FuzzCorpusReplay, EveryInputIsAcceptedOrRefusedWithAnError) {
  const fuzz::Target* target = find_target(GetParam());
  ASSERT_NE(target, nullptr) << "fuzz target '" << GetParam() << "' is not built into the test suite";
  const fs::path root = fs::path(test::source_dir()) / "fuzz";
  const std::vector<fs::path> seeds = files_in(root / "corpus" / GetParam());
  std::vector<fs::path> inputs = seeds;
  for (const fs::path& p : files_in(root / "regressions" / GetParam())) inputs.push_back(p);
  EXPECT_GE(seeds.size(), 3u) << "fuzz/corpus/" << GetParam() << " is missing or nearly empty";
  size_t accepted = 0, refused = 0;
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      target->run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << p.string() << ": escaped as " << typeid(e).name() << ": " << e.what();
    }
  }
  RecordProperty("accepted", static_cast<int>(accepted));
  RecordProperty("refused", static_cast<int>(refused));
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpusReplay, ::testing::ValuesIn(kTargets),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace mambacpp
