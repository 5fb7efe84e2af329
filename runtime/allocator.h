// Owning memory: Buffer (RAII, host or device, 256-byte aligned) and the
// caching Allocator that hands them out and counts current and peak bytes in
// use.
//
//   lossrt::Allocator allocator(lossrt::Device::Cuda(0));
//   ASSIGN_OR_RETURN(lossrt::Buffer buffer, allocator.Allocate(1 << 20));
//   // ... buffer.data() ... ; its memory goes back to the allocator's cache on
//   destruction.
//
// Freed blocks are kept and reused for later requests of a similar size (at
// most twice the request), so steady-state training steps do not call
// cudaMalloc. Device memory handed out is stream-ordered by its owner: reuse is
// safe as long as every user of an allocator's memory runs on the one stream of
// the Context that owns the allocator.
#ifndef LOSSRT_RUNTIME_ALLOCATOR_H_
#define LOSSRT_RUNTIME_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <mutex>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace lossrt {

class Allocator;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  // Gives the memory back to its allocator now.
  void Reset();

 private:
  friend class Allocator;
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int64_t capacity_ = 0;
  Device device_;
};

class Allocator {
 public:
  explicit Allocator(Device device);
  ~Allocator();  // frees the cache; every Buffer must be gone by then
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // A buffer of at least `bytes` bytes (256-byte aligned). Zero bytes gives an
  // empty buffer.
  absl::StatusOr<Buffer> Allocate(int64_t bytes);

  const Device& device() const { return device_; }
  int64_t current_bytes() const;  // held by live buffers (block sizes)
  int64_t peak_bytes()
      const;  // the most current_bytes has been since the last reset
  int64_t cached_bytes() const;  // freed blocks kept for reuse
  void ResetPeak();
  // Returns cached blocks to the system (cudaFree / free).
  void ReleaseCache();

 private:
  friend class Buffer;
  void Release(void* data, int64_t capacity);
  void FreeBlock(void* data) const;

  Device device_;
  mutable std::mutex mutex_;
  std::multimap<int64_t, void*> free_blocks_;  // capacity -> block
  int64_t current_bytes_ = 0;
  int64_t peak_bytes_ = 0;
  int64_t cached_bytes_ = 0;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_ALLOCATOR_H_
