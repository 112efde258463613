// llama.cpp's own quantizer (llama_model_quantize, what the llama-quantize tool calls; no importance matrix) run from
// node-llama-cpp's prebuilt libllama, which ships no llama-quantize binary. Built against the llama.h of the same
// release (node-llama-cpp carries llama.cpp's source as llama/gitRelease.bundle); see gguf_quantize_check.sh.
//   llama_quantize IN.gguf OUT.gguf q8_0|q4_k_m|q6_k|f16|bf16
#include <cstdio>
#include <cstring>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: llama_quantize IN.gguf OUT.gguf q8_0|q4_k_m|q6_k|f16|bf16\n");
    return 2;
  }
  const struct {
    const char* name;
    llama_ftype ftype;
  } types[] = {{"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
               {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K}, {"f16", LLAMA_FTYPE_MOSTLY_F16}, {"bf16", LLAMA_FTYPE_MOSTLY_BF16}};
  llama_model_quantize_params p = llama_model_quantize_default_params();
  bool found = false;
  for (const auto& t : types)
    if (std::strcmp(argv[3], t.name) == 0) {
      p.ftype = t.ftype;
      found = true;
    }
  if (!found) {
    std::fprintf(stderr, "llama_quantize: unknown type '%s'\n", argv[3]);
    return 2;
  }
  p.nthread = 2;
  llama_backend_init();
  const uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
  llama_backend_free();
  if (rc != 0) std::fprintf(stderr, "llama_quantize: llama_model_quantize failed (%u)\n", rc);
  return rc == 0 ? 0 : 1;
}
