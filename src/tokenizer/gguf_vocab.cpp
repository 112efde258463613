#include "tokenizer/gguf_vocab.h"

#include <unordered_map>
#include <utility>

#include "mambacpp/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"

namespace mambacpp {

namespace {

constexpr int64_t kControl = 3, kUserDefined = 4;

// Llama-3's pre-tokenizer regex (llama.cpp's "llama-bpe"), as its tokenizer.json's Split holds it.
constexpr const char* kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

tok::PreTokenizerStep byte_level(bool use_regex) {
  tok::PreTokenizerStep s(tok::PreTokenizerStep::ByteLevel);
  s.byte_level.add_prefix_space = false;
  s.byte_level.trim_offsets = true;
  s.byte_level.use_regex = use_regex;
  s.byte_level_splitter = std::make_shared<tok::ByteLevelSplitter>(s.byte_level);
  return s;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf_vocab(const GgufVocab& v, const std::string& source) {
  if (v.model == "none" || v.model == "no_vocab" || v.tokens.empty())
    fail(source, ": the file has no vocabulary (tokenizer.ggml.model '", v.model,
         "'), so text cannot be encoded; give token ids (--tokens-file)");
  if (v.model == "llama") {
    tok::SpmVocab spm;
    spm.tokens = v.tokens;
    spm.scores = v.scores;
    spm.token_types = v.token_types;
    spm.add_space_prefix = v.add_space_prefix.value_or(true);  // llama.cpp's defaults for its SPM model
    spm.add_bos = v.add_bos.value_or(true);
    spm.add_eos = v.add_eos.value_or(false);
    spm.bos_id = v.bos_id;
    spm.eos_id = v.eos_id;
    spm.unk_id = v.unk_id;
    return std::make_unique<tok::SpmTokenizer>(std::move(spm), source + ": tokenizer.ggml");
  }
  if (v.model != "gpt2")
    fail(source, ": tokenizer.ggml.model '", v.model,
         "' is not supported (supported: gpt2, byte-level BPE; llama, SentencePiece-style)");
  std::vector<tok::PreTokenizerStep> pre;
  if (v.pre.empty() || v.pre == "gpt-2" || v.pre == "default") {
    pre.push_back(byte_level(true));
  } else if (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3") {
    tok::PreTokenizerStep s(tok::PreTokenizerStep::Split);
    s.pattern = std::make_shared<tok::SplitPattern>(tok::SplitPattern::regex(kLlama3Split));
    s.behavior = tok::SplitBehavior::Isolated;
    pre.push_back(s);
    pre.push_back(byte_level(false));
  } else {
    fail(source, ": tokenizer.ggml.pre '", v.pre, "' names a split regex mambacpp does not know (known: gpt-2, "
         "llama-bpe); text would be split differently from llama.cpp");
  }
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    fail(source, ": tokenizer.ggml.token_type has ", v.token_types.size(), " entries for ", v.tokens.size(), " tokens");
  if (v.tokens.size() > (size_t(1) << 22)) fail(source, ": ", v.tokens.size(), " tokens; at most 2^22 are supported");

  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(v.tokens.size());
  std::vector<tok::AddedToken> added;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int64_t type = v.token_types.empty() ? 1 : v.token_types[i];
    vocab.emplace(v.tokens[i], static_cast<int32_t>(i));  // the first id of a repeated string wins, as in llama.cpp
    if ((type == kControl || type == kUserDefined) && !v.tokens[i].empty()) {
      tok::AddedToken a;
      a.id = static_cast<int32_t>(i);
      a.content = v.tokens[i];
      a.special = type == kControl;
      a.normalized = !a.special;
      added.push_back(std::move(a));
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    const size_t space = m.find(' ');
    if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos)
      fail(source, ": tokenizer.ggml.merges[", i, "] is \"", m, "\"; expected \"left right\" with one space");
    merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  tok::Pipeline pipeline;
  pipeline.pre_tokenizer = tok::PreTokenizer(std::move(pre));
  pipeline.decoder = tok::Decoder({tok::DecoderStep(tok::DecoderStep::ByteLevel)});
  if (v.add_bos.value_or(false) && v.bos_id >= 0 && v.bos_id < static_cast<int64_t>(v.tokens.size()))
    pipeline.post_processing.before.push_back(static_cast<int32_t>(v.bos_id));
  auto model = std::make_unique<tok::BpeModel>(std::move(vocab), merges, tok::BpeOptions{}, source + ": tokenizer.ggml");
  return std::make_unique<tok::BpeTokenizer>(std::move(model), std::move(pipeline), std::move(added));
}

}  // namespace mambacpp
