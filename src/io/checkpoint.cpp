// Opening a model directory: config.json, then the weight layout it uses (safetensors or pytorch_model.bin, single
// or sharded with an index, or loose *.safetensors files), with every tensor indexed by name; plus the content hash
// of all weights.
#include "io/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "io/json_relaxed.h"
#include "io/torch_checkpoint.h"
#include "mambacpp/error.h"
#include "core/file_bytes.h"
#include "core/json_limits.h"

namespace fs = std::filesystem;

namespace mambacpp {

struct Checkpoint::HashCache {
  std::once_flag once;
  uint64_t value = 0;
};

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

// FNV-1a step on a 64-bit word. The multiply only carries bits upwards, so the xorshift folds high bits back down;
// without it a flip of a word's top bit would only ever reach the hash's top bit.
inline uint64_t mix(uint64_t h, uint64_t word) {
  h = (h ^ word) * kFnvPrime;
  return h ^ (h >> 29);
}

uint64_t hash_bytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  // Four independent lanes so that the multiply latency overlaps; combined in a fixed order at the end.
  uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);  // memcpy: the data need not be 8-byte aligned
      lane[k] = mix(lane[k], w);
    }
  }
  h = mix(mix(mix(mix(h, lane[0]), lane[1]), lane[2]), lane[3]);
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix(mix(h, tail), n);
}

uint64_t hash_tensor(const std::string& name, const TensorView& v) {
  uint64_t h = hash_bytes(kFnvOffset, name.data(), name.size());
  h = mix(h, static_cast<uint64_t>(v.dtype));
  h = mix(h, static_cast<uint64_t>(v.ndim));
  for (int d = 0; d < v.ndim; ++d) h = mix(h, static_cast<uint64_t>(v.dim(d)));
  return hash_bytes(h, v.data, v.nbytes());
}

std::string read_text(const std::string& path) { return read_file_bytes(path, "config"); }

bool has_extension(const fs::path& p, std::initializer_list<const char*> exts) {
  const std::string e = p.extension().string();
  return std::any_of(exts.begin(), exts.end(), [&](const char* x) { return e == x; });
}

}  // namespace

Checkpoint::Checkpoint(const std::string& directory) : directory_(directory), hash_(std::make_unique<HashCache>()) {
  std::error_code ec;
  if (!fs::is_directory(directory_, ec)) fail("checkpoint ", directory_, ": not a directory");
  const fs::path dir(directory_);

  const fs::path config_path = dir / "config.json";
  if (fs::is_directory(config_path, ec))
    fail("checkpoint ", directory_, ": ", config_path.string(), " is a directory, expected the config file");
  if (!fs::is_regular_file(config_path, ec))
    fail("checkpoint ", directory_, ": config.json not found (expected ", config_path.string(), ")");
  const std::string config_text = read_text(config_path.string());
  config_ = parse_model_config(config_text, config_path.string());
  read_quant_config(config_text, config_path.string());
  open_weights();
  bind_fp8();
}

void Checkpoint::open_weights() {
  std::error_code ec;
  const fs::path dir(directory_);
  for (const char* single : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                             "pytorch_model.bin.index.json"}) {
    if (!fs::is_regular_file(dir / single, ec)) continue;
    const std::string path = (dir / single).string();
    if (has_extension(dir / single, {".json"})) open_index(path);
    else add_file(path);
    return;
  }
  std::vector<fs::path> safetensors, pickles;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (has_extension(e.path(), {".safetensors"})) safetensors.push_back(e.path());
    if (has_extension(e.path(), {".bin", ".pt", ".pth", ".ckpt"})) pickles.push_back(e.path());
  }
  std::sort(safetensors.begin(), safetensors.end());
  for (const auto& p : safetensors) add_file(p.string());
  if (!files_.empty()) return;
  std::sort(pickles.begin(), pickles.end());
  if (!pickles.empty())
    fail("checkpoint ", directory_, ": found ", pickles.front().filename().string(),
         " but no pytorch_model.bin, pytorch_model.bin.index.json or *.safetensors; a pickled checkpoint is read only ",
         "as pytorch_model.bin (rename it if it is a torch.save of the model's state_dict)");
  fail("checkpoint ", directory_,
       ": no weights found (expected model.safetensors, model.safetensors.index.json, pytorch_model.bin, ",
       "pytorch_model.bin.index.json or *.safetensors)");
}

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

void Checkpoint::add_file(const std::string& path) {
  std::vector<std::pair<std::string, TensorView>> views;
  std::set<std::string> fp8;
  std::shared_ptr<const void> owner;
  if (has_extension(path, {".safetensors"})) {
    auto f = std::make_shared<const SafetensorsFile>(path);
    for (const SafetensorInfo& info : f->tensors()) {
      views.emplace_back(info.name, f->view(info));
      if (info.fp8_e4m3) fp8.insert(info.name);
    }
    owner = f;
  } else if (has_extension(path, {".bin", ".pt", ".pth"})) {
    std::shared_ptr<const TorchCheckpointFile> f = TorchCheckpointFile::open(path);
    for (const TorchCheckpointFile::Tensor& t : f->tensors()) views.emplace_back(t.name, f->view(t));
    owner = f;
  } else {
    fail("checkpoint ", directory_, ": ", path, ": unknown weight file type (expected .safetensors or .bin)");
  }
  files_.push_back({path, owner});
  const size_t index = files_.size() - 1;
  for (const auto& [name, view] : views) {
    auto [it, inserted] = tensors_.try_emplace(name, Entry{view, index, fp8.count(name) != 0});
    if (!inserted)
      fail("checkpoint ", directory_, ": tensor '", name, "' appears in both ", files_[it->second.file].path, " and ",
           path);
  }
}

void Checkpoint::open_index(const std::string& index_path) {
  const nlohmann::json index = read_json_file_relaxed(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(index_path, ": expected an object with a \"weight_map\" object");
  const nlohmann::json& weight_map = index["weight_map"];
  if (weight_map.empty()) fail(index_path, ": weight_map is empty");

  // Each shard once, in name order; the first tensor naming a shard is quoted if the shard is missing.
  std::map<std::string, std::string> shards;  // shard file -> a tensor that lists it
  for (const auto& [name, shard] : weight_map.items()) {
    if (!shard.is_string()) fail(index_path, ": weight_map[\"", name, "\"] must be a file name, found ", json_excerpt(shard));
    const std::string file = shard.get<std::string>();
    const fs::path p(file);
    if (file.empty() || p.is_absolute() || p.filename().string() != file)
      fail(index_path, ": weight_map[\"", name, "\"] = \"", file, "\": expected a file name inside ", directory_);
    shards.try_emplace(file, name);
  }
  for (const auto& [file, first_tensor] : shards) {
    const fs::path p = fs::path(directory_) / file;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec))
      fail(index_path, ": shard ", file, " (holding '", first_tensor, "') not found at ", p.string());
    add_file(p.string());
  }
  for (const auto& [name, shard] : weight_map.items()) {
    const std::string expected = (fs::path(directory_) / shard.get<std::string>()).string();
    auto it = tensors_.find(name);
    if (it == tensors_.end())
      fail(index_path, ": tensor '", name, "' is listed in shard ", shard.get<std::string>(),
           " but that shard does not contain it");
    if (files_[it->second.file].path != expected)
      fail(index_path, ": tensor '", name, "' is listed in shard ", shard.get<std::string>(), " but found in ",
           files_[it->second.file].path);
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;  // std::map iterates in sorted order
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? std::string() : files_[it->second.file].path;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f.path);
  return out;
}

uint64_t Checkpoint::content_hash() const {
  std::call_once(hash_->once, [this] {
    // Per-tensor hashes in parallel (large checkpoints are tens of GB), combined in name order so that the result
    // does not depend on the thread count or on how the tensors are split into files.
    std::vector<std::pair<const std::string*, const TensorView*>> items;
    for (const auto& [name, entry] : tensors_) items.emplace_back(&name, &entry.view);
    std::vector<uint64_t> per_tensor(items.size());
    const long long n = static_cast<long long>(items.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (long long i = 0; i < n; ++i) per_tensor[i] = hash_tensor(*items[i].first, *items[i].second);
    uint64_t h = kFnvOffset;
    for (uint64_t t : per_tensor) h = mix(h, t);
    hash_->value = mix(h, per_tensor.size());
  });
  return hash_->value;
}

}  // namespace mambacpp
