// CUDA kernels of the element-wise ops: each thread handles a chunk of eight
// consecutive elements (graph/ops/cuda_chunks.h), read and written as whole
// 16-byte vectors when the tensors are 16-byte aligned (scalar accesses
// otherwise, and for the tail).
// Memory-bound: one read of each input, one write of the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "graph/ops/cuda_chunks.h"
#include "graph/ops/elementwise_cuda.h"

namespace lossrt {
namespace ops {
namespace cuda {
namespace {

using cuda_chunks::Aligned16;
using cuda_chunks::ChunkBlocks;
using cuda_chunks::kChunk;
using cuda_chunks::LoadChunk;
using cuda_chunks::StoreChunk;

constexpr int kThreads = 256;

// No __restrict__: y may be a or b (each element is read before it is written,
// by the same thread).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AddKernel(const T* a, const T* b, T* y, int64_t n, bool vec) {
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
  if (i >= n) return;
  float va[kChunk];
  float vb[kChunk];
  LoadChunk(a, i, n, vec, va);
  LoadChunk(b, i, n, vec, vb);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) va[k] += vb[k];
  StoreChunk(y, i, n, vec, va);
}

// A is f64 when S or D is, else f32: the sum is rounded once, to D.
template <typename S, typename D, typename A>
__global__ void __launch_bounds__(kThreads)
    AccumulateKernel(const S* src, D* dst, int64_t n, bool accumulate,
                     bool vec) {
  const int64_t i =
      (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
  if (i >= n) return;
  A value[kChunk];
  LoadChunk(src, i, n, vec, value);
  if (accumulate) {
    A old[kChunk];
    LoadChunk(dst, i, n, vec, old);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) value[k] = old[k] + value[k];
  }
  StoreChunk(dst, i, n, vec, value);
}

template <typename S, typename D>
cudaError_t Accumulate(const void* src, void* dst, int64_t n, bool accumulate,
                       cudaStream_t stream) {
  using A =
      std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>,
                         double, float>;
  const bool vec = Aligned16(src) && Aligned16(dst);
  AccumulateKernel<S, D, A><<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
      static_cast<const S*>(src), static_cast<D*>(dst), n, accumulate, vec);
  return cudaGetLastError();
}

template <typename S>
cudaError_t AccumulateFrom(const void* src, void* dst, DType dst_dtype,
                           int64_t n, bool accumulate, cudaStream_t stream) {
  switch (dst_dtype) {
    case DType::kF32:
      return Accumulate<S, float>(src, dst, n, accumulate, stream);
    case DType::kBF16:
      return Accumulate<S, __nv_bfloat16>(src, dst, n, accumulate, stream);
    case DType::kF64:
      return Accumulate<S, double>(src, dst, n, accumulate, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n,
                      bool bf16, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(a) && Aligned16(b) && Aligned16(y);
  if (bf16) {
    AddKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a),
        static_cast<const __nv_bfloat16*>(b), static_cast<__nv_bfloat16*>(y), n,
        vec);
  } else {
    AddKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(a), static_cast<const float*>(b),
        static_cast<float*>(y), n, vec);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAccumulate(const void* src, DType src_dtype, void* dst,
                             DType dst_dtype, int64_t n, bool accumulate,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (src_dtype) {
    case DType::kF32:
      return AccumulateFrom<float>(src, dst, dst_dtype, n, accumulate, stream);
    case DType::kBF16:
      return AccumulateFrom<__nv_bfloat16>(src, dst, dst_dtype, n, accumulate,
                                           stream);
    case DType::kF64:
      return AccumulateFrom<double>(src, dst, dst_dtype, n, accumulate, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
