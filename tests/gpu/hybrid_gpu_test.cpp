// Hybrid models on the GPU: the attention, RoPE and MLP kernels against plain fp64 references (cpu/attention.h run
// in double over the same inputs), then whole models against the transformers fixtures, against the CPU path and
// against themselves (chunked == one pass, batched == alone, cache hit == recompute).
//
// Tolerances (max|got - ref| / max|ref|), from the error model:
// - Kernels (f32 in, f32 accumulation): a score sums head_dim products (relative rounding ~ head_dim * 2^-24 in the
//   worst case, 256 * 6e-8 = 1.5e-5 of |q||k|, typically sqrt of that), the softmax adds a few ulps per key and the
//   output sums up to n_keys weighted values whose weights sum to 1: ~1e-6 seen; bound 2e-5. RoPE: one rotation in
//   f32 of exactly-formed cos/sin (double): 2 ulps, bound 1e-6. Elementwise ops: 1e-6.
// - Models with f32 weights (exact on the device): 1e-4 of the largest logit, as on the CPU: only f32 rounding
//   through the 5-6 fixture layers separates them from the fp64 reference. bf16 weights (rounded on the device,
//   2^-9 relative each; fast precision also rounds GEMM inputs): 3e-2, as for the pure models.
// - Self-consistency with f32 weights and state: 1e-5 (summation order of GEMM vs GEMV paths only). A change of
//   GQA head mapping, RoPE channels, cache position or masking moves logits by 1e-2 or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "gpu/gpu_test_util.h"
#include "mambacpp/model.h"
#include "mambacpp/npy.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

using gputest::DeviceArena;
using gputest::Rng;
using gputest::make_batch;
using gputest::rel_err;
namespace fs = std::filesystem;

// ---- Kernels ------------------------------------------------------------------------------------------------------

struct AttnCase {
  int64_t n_heads, n_kv_heads, head_dim, page_tokens;
  std::vector<int64_t> lens, past;  // per sequence
};

// Runs one attention call on the GPU over pages that already hold `past` random rows per sequence, and the same call
// in fp64 on the host; compares the outputs and every cached row after the call (the append included). With bf16
// pages the reference takes the rows rounded to bf16 (the pages' history is bf16 values, and the kernel rounds this
// call's k and v as it appends them), so the output tolerance is the f32 one, and the cached rows are exact.
void check_attention(const AttnCase& c, uint64_t seed, DType kv_dtype = DType::F32) {
  auto be = make_cuda_backend(DType::F32);
  DeviceArena arena(*be);
  Rng rng(seed);
  const int64_t n = static_cast<int64_t>(c.lens.size());
  const int64_t kv_dim = c.n_kv_heads * c.head_dim, q_dim = c.n_heads * c.head_dim;
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = n - 1 - i;
  BatchLayout batch = make_batch(c.lens, slots);
  const int64_t T = batch.total_tokens;
  const auto q = rng.vec(static_cast<size_t>(T * q_dim), -2.0f, 2.0f);
  const auto k = rng.vec(static_cast<size_t>(T * kv_dim), -2.0f, 2.0f);
  const auto v = rng.vec(static_cast<size_t>(T * kv_dim));

  AttentionArgs a;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.page_tokens = c.page_tokens;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.kv_dtype = kv_dtype;
  const bool bf16 = kv_dtype == DType::BF16;
  auto rounded = [&](float x) { return bf16 ? bf16_to_f32(f32_to_bf16(x)) : x; };
  // q as a strided column slice (the model's views may be), k and v contiguous.
  a.q = arena.upload_strided(q, T, q_dim, q_dim + 7, 3);
  a.k = arena.upload(k, DType::F32, {T, kv_dim});
  a.v = arena.upload(v, DType::F32, {T, kv_dim});
  a.out = arena.poisoned({T, q_dim});

  const size_t page_elems = static_cast<size_t>(2 * c.page_tokens * kv_dim);
  std::vector<std::vector<std::vector<double>>> host_pages(static_cast<size_t>(n));
  std::vector<cpu::KvPages<double>> ref_cache(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) {
    const int64_t keys = c.past[static_cast<size_t>(s)] + c.lens[static_cast<size_t>(s)];
    const int64_t n_pages = (keys + c.page_tokens - 1) / c.page_tokens;
    KvSequence kv;
    kv.past = c.past[static_cast<size_t>(s)];
    for (int64_t pg = 0; pg < n_pages; ++pg) {
      // Rows at and after `past` hold NaN: the kernel must write them before anything reads them.
      std::vector<float> page(page_elems, std::nanf(""));
      for (int64_t r = 0; r < c.page_tokens; ++r) {
        if (pg * c.page_tokens + r >= kv.past) continue;
        for (int64_t d = 0; d < kv_dim; ++d) {
          page[static_cast<size_t>(r * kv_dim + d)] = rounded(rng.uniform(-2.0f, 2.0f));
          page[static_cast<size_t>((c.page_tokens + r) * kv_dim + d)] = rounded(rng.uniform(-1.0f, 1.0f));
        }
      }
      TensorView dev = arena.upload(page, kv_dtype, {static_cast<int64_t>(page_elems)});
      kv.pages.push_back(dev.data);
      host_pages[static_cast<size_t>(s)].emplace_back(page.begin(), page.end());
    }
    a.cache.push_back(kv);
    ref_cache[static_cast<size_t>(s)].past = kv.past;
    for (auto& pg : host_pages[static_cast<size_t>(s)]) ref_cache[static_cast<size_t>(s)].pages.push_back(pg.data());
  }
  be->prepare_batch(batch);
  be->attention(a, batch);
  const auto got = arena.download(a.out);

  std::vector<double> qd(q.begin(), q.end()), kd, vd;
  for (float x : k) kd.push_back(rounded(x));
  for (float x : v) vd.push_back(rounded(x));
  std::vector<double> ref(static_cast<size_t>(T * q_dim), 0.0);
  cpu::AttentionParams<double> p;
  p.q = {qd.data(), q_dim};
  p.k = {kd.data(), kv_dim};
  p.v = {vd.data(), kv_dim};
  p.out = {ref.data(), q_dim};
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.page_tokens = c.page_tokens;
  p.scale = static_cast<double>(a.scale);
  cpu::attention<double>(p, std::span<const SeqSpan>(batch.seqs), std::span<const cpu::KvPages<double>>(ref_cache));
  EXPECT_LE(rel_err(got, ref), 2e-5);

  // Every row the cache holds after the call (past rows untouched, this call's rows appended: the fp64 reference
  // appended its rounded rows to host_pages); the unused tail of the last page is not compared.
  for (int64_t s = 0; s < n; ++s) {
    const int64_t keys = c.past[static_cast<size_t>(s)] + c.lens[static_cast<size_t>(s)];
    std::vector<float> got_rows;
    std::vector<double> want_rows;
    for (size_t pg = 0; pg < a.cache[static_cast<size_t>(s)].pages.size(); ++pg) {
      std::vector<unsigned char> raw(page_elems * dtype_size(kv_dtype));
      be->copy_to_host(raw.data(), a.cache[static_cast<size_t>(s)].pages[pg], raw.size());
      std::vector<float> page(page_elems);
      convert_to_f32(raw.data(), kv_dtype, page.data(), static_cast<int64_t>(page_elems));
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t r = 0; r < c.page_tokens; ++r) {
          if (static_cast<int64_t>(pg) * c.page_tokens + r >= keys) continue;
          for (int64_t d = 0; d < kv_dim; ++d) {
            const size_t at = static_cast<size_t>((half * c.page_tokens + r) * kv_dim + d);
            got_rows.push_back(page[at]);
            want_rows.push_back(host_pages[static_cast<size_t>(s)][pg][at]);
          }
        }
    }
    EXPECT_EQ(rel_err(got_rows, want_rows), 0.0) << "cache of sequence " << s;
  }
}

TEST(GpuAttention, PrefillMatchesFp64Reference) {
  MAMBACPP_REQUIRE_GPU();
  // head_dim of every family (Nemotron-H fixture 20, Granite-4.0-H-350m 64, Nemotron-H/Bamba/Granite-1b 128, 256),
  // GQA ratios 1, 3, 4, 8, lengths and pasts not multiples of the 16-item tile, the 32-key step or the page.
  const AttnCase cases[] = {
      {4, 2, 20, 8, {45}, {0}},
      {12, 4, 64, 64, {37, 1, 70}, {0, 5, 129}},
      {32, 8, 128, 64, {100, 3}, {17, 64}},
      {8, 8, 96, 5, {23, 9}, {0, 11}},
      {16, 2, 256, 16, {33}, {40}},
      {2, 1, 128, 1, {7, 19}, {3, 0}},
  };
  uint64_t seed = 1;
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim
                                      << " page " << c.page_tokens);
    check_attention(c, seed++);
  }
}

TEST(GpuAttention, DecodeWithSplitContextMatchesFp64Reference) {
  MAMBACPP_REQUIRE_GPU();
  // One row per sequence over long pasts: few blocks, so the keys are split over the grid (and combined).
  const AttnCase cases[] = {
      {32, 8, 128, 64, {1}, {3001}},
      {4, 2, 20, 8, {1, 1, 1}, {2000, 5, 777}},
      {12, 4, 64, 16, {1, 2}, {4099, 1500}},
  };
  uint64_t seed = 100;
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim);
    check_attention(c, seed++);
  }
}

TEST(GpuAttention, Bf16PagesMatchFp64ReferenceOnRoundedRows) {
  MAMBACPP_REQUIRE_GPU();
  // Prefill and split-context decode over bf16 pages, every head_dim.
  const AttnCase cases[] = {
      {4, 2, 20, 8, {45}, {0}},          {12, 4, 64, 64, {37, 1, 70}, {0, 5, 129}},
      {8, 8, 96, 5, {23, 9}, {0, 11}},   {16, 2, 256, 16, {33}, {40}},
      {32, 8, 128, 64, {1}, {3001}},     {4, 2, 20, 8, {1, 1, 1}, {2000, 5, 777}},
  };
  uint64_t seed = 200;
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim
                                      << " page " << c.page_tokens);
    check_attention(c, seed++, DType::BF16);
  }
}

TEST(GpuHybridOps, RopeMatchesFp64Reference) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::F32);
  DeviceArena arena(*be);
  Rng rng(7);
  struct Case {
    int64_t n_heads, head_dim, rope_dim;
    std::vector<int64_t> lens, start;
  };
  // Bamba's half-rotated heads, a full rotation, long positions (the angle's phase).
  for (const Case& c : {Case{4, 20, 10, {45}, {0}}, Case{8, 128, 64, {13, 1, 30}, {0, 16383, 100000}},
                        Case{3, 64, 64, {5, 9}, {7, 1}}}) {
    const BatchLayout batch = make_batch(c.lens, std::vector<int64_t>(c.lens.size(), 0));
    BatchLayout b = batch;
    const int64_t T = b.total_tokens, D = c.n_heads * c.head_dim;
    const auto x = rng.vec(static_cast<size_t>(T * D), -3.0f, 3.0f);
    TensorView dev = arena.upload_strided(x, T, D, D + 5, 2);
    be->prepare_batch(b);
    be->rope(dev, c.n_heads, c.head_dim, c.rope_dim, 10000.0, c.start, b);
    std::vector<double> ref(x.begin(), x.end());
    cpu::rope<double>({ref.data(), D}, c.n_heads, c.head_dim, c.rope_dim, 10000.0, std::span<const SeqSpan>(b.seqs),
                      std::span<const int64_t>(c.start), 1);
    EXPECT_LE(rel_err(arena.download(dev), ref), 1e-6) << "head_dim " << c.head_dim;
  }
}

TEST(GpuHybridOps, Relu2SiluMulScaleMatchFp64Reference) {
  MAMBACPP_REQUIRE_GPU();
  auto be = make_cuda_backend(DType::F32);
  DeviceArena arena(*be);
  Rng rng(9);
  const int64_t T = 37, D = 1000;
  const auto x = rng.vec(static_cast<size_t>(T * D), -4.0f, 4.0f), y = rng.vec(static_cast<size_t>(T * D), -4.0f, 4.0f);
  TensorView a = arena.upload_strided(x, T, D, 2 * D + 3, D + 1);
  be->relu2(a);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = x[i] > 0 ? double(x[i]) * x[i] : 0.0;
  EXPECT_LE(rel_err(arena.download(a), ref), 1e-6) << "relu2";

  TensorView g = arena.upload_strided(x, T, D, 2 * D, 0), u = arena.upload_strided(y, T, D, 2 * D, D);
  TensorView out = arena.poisoned({T, D});
  be->silu_mul(g, u, out);
  for (size_t i = 0; i < x.size(); ++i) ref[i] = double(x[i]) / (1.0 + std::exp(-double(x[i]))) * y[i];
  EXPECT_LE(rel_err(arena.download(out), ref), 1e-6) << "silu_mul";

  TensorView s = arena.upload_strided(y, T, D, D + 9, 4);
  be->scale(s, 0.22f);
  for (size_t i = 0; i < y.size(); ++i) ref[i] = double(y[i]) * double(0.22f);
  EXPECT_LE(rel_err(arena.download(s), ref), 1e-6) << "scale";
}

// ---- Models -------------------------------------------------------------------------------------------------------

std::vector<std::string> hybrid_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(test::fixture_dir()) / "hybrid";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "logits.npy")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::unique_ptr<Model> load(const std::string& dir, DeviceChoice dev, DType weights = DType::F32,
                            Precision precision = Precision::Exact, int64_t batch_tokens = 2048,
                            int64_t page_tokens = 8) {
  LoadOptions lo;
  lo.device = dev;
  lo.threads = 1;
  lo.weight_dtype = weights;
  lo.precision = precision;
  lo.max_batch_tokens = batch_tokens;
  lo.kv_page_tokens = page_tokens;
  return Model::load(dir, lo);
}

std::vector<float> logits_in_pieces(const Model& m, StateCache& st, std::span<const int32_t> ids,
                                    const std::vector<int64_t>& pieces, int64_t slot = 0) {
  std::vector<float> out;
  size_t at = 0;
  for (int64_t n : pieces) {
    Sequence s = Sequence::tokens(ids.subspan(at, static_cast<size_t>(n)), slot);
    const ForwardResult r = m.forward(st, {&s, 1}, Output::AllLogits);
    out.insert(out.end(), r.values.begin(), r.values.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

TEST(GpuHybrid, FixturesMatchTransformers) {
  MAMBACPP_REQUIRE_GPU();
  const auto dirs = hybrid_dirs();
  ASSERT_EQ(dirs.size(), 3u);
  for (const std::string& dir : dirs) {
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const NpyArray ref = read_npy(dir + "/logits.npy");
    const std::vector<float> expected(ref.values.begin(), ref.values.end());
    const int64_t L = static_cast<int64_t>(ids.size());
    for (DType wd : {DType::F32, DType::BF16})
      for (Precision pr : {Precision::Exact, Precision::Fast}) {
        SCOPED_TRACE(dir + " weights " + dtype_name(wd) + " " + precision_name(pr));
        auto model = load(dir, DeviceChoice::CUDA, wd, pr);
        ASSERT_EQ(model->device(), Device::CUDA);
        const double tol = wd == DType::F32 ? 1e-4 : 3e-2;
        auto st = model->create_state(1);
        const double err = test::max_rel_diff(logits_in_pieces(*model, *st, ids, {L}), expected);
        std::printf("[gpu hybrid] %s %s %s: %.3g\n", fs::path(dir).filename().c_str(), dtype_name(wd),
                    precision_name(pr), err);
        EXPECT_LE(err, tol) << "one pass";
        auto st2 = model->create_state(1);
        EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *st2, ids, {1, 2, 3, 7, 9, 1, L - 23}), expected), tol)
            << "in pieces";
      }
  }
}

TEST(GpuHybrid, MatchesCpuPath) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    auto cpu = load(dir, DeviceChoice::CPU);
    auto gpu = load(dir, DeviceChoice::CUDA);
    auto a = cpu->create_state(1), b = gpu->create_state(1);
    EXPECT_LE(test::max_rel_diff(logits_in_pieces(*gpu, *b, ids, {L - 5, 1, 1, 1, 1, 1}),
                                 logits_in_pieces(*cpu, *a, ids, {L - 5, 1, 1, 1, 1, 1})),
              1e-5);
    // The state the two left behind: SSM state and KV rows of every layer.
    EXPECT_LE(test::max_rel_diff(b->read_slot(0), a->read_slot(0)), 1e-5);
  }
}

TEST(GpuHybrid, AnySplitEqualsOnePass) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    // Pieces of 7 tokens inside one call too, and pages of one row.
    for (auto [cap, page] : {std::pair<int64_t, int64_t>{2048, 64}, {7, 8}, {2048, 1}}) {
      auto model = load(dir, DeviceChoice::CUDA, DType::F32, Precision::Exact, cap, page);
      auto st = model->create_state(1);
      const auto one = logits_in_pieces(*model, *st, ids, {L});
      std::mt19937_64 rng(5 + static_cast<uint64_t>(cap));
      std::vector<int64_t> pieces;
      for (int64_t at = 0; at < L;) {
        const int64_t n = std::min<int64_t>(L - at, std::uniform_int_distribution<int64_t>(1, 11)(rng));
        pieces.push_back(n);
        at += n;
      }
      auto st2 = model->create_state(1);
      EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *st2, ids, pieces), one), 1e-5) << "cap " << cap;
      auto st3 = model->create_state(1);
      EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *st3, ids, std::vector<int64_t>(static_cast<size_t>(L), 1)),
                                   one),
                1e-5)
          << "token by token, cap " << cap;
    }
  }
}

TEST(GpuHybrid, BatchMemberEqualsItselfAlone) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load(dir, DeviceChoice::CUDA, DType::F32, Precision::Exact, 16);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const std::vector<int32_t> a(ids.begin(), ids.begin() + 30), b(ids.begin() + 5, ids.begin() + 17),
        c(ids.rbegin(), ids.rbegin() + 23);
    auto st = model->create_state(4);
    logits_in_pieces(*model, *st, ids, {9}, 3);  // slot 3 first holds other tokens
    std::vector<Sequence> seqs = {Sequence::tokens(a, 2), Sequence::tokens(b, 0), Sequence::tokens(c, 3)};
    const ForwardResult r = model->forward(*st, seqs, Output::AllLogits);
    const int64_t V = model->config().vocab_size;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto alone = model->create_state(1);
      if (i == 2) logits_in_pieces(*model, *alone, ids, {9});
      const int64_t n = seqs[i].length();
      const auto want = logits_in_pieces(*model, *alone, seqs[i].token_ids, {n});
      const std::vector<float> got(r.values.begin() + row * V, r.values.begin() + (row + n) * V);
      EXPECT_LE(test::max_rel_diff(got, want), 1e-5) << "sequence " << i;
      row += n;
    }
    // Decode steps of the three together equal each alone.
    std::vector<Sequence> step = {Sequence::tokens(std::span<const int32_t>(ids).subspan(40, 1), 2),
                                  Sequence::tokens(std::span<const int32_t>(ids).subspan(41, 1), 0),
                                  Sequence::tokens(std::span<const int32_t>(ids).subspan(42, 1), 3)};
    auto st_copy = model->create_state(4);
    for (int64_t s = 0; s < 4; ++s) st_copy->restore(s, st->snapshot(s));
    const ForwardResult together = model->forward(*st, step, Output::LastLogits);
    for (size_t i = 0; i < step.size(); ++i) {
      const ForwardResult alone = model->forward(*st_copy, {&step[i], 1}, Output::LastLogits);
      const std::vector<float> got(together.values.begin() + static_cast<int64_t>(i) * V,
                                   together.values.begin() + static_cast<int64_t>(i + 1) * V);
      EXPECT_LE(test::max_rel_diff(got, alone.values), 1e-5) << "decode row " << i;
    }
  }
}

TEST(GpuHybrid, CacheHitEqualsRecompute) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load(dir, DeviceChoice::CUDA);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    auto st = model->create_state(3);
    const auto whole = logits_in_pieces(*model, *st, ids, {L});
    const int64_t V = model->config().vocab_size;
    const std::vector<float> tail(whole.end() - 15 * V, whole.end());
    // A prefix of 30 tokens, snapshotted, restored into another slot, saved and loaded, copied: each continues to
    // the same logits as the one pass.
    auto pre = model->create_state(3);
    logits_in_pieces(*model, *pre, ids, {30});
    const SlotSnapshot snap = pre->snapshot(0);
    pre->restore(1, snap);
    const std::string path = (fs::temp_directory_path() / "mambacpp_gpu_hybrid_state.bin").string();
    pre->save_snapshot(snap, path, std::vector<int32_t>(ids.begin(), ids.begin() + 30));
    pre->restore(2, pre->load_snapshot(path, nullptr));
    fs::remove(path);
    const auto rest = std::span<const int32_t>(ids).subspan(30);
    for (int64_t slot : {0, 1, 2})
      EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *pre, rest, {L - 30}, slot), tail), 1e-5) << "slot " << slot;
    auto other = model->create_state(2);
    logits_in_pieces(*model, *other, ids, {30}, 0);
    other->copy(0, 1);
    EXPECT_LE(test::max_rel_diff(logits_in_pieces(*model, *other, rest, {L - 30}, 1), tail), 1e-5) << "copied slot";
  }
}

// A bf16 state's slot (bf16 KV pages on the device) goes through snapshot, restore, save, load and copy unchanged:
// every copy continues exactly as the original slot does.
TEST(GpuHybrid, Bf16StateSlotsSurviveSnapshotsAndFiles) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs()) {
    SCOPED_TRACE(dir);
    auto model = load(dir, DeviceChoice::CUDA);
    const auto ids = test::read_token_ids(dir + "/tokens.txt");
    const int64_t L = static_cast<int64_t>(ids.size());
    auto st = model->create_state(4, DType::BF16);
    EXPECT_EQ(2 * st->kv_bytes_per_token(), model->create_state(1)->kv_bytes_per_token());
    logits_in_pieces(*model, *st, ids, {30});
    const SlotSnapshot snap = st->snapshot(0);
    st->restore(1, snap);
    const std::string path = (fs::temp_directory_path() / "mambacpp_gpu_hybrid_bf16.state").string();
    st->save(0, path, std::vector<int32_t>(ids.begin(), ids.begin() + 30));
    st->load(2, path);
    fs::remove(path);
    st->copy(0, 3);
    const auto rest = std::span<const int32_t>(ids).subspan(30);
    const auto want = logits_in_pieces(*model, *st, rest, {5, 1, L - 36}, 0);
    for (int64_t slot : {1, 2, 3})
      EXPECT_EQ(logits_in_pieces(*model, *st, rest, {5, 1, L - 36}, slot), want) << "slot " << slot;
  }
}

// Decode steps of a batch captured as CUDA graphs equal the same steps run eagerly (bit for bit: the same kernels,
// the KV cache read from the state's device mirror either way) and the CPU path (1e-5), while contexts grow across
// page boundaries and the page table grows (pages of one row: 16, 32, 64 pages), and with pages of 64 rows, where
// the decode attention splits the keys of its 1024-row table capacity (most splits then see no key).
//
// A bf16 state (KV rows included) too: graph == eager bit for bit still; against the CPU path within 1e-2 of the
// largest logit, as the two round their states to bf16 from f32 values that differ by f32 noise, so an element now
// and then lands one bf16 ulp (2^-8 relative) apart and the difference is carried on (the CPU's bf16 state against
// its f32 state is within 1e-2 too: hybrid_model_test).
TEST(GpuHybrid, GraphDecodeEqualsEagerAndCpu) {
  MAMBACPP_REQUIRE_GPU();
  for (const std::string& dir : hybrid_dirs())
    for (int64_t page : {1, 64})
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(dir + " page " + std::to_string(page) + " state " + dtype_name(sd));
      const auto ids = test::read_token_ids(dir + "/tokens.txt");
      const size_t L = ids.size();
      auto decode = [&](DeviceChoice dev, bool graphs) {
        LoadOptions lo;
        lo.device = dev;
        lo.threads = 1;
        lo.weight_dtype = DType::F32;
        lo.precision = Precision::Exact;
        lo.kv_page_tokens = page;
        lo.cuda_graphs = graphs;
        auto m = Model::load(dir, lo);
        auto st = m->create_state(4, sd);
        const std::vector<std::vector<int32_t>> prompts = {{ids.begin(), ids.begin() + 5},
                                                           {ids.begin() + 3, ids.begin() + 12},
                                                           {ids.begin(), ids.begin() + 1}};
        const int64_t slots[] = {3, 0, 2};
        std::vector<Sequence> seqs;
        for (size_t i = 0; i < 3; ++i) seqs.push_back(Sequence::tokens(prompts[i], slots[i]));
        std::vector<float> all = m->forward(*st, seqs, Output::LastLogits).values;
        std::vector<int32_t> next(3);
        for (size_t step = 0; step < 40; ++step) {
          for (size_t i = 0; i < 3; ++i) {
            next[i] = ids[(7 * i + step) % L];
            seqs[i] = Sequence::tokens(std::span<const int32_t>(&next[i], 1), slots[i]);
          }
          const ForwardResult r = m->forward(*st, seqs, Output::LastLogits);
          all.insert(all.end(), r.values.begin(), r.values.end());
        }
        return all;
      };
      const auto graph = decode(DeviceChoice::CUDA, true);
      EXPECT_EQ(graph, decode(DeviceChoice::CUDA, false)) << "graph vs eager";
      const double err = test::max_rel_diff(graph, decode(DeviceChoice::CPU, false));
      if (sd == DType::BF16) std::printf("[gpu hybrid] bf16 state, GPU vs CPU decode: %.3g\n", err);
      EXPECT_LE(err, sd == DType::F32 ? 1e-5 : 1e-2) << "vs CPU";
    }
}

}  // namespace
}  // namespace mambacpp
