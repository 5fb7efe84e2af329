// Device helpers shared by the CUDA kernels of the graph's ops: 8-element
// chunks read and written as whole 16-byte vectors where alignment allows,
// single 16-byte vectors read as floats, and the grid of one thread per chunk.
// The element conversions are runtime/device_convert.cuh's. Internal to
// //graph/ops; included by .cu files only.
#ifndef LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_
#define LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_

#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace cuda_chunks {

// Elements per thread: one 16-byte vector of bf16, two of f32, four of f64.
constexpr int kChunk = 8;

// Whether p is 16-byte aligned, so that whole chunks move as 16-byte vectors.
inline bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Blocks of `threads` threads for one thread per chunk of n elements (n <=
// 2^31 - 1, so at most 2^28 / threads blocks).
inline unsigned ChunkBlocks(int64_t n, int threads) {
  return static_cast<unsigned>(
      CeilDiv<int64_t>(CeilDiv<int64_t>(n, kChunk), threads));
}

// Elements [i, i + kChunk) of p below n, converted to A (0 past n). `vec`: p
// is 16-byte aligned and i a multiple of kChunk, so a full chunk is read as
// whole 16-byte vectors.
template <typename T, typename A>
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
    for (int k = 0; k < kChunk; ++k)
      v[k] = device_convert::Convert<A>(elements[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      v[k] = i + k < n ? device_convert::Convert<A>(p[i + k]) : A(0);
    }
  }
}

// The 16 / sizeof(T) elements of one 16-byte vector at p (16-byte aligned), as
// floats, read through the read-only data cache.
template <typename T>
__device__ __forceinline__ void LoadVectorAsFloats(const T* p,
                                                   float (&v)[16 / sizeof(T)]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* elements = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < static_cast<int>(16 / sizeof(T)); ++k)
    v[k] = device_convert::ToFloat(elements[k]);
}

// Stores the elements of v below n at p[i...], rounded to T.
template <typename T, typename A>
__device__ __forceinline__ void StoreChunk(T* p, int64_t i, int64_t n, bool vec,
                                           const A (&v)[kChunk]) {
  if (vec && i + kChunk <= n) {
    constexpr int kWords = sizeof(T) * kChunk / 16;
    uint4 raw[kWords];
    T* elements = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int k = 0; k < kChunk; ++k)
      elements[k] = device_convert::Convert<T>(v[k]);
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<uint4*>(p + i)[w] = raw[w];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (i + k < n) p[i + k] = device_convert::Convert<T>(v[k]);
    }
  }
}

}  // namespace cuda_chunks
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_CUDA_CHUNKS_H_
