#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

Weight Backend::adopt_matrix(const Weight& host) {
  if (!supports_weight_format(host.format))
    fail(description(), ": no kernels for ", host.describe(), " weights (formats this backend runs: f32, f16, bf16)");
  if (host.dense()) return Weight(adopt_weight(host.data));
  // Packed bytes on the CPU are read in place (mmap'd, as dense weights are); a device backend that runs a packed
  // format overrides adopt_packed to copy them into its layout.
  if (device() == Device::CPU && host.device() == Device::CPU) return host;
  return adopt_packed(host);
}

Weight Backend::adopt_packed(const Weight& host) {
  fail(description(), ": adopt_matrix of ", host.describe(), " weights is not implemented");
}

}  // namespace mambacpp
