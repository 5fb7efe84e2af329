// StreamEvent: orders the work of one context's stream after work queued on
// another context's stream of the same device, without a host wait. On a GPU
// it is a cudaEvent_t (timing off): Record marks the producer stream's work so
// far, Wait makes the consumer stream's later work wait for it. On the CPU
// every call runs to completion before returning, so both are no-ops.
//
// Create it once, outside the hot path (it allocates the event); Record and
// Wait allocate nothing. One event may be recorded again after a Wait: a
// Wait orders after the Record that preceded it on the host.
//
//   ASSIGN_OR_RETURN(auto ready, lossrt::StreamEvent::Create(device));
//   RETURN_IF_ERROR(ready->Record(compute));   // gradients written
//   RETURN_IF_ERROR(ready->Wait(comm));        // all-reduce them after
#ifndef LOSSRT_RUNTIME_STREAM_EVENT_H_
#define LOSSRT_RUNTIME_STREAM_EVENT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/context.h"
#include "runtime/device.h"

namespace lossrt {

class StreamEvent {
 public:
  // An event on `device` (CPU: a no-op event). Unavailable for a GPU in a
  // build without CUDA.
  static absl::StatusOr<std::unique_ptr<StreamEvent>> Create(
      const Device& device);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  const Device& device() const { return device_; }

  // Marks the work queued on `producer`'s stream so far. InvalidArgument when
  // the context is on another device.
  absl::Status Record(Context& producer);
  // Makes the work queued on `consumer`'s stream from now on wait for the
  // last Record. InvalidArgument when the context is on another device.
  absl::Status Wait(Context& consumer);

 private:
  StreamEvent(const Device& device, void* event)
      : device_(device), event_(event) {}
  absl::Status CheckDevice(const Context& context, const char* what) const;

  const Device device_;
  void* event_;  // cudaEvent_t; null on the CPU
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_STREAM_EVENT_H_
