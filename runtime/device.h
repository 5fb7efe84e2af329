// Devices: the CPU or a CUDA GPU by ordinal, what the GPU is (name, SMs,
// memory, compute capability, peak memory bandwidth from its clock and bus),
// and the default choice.
//
//   lossrt::Device device = lossrt::DefaultDevice();  // the first GPU if any,
//   else the CPU
#ifndef LOSSRT_RUNTIME_DEVICE_H_
#define LOSSRT_RUNTIME_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lossrt {

enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;

  static Device Cpu() { return Device{DeviceKind::kCpu, 0}; }
  static Device Cuda(int ordinal = 0) {
    return Device{DeviceKind::kCuda, ordinal};
  }
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  std::string ToString() const;  // "cpu" or "cuda:N"
  bool operator==(const Device& other) const {
    return kind == other.kind &&
           (kind == DeviceKind::kCpu || ordinal == other.ordinal);
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int64_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int64_t l2_cache_bytes = 0;
  int64_t shared_memory_per_block_optin = 0;
  int64_t memory_clock_khz = 0;
  int memory_bus_width_bits = 0;

  // 2 (double data rate) * clock * bus width: the peak the datasheet quotes.
  double PeakMemoryBandwidthBytesPerSecond() const {
    return 2.0 * static_cast<double>(memory_clock_khz) * 1e3 *
           memory_bus_width_bits / 8.0;
  }
};

// True when the library was built with the CUDA toolkit.
bool BuiltWithCuda();

// Number of usable CUDA devices (0 when built without CUDA or when no
// driver/GPU is present).
int CudaDeviceCount();

// What a device is. The CPU gets a name and the hardware thread count as
// sm_count.
absl::StatusOr<DeviceInfo> GetDeviceInfo(const Device& device);

// The first GPU if one is present, else the CPU.
Device DefaultDevice();

// "auto" (DefaultDevice), "cpu", "cuda" (= cuda:0) or "cuda:N".
absl::StatusOr<Device> ParseDevice(absl::string_view text);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_DEVICE_H_
