// Shared benchmark helpers: median GPU time of a callable with CUDA events
// after warm-up, and the ceilings measured in the same run: the
// device-to-device copy rate and the dense bf16 cuBLASLt GEMM rate. Built only
// with the CUDA toolkit.
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
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
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

// bf16 GEMM throughput (TFLOP/s) of an n^3 cuBLASLt GEMM (bf16 in and out,
// f32 accumulation, through the context's GEMM runner): the ceiling a
// workload's GEMMs, or any tensor-core kernel, can reach on this GPU today.
inline absl::StatusOr<double> GemmTflops(Context& context, int64_t n) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(GemmRunner * gemm, ContextGemmRunner(context));
  ASSIGN_OR_RETURN(Buffer a, context.allocator().Allocate(n * n * 2));
  ASSIGN_OR_RETURN(Buffer b, context.allocator().Allocate(n * n * 2));
  ASSIGN_OR_RETURN(Buffer d, context.allocator().Allocate(n * n * 2));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.data(), 0, n * n * 2, stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.data(), 0, n * n * 2, stream));
  GemmCall call;
  call.a = {a.data(), CUDA_R_16BF, n, n, n, CUBLAS_OP_T};
  call.b = {b.data(), CUDA_R_16BF, n, n, n, CUBLAS_OP_N};
  call.d = d.data();
  call.d_type = CUDA_R_16BF;
  call.m = call.n = call.ld_d = n;
  ASSIGN_OR_RETURN(double ms, MedianMs(stream, 3, 10, [&](int) {
                     return gemm->Run(call, stream);
                   }));
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace bench
}  // namespace lossrt

#endif  // LOSSRT_BENCH_BENCH_UTIL_H_
