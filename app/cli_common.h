// Options every subcommand shares (declared once: name, default, help) and the helpers that act on them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mambacpp/engine.h"
#include "mambacpp/model.h"

namespace mambacpp::cli {

struct ModelOptions {
  std::string model_dir;  // empty: the shipped default model
  std::string device = "auto";
  std::string dtype = "bf16";  // weights on the GPU
  int threads = 0;
  int64_t max_batch_tokens = 0;  // 0: the device's default piece size
  int64_t ctx_size = 0;  // attention layers' context limit; 0: the config's
  bool no_cuda_graph = false;
  bool no_fused_decode = false;
  std::string precision = "fast";  // GPU, 16-bit weights (mambacpp/precision.h)
  bool no_batch_invariant = false;
  std::string state_dtype = "fp32";  // conv/SSM state: fp32 or bf16

  DType state() const { return parse_dtype(state_dtype); }
};

// A floating-point option in [lo, hi]. CLI11's Range lets NaN through (every comparison with NaN is false); this
// refuses NaN and, with finite bounds, the infinities.
CLI::Validator FiniteRange(double lo, double hi);
// An integer option in [lo, hi]: anything else (a fraction, an exponent, a value past int64, text) is refused with
// "expected an integer in [lo, hi], found '...'".
CLI::Validator IntRange(int64_t lo, int64_t hi);
// The bound of counts and lengths given on the command line (tokens, positions, steps): 2^31 - 1, what an int holds.
// Nothing legitimate comes near it; past it sizes computed from these counts could overflow.
constexpr int64_t kMaxCliCount = INT32_MAX;
// MiB options (--state-cache-mb, --max-out-mb): 2^32 MiB (4 PiB), so that the byte count (MiB << 20) fits int64.
constexpr int64_t kMaxStateCacheMb = int64_t{1} << 32;
// bench: sequences of a closed batch (each a state slot, also checked against the memory) and --serve requests.
constexpr int64_t kMaxBenchBatch = 65536;
constexpr int64_t kMaxBenchRequests = 1 << 20;
// bench: prompt tokens drawn up front (batch x prompt, requests x longest prompt): 2^28, a GiB of int32 ids.
constexpr int64_t kMaxBenchTokens = int64_t{1} << 28;

// Speculative decoding (generate, serve's defaults): where drafts come from and how many per step.
struct SpeculativeCliOptions {
  std::string draft_model;  // --draft-model DIR: loaded with the model's device options
  int draft_ngram = 0;      // --draft-ngram N: prompt lookup
  bool draft_mtp = false;   // --draft-mtp: the model's own multi-token-prediction block
  int draft_max = 0;        // --draft-max K; 0: the engine's default
  bool no_adaptive = false;  // --draft-fixed: always draft --draft-max tokens

  // The request's parameters (draft_model: whether a draft model was given).
  SpeculativeParams params() const;
};
void add_speculative_options(CLI::App& cmd, SpeculativeCliOptions& opts);
// The draft model of --draft-model, loaded as `model` was (device, dtype, threads); null without one.
std::unique_ptr<Model> load_draft_model(const SpeculativeCliOptions& spec, const ModelOptions& model);

// Adds --model, --device, --dtype, --threads, --batch-tokens to a subcommand.
void add_model_options(CLI::App& cmd, ModelOptions& opts);

LoadOptions load_options(const ModelOptions& opts);

// Loads the model the options name (progress on stderr when it is a terminal).
std::unique_ptr<Model> load_model(const ModelOptions& opts);
// Random weights of the named shape (bench/serve --shape) stored as `storage`; an Error naming --shape when they
// would not fit in the machine's memory (they are drawn in host memory before anything runs).
std::unique_ptr<Model> random_model(const std::string& shape, const ModelOptions& opts, DType storage);

// The whole of a regular file named by `option` (a directory or a missing file is an Error naming the option).
std::string read_input_file(const std::string& path, const std::string& option);

// Reads whitespace- or comma-separated token ids; throws Error naming the file and the bad token.
std::vector<int32_t> read_token_file(const std::string& path);
// The parser behind it: ids in [0, 2^31) separated by whitespace and/or one comma ("1 2", "1,2", "1, 2"); an empty
// entry ("1,,2", a trailing comma) is an error. `source` names the input in messages.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source);

// The lines of a --prompts-file (a directory or a missing file is an Error naming the option).
std::vector<std::string> read_prompt_lines(const std::string& path);

// Parses "N,N,..." into positive lengths; throws Error naming the option.
std::vector<int64_t> parse_chunks(const std::string& text, const std::string& option);

bool stderr_is_terminal();

// `generate`'s state slots for `n_prompts` prompts and --max-seqs `max_seqs` (0: the default): never more than the
// prompts, and by default at most kDefaultMaxSeqs, so that a prompts file of many thousand lines does not allocate a
// state for each line up front (the rest wait for a slot).
constexpr int64_t kDefaultMaxSeqs = 64;
int64_t running_slots(int64_t n_prompts, int64_t max_seqs);

// Refuses `n_slots` state slots (allocated and zeroed up front, one per running sequence) that would not fit in the
// machine's memory, on the CPU; an Error names `option`, the flag that chose n_slots. A GPU allocation that does
// not fit fails by itself, cleanly.
void check_state_slots(const Model& model, int64_t n_slots, DType state_dtype, const std::string& option);

}  // namespace mambacpp::cli
