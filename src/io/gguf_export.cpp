#include "io/gguf_export.h"

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "core/fp8.h"
#include "core/ggml_blocks.h"
#include "io/checkpoint.h"
#include "mambacpp/dtype.h"
#include "mambacpp/error.h"

namespace mambacpp {

namespace {

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third one between.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Rows of a weight as floats (any format: a packed source is dequantized, as llama.cpp's --allow-requantize does;
// an FP8 checkpoint's e4m3 bytes are multiplied by their row's or the tensor's scale).
void read_rows(const Weight& w, int64_t row0, int64_t rows, float* out) {
  const int64_t cols = w.dim(w.ndim - 1);
  if (w.format == WeightFormat::FP8_E4M3) {
    const bool per_tensor = w.scale.numel() == 1;
    fp8_dequantize_rows(static_cast<const uint8_t*>(w.data.data) + row0 * cols, rows, cols,
                        w.scale.ptr<const float>() + (per_tensor ? 0 : row0), per_tensor, out);
    return;
  }
  if (w.dense()) {
    const size_t es = dtype_size(w.data.dtype);
    convert_to_f32(static_cast<const char*>(w.data.data) + static_cast<size_t>(row0 * cols) * es, w.data.dtype, out,
                   rows * cols);
    return;
  }
  const int64_t rb = w.data.dim(1);
  for (int64_t r = 0; r < rows; ++r)
    ggml_dequantize_row(w.format, static_cast<const uint8_t*>(w.data.data) + (row0 + r) * rb, cols, out + r * cols);
}

}  // namespace

GgufTarget parse_gguf_target(const std::string& name) {
  if (name == "f32") return GgufTarget::F32;
  if (name == "f16") return GgufTarget::F16;
  if (name == "bf16") return GgufTarget::BF16;
  if (name == "q8_0") return GgufTarget::Q8_0;
  if (name == "q4_k" || name == "q4_k_m") return GgufTarget::Q4_K_M;
  if (name == "q6_k") return GgufTarget::Q6_K;
  fail("unknown GGUF type '", name, "': expected f32, f16, bf16, q8_0, q4_k (Q4_K_M) or q6_k");
}

const char* gguf_target_name(GgufTarget t) {
  switch (t) {
    case GgufTarget::F32: return "f32";
    case GgufTarget::F16: return "f16";
    case GgufTarget::BF16: return "bf16";
    case GgufTarget::Q8_0: return "q8_0";
    case GgufTarget::Q4_K_M: return "q4_k_m";
    case GgufTarget::Q6_K: return "q6_k";
  }
  return "?";
}

uint32_t gguf_file_type(GgufTarget t) {
  switch (t) {  // llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15, MOSTLY_Q6_K 18, MOSTLY_BF16 32
    case GgufTarget::F32: return 0;
    case GgufTarget::F16: return 1;
    case GgufTarget::BF16: return 32;
    case GgufTarget::Q8_0: return 7;
    case GgufTarget::Q4_K_M: return 15;
    case GgufTarget::Q6_K: return 18;
  }
  return 0;
}

WeightFormat gguf_tensor_type(GgufTarget target, const std::string& name, const std::vector<int64_t>& shape,
                              bool tied, int64_t i_layer, int64_t n_layers, int64_t n_experts) {
  // What llama.cpp never quantizes: 1-D tensors, anything not named *.weight (ssm_a, ssm_d), norms, conv taps,
  // expert routers (ffn_gate_inp).
  const bool matrix = shape.size() >= 2 && name.ends_with(".weight") && name.find("_norm.weight") == std::string::npos &&
                      name.find("ssm_conv1d.weight") == std::string::npos &&
                      name.find("ffn_gate_inp.weight") == std::string::npos;
  if (!matrix || target == GgufTarget::F32) return WeightFormat::F32;
  if (target == GgufTarget::F16) return WeightFormat::F16;
  if (target == GgufTarget::BF16) return WeightFormat::BF16;
  const int64_t nx = shape.back();
  WeightFormat t = target == GgufTarget::Q8_0 ? WeightFormat::Q8_0
                   : target == GgufTarget::Q6_K ? WeightFormat::Q6_K
                                                : WeightFormat::Q4_K;
  if (name == "output.weight" || (tied && name == "token_embd.weight")) {
    if (nx % 256 != 0) t = WeightFormat::Q8_0;
    else if (t != WeightFormat::Q8_0) t = WeightFormat::Q6_K;
  } else if (n_experts == 8 && (name.ends_with("attn_v.weight") || name.ends_with("attn_k.weight"))) {
    t = WeightFormat::Q8_0;  // llama.cpp's choice for 8-expert models, whatever the target
  } else if (target == GgufTarget::Q4_K_M) {
    if ((name.ends_with("attn_v.weight") || name.find("ffn_down") != std::string::npos) &&
        use_more_bits(i_layer, n_layers))
      t = WeightFormat::Q6_K;
    if (n_experts == 8 && name.ends_with("attn_output.weight")) t = WeightFormat::Q5_K;
  }
  // Rows that are not whole blocks: llama.cpp's fallbacks, then f16.
  if (nx % weight_format_info(t).block_elems != 0) {
    if (t == WeightFormat::Q4_K) t = WeightFormat::Q5_0;
    else if (t == WeightFormat::Q5_K) t = WeightFormat::Q5_1;
    else if (t == WeightFormat::Q6_K) t = WeightFormat::Q8_0;
    else t = WeightFormat::F16;
    if (nx % weight_format_info(t).block_elems != 0) t = WeightFormat::F16;
  }
  return t;
}

WeightSource gguf_source_of(const Checkpoint& ck) {
  // Checkpoint::weight: 16-bit and f32 tensors as they are, an FP8 module's weight with its scales (read_rows
  // dequantizes it); any other dtype is refused there, naming the tensor.
  return [&ck](const std::string& name) -> std::optional<Weight> {
    std::optional<Weight> w = ck.weight(name);
    if (!w && name == "backbone.embeddings.weight") w = ck.weight("backbone.embedding.weight");
    if (!w && name.rfind("model.", 0) == 0) w = ck.weight("backbone." + name.substr(6));
    return w;
  };
}

void gguf_add_model(GgufWriter& w, const ModelConfig& c, const WeightSource& source, GgufTarget target) {
  gguf_write_config(c, w);  // refuses first what llama.cpp would run wrong (gguf_check_writable)
  w.set_u32("general.file_type", gguf_file_type(target));
  if (c.bos_token_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
  if (c.eos_token_id >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_id));
  if (c.pad_token_id >= 0) w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(c.pad_token_id));
  if (target != GgufTarget::F32 && target != GgufTarget::F16 && target != GgufTarget::BF16)
    w.set_u32("general.quantization_version", 2);

  const std::vector<GgufTensorName> names = gguf_tensor_names(c);
  // llama.cpp's quantizer counts attn_v tensors, and takes the layers' count for ffn_down (its n_ffn_down is
  // n_layer), the index being the ffn_down tensors seen so far, or, in a model with experts, the tensor's block.
  int64_t n_attn_v = 0, seen_attn_v = 0, seen_ffn_down = 0;
  for (const GgufTensorName& n : names) n_attn_v += n.gguf.ends_with("attn_v.weight");
  const int64_t n_experts = c.moe.n_experts;
  for (const GgufTensorName& n : names) {
    // The fused tensor (by its name or another the checkpoint may use), else the experts one by one.
    std::optional<Weight> src = source(n.hf);
    for (size_t k = 0; !src && k < n.alt.size(); ++k) src = source(n.alt[k]);
    std::vector<Weight> per_expert;
    if (!src && !n.expert_names.empty()) {
      for (const std::string& e : n.expert_names) {
        std::optional<Weight> w = source(e);
        if (!w) break;
        const int64_t rows = n.gguf_shape[1], cols = n.gguf_shape[2];
        if (w->numel() != rows * cols || w->dim(w->ndim - 1) != cols)
          fail("GGUF export: tensor '", e, "' has shape ", w->shape_string(), "; expected [", rows, ", ", cols, "]");
        per_expert.push_back(*w);
      }
      if (per_expert.size() != n.expert_names.size()) per_expert.clear();
    }
    if (!src && per_expert.empty())
      fail("GGUF export: the model has no tensor '", n.hf, "'",
           n.expert_names.empty() ? std::string() : " (nor its experts' '" + n.expert_names[0] + "', ...)", " (for ",
           n.gguf, ")");
    int64_t src_numel = 1;
    for (int64_t d : n.hf_shape) src_numel *= d;
    if (src && src->numel() != src_numel)
      fail("GGUF export: tensor '", n.hf, "' has shape ", src->shape_string(), "; expected ", src_numel, " elements");
    int64_t i_layer = 0, n_layers = 0;
    if (n.gguf.ends_with("attn_v.weight")) {
      i_layer = seen_attn_v++;
      n_layers = n_attn_v;
    } else if (n.gguf.find("ffn_down") != std::string::npos) {
      i_layer = n_experts > 1 ? std::stoll(n.gguf.substr(4)) : seen_ffn_down++;
      n_layers = c.n_layer;
    }
    // A tied Falcon-H1 is written with its own `output` (gguf_tensor_names): typed as the untied file it is.
    const bool tied = c.tie_embeddings && c.family != Family::FalconH1;
    const WeightFormat f = gguf_tensor_type(target, n.gguf, n.gguf_shape, tied, i_layer, n_layers, n_experts);
    const int64_t cols = n.gguf_shape.back();
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < n.gguf_shape.size(); ++i) rows *= n.gguf_shape[i];
    // Row r of the stored tensor is row src_row(r) of the fused source: the second half's rows follow the first's,
    // per expert where the tensor stacks experts.
    const bool up_half = n.conversion == GgufConversion::UpHalf;
    const bool half = up_half || n.conversion == GgufConversion::GateHalf;
    const int64_t per = n.experts > 0 ? rows / n.experts : rows;  // rows of one expert (or of the whole matrix)
    auto src_row = [per, half, up_half](int64_t r) {
      const int64_t e = r / per, j = r % per;
      return e * (half ? 2 * per : per) + (up_half ? per : 0) + j;
    };
    const Weight weight = src ? *src : Weight();
    const GgufConversion conv = n.conversion;
    const int64_t heads = n.heads, units = rows > 1 ? rows : cols;  // HeadPermute moves rows, or a bias's elements
    const std::vector<GgufTensorName::Scale> scale = n.scale;
    if (rows == 1 && scale.size() > 1)
      fail("GGUF export: tensor '", n.hf, "' is a vector; its folded multipliers must be one segment");
    if (conv == GgufConversion::HeadPermute && (heads < 1 || units % heads != 0 || (units / heads) % 2 != 0))
      fail("GGUF export: tensor '", n.hf, "' of ", units, " channels cannot be split into ", heads,
           " heads of an even size (llama.cpp's RoPE pairs)");
    w.add_tensor(n.gguf, f, n.gguf_shape,
                 [weight, per_expert, per, src_row, f, rows, cols, conv, heads, scale](uint8_t* out) {
      std::vector<float> row(static_cast<size_t>(cols));
      const int64_t rb = weight_row_bytes(f, cols);
      if (!per_expert.empty()) {  // expert r / per's matrix, row r % per
        for (int64_t r = 0; r < rows; ++r) {
          read_rows(per_expert[static_cast<size_t>(r / per)], r % per, 1, row.data());
          ggml_quantize_row(f, row.data(), cols, out + r * rb);
        }
        return;
      }
      // conv [C, 1, K] -> [C, K] keeps the row length; A / D [H] -> [H, 1] and ssm_norm [d] -> [G, d / G] regroup
      // the elements of a small dense tensor, read whole.
      std::vector<float> all;
      const bool regroup = weight.dim(weight.ndim - 1) != cols;
      if (regroup) {
        all.resize(static_cast<size_t>(weight.numel()));
        const int64_t src_cols = weight.dim(weight.ndim - 1);
        read_rows(weight, 0, weight.numel() / src_cols, all.data());
      }
      for (int64_t r = 0; r < rows; ++r) {
        if (regroup) std::memcpy(row.data(), all.data() + r * cols, static_cast<size_t>(cols) * 4);
        else if (conv == GgufConversion::HeadPermute && rows > 1)
          read_rows(weight, gguf_head_permuted_source(r, rows, heads), 1, row.data());
        else read_rows(weight, src_row(r), 1, row.data());
        if (conv == GgufConversion::HeadPermute && rows == 1) {
          const std::vector<float> hf = row;
          for (int64_t i = 0; i < cols; ++i) row[static_cast<size_t>(i)] = hf[static_cast<size_t>(gguf_head_permuted_source(i, cols, heads))];
        }
        if (conv == GgufConversion::NegExp)
          for (float& v : row) v = -std::exp(v);
        // Falcon-H1's multipliers, one f32 product per factor as llama.cpp's converter computes them in torch.
        for (const GgufTensorName::Scale& s : scale)
          if (r < s.end) {
            for (double factor : s.factors)
              for (float& v : row) v *= static_cast<float>(factor);
            break;
          }
        ggml_quantize_row(f, row.data(), cols, out + r * rb);
      }
    });
  }
}

}  // namespace mambacpp
