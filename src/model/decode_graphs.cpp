#include "model/decode_graphs.h"

namespace mambacpp {

namespace {
// Distinct keys kept; beyond that the cache starts over. One state needs at most one key per decode row count and
// output kind.
constexpr size_t kMaxGraphs = 1024;
}  // namespace

void DecodeGraphs::run(Backend& be, const std::vector<const void*>& key, uint64_t workspace_generation,
                       const void* device_seqs, const std::function<void()>& work) {
  if (graphs_.size() >= kMaxGraphs && !graphs_.count(key)) graphs_.clear();
  Entry& g = graphs_[key];
  if (g.workspace_generation != workspace_generation || g.device_seqs != device_seqs) g = Entry{};
  if (!g.warmed) {
    work();
    g.warmed = true;
    g.workspace_generation = workspace_generation;
    g.device_seqs = device_seqs;
    return;
  }
  if (!g.graph) {
    be.begin_capture();
    try {
      work();
    } catch (...) {
      be.abort_capture();
      throw;
    }
    g.graph = be.end_capture();
  }
  be.replay(*g.graph);
}

}  // namespace mambacpp
