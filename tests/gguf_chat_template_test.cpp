// A model's chat template travels through GGUF: `quantize` writes the directory's template(s) and special-token ids
// as llama.cpp's converter does, and a model loaded from the file renders every conversation exactly as the same
// model loaded from its directory (chat::load_chat_template, the server's template selection, `generate --chat`).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf_file.h"
#include "mambacpp/chat.h"
#include "mambacpp/error.h"
#include "mambacpp/gguf.h"
#include "server/chat_template.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string template_text(const char* file) {
  const std::string t = read_text(fs::path(test::fixture_dir()) / "chat" / "templates" / file);
  EXPECT_GT(t.size(), 100u) << file;
  return t;
}

// Conversations that reach most of a template: a system prompt, several turns, tools offered, a tool call and its
// result, without the generation prompt.
std::vector<chat::Conversation> conversations() {
  std::vector<chat::Conversation> out;
  chat::Conversation c;
  c.messages = ojson::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
      {"role": "user", "content": "And of Japan? 東京 — thanks"}])");
  out.push_back(c);
  c.add_generation_prompt = false;
  out.push_back(c);
  chat::Conversation t;
  t.messages = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}])");
  t.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  out.push_back(t);
  return out;
}

class GgufChatTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mambacpp_gguf_chat_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    model_ = dir_ / "m";
    fs::create_directories(model_);
    const fs::path src = fs::path(test::source_dir()) / "models" / "default";
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) fs::copy_file(src / f, model_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_tokenizer_config(const ojson& chat_template) {
    ojson cfg = {{"bos_token", "<|endoftext|>"},
                 {"eos_token", {{"content", "<|padding|>"}, {"special", true}}},  // an AddedToken object
                 {"pad_token", "<|padding|>"}};
    if (!chat_template.is_null()) cfg["chat_template"] = chat_template;
    write_text(model_ / "tokenizer_config.json", cfg.dump(2));
  }

  std::string quantize() {
    const std::string out = (dir_ / "m.gguf").string();
    quantize_to_gguf(model_.string(), "f16", out);
    return out;
  }

  // The directory and the file give the same template, the same special tokens and the same renderings.
  void expect_same_chat(const std::string& gguf, const std::string& name = "default") {
    const auto from_dir = chat::load_chat_template(model_.string(), name);
    const auto from_gguf = chat::load_chat_template(gguf, name);
    ASSERT_TRUE(from_dir.has_value());
    ASSERT_TRUE(from_gguf.has_value());
    EXPECT_EQ(from_gguf->source, from_dir->source);
    for (const char* k : {"bos_token", "eos_token", "pad_token"})
      EXPECT_EQ(from_gguf->special_tokens.value(k, ojson()), from_dir->special_tokens.value(k, ojson())) << k;
    const chat::Template tmpl(from_dir->source);
    int rendered = 0;
    for (const chat::Conversation& c : conversations()) {
      // A template may refuse a conversation (Hermes' tool_use one needs tools); it must then refuse it from both.
      auto render = [&](const ojson& special) {
        try {
          ++rendered;
          return chat::apply_chat_template(tmpl, c, special);
        } catch (const Error& e) {
          --rendered;
          return std::string("error: ") + e.what();
        }
      };
      const std::string a = render(from_dir->special_tokens);
      EXPECT_EQ(render(from_gguf->special_tokens), a);
    }
    EXPECT_GE(rendered, 2);  // both sides of at least one conversation
  }

  fs::path dir_, model_;
};

TEST_F(GgufChatTemplate, TokenizerConfigTemplateRendersTheSameFromTheFile) {
  write_tokenizer_config(template_text("ibm-granite-granite-4.0.jinja"));
  const std::string gguf = quantize();
  const GgufFile f(gguf);
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), template_text("ibm-granite-granite-4.0.jinja"));
  // tokenizer_config.json's special tokens win over config.json's ids (eos 0 there), as in llama.cpp's converter.
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 0);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.padding_token_id"), 1);
  expect_same_chat(gguf);
  const auto files = chat::load_chat_template(gguf);
  EXPECT_EQ(files->special_tokens["bos_token"], "<|endoftext|>");
  EXPECT_EQ(files->special_tokens["eos_token"], "<|padding|>");
  EXPECT_NE(files->origin.find("tokenizer.chat_template"), std::string::npos);

  // The server and `generate --chat` select it from the file as from the directory.
  const auto server_dir = server::select_chat_template("auto", model_.string());
  const auto server_gguf = server::select_chat_template("auto", gguf);
  ASSERT_NE(server_gguf, nullptr);
  EXPECT_EQ(server_gguf->name, "model");
  EXPECT_EQ(server_gguf->stop_strings, server_dir->stop_strings);
  for (const chat::Conversation& c : conversations()) EXPECT_EQ(server_gguf->render(c), server_dir->render(c));
}

TEST_F(GgufChatTemplate, JinjaFileAndNamedTemplatesTravel) {
  // A list of named templates: the default as tokenizer.chat_template, the others by name, as llama.cpp writes them.
  write_tokenizer_config(ojson::array({{{"name", "default"}, {"template", template_text("Qwen-Qwen3-0.6B.jinja")}},
                                       {{"name", "tool_use"},
                                        {"template", template_text("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")}}}));
  std::string gguf = quantize();
  {
    const GgufFile f(gguf);
    EXPECT_EQ(f.get_string("tokenizer.chat_template.tool_use"),
              template_text("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"));
    ASSERT_NE(f.find("tokenizer.chat_templates"), nullptr);
    EXPECT_EQ(f.find("tokenizer.chat_templates")->strings, std::vector<std::string>{"tool_use"});
  }
  expect_same_chat(gguf);
  expect_same_chat(gguf, "tool_use");
  EXPECT_NE(test::error_of([&] { chat::load_chat_template(gguf, "rag"); }).find("tool_use"), std::string::npos);

  // chat_template.jinja beside tokenizer_config.json is the one transformers uses, so it is the one written.
  write_text(model_ / "chat_template.jinja", template_text("NVIDIA-Nemotron-Nano-v2.jinja"));
  gguf = quantize();
  EXPECT_EQ(GgufFile(gguf).get_string("tokenizer.chat_template"), template_text("NVIDIA-Nemotron-Nano-v2.jinja"));
  expect_same_chat(gguf);
}

TEST_F(GgufChatTemplate, AFileWithoutATemplateHasNone) {
  write_tokenizer_config(nullptr);
  const std::string gguf = quantize();
  EXPECT_EQ(GgufFile(gguf).find("tokenizer.chat_template"), nullptr);
  EXPECT_FALSE(chat::load_chat_template(gguf).has_value());
  EXPECT_EQ(server::select_chat_template("auto", gguf), nullptr);
  EXPECT_NE(server::select_chat_template("chatml", gguf), nullptr);  // the built-in one still works
}

TEST_F(GgufChatTemplate, GenerateChatUsesTheFilesTemplate) {
  write_tokenizer_config(template_text("ibm-granite-granite-4.0.jinja"));
  const std::string gguf = quantize();
  const std::string args = " --device cpu --chat -p 'Capital of France?' --system 'Be brief.' -n 1 --temp 0 --json";
  const test::CliResult a = test::run_cli("generate --model " + model_.string() + args);
  const test::CliResult b = test::run_cli("generate --model " + gguf + args);
  ASSERT_EQ(a.exit_code, 0) << a.output();
  ASSERT_EQ(b.exit_code, 0) << b.output();
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_GT(ja["prompt_tokens"].size(), 20u);  // the template's text, not the bare prompt
  EXPECT_EQ(jb["prompt_tokens"], ja["prompt_tokens"]);  // the same rendering, encoded by the file's vocabulary
}

}  // namespace
}  // namespace mambacpp
