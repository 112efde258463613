// `mambacpp quantize`: any model mambacpp reads, written as a GGUF file llama.cpp loads (mambacpp/gguf.h).
#include <cstdio>

#include "commands.h"
#include "mambacpp/gguf.h"

namespace mambacpp::cli {

namespace {
struct QuantizeOptions {
  std::string model;
  std::string type;
  std::string out;
};
}  // namespace

CLI::App* add_quantize_command(CLI::App& app, std::function<void()>& run) {
  auto opts = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "write a model as a GGUF file in llama.cpp's format and types");
  cmd->add_option("-m,--model", opts->model, "model directory or .gguf file")->required();
  cmd->add_option("--type", opts->type, "f32, f16, bf16, q8_0, q4_k (Q4_K_M) or q6_k")->required();
  cmd->add_option("-o,--out", opts->out, "the .gguf file to write (atomically)")->required();
  cmd->callback([opts, &run] {
    run = [opts] {
      const QuantizeReport r = quantize_to_gguf(opts->model, opts->type, opts->out);
      std::fprintf(stderr, "wrote %s: %lld tensors, %.1f MiB\n", opts->out.c_str(), static_cast<long long>(r.tensors),
                   static_cast<double>(r.bytes) / (1 << 20));
    };
  });
  return cmd;
}

}  // namespace mambacpp::cli
