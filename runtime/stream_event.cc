// StreamEvent: a cudaEvent_t recorded on one context's stream and waited on
// by another's; no-ops on the CPU.
#include "runtime/stream_event.h"

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {

absl::StatusOr<std::unique_ptr<StreamEvent>> StreamEvent::Create(
    const Device& device) {
  if (device.is_cpu()) {
    return std::unique_ptr<StreamEvent>(new StreamEvent(device, nullptr));
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device.ordinal));
  cudaEvent_t event = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return std::unique_ptr<StreamEvent>(new StreamEvent(device, event));
#else
  return absl::UnavailableError(absl::StrCat(
      "StreamEvent on ", device.ToString(), ": this build has no CUDA"));
#endif
}

StreamEvent::~StreamEvent() {
#ifdef LOSSRT_WITH_CUDA
  if (event_ != nullptr) {
    absl::StatusOr<ScopedDevice> scoped = ScopedDevice::Enter(device_.ordinal);
    cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  }
#endif
}

absl::Status StreamEvent::CheckDevice(const Context& context,
                                      const char* what) const {
  if (context.device() != device_) {
    return InvalidArgument("StreamEvent::", what, ": the context is on ",
                           context.device().ToString(), ", the event on ",
                           device_.ToString());
  }
  return absl::OkStatus();
}

absl::Status StreamEvent::Record(Context& producer) {
  RETURN_IF_ERROR(CheckDevice(producer, "Record"));
  if (event_ == nullptr) return absl::OkStatus();
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(producer));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  CUDA_RETURN_IF_ERROR(
      cudaEventRecord(static_cast<cudaEvent_t>(event_), stream));
#endif
  return absl::OkStatus();
}

absl::Status StreamEvent::Wait(Context& consumer) {
  RETURN_IF_ERROR(CheckDevice(consumer, "Wait"));
  if (event_ == nullptr) return absl::OkStatus();
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(consumer));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event_), 0));
#endif
  return absl::OkStatus();
}

}  // namespace lossrt
