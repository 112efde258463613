// A restricted unpickler for the data.pkl of a torch.save checkpoint. It implements the pickle opcodes that such a
// file uses (protocols 2 to 5) and only these globals: collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// torch._utils._rebuild_parameter and the storage types torch.FloatStorage / HalfStorage / BFloat16Storage. Nothing is
// ever called or imported: globals become tags, REDUCE on an allowed tag builds plain data (a dict, a tensor
// description), and anything else - another global, another callable, object construction opcodes - is refused with
// an error naming what was found and where. Strings and containers are bounded by the input, nesting by
// kMaxPickleNesting, so memory stays proportional to the pickle's size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mambacpp/dtype.h"

namespace mambacpp {

// Containers nested deeper than this (or MARKs open at once) are refused. torch.save's state dicts use 3 or 4.
constexpr int kMaxPickleNesting = 100;

struct PickledStorage {
  std::string key;   // the zip entry is <archive>/data/<key>
  std::string type;  // e.g. "torch.FloatStorage" (for messages)
  DType dtype = DType::F32;
  uint64_t numel = 0;    // elements of the storage
  std::string location;  // e.g. "cpu", "cuda:0": ignored, the bytes are the same
};

struct PickledTensor {
  std::string name;
  size_t storage = 0;   // index into TorchPickle::storages
  uint64_t offset = 0;  // storage_offset, in elements
  std::vector<int64_t> shape, stride;
};

struct TorchPickle {
  std::vector<PickledStorage> storages;  // each key once, in order of first use
  std::vector<PickledTensor> tensors;    // in the order of the file's dict
};

// Reads a pickled dict of name -> tensor (what torch.save(state_dict) writes); `source` names it in messages.
// Throws mambacpp::Error for any input outside that shape.
TorchPickle read_torch_pickle(const uint8_t* data, size_t size, const std::string& source);

}  // namespace mambacpp
