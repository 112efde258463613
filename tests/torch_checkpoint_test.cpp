// The pytorch_model.bin reader: the zip layer, the restricted unpickler and the checkpoint file, on files made by
// torch.save (fuzz/corpus/torch_checkpoint, scripts/make_checkpoint_fixtures.py) and on hostile inputs built here by
// hand. Each hostile input must be refused with its own message, and nothing in it may run. The model-level checks
// (logits of the fixture checkpoints against transformers) are in checkpoint_formats_test.cpp.
#include "io/torch_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/checkpoint.h"
#include "io/torch_pickle.h"
#include "io/zip_archive.h"
#include "mambacpp/error.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string corpus_dir() { return test::source_dir() + "/fuzz/corpus/torch_checkpoint"; }
std::vector<uint8_t> seed(const std::string& name) { return read_file(corpus_dir() + "/" + name); }

// ---- A zip writer (stored or deflated entries; optionally every record in its zip64 form) -------------------------

struct ZipSpec {
  std::string name;
  std::string data;
  bool deflate = false;
};

void put16(std::string& s, uint32_t v) { s += char(v & 0xff), s += char(v >> 8 & 0xff); }
void put32(std::string& s, uint32_t v) { put16(s, v & 0xffff), put16(s, v >> 16); }
void put64(std::string& s, uint64_t v) { put32(s, static_cast<uint32_t>(v)), put32(s, static_cast<uint32_t>(v >> 32)); }

std::string raw_deflate(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, in.size()) + 16, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::vector<uint8_t> make_zip(const std::vector<ZipSpec>& entries, bool zip64 = false) {
  std::string file, dir;
  for (const ZipSpec& e : entries) {
    const std::string body = e.deflate ? raw_deflate(e.data) : e.data;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(e.data.data()), static_cast<uInt>(e.data.size())));
    const uint64_t offset = file.size();
    put32(file, 0x04034b50), put16(file, 20), put16(file, 0), put16(file, e.deflate ? 8 : 0), put32(file, 0);
    put32(file, crc), put32(file, static_cast<uint32_t>(body.size())),
        put32(file, static_cast<uint32_t>(e.data.size()));
    put16(file, static_cast<uint32_t>(e.name.size())), put16(file, 0);
    file += e.name + body;
    put32(dir, 0x02014b50), put16(dir, 45), put16(dir, 20), put16(dir, 0), put16(dir, e.deflate ? 8 : 0);
    put32(dir, 0), put32(dir, crc);
    put32(dir, zip64 ? 0xffffffffu : static_cast<uint32_t>(body.size()));
    put32(dir, zip64 ? 0xffffffffu : static_cast<uint32_t>(e.data.size()));
    put16(dir, static_cast<uint32_t>(e.name.size())), put16(dir, zip64 ? 28 : 0), put16(dir, 0), put16(dir, 0);
    put16(dir, 0), put32(dir, 0), put32(dir, zip64 ? 0xffffffffu : static_cast<uint32_t>(offset));
    dir += e.name;
    if (zip64) put16(dir, 1), put16(dir, 24), put64(dir, e.data.size()), put64(dir, body.size()), put64(dir, offset);
  }
  const uint64_t dir_offset = file.size();
  file += dir;
  if (zip64) {
    const uint64_t rec = file.size();
    put32(file, 0x06064b50), put64(file, 44), put16(file, 45), put16(file, 45), put32(file, 0), put32(file, 0);
    put64(file, entries.size()), put64(file, entries.size()), put64(file, dir.size()), put64(file, dir_offset);
    put32(file, 0x07064b50), put32(file, 0), put64(file, rec), put32(file, 1);
  }
  put32(file, 0x06054b50), put16(file, 0), put16(file, 0);
  put16(file, zip64 ? 0xffff : static_cast<uint32_t>(entries.size()));
  put16(file, zip64 ? 0xffff : static_cast<uint32_t>(entries.size()));
  put32(file, zip64 ? 0xffffffffu : static_cast<uint32_t>(dir.size()));
  put32(file, zip64 ? 0xffffffffu : static_cast<uint32_t>(dir_offset));
  put16(file, 0);
  return {file.begin(), file.end()};
}

// ---- A pickle writer for the few opcodes a state dict uses ---------------------------------------------------------

struct Pickle {
  std::string b = "\x80\x02";
  Pickle& op(char c) { return b += c, *this; }
  Pickle& str(const std::string& s) {
    b += 'X', put32(b, static_cast<uint32_t>(s.size())), b += s;
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) {
    b += 'c' + module + '\n' + name + '\n';
    return *this;
  }
  Pickle& int1(int v) { return b += 'K', b += char(v), *this; }
  Pickle& int_tuple(std::initializer_list<int> v) {
    op('(');
    for (int x : v) int1(x);
    return op('t');
  }
  // Pushes a tensor: _rebuild_tensor_v2((storage key, FloatStorage, numel), offset, size, stride, False, {}).
  Pickle& tensor(const std::string& key, int numel, int offset, std::initializer_list<int> size,
                 std::initializer_list<int> stride, const std::string& storage_type = "FloatStorage") {
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(').str("storage").global("torch", storage_type).str(key).str("cpu").int1(numel).op('t').op('Q');
    int1(offset).int_tuple(size).int_tuple(stride).op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
  std::string done() { return b + "."; }
};

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// A torch.save-like archive around `pkl` with storage "0" holding `storage` bytes (omitted when empty).
std::vector<uint8_t> archive(const std::string& pkl, const std::string& storage, bool deflate = false,
                             bool zip64 = false) {
  std::vector<ZipSpec> e = {{"archive/data.pkl", pkl, deflate}, {"archive/byteorder", "little", deflate}};
  if (!storage.empty()) e.push_back({"archive/data/0", storage, deflate});
  return make_zip(e, zip64);
}

std::string load_error(const std::vector<uint8_t>& bytes) {
  return error_of([&] { TorchCheckpointFile::from_bytes(bytes, "test.bin"); });
}

std::vector<float> values_of(const TorchCheckpointFile::Tensor& t) {
  std::vector<float> v(t.nbytes / 4);
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

const TorchCheckpointFile::Tensor& tensor_named(const TorchCheckpointFile& f, const std::string& name) {
  for (const auto& t : f.tensors())
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// ---- Hand-built archives: what is accepted -------------------------------------------------------------------------

const std::string kOneTensor = Pickle().op('}').str("w").tensor("0", 6, 0, {2, 3}, {3, 1}).op('s').done();
const std::string kSix = floats({1, 2, 3, 4, 5, 6});

TEST(TorchCheckpoint, ReadsAStoredAZip64AndADeflatedArchiveAlike) {
  for (bool zip64 : {false, true}) {
    for (bool deflate : {false, true}) {
      SCOPED_TRACE(std::string(zip64 ? "zip64 " : "") + (deflate ? "deflated" : "stored"));
      auto f = TorchCheckpointFile::from_bytes(archive(kOneTensor, kSix, deflate, zip64));
      ASSERT_EQ(f->tensors().size(), 1u);
      const auto& t = f->tensors()[0];
      EXPECT_EQ(t.name, "w");
      EXPECT_EQ(t.dtype, DType::F32);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
      EXPECT_EQ(values_of(t), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    }
  }
}

TEST(TorchCheckpoint, AViewWithAnOffsetPointsIntoItsStorage) {
  const std::string pkl = Pickle().op('}').str("tail").tensor("0", 6, 2, {4}, {1}).op('s').done();
  auto f = TorchCheckpointFile::from_bytes(archive(pkl, kSix));
  EXPECT_EQ(values_of(f->tensors()[0]), (std::vector<float>{3, 4, 5, 6}));
}

// ---- Hostile and broken inputs: each refused with its own message, nothing executed ---------------------------------

TEST(TorchCheckpointHostile, SystemAndEvalGlobalsAreRefusedAndNothingRuns) {
  test::TempDir tmp;
  const std::string marker = tmp.file("pwned");
  const std::string cmd = "touch " + marker;
  const std::string system_call = Pickle().global("posix", "system").str(cmd).op('\x85').op('R').done();
  EXPECT_THAT(load_error(archive(system_call, "")), HasSubstr("global 'posix.system' is not allowed"));
  // Protocol 4 spelling: module and name as strings, then STACK_GLOBAL.
  std::string eval_call = "\x80\x04";
  for (const std::string& s : {std::string("builtins"), std::string("eval")})
    eval_call += '\x8c', eval_call += char(s.size()), eval_call += s;
  eval_call += "\x93";
  eval_call += Pickle().str("__import__('os').system('" + cmd + "')").b.substr(2) + "\x85R.";
  EXPECT_THAT(load_error(archive(eval_call, "")), HasSubstr("global 'builtins.eval' is not allowed"));
  EXPECT_FALSE(fs::exists(marker)) << "a refused pickle ran its command";
}

TEST(TorchCheckpointHostile, ReduceOnAStorageTypeOrAnObjectOpcodeIsRefused) {
  const std::string call_storage = Pickle().global("torch", "FloatStorage").op(')').op('R').done();
  EXPECT_THAT(load_error(archive(call_storage, "")), HasSubstr("calling a storage type is not allowed"));
  const std::string newobj = Pickle().global("collections", "OrderedDict").op(')').op('\x81').done();
  EXPECT_THAT(load_error(archive(newobj, "")), HasSubstr("NEWOBJ (object construction) is not allowed"));
  const std::string long_storage = Pickle().op('}').str("i").tensor("0", 1, 0, {1}, {1}, "LongStorage").op('s').done();
  EXPECT_THAT(load_error(archive(long_storage, std::string(8, '\0'))),
              HasSubstr("storage type torch.LongStorage is not supported"));
}

TEST(TorchCheckpointHostile, AHugeStringLengthIsRefused) {
  std::string pkl = "\x80\x02X";
  put32(pkl, 0xfffffff0u);
  pkl += "abc.";
  EXPECT_THAT(load_error(archive(pkl, "")), HasSubstr("string of 4294967280 bytes runs past the end of the pickle"));
}

TEST(TorchCheckpointHostile, AMissingOrShortStorageEntryIsRefused) {
  EXPECT_THAT(load_error(archive(kOneTensor, "")),
              HasSubstr("storage '0' of tensor 'w': the archive has no entry 'archive/data/0'"));
  EXPECT_THAT(load_error(archive(kOneTensor, floats({1, 2}))),
              HasSubstr("entry 'archive/data/0' holds 8 bytes, expected 24 (6 elements of torch.FloatStorage)"));
}

TEST(TorchCheckpointHostile, AnOffsetPastTheStorageIsRefused) {
  const std::string pkl = Pickle().op('}').str("w").tensor("0", 6, 5, {3}, {1}).op('s').done();
  EXPECT_THAT(load_error(archive(pkl, kSix)),
              HasSubstr("tensor 'w' covers elements [5, 5 + 3) of storage '0', which has 6 elements"));
  // Strides that are not row-major describe a view mambacpp cannot express.
  const std::string transposed = Pickle().op('}').str("t").tensor("0", 6, 0, {3, 2}, {1, 3}).op('s').done();
  EXPECT_THAT(load_error(archive(transposed, kSix)), HasSubstr("tensor 't' is not contiguous"));
}

TEST(TorchCheckpointHostile, DeepNestingIsRefused) {
  std::string lists = "\x80\x02" + std::string(300, ']') + std::string(299, 'a') + ".";
  EXPECT_THAT(load_error(archive(lists, "")), HasSubstr("containers nested deeper than 100 levels"));
  std::string marks = "\x80\x02" + std::string(300, '(') + ".";
  EXPECT_THAT(load_error(archive(marks, "")), HasSubstr("more than 100 MARKs open at once"));
  // A list appended to itself is a cycle, not a depth: it must neither hang nor recurse.
  std::string cycle = "\x80\x02]" + std::string(200, '2') + std::string(200, 'a') + ".";
  EXPECT_THAT(load_error(archive(cycle, "")), HasSubstr("nested deeper than 100 levels"));
}

TEST(TorchCheckpointHostile, ATruncatedPickleOrArchiveIsRefused) {
  const std::string cut = kOneTensor.substr(0, kOneTensor.find("storage") + 3);  // inside a string
  EXPECT_THAT(load_error(archive(cut, kSix)),
              HasSubstr("string of 7 bytes runs past the end of the pickle (3 bytes left)"));
  const std::string cut_global = kOneTensor.substr(0, kOneTensor.find("_rebuild"));
  EXPECT_THAT(load_error(archive(cut_global, kSix)), HasSubstr("GLOBAL's name has no terminating newline"));
  const std::string no_stop = kOneTensor.substr(0, kOneTensor.size() - 1);
  EXPECT_THAT(load_error(archive(no_stop, kSix)), HasSubstr("the pickle ends without a STOP opcode"));
  std::vector<uint8_t> zip = archive(kOneTensor, kSix);
  zip.resize(zip.size() - 30);
  EXPECT_THAT(load_error(zip), HasSubstr("no zip end-of-central-directory record found"));
}

TEST(TorchCheckpointHostile, ANonZipOrLegacyFileIsRefusedWithAdvice) {
  const std::string text = "hello, this is not a checkpoint";
  EXPECT_THAT(load_error({text.begin(), text.end()}),
              HasSubstr("not a PyTorch checkpoint: expected a zip archive (bytes 50 4b 03 04), found 68 65 6c 6c"));
  EXPECT_THAT(load_error(seed("legacy.pt")),
              HasSubstr("legacy (pre-1.6, non-zip) serialization format is not supported. Convert it with PyTorch"));
  EXPECT_THAT(load_error({}), HasSubstr("empty file"));
}

TEST(TorchCheckpointHostile, CorruptZipStructuresAreRefused) {
  // A flipped byte inside the stored pickle: the CRC catches it before the unpickler runs.
  std::vector<uint8_t> zip = archive(kOneTensor, kSix);
  const std::string needle = "_rebuild_tensor_v2";
  auto at = std::search(zip.begin(), zip.end(), needle.begin(), needle.end());
  ASSERT_NE(at, zip.end());
  *at ^= 0x20;
  EXPECT_THAT(load_error(zip), HasSubstr("fails its CRC-32 check"));
  // A deflated entry whose compressed bytes are garbage.
  std::vector<uint8_t> def = archive(kOneTensor, kSix, true);
  def[30 + std::strlen("archive/data.pkl") + 3] ^= 0xff;
  EXPECT_THAT(load_error(def),
              ::testing::AnyOf(HasSubstr("is corrupt (zlib"), HasSubstr("CRC-32"), HasSubstr("inflates to")));
  // A central directory that points outside the file.
  std::vector<uint8_t> far = archive(kOneTensor, kSix);
  const size_t eocd = far.size() - 22;
  far[eocd + 16] = 0xf0, far[eocd + 17] = 0xff;
  EXPECT_THAT(load_error(far), HasSubstr("central directory at byte"));
  // A zip without data.pkl.
  EXPECT_THAT(load_error(make_zip({{"x/y.txt", "hi"}})), HasSubstr("without an <archive>/data.pkl entry"));
  // Big-endian files.
  EXPECT_THAT(load_error(make_zip({{"archive/data.pkl", kOneTensor}, {"archive/byteorder", "big"}})),
              HasSubstr("only little-endian checkpoints are supported"));
}

TEST(TorchCheckpointHostile, NonDictResultsAndNestedDictsAreRefused) {
  EXPECT_THAT(load_error(archive(Pickle().op(']').done(), "")), HasSubstr("the pickle holds a list; expected a dict"));
  const std::string nested = Pickle().op('}').str("model").op('}').op('s').done();
  EXPECT_THAT(load_error(archive(nested, "")), HasSubstr("entry 'model' is a dict, expected a tensor"));
  const std::string unknown_memo("\x80\x02h\x07.", 5);
  EXPECT_THAT(load_error(archive(unknown_memo, "")), HasSubstr("memo index 7 was never stored"));
}

// ---- torch.save's own files (the fuzz seed corpus) -----------------------------------------------------------------

TEST(TorchCheckpointCorpus, TorchSaveFilesReadAsTorchWroteThem) {
  auto views = TorchCheckpointFile::from_bytes(seed("views.pt"));
  const auto &a = tensor_named(*views, "a"), &b = tensor_named(*views, "b"), &c = tensor_named(*views, "c");
  // a = base[2:6], b = base[:3], c = base.view(2, 5)[1]: one storage, three offsets.
  EXPECT_EQ(a.data, b.data + 2 * 4);
  EXPECT_EQ(c.data, b.data + 5 * 4);
  EXPECT_EQ(a.shape, std::vector<int64_t>{4});
  EXPECT_EQ(c.shape, std::vector<int64_t>{5});
  auto tied = TorchCheckpointFile::from_bytes(seed("tied.pt"));
  EXPECT_EQ(tensor_named(*tied, "emb").data, tensor_named(*tied, "head").data);

  auto mixed = TorchCheckpointFile::from_bytes(seed("mixed_dtypes.pt"));
  auto deflated = TorchCheckpointFile::from_bytes(seed("mixed_dtypes_deflated.pt"));
  const std::vector<std::pair<std::string, DType>> want = {
      {"a", DType::F16}, {"b", DType::BF16}, {"c", DType::F32}, {"d", DType::F32}};
  for (const auto& [name, dtype] : want) {
    SCOPED_TRACE(name);
    const auto &s = tensor_named(*mixed, name), &d = tensor_named(*deflated, name);
    EXPECT_EQ(s.dtype, dtype);
    EXPECT_EQ(d.dtype, dtype);
    EXPECT_EQ(s.shape, d.shape);
    ASSERT_EQ(s.nbytes, d.nbytes);
    if (s.nbytes > 0) EXPECT_EQ(std::memcmp(s.data, d.data, s.nbytes), 0);  // an empty tensor's data may be null
  }
  EXPECT_EQ(tensor_named(*mixed, "c").shape, std::vector<int64_t>{});  // 0-d
  EXPECT_EQ(tensor_named(*mixed, "d").shape, (std::vector<int64_t>{0, 4}));

  auto lin = TorchCheckpointFile::from_bytes(seed("linear_state_dict.pt"));  // OrderedDict + _metadata BUILD
  EXPECT_EQ(tensor_named(*lin, "weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tensor_named(*lin, "bias").shape, std::vector<int64_t>{2});
  EXPECT_EQ(tensor_named(*TorchCheckpointFile::from_bytes(seed("parameter.pt")), "p").shape, std::vector<int64_t>{3});
  auto p4 = TorchCheckpointFile::from_bytes(seed("proto4.pt"));
  EXPECT_EQ(tensor_named(*p4, "x").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(tensor_named(*p4, "y").dtype, DType::BF16);
  EXPECT_EQ(tensor_named(*TorchCheckpointFile::from_bytes(seed("four_dims.pt")), "t").shape,
            (std::vector<int64_t>{1, 2, 1, 3}));

  EXPECT_THAT(load_error(seed("noncontiguous.pt")), HasSubstr("tensor 't' is not contiguous"));
  EXPECT_THAT(load_error(seed("int64.pt")), HasSubstr("torch.LongStorage is not supported"));
}

// The fuzz target's property on every corpus file and on every truncation and single-byte change of a few: either
// a mambacpp::Error, or tensors that lie wholly inside memory the file owns (read here so that a bad range shows).
void check_property(const std::vector<uint8_t>& bytes, const std::string& what) {
  try {
    auto f = TorchCheckpointFile::from_bytes(bytes, what);
    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors()) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      ASSERT_EQ(t.nbytes, numel * dtype_size(t.dtype)) << what << " " << t.name;
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    }
  } catch (const Error&) {
  }
}

TEST(TorchCheckpointCorpus, ReplayAndMutationsEitherLoadOrFailCleanly) {
  size_t files = 0, cases = 0;
  for (const auto& e : fs::directory_iterator(corpus_dir())) {
    const std::vector<uint8_t> bytes = read_file(e.path().string());
    check_property(bytes, e.path().filename().string());
    ++files;
    // Every truncation, and a byte flip at every position (the CRC is on: most flips stop at the zip layer).
    for (size_t n = 0; n < bytes.size(); n += 7, ++cases) check_property({bytes.begin(), bytes.begin() + n}, "cut");
    for (size_t i = 0; i < bytes.size(); i += 3, ++cases) {
      std::vector<uint8_t> m = bytes;
      m[i] ^= 0x5a;
      check_property(m, "flip");
    }
  }
  EXPECT_GE(files, 12u) << "the seed corpus is missing";
  EXPECT_GT(cases, 1000u);
}

// The unpickler alone on every pickle seed and its truncations (no zip layer, no CRC in the way).
TEST(TorchCheckpointCorpus, PickleSeedsAndTheirTruncationsParseOrFailCleanly) {
  size_t ok = 0, files = 0;
  for (const auto& e : fs::directory_iterator(test::source_dir() + "/fuzz/corpus/torch_pickle")) {
    const std::vector<uint8_t> bytes = read_file(e.path().string());
    ++files;
    for (size_t n = 0; n <= bytes.size(); ++n) {
      try {
        read_torch_pickle(bytes.data(), n, "seed");
        ok += n == bytes.size();
      } catch (const Error&) {
      }
      for (size_t i = 0; i < n; i += 5) {
        std::vector<uint8_t> m(bytes.begin(), bytes.begin() + n);
        m[i] ^= 0x41;
        try {
          read_torch_pickle(m.data(), m.size(), "flip");
        } catch (const Error&) {
        }
      }
    }
  }
  EXPECT_GE(files, 10u);
  EXPECT_EQ(ok, files - 2) << "every whole pickle seed except int64 and noncontiguous should parse";
}

// ---- Directory layouts
// -----------------------------------------------------------------------------------------------

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TEST(TorchCheckpointDirectory, LayoutErrorsNameTheFile) {
  const std::string config = test::fixture_dir() + "/checkpoints/mamba2_ssm_bf16_tied/config.json";
  {
    test::TempDir tmp;
    fs::copy_file(config, tmp.file("config.json"));
    write_bytes(tmp.file("pytorch_model.bin"), seed("legacy.pt"));
    EXPECT_THAT(error_of([&] { Checkpoint c(tmp.path()); }), HasSubstr("legacy (pre-1.6, non-zip)"));
  }
  {
    test::TempDir tmp;
    fs::copy_file(config, tmp.file("config.json"));
    std::ofstream(tmp.file("pytorch_model.bin.index.json"))
        << R"({"weight_map": {"backbone.norm_f.weight": "pytorch_model-00001-of-00002.bin"}})";
    EXPECT_THAT(error_of([&] { Checkpoint c(tmp.path()); }),
                HasSubstr("shard pytorch_model-00001-of-00002.bin (holding 'backbone.norm_f.weight') not found"));
  }
  {
    test::TempDir tmp;
    fs::copy_file(config, tmp.file("config.json"));
    write_bytes(tmp.file("consolidated.pth"), seed("f32.pt"));
    EXPECT_THAT(error_of([&] { Checkpoint c(tmp.path()); }),
                HasSubstr("found consolidated.pth but no pytorch_model.bin"));
  }
}

}  // namespace
}  // namespace mambacpp
