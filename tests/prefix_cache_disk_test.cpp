// The prefix cache's disk tier (src/engine/prefix_cache.h): a snapshot dropped from memory is read back from disk
// with the same bytes, the disk budget evicts the least recently used files, a new cache over the same directory
// finds the states again, and a file of another model is deleted, never served.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/prefix_cache.h"
#include "mambacpp/model.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> load_tiny(const test::TempDir& dir, uint64_t seed) {
  test::write_random_model(dir.path(), test::tiny_mamba2_config(), seed);
  LoadOptions opt;
  opt.device = DeviceChoice::CPU;
  return Model::load(dir.path(), opt);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> state_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

class PrefixCacheDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    model = load_tiny(model_dir, 3);
    state = model->create_state(1);
  }
  // The state after `tokens`, as a snapshot, and its bytes as a state file.
  SlotSnapshot run(const std::vector<int32_t>& tokens, std::string* file_bytes) {
    state->reset(0);
    Sequence s = Sequence::tokens(tokens, 0);
    model->forward(*state, {&s, 1}, Output::None);
    state->save(0, tmp.file("ref.state"), tokens);
    *file_bytes = slurp(tmp.file("ref.state"));
    return state->snapshot(0);
  }
  std::string saved(const SlotSnapshot& snap, const std::vector<int32_t>& tokens) {
    state->restore(0, snap);
    state->save(0, tmp.file("got.state"), tokens);
    return slurp(tmp.file("got.state"));
  }
  test::TempDir model_dir{"mambacpp_pc_model"}, tmp{"mambacpp_pc"}, cache_dir{"mambacpp_pc_dir"};
  std::unique_ptr<Model> model;
  std::unique_ptr<StateCache> state;
};

TEST_F(PrefixCacheDisk, ASnapshotDroppedFromMemoryIsReadBackFromDiskWithTheSameBytes) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5}, b = {9, 8, 7};
  std::string a_bytes, b_bytes;
  SlotSnapshot sa = run(a, &a_bytes);
  SlotSnapshot sb = run(b, &b_bytes);
  PrefixCache cache(static_cast<int64_t>(sa.bytes()));  // memory holds one snapshot
  cache.enable_disk(cache_dir.path(), int64_t{64} << 20, *state);
  ASSERT_TRUE(cache.insert(a, std::move(sa)));
  ASSERT_TRUE(cache.insert(b, std::move(sb)));  // evicts a from memory; it stays on disk
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(cache.disk_entries(), 2);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  const PrefixCache::Hit hit = cache.lookup(prompt, 6);
  ASSERT_NE(hit.snapshot, nullptr);
  EXPECT_EQ(hit.length, 5);
  EXPECT_TRUE(saved(*hit.snapshot, a) == a_bytes);
}

TEST_F(PrefixCacheDisk, ANewCacheOverTheDirectoryFindsTheStatesAndTheBudgetEvictsTheOldest) {
  std::string a_bytes, b_bytes, c_bytes;
  SlotSnapshot sa = run({1, 2, 3}, &a_bytes);
  SlotSnapshot sb = run({4, 5, 6}, &b_bytes);
  SlotSnapshot sc = run({7, 8, 9}, &c_bytes);
  const int64_t file = static_cast<int64_t>(a_bytes.size());
  {
    PrefixCache cache(int64_t{64} << 20);
    cache.enable_disk(cache_dir.path(), 2 * file + file / 2, *state);  // two files fit
    cache.insert({1, 2, 3}, std::move(sa));
    cache.insert({4, 5, 6}, std::move(sb));
    cache.insert({7, 8, 9}, std::move(sc));
    EXPECT_EQ(cache.disk_entries(), 2);
    EXPECT_EQ(state_files(cache_dir.path()).size(), 2u);
  }
  PrefixCache fresh(int64_t{64} << 20);
  fresh.enable_disk(cache_dir.path(), int64_t{64} << 20, *state);
  EXPECT_EQ(fresh.disk_entries(), 2);
  EXPECT_EQ(fresh.lookup(std::vector<int32_t>{1, 2, 3, 0}, 3).snapshot, nullptr);  // the oldest went
  const PrefixCache::Hit hit = fresh.lookup(std::vector<int32_t>{7, 8, 9, 0}, 3);
  ASSERT_NE(hit.snapshot, nullptr);
  EXPECT_TRUE(saved(*hit.snapshot, {7, 8, 9}) == c_bytes);
}

TEST_F(PrefixCacheDisk, AFileOfAnotherModelIsDeletedAtStartNeverServed) {
  std::string bytes;
  SlotSnapshot s = run({1, 2, 3}, &bytes);
  {
    PrefixCache cache(int64_t{64} << 20);
    cache.enable_disk(cache_dir.path(), int64_t{64} << 20, *state);
    cache.insert({1, 2, 3}, std::move(s));
  }
  ASSERT_EQ(state_files(cache_dir.path()).size(), 1u);
  test::TempDir other_dir("mambacpp_pc_other");
  auto other = load_tiny(other_dir, 4);  // same shapes, other weights
  auto other_state = other->create_state(1);
  PrefixCache cache(int64_t{64} << 20);
  testing::internal::CaptureStderr();
  cache.enable_disk(cache_dir.path(), int64_t{64} << 20, *other_state);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, testing::AllOf(testing::HasSubstr("skipping"), testing::HasSubstr("another model")));
  EXPECT_EQ(cache.disk_entries(), 0);
  EXPECT_TRUE(state_files(cache_dir.path()).empty());
  EXPECT_EQ(cache.lookup(std::vector<int32_t>{1, 2, 3, 0}, 3).snapshot, nullptr);
}

}  // namespace
}  // namespace mambacpp
