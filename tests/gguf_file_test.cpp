// The GGUF reader against malformed files (each defect refused with a message naming the key or tensor, never a
// crash) and the writer's output read back by the reader.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf_file.h"
#include "io/gguf_writer.h"
#include "mambacpp/error.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

// A GGUF built field by field, so each test can break exactly one thing.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Bytes& kv_u32(const std::string& k, uint32_t v) { return str(k).put<uint32_t>(4).put<uint32_t>(v); }
  Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad(size_t align = 32) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Bytes& data(size_t n) {
    b.resize(b.size() + n, 0x3f);
    return *this;
  }
};

std::string refusal(const std::vector<uint8_t>& bytes) {
  return test::error_of([&] { GgufFile::from_bytes(bytes, "t.gguf"); });
}

TEST(GgufFile, ReadsAWellFormedFile) {
  Bytes f;
  f.header(2, 2).kv_u32("general.alignment", 32).str("name").put<uint32_t>(8).str("x");
  f.tensor("a", {4, 2}, 0, 0).tensor("b", {64}, 8, 32).pad().data(32 + 68);
  auto g = GgufFile::from_bytes(f.b);
  ASSERT_EQ(g->tensors().size(), 2u);
  EXPECT_EQ(g->get_string("name"), "x");
  const GgufTensor* a = g->tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(a->nbytes, 32u);
  EXPECT_EQ(g->tensor("b")->format, WeightFormat::Q8_0);
  EXPECT_EQ(g->tensor("b")->nbytes, 68u);
}

TEST(GgufFile, RefusesEachDefectNamingIt) {
  EXPECT_NE(refusal({'G', 'G'}).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(Bytes().put<uint32_t>(0x12345678).b).find("not a GGUF"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, 0, 1).b).find("version 1"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, 0, 7).b).find("version 7"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, uint64_t(1) << 60).b).find("key count"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(uint64_t(1) << 60, 0).b).find("tensor count"), std::string::npos);
  // A key whose length runs past the end; one whose string value is absurdly long.
  EXPECT_NE(refusal(Bytes().header(0, 1).put<uint64_t>(1000).put<uint64_t>(0).b).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(uint64_t(1) << 62).b).find("'k'"),
            std::string::npos);
  // An array longer than the file; an unknown value type; a duplicate key; an alignment that is not a power of two.
  const std::string arr = refusal(Bytes().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(
      uint64_t(1) << 61).b);
  EXPECT_NE(arr.find("'arr'"), std::string::npos) << arr;
  EXPECT_NE(refusal(Bytes().header(0, 1).str("k").put<uint32_t>(99).b).find("unknown value type"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b).find("twice"), std::string::npos);
  EXPECT_NE(refusal(Bytes().header(0, 1).kv_u32("general.alignment", 48).b).find("power of two"), std::string::npos);
  // Tensors: past the end, an offset that wraps, an unaligned offset, too many dims, an overflowing element count,
  // a zero dim, an unknown or unsupported type (named), a row that is not whole blocks, a duplicate name.
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t off, size_t data) {
    Bytes f;
    f.header(1, 0).tensor("blk.0.w", std::move(ne), type, off).pad().data(data);
    return refusal(f.b);
  };
  EXPECT_NE(one({8}, 0, 0, 16).find("past the end"), std::string::npos);
  EXPECT_NE(one({8}, 0, ~uint64_t(0) - 31, 64).find("past the end"), std::string::npos);
  EXPECT_NE(one({8}, 0, 4, 64).find("alignment"), std::string::npos);
  EXPECT_NE(one({1, 1, 1, 1, 1}, 0, 0, 64).find("dimensions"), std::string::npos);
  EXPECT_NE(one({uint64_t(1) << 30, uint64_t(1) << 30, 1 << 10}, 0, 0, 64).find("overflows"), std::string::npos);
  EXPECT_NE(one({0}, 0, 0, 64).find("dimension 0"), std::string::npos);
  const std::string q41 = one({32}, 3, 0, 64);
  EXPECT_NE(q41.find("q4_1"), std::string::npos) << q41;
  EXPECT_NE(q41.find("blk.0.w"), std::string::npos) << q41;
  EXPECT_NE(one({32}, 1000, 0, 64).find("unknown"), std::string::npos);
  EXPECT_NE(one({48}, 8, 0, 64).find("multiple of its block"), std::string::npos);
  Bytes dup;
  dup.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().data(64);
  EXPECT_NE(refusal(dup.b).find("twice"), std::string::npos);
}

TEST(GgufFile, EveryTruncationOfAValidFileIsRefused) {
  Bytes f;
  f.header(1, 2).kv_u32("a.b", 3).str("s").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("x").str("yz");
  f.tensor("t", {32, 2}, 8, 0).pad().data(68);
  EXPECT_NO_THROW(GgufFile::from_bytes(f.b));
  for (size_t n = 0; n < f.b.size(); ++n)
    EXPECT_THROW(GgufFile::from_bytes(std::vector<uint8_t>(f.b.begin(), f.b.begin() + static_cast<long>(n))), Error)
        << n;
}

TEST(GgufWriter, WhatItWritesReadsBack) {
  const fs::path dir = fs::temp_directory_path() / "mambacpp_gguf_writer_test";
  fs::create_directories(dir);
  const std::string path = (dir / "w.gguf").string();
  GgufWriter w;
  w.set_string("general.architecture", "mamba2");
  w.set_u32("a.u", 7);
  w.set_i32("a.i", -3);
  w.set_f32("a.f", 0.5f);
  w.set_bool("a.b", true);
  w.set_strings("a.s", {"x", "", "yz"});
  w.set_ints("a.ii", GgufType::I32, {1, -2, 3});
  w.set_floats("a.ff", {0.25, -1.5});
  w.set_u32("a.u", 9);  // replaces, keeps its place
  std::vector<float> vals(96);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<float>(i) * 0.25f;
  w.add_tensor("t.f32", WeightFormat::F32, {3, 32}, [&](uint8_t* out) { std::memcpy(out, vals.data(), 384); });
  w.add_tensor("t.q8", WeightFormat::Q8_0, {2, 64}, [](uint8_t* out) { std::memset(out, 1, 136); });
  w.write(path);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "w.gguf");  // no temporary left
  GgufFile g(path);
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.keys().size(), 8u);
  EXPECT_EQ(g.keys()[1], "a.u");
  EXPECT_EQ(g.get_int("a.u"), 9);
  EXPECT_EQ(g.get_int("a.i"), -3);
  EXPECT_EQ(g.get_float("a.f", 0), 0.5);
  EXPECT_TRUE(g.get_bool("a.b", false));
  EXPECT_EQ(g.find("a.s")->strings, (std::vector<std::string>{"x", "", "yz"}));
  EXPECT_EQ(g.find("a.ii")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(g.find("a.ff")->floats, (std::vector<double>{0.25, -1.5}));
  EXPECT_NE(test::error_of([&] { g.get_int("a.s"); }).find("'a.s'"), std::string::npos);
  const GgufTensor* t = g.tensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(std::memcmp(t->data, vals.data(), 384), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(g.tensor("t.q8")->data) % 32, 0u);
  EXPECT_EQ(g.tensor("t.q8")->shape(), (std::vector<int64_t>{2, 64}));
  // A producer that throws leaves the old file and no temporary.
  GgufWriter bad;
  bad.add_tensor("x", WeightFormat::F32, {4}, [](uint8_t*) { throw Error("no bytes"); });
  EXPECT_THROW(bad.write(path), Error);
  EXPECT_NO_THROW(GgufFile g2(path));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mambacpp
