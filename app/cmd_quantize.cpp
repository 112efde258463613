// `mambacpp quantize`: any model mambacpp reads, written as a GGUF file llama.cpp loads (mambacpp/gguf.h), or with
// --type fp8 as a ModelOpt FP8 checkpoint directory (mambacpp/fp8_checkpoint.h).
#include <cstdio>

#include "commands.h"
#include "mambacpp/fp8_checkpoint.h"
#include "mambacpp/gguf.h"

namespace mambacpp::cli {

namespace {
struct QuantizeOptions {
  std::string model;
  std::string type;
  std::string out;
};

void quantize_fp8(const QuantizeOptions& o) {
  const Fp8QuantizeReport r = quantize_to_fp8_checkpoint(o.model, o.out, [](int64_t done, int64_t total) {
    std::fprintf(stderr, "\rquantizing: tensor %lld / %lld", static_cast<long long>(done), static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\r\033[K");
  });
  std::fprintf(stderr, "wrote %s: %lld tensors in fp8 e4m3 (per-channel scales), %lld kept, %.1f MiB of weights\n",
               o.out.c_str(), static_cast<long long>(r.quantized), static_cast<long long>(r.kept),
               static_cast<double>(r.bytes) / (1 << 20));
}
}  // namespace

CLI::App* add_quantize_command(CLI::App& app, std::function<void()>& run) {
  auto opts = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "write a model as a GGUF file in llama.cpp's format and types, or as an FP8 checkpoint (ModelOpt)");
  cmd->add_option("-m,--model", opts->model, "model directory or .gguf file")->required();
  cmd->add_option("--type", opts->type,
                  "f32, f16, bf16, q8_0, q4_k (Q4_K_M) or q6_k (a .gguf file); fp8 (a ModelOpt FP8 directory)")
      ->required();
  cmd->add_option("-o,--out", opts->out, "the .gguf file to write (atomically); for fp8 a new or empty directory")
      ->required();
  cmd->callback([opts, &run] {
    run = [opts] {
      if (opts->type == "fp8" || opts->type == "FP8") return quantize_fp8(*opts);
      const QuantizeReport r = quantize_to_gguf(opts->model, opts->type, opts->out);
      std::fprintf(stderr, "wrote %s: %lld tensors, %.1f MiB\n", opts->out.c_str(), static_cast<long long>(r.tensors),
                   static_cast<double>(r.bytes) / (1 << 20));
    };
  });
  return cmd;
}

}  // namespace mambacpp::cli
