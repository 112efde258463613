// CUDA graphs: the model captures a decode step once and replays it. Nothing is created or allocated inside a
// capture: the cuBLAS handle and its workspace exist before it, and the scratch arena retires (never frees) a buffer
// a captured graph may hold.
#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace mambacpp {

namespace {

struct CudaGraph final : Backend::Graph {
  cudaGraphExec_t exec = nullptr;
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

}  // namespace

void CudaBackend::begin_capture() {
  cublas();  // handles and workspaces exist before capture: nothing is created or allocated inside it
  scratch_.mark_captured();
  MAMBACPP_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
}

std::unique_ptr<Backend::Graph> CudaBackend::end_capture() {
  cudaGraph_t graph = nullptr;
  MAMBACPP_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  auto g = std::make_unique<CudaGraph>();
  const cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  MAMBACPP_CUDA_CHECK(err);
  return g;
}

void CudaBackend::abort_capture() {
  cudaGraph_t graph = nullptr;
  if (stream_ && cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

void CudaBackend::replay(Graph& graph) {
  MAMBACPP_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec, stream()));
}

}  // namespace mambacpp
