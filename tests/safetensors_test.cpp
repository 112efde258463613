// safetensors validation (one test per corruption, message checked) and Checkpoint directory layouts: single file,
// sharded with an index, loose files, pickled-only, missing config; plus the content hash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "mambacpp/error.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using test::error_of;

// A safetensors image: u64 LE header length, the header text, then `data` (the length field can be forged).
std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data, uint64_t header_len) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(header_len >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> data(data_bytes);
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
  return image(header, data, header.size());
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// Opens `bytes` from memory and from a file; both paths must give the same verdict. Returns the file's message.
std::string open_error(const std::vector<uint8_t>& bytes) {
  test::TempDir dir("st");
  const std::string path = dir.file("bad.safetensors");
  write_file(path, bytes);
  const std::string from_file = error_of([&] { SafetensorsFile f(path); });
  const std::string from_memory = error_of([&] { SafetensorsFile::from_bytes(bytes, path); });
  EXPECT_EQ(from_file, from_memory);
  EXPECT_THAT(from_file, HasSubstr(path));
  return from_file;
}

TEST(Safetensors, ValidFileRoundTrip) {
  // a: f32 [2, 3] (24 bytes), b: bf16 [4] (8 bytes), c: i64 scalar (8 bytes), e: f32 [0] (empty).
  const float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
  const uint16_t b[4] = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f), f32_to_bf16(2.0f), f32_to_bf16(100.0f)};
  const int64_t c = -42;
  std::vector<uint8_t> data(40);
  std::memcpy(data.data(), a, 24);
  std::memcpy(data.data() + 24, b, 8);
  std::memcpy(data.data() + 32, &c, 8);
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
          "c": {"dtype": "I64", "shape": [], "data_offsets": [32, 40]},
          "e": {"dtype": "F32", "shape": [0], "data_offsets": [24, 24]},
          "__metadata__": {"format": "pt"}})";
  test::TempDir dir("st");
  write_file(dir.file("ok.safetensors"), image(header, data, header.size()));

  const SafetensorsFile f(dir.file("ok.safetensors"));
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[3].name, "e");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THAT(error_of([&] { f.view("nope"); }), AllOf(HasSubstr("ok.safetensors"), HasSubstr("'nope'")));

  const SafetensorInfo* ia = f.find("a");
  ASSERT_NE(ia, nullptr);
  EXPECT_EQ(ia->dtype, DType::F32);
  EXPECT_THAT(ia->shape, ElementsAre(2, 3));
  const TensorView va = f.view(*ia);
  EXPECT_EQ(va.ndim, 2);
  EXPECT_EQ(va.dim(0), 2);
  EXPECT_EQ(va.dim(1), 3);
  EXPECT_EQ(va.device, Device::CPU);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(va.ptr<float>()[i], a[i]);

  const TensorView vb = f.view("b");
  EXPECT_EQ(vb.dtype, DType::BF16);
  EXPECT_EQ(load_as_f32(vb.data, vb.dtype, 1), -0.5f);
  EXPECT_EQ(load_as_f32(vb.data, vb.dtype, 3), 100.0f);

  const TensorView vc = f.view("c");
  EXPECT_EQ(vc.ndim, 0);
  EXPECT_EQ(vc.numel(), 1);
  EXPECT_EQ(*vc.ptr<int64_t>(), -42);
  EXPECT_EQ(f.view("e").numel(), 0);

  // The same bytes from memory; and a moved-from object leaves the views of the new owner intact.
  SafetensorsFile m = SafetensorsFile::from_bytes(image(header, data, header.size()), "mem");
  SafetensorsFile moved = std::move(m);
  EXPECT_EQ(moved.view("a").ptr<float>()[5], -7.0f);
}

TEST(Safetensors, WrittenByTestSupportHelper) {
  test::TempDir dir("st");
  test::write_safetensors(dir.file("w.safetensors"),
                          {{"x", {{2, 2}, {1, 2, 3, 4}, DType::F16}}, {"y", {{3}, {5, 6, 7}, DType::F32}}});
  const SafetensorsFile f(dir.file("w.safetensors"));
  const TensorView x = f.view("x");
  EXPECT_EQ(x.dtype, DType::F16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_f32(x.data, x.dtype, i), static_cast<float>(i + 1));
  EXPECT_EQ(f.view("y").ptr<float>()[2], 7.0f);
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  EXPECT_THAT(open_error({1, 2, 3, 4, 5}), AllOf(HasSubstr("5 bytes"), HasSubstr("too short")));
  EXPECT_THAT(open_error({}), AllOf(HasSubstr("0 bytes"), HasSubstr("too short")));
}

TEST(SafetensorsCorrupt, HeaderLengthPastEndOfFile) {
  EXPECT_THAT(open_error(image("{}", {}, 1000)),
              AllOf(HasSubstr("header length 1000"), HasSubstr("past the end"), HasSubstr("2 bytes")));
  EXPECT_THAT(open_error(image("{}", {}, uint64_t{1} << 60)), AllOf(HasSubstr("absurd"), HasSubstr("1152921504606846976")));
}

TEST(SafetensorsCorrupt, HeaderNotJsonObject) {
  EXPECT_THAT(open_error(image(R"({"a": {"dtype": )", 0)), HasSubstr("header: invalid JSON"));
  EXPECT_THAT(open_error(image("[1, 2]", 0)), AllOf(HasSubstr("JSON object"), HasSubstr("array")));
  EXPECT_THAT(open_error(image(R"({"a": 3})", 0)), AllOf(HasSubstr("tensor 'a'"), HasSubstr("expected an object")));
  EXPECT_THAT(open_error(image(R"({"__metadata__": {"k": 1}})", 0)), HasSubstr("__metadata__"));
}

TEST(SafetensorsCorrupt, MissingFields) {
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [1]}})", 4)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("missing \"data_offsets\"")));
  EXPECT_THAT(open_error(image(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("missing \"dtype\"")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("missing \"shape\"")));
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  // e5m2 FP8 is not a format any published FP8 checkpoint we load uses (ModelOpt and compressed-tensors store e4m3).
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", 4)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("\"F8_E5M2\""), HasSubstr("not supported"),
                    HasSubstr("F32, F16, BF16, F64, I32, I64, F8_E4M3")));
}

TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [25], "data_offsets": [0, 100]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("[0, 100]"), HasSubstr("past the data section (24 bytes)")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("begin > end")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("non-negative")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("[begin, end]")));
}

TEST(SafetensorsCorrupt, SizeMismatch) {
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("hold 20 bytes"), HasSubstr("expected 24")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "BF16", "shape": [4611686018427387904, 4],
                                        "data_offsets": [0, 0]}})",
                               24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("overflows")));
  EXPECT_THAT(open_error(image(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})", 24)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("invalid dimension")));
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  EXPECT_THAT(open_error(image(R"({"p": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                   "q": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                               24)),
              AllOf(HasSubstr("'p' [0, 16)"), HasSubstr("'q' [8, 24)"), HasSubstr("overlap")));
  // Touching ranges and empty tensors inside another's range are fine.
  EXPECT_EQ(error_of([] {
              SafetensorsFile::from_bytes(image(R"({"p": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                   "q": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
                                                   "z": {"dtype": "F32", "shape": [0], "data_offsets": [12, 12]}})",
                                                24));
            }),
            "(no error)");
}

TEST(SafetensorsCorrupt, TooManyDimensionsForAView) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      image(R"({"w": {"dtype": "F32", "shape": [1, 1, 1, 1, 2], "data_offsets": [0, 8]}})", 8), "five.safetensors");
  EXPECT_THAT(error_of([&] { f.view("w"); }), AllOf(HasSubstr("'w'"), HasSubstr("5 dimensions")));
}

// ---- Checkpoint directories ---------------------------------------------------------------------------------------

const char* kTinyConfig =
    R"({"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 4, "num_hidden_layers": 1,
        "vocab_size": 3, "state_size": 2, "time_step_rank": 1})";

std::map<std::string, test::HostTensor> some_tensors() {
  return {{"backbone.embeddings.weight", {{3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, DType::F32}},
          {"backbone.norm_f.weight", {{4}, {1, 1, 1, 1}, DType::BF16}},
          {"backbone.layers.0.mixer.D", {{8}, {0, 1, 2, 3, 4, 5, 6, 7}, DType::F32}},
          {"backbone.layers.0.mixer.A_log", {{8, 2}, std::vector<float>(16, 0.5f), DType::F16}}};
}

std::vector<std::string> sorted_names(const std::map<std::string, test::HostTensor>& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

TEST(Checkpoint, SingleFileAndContentHash) {
  test::TempDir a("ck"), b("ck"), c("ck");
  for (const auto* d : {&a, &b, &c}) write_text(d->file("config.json"), kTinyConfig);
  auto tensors = some_tensors();
  test::write_safetensors(a.file("model.safetensors"), tensors);
  test::write_safetensors(b.file("model.safetensors"), tensors);
  tensors["backbone.layers.0.mixer.D"].values[5] = 5.5f;  // one value differs
  test::write_safetensors(c.file("model.safetensors"), tensors);

  const Checkpoint ck(a.path());
  EXPECT_EQ(ck.directory(), a.path());
  EXPECT_EQ(ck.config().d_model, 4);
  EXPECT_EQ(ck.names(), sorted_names(tensors));
  const TensorView* emb = ck.find("backbone.embeddings.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape_string(), "[3, 4]");
  EXPECT_EQ(emb->ptr<float>()[11], 12.0f);
  EXPECT_EQ(ck.find("lm_head.weight"), nullptr);
  EXPECT_EQ(ck.file_of("backbone.norm_f.weight"), a.file("model.safetensors"));

  const uint64_t h = ck.content_hash();
  EXPECT_EQ(ck.content_hash(), h);
  EXPECT_EQ(Checkpoint(b.path()).content_hash(), h);  // same tensors, another directory
  EXPECT_NE(Checkpoint(c.path()).content_hash(), h);  // one value changed
}

TEST(Checkpoint, ShardedWithIndex) {
  test::TempDir dir("ck"), single("ck");
  write_text(dir.file("config.json"), kTinyConfig);
  write_text(single.file("config.json"), kTinyConfig);
  auto all = some_tensors();
  test::write_safetensors(single.file("model.safetensors"), all);
  std::map<std::string, test::HostTensor> s1, s2;
  nlohmann::json weight_map;
  int i = 0;
  for (const auto& [name, t] : all) {
    const bool first = (i++ % 2) == 0;
    (first ? s1 : s2)[name] = t;
    weight_map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  test::write_safetensors(dir.file("model-00001-of-00002.safetensors"), s1);
  test::write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2);
  write_text(dir.file("model.safetensors.index.json"),
             nlohmann::json{{"metadata", {{"total_size", 100}}}, {"weight_map", weight_map}}.dump());

  const Checkpoint ck(dir.path());
  EXPECT_EQ(ck.names(), sorted_names(all));
  EXPECT_EQ(ck.files().size(), 2u);
  for (const auto& [name, shard] : weight_map.items()) EXPECT_EQ(ck.file_of(name), dir.file(shard.get<std::string>()));
  EXPECT_EQ(ck.file_of("backbone.norm_f.weight"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck.find("backbone.layers.0.mixer.D")->ptr<float>()[7], 7.0f);
  // The hash does not depend on how the tensors are split into files.
  EXPECT_EQ(ck.content_hash(), Checkpoint(single.path()).content_hash());
}

TEST(Checkpoint, IndexErrors) {
  test::TempDir dir("ck");
  write_text(dir.file("config.json"), kTinyConfig);
  auto all = some_tensors();
  test::write_safetensors(dir.file("shard1.safetensors"), all);
  nlohmann::json weight_map;
  for (const auto& [name, t] : all) weight_map[name] = "shard1.safetensors";

  weight_map["lm_head.weight"] = "shard2.safetensors";
  write_text(dir.file("model.safetensors.index.json"), nlohmann::json{{"weight_map", weight_map}}.dump());
  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.path()); }),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("shard2.safetensors"),
                    HasSubstr("lm_head.weight"), HasSubstr("not found")));

  weight_map["lm_head.weight"] = "shard1.safetensors";
  write_text(dir.file("model.safetensors.index.json"), nlohmann::json{{"weight_map", weight_map}}.dump());
  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.path()); }),
              AllOf(HasSubstr("'lm_head.weight'"), HasSubstr("shard1.safetensors"),
                    HasSubstr("does not contain it")));

  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.path()); }),
              AllOf(HasSubstr("../x.safetensors"), HasSubstr("file name inside")));
}

TEST(Checkpoint, LooseSafetensorsFiles) {
  test::TempDir dir("ck");
  write_text(dir.file("config.json"), kTinyConfig);
  auto all = some_tensors();
  std::map<std::string, test::HostTensor> s1{{"backbone.embeddings.weight", all["backbone.embeddings.weight"]}};
  std::map<std::string, test::HostTensor> s2{{"backbone.norm_f.weight", all["backbone.norm_f.weight"]}};
  test::write_safetensors(dir.file("weights_a.safetensors"), s1);
  test::write_safetensors(dir.file("weights_b.safetensors"), s2);
  const Checkpoint ck(dir.path());
  EXPECT_THAT(ck.names(), ElementsAre("backbone.embeddings.weight", "backbone.norm_f.weight"));

  test::write_safetensors(dir.file("weights_c.safetensors"), s1);  // the same name twice
  EXPECT_THAT(error_of([&] { Checkpoint again(dir.path()); }),
              AllOf(HasSubstr("'backbone.embeddings.weight'"), HasSubstr("weights_a.safetensors"),
                    HasSubstr("weights_c.safetensors")));
}

TEST(Checkpoint, ABrokenPytorchModelBinIsRefused) {  // the reader itself: tests/torch_checkpoint_test.cpp
  test::TempDir dir("ck");
  write_text(dir.file("config.json"), kTinyConfig);
  write_text(dir.file("pytorch_model.bin"), "not really a pickle");
  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.path()); }),
              AllOf(HasSubstr(dir.file("pytorch_model.bin")), HasSubstr("not a PyTorch checkpoint"),
                    HasSubstr("expected a zip archive")));
}

TEST(Checkpoint, MissingPieces) {
  test::TempDir dir("ck");
  test::write_safetensors(dir.file("model.safetensors"), some_tensors());
  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.path()); }),
              AllOf(HasSubstr("config.json not found"), HasSubstr(dir.file("config.json"))));

  test::TempDir empty("ck");
  write_text(empty.file("config.json"), kTinyConfig);
  EXPECT_THAT(error_of([&] { Checkpoint ck(empty.path()); }),
              AllOf(HasSubstr(empty.path()), HasSubstr("no weights found")));

  EXPECT_THAT(error_of([&] { Checkpoint ck(dir.file("model.safetensors")); }), HasSubstr("not a directory"));

  test::TempDir bad_config("ck");
  write_text(bad_config.file("config.json"), R"({"model_type": "mamba", "hidden_size": 4})");
  EXPECT_THAT(error_of([&] { Checkpoint ck(bad_config.path()); }),
              AllOf(HasSubstr(bad_config.file("config.json")), HasSubstr("num_hidden_layers")));
}

}  // namespace
}  // namespace mambacpp
