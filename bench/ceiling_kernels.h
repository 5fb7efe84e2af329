// Plain memory-bound kernels (bench/ceiling_kernels.cu) that set the ceilings
// a benchmark reports its kernels against: a read-and-sum (what any kernel
// that only reads its input can reach) and a copy (what any kernel that reads
// its input and writes as many bytes can reach). Internal to //bench; built
// only with the CUDA toolkit.
//
//   CUDA_RETURN_IF_ERROR(bench::LaunchReadSum(src, bytes, 16 * sm_count,
//                                             sink, stream));
//
// Pointers are device memory, 16-byte aligned (else cudaErrorInvalidValue).
// Each launcher queues its kernel on `stream` with `blocks` blocks of
// kCeilingThreads threads and returns the launch's error.
#ifndef LOSSRT_BENCH_CEILING_KERNELS_H_
#define LOSSRT_BENCH_CEILING_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace bench {

// Threads per block of every ceiling kernel.
inline constexpr int kCeilingThreads = 256;

// Reads the `bytes` bytes at `src` and sums them (as floats); writes the sum
// to `sink` (one float) only if it equals a value no real input sums to, so
// the loads cannot be optimized away while nothing is written in practice.
cudaError_t LaunchReadSum(const void* src, int64_t bytes, int blocks,
                          float* sink, cudaStream_t stream);

// How the copy kernel moves its 16-byte elements: loads in flight per thread
// per iteration (all loads of an iteration, then all stores) and whether they
// take the streaming (evict-first) cache hints __ldcs/__stcs.
enum class CopyVariant {
  kUnroll2Streaming,
  kUnroll4Streaming,
  kUnroll4Plain,
};

// Every copy variant, for a caller that keeps the fastest.
inline constexpr CopyVariant kCopyVariants[] = {
    CopyVariant::kUnroll2Streaming,
    CopyVariant::kUnroll4Streaming,
    CopyVariant::kUnroll4Plain,
};

// Copies the `bytes` bytes at `src` to `dst` (the two must not overlap).
cudaError_t LaunchCopy(const void* src, void* dst, int64_t bytes,
                       CopyVariant variant, int blocks, cudaStream_t stream);

}  // namespace bench
}  // namespace lossrt

#endif  // LOSSRT_BENCH_CEILING_KERNELS_H_
