// Model::random: weights of a real shape drawn from a counter-based generator (fast, parallel, reproducible), for
// benchmarks. Norm weights are 1, decays span slow and fast, projections are scaled by 1/sqrt(fan_in).
// Model::random_quantized: the same values, the matrices quantized to a ggml block format (core/ggml_blocks.h), or
// to fp8 e4m3 with per-output-channel scales (core/fp8.h; embeddings and lm_head stay bf16, as ModelOpt leaves them).
// K-quant matrices (256-element super-blocks) are the exception: ggml's reference rounding for them searches scales
// (100-400 ns a weight: minutes for a few billion), so each matrix quantizes a pool of kKQuantPoolBlocks super-blocks
// drawn from the same distribution and every block of the matrix is one of them, picked by a hash of its position.
// Values of the right scale and bytes of the real layout are all a benchmark needs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "backend/cpu/thread_pool.h"
#include "mambacpp/error.h"
#include "model/model_impl.h"
#include "core/splitmix.h"
#include "core/fp8.h"
#include "core/ggml_blocks.h"
#include "core/weight.h"
#include "model/weights.h"

namespace mambacpp {

namespace {

constexpr int64_t kKQuantPoolBlocks = 512;

double uniform01(uint64_t seed, uint64_t stream, uint64_t i) {
  return static_cast<double>(splitmix64(seed ^ splitmix64(stream * 0x100000001b3ull + i)) >> 11) * 0x1.0p-53;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor a pure Mamba config needs, by name and shape, as bind_weights expects them.
void pure_shapes(const ModelConfig& c, std::map<std::string, std::vector<int64_t>>& shapes) {
  shapes["backbone.embeddings.weight"] = {c.vocab_size, c.d_model};
  shapes["backbone.norm_f.weight"] = {c.d_model};
  if (!c.tie_embeddings) shapes["lm_head.weight"] = {c.vocab_size, c.d_model};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".", m = p + "mixer.";
    shapes[p + "norm.weight"] = {c.d_model};
    shapes[m + "in_proj.weight"] = {c.in_proj_size(), c.d_model};
    shapes[m + "conv1d.weight"] = {c.conv_channels(), 1, c.d_conv};
    shapes[m + "out_proj.weight"] = {c.d_model, c.d_inner};
    if (c.use_bias) shapes[m + "in_proj.bias"] = {c.in_proj_size()}, shapes[m + "out_proj.bias"] = {c.d_model};
    if (c.use_conv_bias) shapes[m + "conv1d.bias"] = {c.conv_channels()};
    if (c.arch == Arch::Mamba1) {
      shapes[m + "x_proj.weight"] = {c.dt_rank + 2 * c.d_state, c.d_inner};
      shapes[m + "dt_proj.weight"] = {c.d_inner, c.dt_rank};
      shapes[m + "dt_proj.bias"] = {c.d_inner};
      shapes[m + "A_log"] = {c.d_inner, c.d_state};
      shapes[m + "D"] = {c.d_inner};
    } else {
      shapes[m + "dt_bias"] = {c.n_heads};
      shapes[m + "A_log"] = {c.n_heads};
      shapes[m + "D"] = {c.n_heads};
      shapes[m + "norm.weight"] = {c.d_inner};
    }
  }
}

// Where a matrix is stored in a quantized random model: the target's format as llama.cpp's quantizer gives it without
// an importance matrix (q4_k is Q4_K_M: the embedding and output in Q6_K; its choice of Q6_K for some layers' attn_v
// and ffn_down is not made here), falling back to a 32-element format (Q5_0 / Q8_0) for rows that are not whole
// super-blocks and to f16 for rows that are not whole blocks. Routers stay f32.
WeightFormat random_matrix_format(WeightFormat target, const std::string& name, int64_t cols) {
  if (name.find("router") != std::string::npos) return WeightFormat::F32;
  const bool table = ends_with(name, "embeddings.weight") || ends_with(name, "embed_tokens.weight") ||
                     ends_with(name, "embedding.weight") || ends_with(name, "lm_head.weight");
  if (target == WeightFormat::FP8_E4M3) return table ? WeightFormat::BF16 : target;
  WeightFormat f = target == WeightFormat::Q4_K && table ? WeightFormat::Q6_K : target;
  if (weight_format_info(f).block_elems == 256 && cols % 256 != 0)
    f = f == WeightFormat::Q6_K ? WeightFormat::Q8_0 : f == WeightFormat::Q5_K ? WeightFormat::Q5_1 : WeightFormat::Q5_0;
  if (cols % weight_format_info(f).block_elems != 0) f = WeightFormat::F16;
  return f;
}

}  // namespace

std::unique_ptr<Model> Model::random(const ModelConfig& config, const LoadOptions& options, uint64_t seed, DType storage) {
  if (storage != DType::F32 && storage != DType::F16 && storage != DType::BF16)
    fail("random model: storage dtype must be f32, f16 or bf16, found ", dtype_name(storage));
  return random_quantized(config, options, seed, dtype_name(storage));
}

std::unique_ptr<Model> Model::random_quantized(const ModelConfig& config, const LoadOptions& options, uint64_t seed,
                                               const std::string& format) {
  config.validate();
  const WeightFormat wf = format == "fp8" ? WeightFormat::FP8_E4M3 : parse_weight_format(format);
  const DType storage = is_dense(wf) ? dense_dtype(wf) : DType::F32;
  const bool quantized = !is_dense(wf);
  auto impl = std::make_unique<Impl>();
  impl->dir = "(random weights)";
  impl->options = options;
  impl->config = config;
  impl->random_seed = seed;
  impl->backend = make_backend(impl->options);

  const ModelConfig& c = config;
  std::map<std::string, std::vector<int64_t>> shapes;
  if (c.hybrid())
    for (auto& [name, shape] : hybrid_weight_shapes(c)) shapes[name] = shape;
  else
    pure_shapes(c, shapes);

  const int threads =
      options.threads > 0 ? options.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::map<std::string, TensorView> views;
  std::map<std::string, Weight> packed;
  std::vector<std::string> names;
  uint64_t stream = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const double fan_in = shape.size() >= 2 ? static_cast<double>(shape.back()) : 1.0;  // conv: d_conv taps
    ++stream;
    const bool is_norm = ends_with(name, "norm.weight") || ends_with(name, "norm_f.weight");
    const bool is_a_log = ends_with(name, "A_log"), is_d = ends_with(name, ".D");
    const bool is_dt_bias = ends_with(name, "dt_bias") || ends_with(name, "dt_proj.bias");
    const double scale = 1.0 / std::sqrt(fan_in);
    constexpr int64_t kBlock = 1 << 16;
    DType dt = storage;
    if (quantized) {
      // Matrices quantized row by row (ggml's reference rounding) straight from the drawn values; everything else
      // f32, as llama.cpp keeps vectors, conv taps, A and D.
      const bool matrix = shape.size() >= 2 && ends_with(name, ".weight") && !is_norm &&
                          name.find("conv1d") == std::string::npos;
      const WeightFormat f = matrix ? random_matrix_format(wf, name, shape.back()) : WeightFormat::F32;
      dt = is_dense(f) ? dense_dtype(f) : dt;
      if (!is_dense(f)) {
        if (shape.size() > 3) fail("random model: tensor '", name, "' has more than 3 dims; cannot quantize it");
        const int64_t cols = shape.back(), rows = n / cols, rb = weight_row_bytes(f, cols);
        // fp8's scales first: a later emplace_back would move the blob's vector (its bytes stay where they are).
        const bool fp8 = f == WeightFormat::FP8_E4M3;
        float* scales = fp8 ? reinterpret_cast<float*>(
                                  impl->random_blobs.emplace_back(static_cast<size_t>(rows) * sizeof(float)).data())
                            : nullptr;
        std::vector<char>& blob = impl->random_blobs.emplace_back(static_cast<size_t>(rows * rb));
        const int64_t bel = weight_format_info(f).block_elems, bb = weight_format_info(f).block_bytes;
        const bool pooled = bel == 256;
        std::vector<uint8_t> pool(pooled ? static_cast<size_t>(kKQuantPoolBlocks * bb) : 0);
        if (pooled)
          cpu::parallel_tasks(threads, kKQuantPoolBlocks, [&](int64_t p) {
            std::vector<float> vals(static_cast<size_t>(bel));
            for (int64_t i = 0; i < bel; ++i)
              vals[i] = static_cast<float>((2.0 * uniform01(seed, stream, static_cast<uint64_t>(p * bel + i)) - 1.0) *
                                           scale);
            ggml_quantize_row(f, vals.data(), bel, &pool[static_cast<size_t>(p * bb)]);
          });
        const int64_t rows_per_task = std::max<int64_t>(1, kBlock / cols);
        cpu::parallel_tasks(threads, (rows + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
          const int64_t r0 = task * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
          std::vector<float> vals(static_cast<size_t>(cols));
          for (int64_t r = r0; r < r1; ++r) {
            if (pooled) {
              uint8_t* row = reinterpret_cast<uint8_t*>(blob.data()) + r * rb;
              for (int64_t b = 0; b < cols / bel; ++b) {
                const uint64_t h = splitmix64(seed ^ splitmix64((stream << 40) + 0x9e3779b9ull + r * (cols / bel) + b));
                std::memcpy(row + b * bb, &pool[static_cast<size_t>((h % kKQuantPoolBlocks) * bb)],
                            static_cast<size_t>(bb));
              }
              continue;
            }
            for (int64_t i = 0; i < cols; ++i)
              vals[i] = static_cast<float>((2.0 * uniform01(seed, stream, static_cast<uint64_t>(r * cols + i)) - 1.0) *
                                           scale);
            uint8_t* row = reinterpret_cast<uint8_t*>(blob.data()) + r * rb;
            if (fp8)
              fp8_quantize_rows(vals.data(), 1, cols, row, scales + r);
            else
              ggml_quantize_row(f, vals.data(), cols, row);
          }
        });
        const TensorView sv = fp8 ? TensorView(scales, DType::F32, {rows}) : TensorView();
        packed[name] = shape.size() == 2 ? Weight::packed(f, blob.data(), {shape[0], shape[1]}, Device::CPU, sv)
                                         : Weight::packed(f, blob.data(), {shape[0], shape[1], shape[2]}, Device::CPU, sv);
        names.push_back(name);
        continue;
      }
    }
    std::vector<char>& blob = impl->random_blobs.emplace_back(static_cast<size_t>(n) * dtype_size(dt));
    // On the CPU backend's pool (it sleeps when idle; OpenMP's default active wait kept spinning after the load).
    cpu::parallel_tasks(threads, (n + kBlock - 1) / kBlock, [&](int64_t blk) {
      const int64_t b = blk * kBlock, m = std::min(kBlock, n - b);
      std::vector<float> vals(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) {
        const double u = uniform01(seed, stream, static_cast<uint64_t>(b + i));
        double v;
        if (is_norm || is_d) v = 1.0;
        else if (is_a_log) v = std::log(1.0 + 15.0 * u);
        else if (is_dt_bias) v = std::log(std::expm1(0.001 + 0.099 * u));  // softplus^-1 of dt in [0.001, 0.1]
        else v = (2.0 * u - 1.0) * scale;
        vals[i] = static_cast<float>(v);
      }
      convert_from_f32(vals.data(), blob.data() + static_cast<size_t>(b) * dtype_size(dt), dt, m);
    });
    TensorView v;
    v.data = blob.data();
    v.dtype = dt;
    v.ndim = static_cast<int>(shape.size());
    for (size_t k = 0; k < shape.size(); ++k) v.shape[k] = shape[k];
    if (impl->backend->device() == Device::CPU) {
      // The CPU backend's own copy (huge pages), when it makes one: adopted tensor by tensor and the host blob freed
      // at once, so the load never holds the model twice (adopting the copy again in bind_weights returns it).
      const TensorView kept = impl->backend->adopt_weight(v);
      if (kept.data != v.data) {
        v = kept;
        std::vector<char>().swap(blob);
      }
    }
    views[name] = v;
    names.push_back(name);
  }
  const TensorLookup dense = lookup_views(
      [&views](const std::string& name) -> const TensorView* {
        auto it = views.find(name);
        return it == views.end() ? nullptr : &it->second;
      },
      impl->dir);
  impl->weights = bind_weights(
      impl->config,
      [&](const std::string& name) -> std::optional<Weight> {
        auto it = packed.find(name);
        return it != packed.end() ? std::optional<Weight>(it->second) : dense(name);
      },
      names, *impl->backend, impl->dir);
  // A device backend holds its own copies now; the host blobs are only needed when the CPU reads them in place.
  if (impl->backend->device() != Device::CPU) impl->random_blobs.clear();
  impl->backend->synchronize();
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

}  // namespace mambacpp
