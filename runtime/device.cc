// Device discovery through the CUDA runtime (when built with it).
#include "runtime/device.h"

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_status.h"
#endif

namespace lossrt {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", ordinal);
}

bool BuiltWithCuda() {
#ifdef LOSSRT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#ifdef LOSSRT_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(const Device& device) {
  DeviceInfo info;
  if (device.is_cpu()) {
    info.name = "cpu";
    info.sm_count = static_cast<int>(std::thread::hardware_concurrency());
    return info;
  }
  if (device.ordinal < 0 || device.ordinal >= CudaDeviceCount()) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ",
                                               device.ToString(), " (",
                                               CudaDeviceCount(), " present)"));
  }
#ifdef LOSSRT_WITH_CUDA
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device.ordinal));
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.compute_capability_major = prop.major;
  info.compute_capability_minor = prop.minor;
  info.l2_cache_bytes = prop.l2CacheSize;
  info.shared_memory_per_block_optin =
      static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  int value = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &value, cudaDevAttrMemoryClockRate, device.ordinal));
  info.memory_clock_khz = value;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &value, cudaDevAttrGlobalMemoryBusWidth, device.ordinal));
  info.memory_bus_width_bits = value;
  return info;
#else
  return absl::UnavailableError("built without CUDA");
#endif
}

Device DefaultDevice() {
  return CudaDeviceCount() > 0 ? Device::Cuda(0) : Device::Cpu();
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "auto") return DefaultDevice();
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  absl::string_view ordinal_text =
      text;  // `text` stays whole for the error message
  if (absl::ConsumePrefix(&ordinal_text, "cuda:")) {
    int ordinal = 0;
    if (absl::SimpleAtoi(ordinal_text, &ordinal) && ordinal >= 0)
      return Device::Cuda(ordinal);
  }
  return InvalidArgument("device must be auto, cpu, cuda or cuda:N, got '",
                         text, "'");
}

}  // namespace lossrt
