// Shared helpers for the tests: fixture paths, error measures, temporary directories, and tiny random models
// written as real checkpoints (config.json + model.safetensors) so that tests go through the real loader.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mambacpp/config.h"
#include "mambacpp/dtype.h"

namespace mambacpp::test {

std::string fixture_dir();  // <source>/fixtures
std::string source_dir();

// max|a - b| / max|b| over the whole tensor; +inf when sizes differ or anything is NaN/inf.
double max_rel_diff(std::span<const float> a, std::span<const float> b);
double max_rel_diff(std::span<const double> a, std::span<const double> b);

// The message of the mambacpp::Error that f throws, or "(no error)".
std::string error_of(const std::function<void()>& f);

// The transformers fixture model directories (fixtures/models/*/ with a logits.npy), sorted.
std::vector<std::string> fixture_model_dirs();
// Whitespace-separated token ids (the fixtures' tokens.txt).
std::vector<int32_t> read_token_ids(const std::string& path);

// Runs the mambacpp binary with `args` (shell syntax) and collects its exit code, stdout and stderr.
struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  std::string output() const { return out + err; }
};
CliResult run_cli(const std::string& args);

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "mambacpp_test");
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tensor to be written to a safetensors file: f32 values, stored as `dtype`.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
  DType dtype = DType::F32;
};
void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors);

// Writes a random model of the given config (transformers names and config.json keys) into `dir`. Weights are drawn
// so that every parameter visibly matters (A_log spread, dt bias so decays span fast and slow, O(1) projections).
void write_random_model(const std::string& dir, const ModelConfig& config, uint64_t seed,
                        DType storage = DType::F32);

// Small awkward configs for property tests.
ModelConfig tiny_mamba1_config();
ModelConfig tiny_mamba2_config();

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed);

}  // namespace mambacpp::test
