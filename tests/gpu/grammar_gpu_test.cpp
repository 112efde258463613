// Constrained output on the GPU: a step with a grammar row takes whole rows of logits off the device (the device's
// top-k selection does not see the mask), masks them on the host, and still gives every row what it gets alone; hot
// samples of the shipped model on the GPU all validate against their JSON schema.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpu/gpu_test_util.h"
#include "mambacpp/engine.h"
#include "mambacpp/grammar.h"
#include "mambacpp/model.h"
#include "mambacpp/tokenizer.h"
#include "support/engine_support.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

TEST(GpuGrammar, ConstrainedRowsValidateAndOthersEqualAlone) {
  MAMBACPP_REQUIRE_GPU();
  LoadOptions lo;
  lo.device = DeviceChoice::CUDA;
  lo.precision = Precision::Exact;
  const auto model = Model::load(test::source_dir() + "/models/default", lo);
  const auto tok = Tokenizer::load(test::source_dir() + "/models/default/tokenizer.json");
  const std::string schema = R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "color":{"enum":["red","green"]},"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string",
      "maxLength":4},"maxItems":2}},"required":["ok","color"],"additionalProperties":false})";
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt = tok->encode(i % 2 ? "The answer in JSON:" : "def main(", false);
    r.max_new_tokens = 300;
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 1.5f;
    r.sampling.top_k = i % 4 == 1 ? 20 : 0;  // some unconstrained rows could use device selection alone
    r.sampling.seed = 50 + static_cast<uint64_t>(i), r.sampling.seed_given = true;
    if (i % 2 == 0) {
      r.grammar = json_schema_to_grammar(schema);
    } else {
      r.max_new_tokens = 16;
      r.ignore_eos = true;
    }
    reqs.push_back(std::move(r));
  }
  const std::vector<GenerateResult> got = test::run_batch(*model, reqs, tok.get(), {}, 8);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << i << ": " << got[i].error;
    if (reqs[i].grammar.empty()) {
      EXPECT_EQ(got[i].tokens, test::run_alone(*model, reqs[i], tok.get()).tokens) << "request " << i;
      continue;
    }
    ASSERT_EQ(got[i].finish_reason, FinishReason::Eos) << got[i].text;
    const auto v = nlohmann::json::parse(got[i].text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << got[i].text;
    EXPECT_TRUE(v["ok"].is_boolean()) << got[i].text;
    EXPECT_TRUE(v["color"] == "red" || v["color"] == "green") << got[i].text;
    for (const auto& [k, unused] : v.items()) EXPECT_TRUE(k == "ok" || k == "color" || k == "n" || k == "tags") << k;
  }
}

}  // namespace
}  // namespace mambacpp
