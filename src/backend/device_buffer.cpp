// DeviceBuffer: RAII ownership of one allocation made through a Backend (host memory or device memory alike).
#include <utility>

#include "backend/backend.h"
#include "mambacpp/error.h"

namespace mambacpp {

DeviceBuffer::DeviceBuffer(Backend& backend, size_t bytes)
    : backend_(&backend), data_(backend.allocate(bytes)), size_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (backend_ && data_) backend_->deallocate(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (backend_ && data_) backend_->deallocate(data_);
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Backend::unsupported(const char* what) const { fail(description(), ": ", what, " is not supported"); }

}  // namespace mambacpp
