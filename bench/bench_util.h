// Shared benchmark helpers: median GPU time of a callable with CUDA events
// after warm-up, the device-to-device copy ceiling measured in the same run,
// and a tiny JSON-lines writer. Built only with the CUDA toolkit.
#ifndef LOSSRT_BENCH_BENCH_UTIL_H_
#define LOSSRT_BENCH_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/context.h"
#include "runtime/cuda_status.h"
#include "runtime/status.h"

namespace lossrt {
namespace bench {

// Median milliseconds of `fn` (which queues work on `stream`, given the
// repetition index so it can rotate inputs), each repetition timed by its own
// pair of events.
inline absl::StatusOr<double> MedianMs(
    cudaStream_t stream, int warmup, int repeats,
    const std::function<absl::Status(int)>& fn) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn(i));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(2 * repeats);
  for (auto& event : events) CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  for (int i = 0; i < repeats; ++i) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * i], stream));
    RETURN_IF_ERROR(fn(warmup + i));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events[2 * i + 1], stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<double> times(repeats);
  for (int i = 0; i < repeats; ++i) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    times[i] = ms;
  }
  for (auto& event : events) cudaEventDestroy(event);
  std::nth_element(times.begin(), times.begin() + repeats / 2, times.end());
  return times[repeats / 2];
}

// Device-to-device copy rate in bytes/s (bytes read + bytes written) over
// `bytes`-sized buffers, the ceiling for read+write kernels.
inline absl::StatusOr<double> CopyBandwidth(Context& context, int64_t bytes) {
  ASSIGN_OR_RETURN(void* raw_stream, context.stream());
  cudaStream_t stream = static_cast<cudaStream_t>(raw_stream);
  ASSIGN_OR_RETURN(Buffer src, context.allocator().Allocate(bytes));
  ASSIGN_OR_RETURN(Buffer dst, context.allocator().Allocate(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), 1, bytes, stream));
  ASSIGN_OR_RETURN(
      double ms, MedianMs(stream, 3, 20, [&](int) -> absl::Status {
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), bytes,
                                             cudaMemcpyDeviceToDevice, stream));
        return absl::OkStatus();
      }));
  return 2.0 * bytes / (ms * 1e-3);
}

}  // namespace bench
}  // namespace lossrt

#endif  // LOSSRT_BENCH_BENCH_UTIL_H_
