// CUDA kernels of GELU and SwiGLU: each thread handles eight consecutive
// elements (of the output, for SwiGLU), read and written as whole 16-byte
// vectors when the tensors are 16-byte aligned (and, for SwiGLU, the width a
// multiple of eight, so that no chunk straddles a row); scalar accesses
// otherwise. Memory-bound: one read of each input, one write of the output.
// Arithmetic is fp32 with accurate tanhf/expf (their cost hides under the
// memory traffic).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "graph/ops/activation_cuda.h"
#include "graph/ops/cuda_chunks.h"
#include "runtime/device_convert.cuh"

namespace lossrt {
namespace ops {
namespace cuda {
namespace {

using cuda_chunks::Aligned16;
using cuda_chunks::ChunkBlocks;
using cuda_chunks::kChunk;
using cuda_chunks::LoadChunk;
using cuda_chunks::StoreChunk;
using device_convert::FromFloat;
using device_convert::ToFloat;

constexpr int kThreads = 256;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// sigmoid(z) and 1 - sigmoid(z), each without cancellation: exp of minus
// |z| only, so nothing overflows and neither side loses its small value.
__device__ __forceinline__ void SigmoidPair(float z, float& s, float& rest) {
  const float e = expf(-fabsf(z));
  const float inv = 1.0f / (1.0f + e);
  s = z >= 0.0f ? inv : e * inv;
  rest = z >= 0.0f ? e * inv : inv;
}

// 0.5 (1 + tanh(u)) = sigmoid(2 u): written that way, gelu keeps its relative
// accuracy in the negative tail, where 1 + tanh(u) would cancel in fp32.
__device__ __forceinline__ float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  float s, rest;
  SigmoidPair(2.0f * u, s, rest);
  return x * s;
}

// d/dx of Gelu: s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2), s = sigmoid(2 u)
// (the tanh form 0.5 (1 + t) + 0.5 x (1 - t^2) u' rewritten without
// cancellation).
__device__ __forceinline__ float GeluGrad(float x) {
  const float x2 = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x2);
  float s, rest;
  SigmoidPair(2.0f * u, s, rest);
  return s +
         2.0f * x * s * rest * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
}

// 1 / (1 + exp(-g)): 0 for g -> -inf (exp overflows to inf), 1 for g -> inf.
__device__ __forceinline__ float Sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

// The first element of the calling thread's chunk.
__device__ __forceinline__ int64_t ThreadChunk() {
  return (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
}

// No __restrict__ in these kernels: outputs may be inputs (each element is
// read before it is written, by the same thread).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GeluForwardKernel(const T* x, T* y, int64_t n, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float v[kChunk];
  LoadChunk(x, i, n, vec, v);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) v[k] = Gelu(v[k]);
  StoreChunk(y, i, n, vec, v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    GeluBackwardKernel(const T* x, const T* dy, T* dx, int64_t n,
                       bool accumulate, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float xv[kChunk];
  float g[kChunk];
  LoadChunk(x, i, n, vec, xv);
  LoadChunk(dy, i, n, vec, g);
  float old[kChunk];
  if (accumulate) LoadChunk(dx, i, n, vec, old);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    g[k] *= GeluGrad(xv[k]);
    if (accumulate) g[k] = old[k] + g[k];
  }
  StoreChunk(dx, i, n, vec, g);
}

// Gate and up values of output elements [i, i + kChunk) of a [rows, width]
// output from x [rows, 2 width]. `vec`: width % kChunk == 0 and x aligned, so
// the chunk lies in one row and both halves are whole aligned vectors.
template <typename T>
__device__ __forceinline__ void LoadGateUp(const T* x, int64_t i, int64_t n,
                                           int64_t width, bool vec,
                                           float (&gate)[kChunk],
                                           float (&up)[kChunk]) {
  if (vec) {
    const int64_t row = i / width;
    const T* gate_row = x + row * 2 * width + (i - row * width);
    LoadChunk(gate_row, 0, kChunk, true, gate);
    LoadChunk(gate_row + width, 0, kChunk, true, up);
    return;
  }
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const int64_t j = i + k;
    gate[k] = up[k] = 0.0f;
    if (j < n) {
      const int64_t row = j / width;
      const int64_t at = row * 2 * width + (j - row * width);
      gate[k] = ToFloat(x[at]);
      up[k] = ToFloat(x[at + width]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void StoreGateUp(T* dx, int64_t i, int64_t n,
                                            int64_t width, bool vec,
                                            const float (&gate)[kChunk],
                                            const float (&up)[kChunk]) {
  if (vec) {
    const int64_t row = i / width;
    T* gate_row = dx + row * 2 * width + (i - row * width);
    StoreChunk(gate_row, 0, kChunk, true, gate);
    StoreChunk(gate_row + width, 0, kChunk, true, up);
    return;
  }
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const int64_t j = i + k;
    if (j < n) {
      const int64_t row = j / width;
      const int64_t at = row * 2 * width + (j - row * width);
      dx[at] = FromFloat<T>(gate[k]);
      dx[at + width] = FromFloat<T>(up[k]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                        int64_t width, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float gate[kChunk];
  float up[kChunk];
  LoadGateUp(x, i, n, width, vec, gate, up);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    gate[k] = gate[k] * Sigmoid(gate[k]) * up[k];
  }
  StoreChunk(y, i, n, vec, gate);
}

// d gate = dy up s (1 + g (1 - s)), d up = dy g s, with s = sigmoid(g).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(const T* x, const T* __restrict__ dy, T* dx, int64_t n,
                         int64_t width, bool accumulate, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float gate[kChunk];
  float up[kChunk];
  float grad[kChunk];
  LoadGateUp(x, i, n, width, vec, gate, up);
  LoadChunk(dy, i, n, vec, grad);
  float old_gate[kChunk];
  float old_up[kChunk];
  if (accumulate) LoadGateUp<T>(dx, i, n, width, vec, old_gate, old_up);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const float s = Sigmoid(gate[k]);
    const float d_gate = grad[k] * up[k] * s * (1.0f + gate[k] * (1.0f - s));
    const float d_up = grad[k] * gate[k] * s;
    gate[k] = accumulate ? old_gate[k] + d_gate : d_gate;
    up[k] = accumulate ? old_up[k] + d_up : d_up;
  }
  StoreGateUp(dx, i, n, width, vec, gate, up);
}

}  // namespace

cudaError_t LaunchGeluForward(const void* x, void* y, int64_t n, bool bf16,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x) && Aligned16(y);
  if (bf16) {
    GeluForwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), n,
        vec);
  } else {
    GeluForwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<float*>(y), n, vec);
  }
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const void* x, const void* dy, void* dx,
                               int64_t n, bool accumulate, bool bf16,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x) && Aligned16(dy) && Aligned16(dx);
  if (bf16) {
    GeluBackwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x),
        static_cast<const __nv_bfloat16*>(dy), static_cast<__nv_bfloat16*>(dx),
        n, accumulate, vec);
  } else {
    GeluBackwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(dy),
        static_cast<float*>(dx), n, accumulate, vec);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluForward(const void* x, void* y, int64_t rows,
                                int64_t width, bool bf16, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n == 0) return cudaSuccess;
  const bool vec = width % kChunk == 0 && Aligned16(x) && Aligned16(y);
  if (bf16) {
    SwiGluForwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), n,
        width, vec);
  } else {
    SwiGluForwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<float*>(y), n, width, vec);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluBackward(const void* x, const void* dy, void* dx,
                                 int64_t rows, int64_t width, bool accumulate,
                                 bool bf16, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n == 0) return cudaSuccess;
  const bool vec =
      width % kChunk == 0 && Aligned16(x) && Aligned16(dy) && Aligned16(dx);
  if (bf16) {
    SwiGluBackwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x),
        static_cast<const __nv_bfloat16*>(dy), static_cast<__nv_bfloat16*>(dx),
        n, width, accumulate, vec);
  } else {
    SwiGluBackwardKernel<<<ChunkBlocks(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(dy),
        static_cast<float*>(dx), n, width, accumulate, vec);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
