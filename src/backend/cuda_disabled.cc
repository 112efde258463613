// Linked instead of the CUDA backend when mambacpp is built without CUDA (MAMBACPP_CUDA=OFF).
#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

bool cuda_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(DType, Precision, bool) {
  fail("--device cuda: this mambacpp was built without CUDA (reconfigure with -DMAMBACPP_CUDA=ON and nvcc on PATH)");
}

}  // namespace mambacpp
