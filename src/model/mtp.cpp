// Loading and running Nemotron-H's MTP block (model/mtp.h).
#include "model/mtp.h"

#include <algorithm>
#include <map>
#include <string>

#include "mambacpp/error.h"
#include "model/model_impl.h"

namespace mambacpp {

namespace {

// Where the checkpoint keeps its MTP layers: "mtp." in the released checkpoints (vLLM's loader), the other two
// spellings as the model's loader skips them.
std::string mtp_prefix(const Checkpoint& ck) {
  const std::vector<std::string> names = ck.names();
  for (const char* p : {"mtp.", "model.mtp.", "backbone.mtp."}) {
    const std::string layers = std::string(p) + "layers.";
    for (const std::string& n : names)
      if (n.rfind(layers, 0) == 0) return p;
  }
  return "";
}

const TensorView& glue_tensor(const Checkpoint& ck, const std::string& name, std::initializer_list<int64_t> shape,
                              const std::string& dir) {
  const TensorView* t = ck.find(name);
  if (!t) fail(dir, ": missing tensor '", name, "' of the MTP block");
  bool ok = t->ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) ok = ok && t->dim(i++) == d;
  if (!ok) {
    std::string want = "[";
    i = 0;
    for (int64_t d : shape) want += (i++ ? ", " : "") + std::to_string(d);
    fail(dir, ": tensor '", name, "' has shape ", t->shape_string(), "; expected ", want, "]");
  }
  if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
    fail(dir, ": tensor '", name, "' has dtype ", dtype_name(t->dtype), "; expected f32, f16 or bf16");
  return *t;
}

}  // namespace

MtpHead::~MtpHead() = default;

std::unique_ptr<MtpHead> MtpHead::load(const Model& target) {
  const ModelConfig& c = target.config();
  const std::string& dir = target.directory();
  if (c.family != Family::NemotronH || c.mtp_layers_ignored == 0 || c.mtp_layers.empty())
    fail("--draft-mtp: the model '", dir, "' has no multi-token-prediction layers (",
         c.family == Family::NemotronH ? "its config.json declares no num_nextn_predict_layers"
                                       : std::string("only Nemotron-H checkpoints carry them; this is a ") +
                                             (c.hybrid() ? family_name(c.family) : arch_name(c.arch)) + " model",
         "); draft with --draft-model DIR or --draft-ngram N instead");
  if (c.mtp_layers_ignored != 1)
    fail("--draft-mtp: the model '", dir, "' declares num_nextn_predict_layers = ", c.mtp_layers_ignored,
         "; one MTP block (reused for every drafted token) is supported");
  if (std::find(c.mtp_layers.begin(), c.mtp_layers.end(), LayerKind::MoE) != c.mtp_layers.end() && c.moe.n_experts == 0)
    fail("--draft-mtp: the MTP block of '", dir, "' has MoE layers but the model has none, so its config gives no "
         "expert sizes for them; not supported");
  if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0)
    fail("--draft-mtp: the model '", dir, "' is a GGUF file; the MTP block is read from the safetensors checkpoint "
         "directory");

  auto impl = std::make_unique<Model::Impl>();
  impl->dir = dir;
  impl->options = target.load_options();
  impl->options.progress = false;
  impl->checkpoint = std::make_unique<Checkpoint>(dir);
  const Checkpoint& ck = *impl->checkpoint;
  ModelConfig bc = c;
  bc.layers = c.mtp_layers;
  bc.n_layer = static_cast<int64_t>(bc.layers.size());
  bc.mtp_layers_ignored = 0;
  bc.mtp_layers.clear();
  if (std::find(bc.layers.begin(), bc.layers.end(), LayerKind::MoE) == bc.layers.end()) bc.moe = MoeConfig{};
  bc.validate();
  impl->config = bc;
  impl->backend = make_backend(impl->options);

  const std::string prefix = mtp_prefix(ck);
  if (prefix.empty())
    fail("--draft-mtp: ", dir, ": config.json declares num_nextn_predict_layers = 1, but the checkpoint holds no MTP "
         "tensors (mtp.layers.*)");
  const std::string first = prefix + "layers.0.", last = prefix + "layers." + std::to_string(bc.n_layer - 1) + ".";
  const std::string embeddings = ck.find("model.embeddings.weight") ? "model.embeddings.weight" : "backbone.embeddings.weight";
  // The block binds as a Nemotron-H model under "model.": its layers are the MTP layers, its norm_f the last layer's
  // final_layernorm, its embeddings and LM head the model's own.
  std::map<std::string, std::string> source_of = {{"model.embeddings.weight", embeddings},
                                                   {"model.norm_f.weight", last + "final_layernorm.weight"},
                                                   {"lm_head.weight", "lm_head.weight"}};
  const std::vector<std::string> glue = {first + "enorm.weight", first + "hnorm.weight", first + "eh_proj.weight",
                                         last + "final_layernorm.weight"};
  std::vector<std::string> names = {"model.embeddings.weight", "model.norm_f.weight", "lm_head.weight"};
  for (const std::string& n : ck.names()) {
    if (n.rfind(prefix + "layers.", 0) != 0 || std::find(glue.begin(), glue.end(), n) != glue.end()) continue;
    const std::string as = "model." + n.substr(prefix.size());
    source_of[as] = n;
    names.push_back(as);
  }
  const std::string source = dir + " (MTP block: " + prefix + "layers.* bound as model.layers.*)";
  impl->weights = bind_weights(
      bc,
      lookup_views(
          [&](const std::string& name) -> const TensorView* {
            const auto it = source_of.find(name);
            return it == source_of.end() ? nullptr : ck.find(it->second);
          },
          source),
      names, *impl->backend, source);

  std::unique_ptr<MtpHead> head(new MtpHead());
  Backend& be = *impl->backend;
  const int64_t d = bc.d_model;
  head->eps_ = static_cast<float>(bc.norm_eps);
  head->enorm_ = be.adopt_weight(glue_tensor(ck, glue[0], {d}, dir));
  head->hnorm_ = be.adopt_weight(glue_tensor(ck, glue[1], {d}, dir));
  const TensorView& eh = glue_tensor(ck, glue[2], {d, 2 * d}, dir);
  head->eh_embed_host_.resize(static_cast<size_t>(d * d));
  head->eh_hidden_host_.resize(static_cast<size_t>(d * d));
  for (int64_t r = 0; r < d; ++r) {
    const char* row = eh.ptr<char>() + static_cast<size_t>(r * 2 * d) * dtype_size(eh.dtype);
    convert_to_f32(row, eh.dtype, head->eh_embed_host_.data() + r * d, d);
    convert_to_f32(row + static_cast<size_t>(d) * dtype_size(eh.dtype), eh.dtype, head->eh_hidden_host_.data() + r * d, d);
  }
  head->eh_embed_ = be.adopt_matrix(Weight(TensorView(head->eh_embed_host_.data(), DType::F32, {d, d})));
  head->eh_hidden_ = be.adopt_matrix(Weight(TensorView(head->eh_hidden_host_.data(), DType::F32, {d, d})));
  be.synchronize();
  head->block_ = Model::Impl::wrap(std::move(impl));
  return head;
}

std::unique_ptr<StateCache> MtpHead::create_state(int64_t n_slots, DType state_dtype) const {
  return block_->create_state(n_slots, state_dtype);
}

ForwardResult MtpHead::forward(StateCache& state, std::span<const MtpSequence> seqs, Output output) const {
  if (output != Output::None && output != Output::AllLogitsAndHidden)
    fail("MTP forward: expected Output::None or Output::AllLogitsAndHidden");
  const ModelConfig& c = block_->config();
  const int64_t d = c.d_model;
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MtpSequence& s = seqs[i];
    const int64_t L = static_cast<int64_t>(s.next_tokens.size());
    if (L == 0) fail("MTP sequence ", i, ": no rows");
    if (static_cast<int64_t>(s.hidden.size()) != L * d)
      fail("MTP sequence ", i, ": ", L, " tokens need ", L * d, " hidden values ([L, ", d, "]), found ", s.hidden.size());
    for (int32_t t : s.next_tokens)
      if (t < 0 || t >= c.vocab_size) fail("MTP sequence ", i, ": token id ", t, " out of range [0, ", c.vocab_size, ")");
    total += L;
  }
  Backend& be = block_->backend();
  const Device dev = be.device();
  if (total > rows_reserved_) {
    const size_t row_bytes = static_cast<size_t>(d) * 4;
    for (DeviceBuffer* b : {&embedded_, &hidden_, &normed_e_, &normed_h_, &fused_, &fused_h_})
      *b = DeviceBuffer(be, static_cast<size_t>(total) * row_bytes);
    ids_ = DeviceBuffer(be, static_cast<size_t>(total) * 4);
    rows_reserved_ = total;
  }
  std::vector<int32_t> ids;
  std::vector<float> hidden;
  ids.reserve(static_cast<size_t>(total));
  hidden.reserve(static_cast<size_t>(total * d));
  for (const MtpSequence& s : seqs) {
    ids.insert(ids.end(), s.next_tokens.begin(), s.next_tokens.end());
    hidden.insert(hidden.end(), s.hidden.begin(), s.hidden.end());
  }
  auto rows = [&](const DeviceBuffer& b) { return TensorView(b.data(), DType::F32, {total, d}, dev); };
  be.copy_from_host(ids_.data(), ids.data(), ids.size() * 4);
  be.copy_from_host(hidden_.data(), hidden.data(), hidden.size() * 4);
  be.embed(block_->weights().embeddings, TensorView(ids_.data(), DType::I32, {total}, dev), rows(embedded_));
  be.rmsnorm(rows(embedded_), enorm_, eps_, rows(normed_e_));
  be.rmsnorm(rows(hidden_), hnorm_, eps_, rows(normed_h_));
  // eh_proj over the concatenation, as the sum of its two column blocks' products.
  be.linear(rows(normed_e_), eh_embed_, {}, rows(fused_));
  be.linear(rows(normed_h_), eh_hidden_, {}, rows(fused_h_));
  be.add_inplace(rows(fused_), rows(fused_h_));
  std::vector<float> fused(static_cast<size_t>(total * d));
  be.copy_to_host(fused.data(), fused_.data(), fused.size() * 4);
  be.synchronize();

  std::vector<Sequence> block_seqs;
  int64_t row = 0;
  for (const MtpSequence& s : seqs) {
    const int64_t L = static_cast<int64_t>(s.next_tokens.size());
    block_seqs.push_back(Sequence::embeds(TensorView(fused.data() + row * d, DType::F32, {L, d}), s.slot));
    row += L;
  }
  return block_->forward(state, block_seqs, output);
}

}  // namespace mambacpp
