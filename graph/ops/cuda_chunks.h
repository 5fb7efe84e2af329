// Device helpers shared by the element-wise CUDA kernels of the graph's ops:
// float <-> f32/bf16 conversion and 8-element chunks read and written as whole
// 16-byte vectors where alignment allows. Internal; included by .cu files only.
#ifndef LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_
#define LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_

#include <cuda_bf16.h>

#include <cstdint>

namespace lossrt {
namespace ops {
namespace cuda_chunks {

// Elements per thread: one 16-byte vector of bf16, two of f32.
constexpr int kChunk = 8;

__device__ __forceinline__ float ToFloat(float value) { return value; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float value);
template <>
__device__ __forceinline__ float FromFloat<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

// Elements [i, i + kChunk) of p below n as floats (0 past n). `vec`: p is
// 16-byte aligned and i a multiple of kChunk, so a full chunk is read as whole
// 16-byte vectors.
template <typename T>
__device__ __forceinline__ void LoadChunk(const T* p, int64_t i, int64_t n,
                                          bool vec, float (&v)[kChunk]) {
  if (vec && i + kChunk <= n) {
    constexpr int kWords = sizeof(T) * kChunk / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      raw[w] = reinterpret_cast<const uint4*>(p + i)[w];
    }
    const T* elements = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = ToFloat(elements[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      v[k] = i + k < n ? ToFloat(p[i + k]) : 0.0f;
    }
  }
}

// Stores the elements of v below n at p[i...], rounded to T.
template <typename T>
__device__ __forceinline__ void StoreChunk(T* p, int64_t i, int64_t n, bool vec,
                                           const float (&v)[kChunk]) {
  if (vec && i + kChunk <= n) {
    constexpr int kWords = sizeof(T) * kChunk / 16;
    uint4 raw[kWords];
    T* elements = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) elements[k] = FromFloat<T>(v[k]);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<uint4*>(p + i)[w] = raw[w];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (i + k < n) p[i + k] = FromFloat<T>(v[k]);
    }
  }
}

}  // namespace cuda_chunks
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_
