// torch.save's zip layout: <archive>/data.pkl (the pickled dict), <archive>/data/<key> (one entry per storage, raw
// little-endian elements), <archive>/byteorder ("little"; absent in files from before it was written), and version
// records that are not needed to read the tensors.
#include "io/torch_checkpoint.h"

#include <cstring>
#include <map>

#include "io/torch_pickle.h"
#include "io/zip_archive.h"
#include "mambacpp/error.h"

namespace mambacpp {
namespace {

std::string first_bytes(const uint8_t* data, uint64_t size) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint64_t i = 0; i < size && i < 4; ++i) s += std::string(i ? " " : "") + hex[data[i] >> 4] + hex[data[i] & 15];
  return s;
}

}  // namespace

std::unique_ptr<TorchCheckpointFile> TorchCheckpointFile::open(const std::string& path) {
  std::unique_ptr<TorchCheckpointFile> f(new TorchCheckpointFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->parse(f->map_->data(), f->map_->size());
  return f;
}

std::unique_ptr<TorchCheckpointFile> TorchCheckpointFile::from_bytes(std::vector<uint8_t> bytes,
                                                                     const std::string& source) {
  std::unique_ptr<TorchCheckpointFile> f(new TorchCheckpointFile());
  f->path_ = source;
  f->bytes_ = std::move(bytes);
  f->parse(f->bytes_.data(), f->bytes_.size());
  return f;
}

void TorchCheckpointFile::parse(const uint8_t* data, uint64_t size) {
  if (size == 0) fail(path_, ": empty file (expected a torch.save zip archive)");
  if (!looks_like_zip(data, size)) {
    if (data[0] == 0x80)  // a pickle PROTO opcode: torch.save(..., _use_new_zipfile_serialization=False)
      fail(path_, ": PyTorch's legacy (pre-1.6, non-zip) serialization format is not supported. Convert it with ",
           "PyTorch: python -c \"import torch; f='", path_, "'; torch.save(torch.load(f, weights_only=True), f)\" ",
           "(rewrites it in the zip format), or save it as safetensors");
    fail(path_, ": not a PyTorch checkpoint: expected a zip archive (bytes 50 4b 03 04), found ",
         first_bytes(data, size));
  }
  const ZipArchive zip(data, size, path_);

  // The pickle is <archive>/data.pkl for one top-level folder name, which torch.save takes from the file name.
  const ZipEntry* pkl = nullptr;
  for (const ZipEntry& e : zip.entries()) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || e.name.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    if (pkl) fail(path_, ": two pickles ('", pkl->name, "' and '", e.name, "'); expected one <archive>/data.pkl");
    pkl = &e;
  }
  if (!pkl)
    fail(path_, ": zip archive without an <archive>/data.pkl entry: not a torch.save checkpoint (",
         zip.entries().size(), " entries",
         zip.entries().empty() ? "" : ", the first '" + zip.entries().front().name.substr(0, 100) + "'", ")");
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - std::strlen("data.pkl"));
  if (const ZipEntry* bo = zip.find(prefix + "byteorder")) {
    const std::vector<uint8_t> b = zip.extract(*bo);
    const std::string order(b.begin(), b.end());
    if (order != "little")
      fail(path_, ": byte order '", order.substr(0, 20), "' (entry ", bo->name,
           "): only little-endian checkpoints are supported");
  }
  const std::vector<uint8_t> pickle = zip.extract(*pkl);
  const TorchPickle p = read_torch_pickle(pickle.data(), pickle.size(), path_ + ": " + pkl->name);

  // Each storage: its entry must exist and hold exactly numel elements.
  std::map<size_t, std::string> user;  // storage -> the first tensor that uses it (for messages)
  for (const PickledTensor& t : p.tensors) user.try_emplace(t.storage, t.name);
  std::vector<const uint8_t*> storage_data(p.storages.size(), nullptr);
  for (size_t i = 0; i < p.storages.size(); ++i) {
    const PickledStorage& s = p.storages[i];
    if (!user.count(i)) continue;  // described but used by no tensor of the dict
    const std::string entry = prefix + "data/" + s.key;
    const std::string who = "storage '" + s.key + "' of tensor '" + user[i] + "'";
    const ZipEntry* e = zip.find(entry);
    if (!e) fail(path_, ": ", who, ": the archive has no entry '", entry, "'");
    const uint64_t elem = dtype_size(s.dtype);
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(s.numel, elem, &nbytes)) fail(path_, ": ", who, ": ", s.numel, " elements overflow");
    if (e->size != nbytes)
      fail(path_, ": ", who, ": entry '", entry, "' holds ", e->size, " bytes, expected ", nbytes, " (", s.numel,
           " elements of ", s.type, ")");
    const uint8_t* in_place = zip.stored_data(*e);
    // Kernels read elements directly: a stored entry that is not aligned to its element size is copied.
    if (in_place && reinterpret_cast<uintptr_t>(in_place) % elem == 0) {
      storage_data[i] = in_place;
    } else {
      owned_.push_back(zip.extract(*e));
      storage_data[i] = owned_.back().data();
    }
  }
  for (const PickledTensor& pt : p.tensors) {
    const PickledStorage& s = p.storages[pt.storage];
    Tensor t;
    t.name = pt.name;
    t.dtype = s.dtype;
    t.shape = pt.shape;
    uint64_t numel = 1;
    for (int64_t d : pt.shape) numel *= static_cast<uint64_t>(d);  // no overflow: checked by the unpickler
    t.nbytes = numel * dtype_size(s.dtype);
    t.data = storage_data[pt.storage] + (numel ? pt.offset * dtype_size(s.dtype) : 0);
    tensors_.push_back(std::move(t));
  }
}

TensorView TorchCheckpointFile::view(const Tensor& t) const {
  if (t.shape.size() > 4)
    fail(path_, ": tensor '", t.name, "' has ", t.shape.size(), " dimensions; at most 4 are supported");
  TensorView v;
  v.data = const_cast<uint8_t*>(t.data);  // read-only memory: TensorView has no const
  v.dtype = t.dtype;
  v.device = Device::CPU;
  v.ndim = static_cast<int>(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) v.shape[i] = t.shape[i];
  return v;
}

}  // namespace mambacpp
