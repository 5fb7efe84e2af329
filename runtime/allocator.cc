// The caching allocator: a size-keyed free list over cudaMalloc (device) or
// aligned_alloc (host).
#include "runtime/allocator.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace {

constexpr int64_t kAlignment = 256;

}  // namespace

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = other.allocator_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    capacity_ = other.capacity_;
    device_ = other.device_;
    other.allocator_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = other.capacity_ = 0;
  }
  return *this;
}

void Buffer::Reset() {
  if (allocator_ != nullptr && data_ != nullptr)
    allocator_->Release(data_, capacity_);
  allocator_ = nullptr;
  data_ = nullptr;
  bytes_ = capacity_ = 0;
}

Allocator::Allocator(Device device) : device_(device) {}

Allocator::~Allocator() { ReleaseCache(); }

absl::StatusOr<Buffer> Allocator::Allocate(int64_t bytes) {
  if (bytes < 0) return InvalidArgument("Allocate: negative size ", bytes);
  Buffer buffer;
  buffer.device_ = device_;
  if (bytes == 0) return buffer;
  // Small blocks round to 256 B, large ones to 2 MiB so that the cache matches
  // well.
  const int64_t capacity = RoundUp(
      bytes, bytes < (int64_t{1} << 20) ? kAlignment : (int64_t{2} << 20));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_blocks_.lower_bound(capacity);
    if (it != free_blocks_.end() && it->first <= 2 * capacity) {
      buffer.allocator_ = this;
      buffer.data_ = it->second;
      buffer.bytes_ = bytes;
      buffer.capacity_ = it->first;
      cached_bytes_ -= it->first;
      free_blocks_.erase(it);
      current_bytes_ += buffer.capacity_;
      if (current_bytes_ > peak_bytes_) peak_bytes_ = current_bytes_;
      return buffer;
    }
  }
  void* data = nullptr;
  if (device_.is_cpu()) {
    data = std::aligned_alloc(kAlignment, capacity);
    if (data == nullptr) {
      ReleaseCache();
      data = std::aligned_alloc(kAlignment, capacity);
    }
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
  } else {
#ifdef LOSSRT_WITH_CUDA
    ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
    cudaError_t error = cudaMalloc(&data, capacity);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ReleaseCache();
      error = cudaMalloc(&data, capacity);
    }
    CUDA_RETURN_IF_ERROR(error);
#else
    return absl::UnavailableError(
        "device memory requested, but built without CUDA");
#endif
  }
  std::lock_guard<std::mutex> lock(mutex_);
  buffer.allocator_ = this;
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  buffer.capacity_ = capacity;
  current_bytes_ += capacity;
  if (current_bytes_ > peak_bytes_) peak_bytes_ = current_bytes_;
  return buffer;
}

void Allocator::Release(void* data, int64_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_.emplace(capacity, data);
  cached_bytes_ += capacity;
  current_bytes_ -= capacity;
}

void Allocator::FreeBlock(void* data) const {
  if (device_.is_cpu()) {
    std::free(data);
    return;
  }
#ifdef LOSSRT_WITH_CUDA
  auto scoped = ScopedDevice::Enter(device_.ordinal);
  cudaFree(data);  // the destructor path has nobody to report an error to
#endif
}

void Allocator::ReleaseCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [capacity, data] : free_blocks_) FreeBlock(data);
  free_blocks_.clear();
  cached_bytes_ = 0;
}

int64_t Allocator::current_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_bytes_;
}

int64_t Allocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_bytes_;
}

int64_t Allocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

void Allocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_bytes_ = current_bytes_;
}

}  // namespace lossrt
