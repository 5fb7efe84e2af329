// Makes a CUDA device current for a scope and restores the previous one after,
// so that library calls never leave the caller's thread on another device.
// Internal.
#ifndef LOSSRT_RUNTIME_SCOPED_DEVICE_H_
#define LOSSRT_RUNTIME_SCOPED_DEVICE_H_

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "runtime/cuda_status.h"

namespace lossrt {

class ScopedDevice {
 public:
  static absl::StatusOr<ScopedDevice> Enter(int ordinal) {
    ScopedDevice scoped;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&scoped.previous_));
    if (scoped.previous_ != ordinal) {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
      scoped.restore_ = true;
    }
    return scoped;
  }
  ScopedDevice(ScopedDevice&& other) noexcept
      : previous_(other.previous_), restore_(other.restore_) {
    other.restore_ = false;
  }
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  ScopedDevice() = default;
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_SCOPED_DEVICE_H_
