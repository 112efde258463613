#include "cli_common.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "mambacpp/error.h"
#include "mambacpp/shapes.h"

namespace mambacpp::cli {

CLI::Validator FiniteRange(double lo, double hi) {
  std::ostringstream desc;
  desc << "NUMBER in [" << lo << ", " << hi << "]";
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "expected a number, found '" + text + "'";
        if (std::isnan(v) || !(v >= lo && v <= hi)) {
          std::ostringstream os;
          os << "expected a number in [" << lo << ", " << hi << "], found " << text;
          return os.str();
        }
        return std::string();
      },
      desc.str());
}

CLI::Validator IntRange(int64_t lo, int64_t hi) {
  const std::string desc = "INTEGER in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        // Strictly an integer: CLI11's own conversion clamps an overflowing value (99999999999999999999 became
        // INT64_MAX), and its ranges print the double bounds in full.
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data() + (!text.empty() && text[0] == '+'), end, v);
        if (text.empty() || ec != std::errc() || ptr != end || v < lo || v > hi)
          return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found '" +
                 text.substr(0, 40) + (text.size() > 40 ? "...'" : "'");
        return std::string();
      },
      desc);
}

namespace {

// The regular file `path` opened, or an Error naming `option` (a directory opens as an empty stream otherwise).
std::ifstream open_input(const std::string& path, const std::string& option) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(option, ": '", path, "' is a directory, expected a file");
  if (!std::filesystem::exists(path, ec)) fail(option, ": cannot open '", path, "': no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(option, ": cannot open '", path, "'");
  return in;
}

}  // namespace

void add_model_options(CLI::App& cmd, ModelOptions& opts) {
  cmd.add_option("-m,--model", opts.model_dir, "model directory (config.json + *.safetensors) or FILE.gguf; default: the shipped model");
  cmd.add_option("--device", opts.device, "auto (GPU when usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--dtype", opts.dtype, "weight dtype on the GPU: bf16, fp16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
      ->capture_default_str();
  cmd.add_option("-t,--threads", opts.threads, "CPU threads (0 = all)")
      ->check(IntRange(0, kMaxThreads))
      ->capture_default_str();
  cmd.add_option("--batch-tokens", opts.max_batch_tokens,
                 "tokens per internal prefill piece (bounds memory); default " + std::to_string(kGpuPieceTokens) +
                     " on the GPU, " + std::to_string(kCpuPieceTokens) + " on the CPU")
      ->check(IntRange(1, kMaxCliCount));
  cmd.add_option("--state-dtype", opts.state_dtype, "conv/SSM state dtype: fp32, or bf16 (half the state bytes)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd.add_option("--ctx-size", opts.ctx_size,
                 "models with attention layers: positions a sequence may hold (0 = the config's limit, if any)")
      ->check(IntRange(0, kMaxCliCount))
      ->capture_default_str();
  cmd.add_option("--precision", opts.precision,
                 "GPU, 16-bit weights: fast (activations rounded to the weight dtype, one tensor-core product; "
                 "batch-invariant) or exact (f32-accurate products)")
      ->check(CLI::IsMember({"fast", "exact"}))
      ->capture_default_str();
  cmd.add_flag("--no-batch-invariant", opts.no_batch_invariant,
               "GPU, fast precision: decode batches of up to 8 rows take the fused GEMVs (f32 activations), so a "
               "sequence's last bits may depend on its batch size");
  cmd.add_flag("--no-cuda-graph", opts.no_cuda_graph, "GPU: run decode steps eagerly instead of replaying a CUDA graph");
  cmd.add_flag("--no-fused-decode", opts.no_fused_decode,
               "GPU: run blocks with the plain per-op kernels instead of the fused ones (decode steps, and "
               "prefill's norms and residual adds)");
}

LoadOptions load_options(const ModelOptions& opts) {
  LoadOptions lo;
  lo.device = parse_device_choice(opts.device);
  lo.weight_dtype = parse_dtype(opts.dtype);
  lo.threads = opts.threads;
  lo.max_batch_tokens = opts.max_batch_tokens;
  lo.ctx_size = opts.ctx_size;
  lo.cuda_graphs = !opts.no_cuda_graph;
  lo.fused_decode = !opts.no_fused_decode;
  lo.precision = parse_precision(opts.precision);
  lo.batch_invariant = !opts.no_batch_invariant;
  lo.progress = stderr_is_terminal();
  return lo;
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

int64_t running_slots(int64_t n_prompts, int64_t max_seqs) {
  return std::min(n_prompts, max_seqs > 0 ? max_seqs : kDefaultMaxSeqs);
}

void check_state_slots(const Model& model, int64_t n_slots, DType state_dtype, const std::string& option) {
  if (model.device() != Device::CPU) return;  // a GPU allocation that does not fit fails cleanly (no overcommit)
  const double slot = static_cast<double>(model.create_state(1, state_dtype)->slot_bytes());
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double need = slot * static_cast<double>(n_slots);
  if (have > 0 && need > have) {
    std::ostringstream os;
    os.precision(3);
    os << option << " " << n_slots << ": " << n_slots << " state slots of " << slot / (1 << 20) << " MiB each need "
       << need / (1 << 30) << " GiB, more than this machine's " << have / (1 << 30)
       << " GiB of memory (they are allocated up front); lower " << option;
    fail(os.str());
  }
}

namespace {

// Weights of `c`, roughly (the projections, convolutions, embeddings and LM head; the per-channel vectors left out):
// enough to tell a shape that fits from one that does not.
double weight_elements(const ModelConfig& c) {
  const double D = static_cast<double>(c.d_model), V = static_cast<double>(c.vocab_size);
  const double Di = static_cast<double>(c.d_inner), N = static_cast<double>(c.d_state);
  const double K = static_cast<double>(c.d_conv), G = static_cast<double>(c.n_groups), H = static_cast<double>(c.n_heads);
  const double hd = static_cast<double>(c.attn_head_dim), hq = static_cast<double>(c.n_attn_heads);
  const double hkv = static_cast<double>(c.n_kv_heads), M = static_cast<double>(c.mlp_size);
  const double mlp = D * M * (c.mlp_act == MlpAct::SiluGated ? 3 : 2);
  double n = V * D * (c.tie_embeddings ? 1 : 2);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    switch (c.layer_kind(l)) {
      case LayerKind::Mamba1:
        n += D * 2 * Di + Di * K + Di * (static_cast<double>(c.dt_rank) + 2 * N) + static_cast<double>(c.dt_rank) * Di +
             Di * N + Di * D;
        break;
      case LayerKind::Mamba2: n += D * (2 * Di + 2 * G * N + H) + (Di + 2 * G * N) * K + Di * D; break;
      case LayerKind::Attention: n += D * (hq * hd + 2 * hkv * hd) + hq * hd * D; break;
      case LayerKind::MLP: n += mlp; break;
      case LayerKind::ParallelHybrid:  // Falcon-H1: a Mamba-2 mixer, attention and an MLP in every layer
        n += D * (2 * Di + 2 * G * N + H) + (Di + 2 * G * N) * K + Di * D + D * (hq * hd + 2 * hkv * hd) + hq * hd * D +
             mlp;
        break;
    }
    if (c.mlp_after_mixer) n += mlp;
  }
  return n;
}

}  // namespace

std::unique_ptr<Model> random_model(const std::string& shape, const ModelOptions& opts, DType storage) {
  const ModelConfig c = named_shape(shape);
  // The weights are drawn into host memory whatever the device: past the machine's memory the kernel would kill the
  // process (or another one) instead of an allocation failing.
  const double need = weight_elements(c) * static_cast<double>(dtype_size(storage));
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (have > 0 && need > 0.9 * have) {
    std::ostringstream os;
    os.precision(3);
    os << "--shape " << shape << ": its random weights in " << dtype_name(storage) << " take about " << need / 0x1p30
       << " GiB, more than 90% of this machine's " << have / 0x1p30 << " GiB of memory"
       << (storage == DType::F32 ? "; try --weights bf16" : "");
    fail(os.str());
  }
  return Model::random(c, load_options(opts), 1, storage);
}

std::unique_ptr<Model> load_model(const ModelOptions& opts) {
  const LoadOptions lo = load_options(opts);
  const std::string dir = opts.model_dir.empty() ? default_model_dir() : opts.model_dir;
  auto model = Model::load(dir, lo);
  if (lo.progress) std::cerr << "loaded " << dir << " on " << model->device_description() << "\n";
  return model;
}

SpeculativeParams SpeculativeCliOptions::params() const {
  SpeculativeParams p;
  p.draft_model = !draft_model.empty();
  p.draft_ngram = draft_ngram;
  p.draft_mtp = draft_mtp;
  p.draft_max = draft_max;
  p.adaptive = !no_adaptive;
  return p;
}

void add_speculative_options(CLI::App& cmd, SpeculativeCliOptions& opts) {
  cmd.add_option("--draft-model", opts.draft_model,
                 "speculative decoding: a smaller model of the same vocabulary drafts tokens that the model verifies")
      ->check(CLI::ExistingPath);
  cmd.add_option("--draft-ngram", opts.draft_ngram,
                 "speculative decoding by prompt lookup: draft the continuation of the last N tokens' earlier "
                 "occurrence in the prompt and output (0: off)")
      ->check(IntRange(0, 16))
      ->capture_default_str();
  cmd.add_flag("--draft-mtp", opts.draft_mtp,
               "speculative decoding with the model's own multi-token-prediction layers (Nemotron-H checkpoints with "
               "num_nextn_predict_layers, e.g. Nemotron 3 Super)");
  cmd.add_option("--draft-max", opts.draft_max,
                 "speculative decoding: tokens drafted per step at most (0: " + std::to_string(kDefaultDraftMax) +
                     "; a verify row holds at most 16 tokens)")
      ->check(IntRange(0, 32))
      ->capture_default_str();
  cmd.add_flag("--draft-fixed", opts.no_adaptive,
               "speculative decoding: always draft --draft-max tokens (default: fewer, and pauses, while drafts are "
               "rejected)");
}

std::unique_ptr<Model> load_draft_model(const SpeculativeCliOptions& spec, const ModelOptions& model) {
  if (spec.draft_mtp && (spec.draft_ngram > 0 || !spec.draft_model.empty()))
    fail("--draft-mtp, --draft-model and --draft-ngram: drafts come from one source, give one of them");
  if (spec.draft_model.empty()) return nullptr;
  if (spec.draft_ngram > 0) fail("--draft-model and --draft-ngram: drafts come from one source, give one of them");
  ModelOptions d = model;
  d.model_dir = spec.draft_model;
  return load_model(d);
}

std::string read_input_file(const std::string& path, const std::string& option) {
  std::ifstream in = open_input(path, option);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(option, ": cannot read '", path, "'");
  return ss.str();
}

std::vector<int32_t> read_token_file(const std::string& path) {
  std::ifstream in = open_input(path, "--tokens-file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_token_ids(ss.str(), "--tokens-file '" + path + "'");
}

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source) {
  std::vector<int32_t> ids;
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  const auto bad = [&](size_t at, const std::string& found) {
    fail(source, ": expected integer token ids in [0, 2^31) separated by spaces or one comma, found ", found, " at byte ", at,
         " (token ", ids.size(), ")");
  };
  size_t i = 0;
  const size_t n = text.size();
  bool comma = false;  // a comma since the last id: another id must follow
  while (true) {
    while (i < n && space(text[i])) ++i;
    if (i == n) break;
    if (text[i] == ',') {
      if (ids.empty() || comma) bad(i, "an empty entry ','");
      comma = true;
      ++i;
      continue;
    }
    const size_t start = i;
    int64_t v = 0;
    while (i < n && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + (text[i] - '0');
      if (v > INT32_MAX) bad(start, "an id above 2^31 - 1");
      ++i;
    }
    if (i == start || (i < n && !space(text[i]) && text[i] != ',')) {
      size_t end = start;
      while (end < n && !space(text[end]) && text[end] != ',' && end - start < 40) ++end;
      bad(start, "'" + text.substr(start, end - start) + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
    comma = false;
  }
  if (comma) bad(n, "a trailing ','");
  return ids;
}

std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::ifstream in = open_input(path, "--prompts-file");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  if (in.bad()) fail("--prompts-file: cannot read '", path, "'");
  return lines;
}

std::vector<int64_t> parse_chunks(const std::string& text, const std::string& option) {
  std::vector<int64_t> out;
  std::istringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || v <= 0)
      fail(option, ": expected positive lengths separated by commas (e.g. 3,1,17), found '", part, "'");
    out.push_back(v);
  }
  if (out.empty()) fail(option, ": expected at least one length");
  return out;
}

}  // namespace mambacpp::cli
