// CUDA kernels of the element-wise ops: each thread handles a chunk of eight
// consecutive elements, read and written as whole 16-byte vectors when the
// tensors are 16-byte aligned (scalar accesses otherwise, and for the tail).
// Memory-bound: one read of each input, one write of the output.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "graph/ops/elementwise_cuda.h"

namespace lossrt {
namespace ops {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Elements per thread: 16 bytes of bf16, 32 of f32, 64 of f64, so that every
// dtype moves whole 16-byte vectors and a thread has all its loads in flight
// at once.
constexpr int kChunk = 8;

template <typename A, typename T>
__device__ __forceinline__ A Cast(T value) {
  return static_cast<A>(value);
}
template <>
__device__ __forceinline__ float Cast<float, __nv_bfloat16>(
    __nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ double Cast<double, __nv_bfloat16>(
    __nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16
Cast<__nv_bfloat16, float>(float value) {
  return __float2bfloat16_rn(value);
}
// Through f32, as the CPU does (runtime/dtype.h converts from float only).
template <>
__device__ __forceinline__ __nv_bfloat16
Cast<__nv_bfloat16, double>(double value) {
  return __float2bfloat16_rn(static_cast<float>(value));
}

// Elements [i, i + kChunk) of p that lie below n, widened to A (0 past n).
// `vec`: p is 16-byte aligned, so a full chunk (i is a multiple of kChunk) is
// read as sizeof(T) / 2 whole 16-byte vectors.
template <typename A, typename T>
__device__ __forceinline__ void LoadChunk(const T* p, int64_t i, int64_t n,
                                          bool vec, A (&v)[kChunk]) {
  if (vec && i + kChunk <= n) {
    constexpr int kWords = sizeof(T) * kChunk / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      raw[w] = reinterpret_cast<const uint4*>(p + i)[w];
    }
    const T* elements = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = Cast<A>(elements[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      v[k] = i + k < n ? Cast<A>(p[i + k]) : A(0);
    }
  }
}

// Stores the elements of v that lie below n at p[i...], rounded to T.
template <typename T, typename A>
__device__ __forceinline__ void StoreChunk(T* p, int64_t i, int64_t n, bool vec,
                                           const A (&v)[kChunk]) {
  if (vec && i + kChunk <= n) {
    constexpr int kWords = sizeof(T) * kChunk / 16;
    uint4 raw[kWords];
    T* elements = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) elements[k] = Cast<T>(v[k]);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<uint4*>(p + i)[w] = raw[w];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (i + k < n) p[i + k] = Cast<T>(v[k]);
    }
  }
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for one thread per chunk of n elements (n <= 2^31 - 1, so at most
// 2^20 blocks).
unsigned Blocks(int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  return static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
}

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
  const bool vec = Aligned(src) && Aligned(dst);
  AccumulateKernel<S, D, A><<<Blocks(n), kThreads, 0, stream>>>(
      static_cast<const S*>(src), static_cast<D*>(dst), n, accumulate, vec);
  return cudaGetLastError();
}

template <typename S>
cudaError_t AccumulateFrom(const void* src, void* dst, ElementType dst_type,
                           int64_t n, bool accumulate, cudaStream_t stream) {
  switch (dst_type) {
    case ElementType::kF32:
      return Accumulate<S, float>(src, dst, n, accumulate, stream);
    case ElementType::kBF16:
      return Accumulate<S, __nv_bfloat16>(src, dst, n, accumulate, stream);
    case ElementType::kF64:
      return Accumulate<S, double>(src, dst, n, accumulate, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n,
                      bool bf16, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned(a) && Aligned(b) && Aligned(y);
  if (bf16) {
    AddKernel<<<Blocks(n), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a),
        static_cast<const __nv_bfloat16*>(b), static_cast<__nv_bfloat16*>(y), n,
        vec);
  } else {
    AddKernel<<<Blocks(n), kThreads, 0, stream>>>(
        static_cast<const float*>(a), static_cast<const float*>(b),
        static_cast<float*>(y), n, vec);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAccumulate(const void* src, ElementType src_type, void* dst,
                             ElementType dst_type, int64_t n, bool accumulate,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (src_type) {
    case ElementType::kF32:
      return AccumulateFrom<float>(src, dst, dst_type, n, accumulate, stream);
    case ElementType::kBF16:
      return AccumulateFrom<__nv_bfloat16>(src, dst, dst_type, n, accumulate,
                                           stream);
    case ElementType::kF64:
      return AccumulateFrom<double>(src, dst, dst_type, n, accumulate, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
