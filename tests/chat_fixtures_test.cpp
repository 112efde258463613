// Real chat templates (fixtures/chat/templates/) rendered by mambacpp's interpreter against what transformers
// rendered for the same conversations (fixtures/chat/rendered/, written by scripts/make_chat_fixtures.py on a
// machine with transformers). Where transformers raised, mambacpp must raise too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mambacpp/chat.h"
#include "mambacpp/error.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ChatFixtures, RealTemplatesRenderAsTransformers) {
  const fs::path root = fs::path(MAMBACPP_FIXTURE_DIR) / "chat";
  size_t templates = 0, rendered = 0, raised = 0;
  for (const auto& entry : fs::directory_iterator(root / "templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const fs::path reference = root / "rendered" / (entry.path().stem().string() + ".json");
    ASSERT_TRUE(fs::exists(reference)) << reference << " is missing: run scripts/make_chat_fixtures.py";
    const json doc = json::parse(read(reference));
    const mambacpp::chat::Template tmpl(read(entry.path()));
    ++templates;
    for (const json& c : doc["cases"]) {
      SCOPED_TRACE(entry.path().filename().string() + " / " + c["name"].get<std::string>());
      mambacpp::chat::Conversation conv;
      conv.messages = c["messages"];
      conv.tools = c["tools"];
      conv.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      conv.extra = c["chat_template_kwargs"];
      if (c.contains("output")) {
        EXPECT_EQ(mambacpp::chat::apply_chat_template(tmpl, conv, doc["special_tokens"]), c["output"].get<std::string>());
        ++rendered;
      } else {
        EXPECT_THROW(mambacpp::chat::apply_chat_template(tmpl, conv, doc["special_tokens"]), mambacpp::Error)
            << "transformers raised: " << c["error"];
        ++raised;
      }
    }
  }
  EXPECT_GE(templates, 10u);
  EXPECT_GT(rendered, 2 * raised) << "most cases must render, not only raise";
}

}  // namespace
