#include "support/test_support.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "mambacpp/error.h"

namespace mambacpp::test {

namespace fs = std::filesystem;

std::string source_dir() { return MAMBACPP_SOURCE_DIR; }
std::string fixture_dir() { return MAMBACPP_FIXTURE_DIR; }

template <class T>
static double rel_diff(std::span<const T> a, std::span<const T> b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return std::numeric_limits<double>::infinity();
    max_err = std::max(max_err, std::fabs(x - y));
    max_ref = std::max(max_ref, std::fabs(y));
  }
  if (max_ref == 0.0) return max_err == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return max_err / max_ref;
}
double max_rel_diff(std::span<const float> a, std::span<const float> b) { return rel_diff(a, b); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

CliResult run_cli(const std::string& args) {
  TempDir tmp("mambacpp_cli");
  const std::string cmd = std::string(MAMBACPP_BINARY) + " " + args + " 2>" + tmp.file("stderr.txt");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) fail("cannot run ", cmd);
  CliResult r;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(tmp.file("stderr.txt"));
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

std::vector<std::string> fixture_model_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(fixture_dir()) / "models";
  if (!fs::exists(root)) return dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<int32_t> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open ", path);
  std::vector<int32_t> ids;
  for (int64_t v; in >> v;) ids.push_back(static_cast<int32_t>(v));
  return ids;
}
double max_rel_diff(std::span<const double> a, std::span<const double> b) { return rel_diff(a, b); }

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (!mkdtemp(tmpl.data())) fail("cannot create a temporary directory from ", tmpl);
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    MAMBACPP_ASSERT(static_cast<int64_t>(t.values.size()) == n);
    size_t begin = data.size();
    std::string bytes(static_cast<size_t>(n) * dtype_size(t.dtype), '\0');
    convert_from_f32(t.values.data(), bytes.data(), t.dtype, n);
    data += bytes;
    const char* st_dtype = t.dtype == DType::F32 ? "F32" : t.dtype == DType::F16 ? "F16" : "BF16";
    header[name] = {{"dtype", st_dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) fail("failed writing ", path);
}

namespace {

struct Init {
  std::mt19937_64 rng;
  HostTensor normal(std::vector<int64_t> shape, double mean, double std) {
    HostTensor t{shape, {}, DType::F32};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<double> dist(mean, std);
    t.values.resize(static_cast<size_t>(n));
    for (auto& v : t.values) v = static_cast<float>(dist(rng));
    return t;
  }
  HostTensor uniform(std::vector<int64_t> shape, double lo, double hi) {
    HostTensor t{shape, {}, DType::F32};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<double> dist(lo, hi);
    t.values.resize(static_cast<size_t>(n));
    for (auto& v : t.values) v = static_cast<float>(dist(rng));
    return t;
  }
  // dt bias so that softplus(bias) is log-uniform in [0.01, 0.5]: decays span slow and fast.
  HostTensor dt_bias(int64_t n) {
    HostTensor t = uniform({n}, std::log(0.01), std::log(0.5));
    for (auto& v : t.values) {
      double dt = std::exp(static_cast<double>(v));
      v = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // inverse softplus
    }
    return t;
  }
  HostTensor a_log(std::vector<int64_t> shape) {
    HostTensor t = uniform(shape, 1.0, 16.0);
    for (auto& v : t.values) v = std::log(v);
    return t;
  }
};

}  // namespace

void write_random_model(const std::string& dir, const ModelConfig& c, uint64_t seed, DType storage) {
  fs::create_directories(dir);
  Init init{std::mt19937_64(seed)};
  std::map<std::string, HostTensor> w;
  const double in_scale = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  const double inner_scale = 1.0 / std::sqrt(static_cast<double>(c.d_inner));
  w["backbone.embeddings.weight"] = init.normal({c.vocab_size, c.d_model}, 0.0, 1.0);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    std::string p = "backbone.layers." + std::to_string(i) + ".";
    w[p + "norm.weight"] = init.normal({c.d_model}, 1.0, 0.2);
    w[p + "mixer.in_proj.weight"] = init.normal({c.in_proj_size(), c.d_model}, 0.0, in_scale);
    w[p + "mixer.conv1d.weight"] = init.normal({c.conv_channels(), 1, c.d_conv}, 0.0, 0.5);
    if (c.use_conv_bias) w[p + "mixer.conv1d.bias"] = init.normal({c.conv_channels()}, 0.0, 0.2);
    w[p + "mixer.out_proj.weight"] = init.normal({c.d_model, c.d_inner}, 0.0, inner_scale);
    if (c.use_bias) {
      w[p + "mixer.in_proj.bias"] = init.normal({c.in_proj_size()}, 0.0, 0.2);
      w[p + "mixer.out_proj.bias"] = init.normal({c.d_model}, 0.0, 0.2);
    }
    if (c.arch == Arch::Mamba1) {
      w[p + "mixer.x_proj.weight"] = init.normal({c.dt_rank + 2 * c.d_state, c.d_inner}, 0.0, inner_scale);
      w[p + "mixer.dt_proj.weight"] =
          init.normal({c.d_inner, c.dt_rank}, 0.0, 1.0 / std::sqrt(static_cast<double>(c.dt_rank)));
      w[p + "mixer.dt_proj.bias"] = init.dt_bias(c.d_inner);
      w[p + "mixer.A_log"] = init.a_log({c.d_inner, c.d_state});
      w[p + "mixer.D"] = init.uniform({c.d_inner}, 0.5, 1.5);
    } else {
      w[p + "mixer.dt_bias"] = init.dt_bias(c.n_heads);
      w[p + "mixer.A_log"] = init.a_log({c.n_heads});
      w[p + "mixer.D"] = init.uniform({c.n_heads}, 0.5, 1.5);
      w[p + "mixer.norm.weight"] = init.normal({c.d_inner}, 1.0, 0.2);
    }
  }
  w["backbone.norm_f.weight"] = init.normal({c.d_model}, 1.0, 0.2);
  if (!c.tie_embeddings) w["lm_head.weight"] = init.normal({c.vocab_size, c.d_model}, 0.0, in_scale);
  for (auto& [name, t] : w) t.dtype = storage;
  write_safetensors(dir + "/model.safetensors", w);

  nlohmann::json j;
  j["hidden_size"] = c.d_model;
  j["num_hidden_layers"] = c.n_layer;
  j["vocab_size"] = c.vocab_size;
  j["state_size"] = c.d_state;
  j["conv_kernel"] = c.d_conv;
  j["expand"] = c.d_inner / c.d_model;
  j["use_bias"] = c.use_bias;
  j["use_conv_bias"] = c.use_conv_bias;
  j["residual_in_fp32"] = c.residual_in_fp32;
  j["layer_norm_epsilon"] = c.norm_eps;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  if (c.eos_token_id >= 0 && c.extra_eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_id;
  if (!c.extra_eos_token_ids.empty()) {  // a list, as Llama-3-style configs give it
    j["eos_token_id"] = {c.eos_token_id};
    for (int64_t id : c.extra_eos_token_ids) j["eos_token_id"].push_back(id);
  }
  if (c.arch == Arch::Mamba1) {
    j["model_type"] = "mamba";
    j["architectures"] = {"MambaForCausalLM"};
    j["time_step_rank"] = c.dt_rank;
  } else {
    j["model_type"] = "mamba2";
    j["architectures"] = {"Mamba2ForCausalLM"};
    j["num_heads"] = c.n_heads;
    j["head_dim"] = c.head_dim;
    j["n_groups"] = c.n_groups;
    j["chunk_size"] = c.chunk_size;
    j["rms_norm"] = true;
  }
  std::string text = j.dump(2);
  if (c.arch == Arch::Mamba2) {  // time_step_limit as transformers writes it: a bare Infinity when unlimited
    std::string hi = std::isfinite(c.dt_max) ? std::to_string(c.dt_max) : "Infinity";
    text.insert(text.rfind('}'), ",\n  \"time_step_limit\": [" + std::to_string(c.dt_min) + ", " + hi + "]\n");
  }
  std::ofstream(dir + "/config.json") << text;
}

ModelConfig tiny_mamba1_config() {
  ModelConfig c;
  c.arch = Arch::Mamba1;
  c.d_model = 20;
  c.n_layer = 2;
  c.vocab_size = 53;
  c.d_state = 6;
  c.d_conv = 4;
  c.d_inner = 40;
  c.dt_rank = 2;
  c.use_bias = true;
  c.tie_embeddings = false;
  return c;
}

ModelConfig tiny_mamba2_config() {
  ModelConfig c;
  c.arch = Arch::Mamba2;
  c.d_model = 18;
  c.n_layer = 2;
  c.vocab_size = 47;
  c.d_state = 6;
  c.d_conv = 4;
  c.d_inner = 36;
  c.n_heads = 6;
  c.head_dim = 6;
  c.n_groups = 2;
  c.chunk_size = 8;
  c.tie_embeddings = true;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = dist(rng);
  return ids;
}

}  // namespace mambacpp::test
