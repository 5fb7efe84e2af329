// CUDA kernels of the causal attention op's cuBLAS path (the softmax between
// the GEMMs, forward and backward) and the delta = rowsum(d_out * out) kernel
// both GPU paths share. All arithmetic is fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "graph/ops/attention_cuda.h"
#include "graph/ops/cuda_chunks.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace attention {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;

using device_convert::FromFloat;
using device_convert::ToFloat;

// One warp per (row, head): the dot product of d_out and out over head_dim.
template <typename T>
__global__ void DeltaKernel(const T* __restrict__ out,
                            const T* __restrict__ d_out, int64_t rows,
                            int64_t seq, int64_t heads, int64_t head_dim,
                            float* __restrict__ delta) {
  const int64_t item =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= rows * heads) return;  // whole warps leave together
  const int64_t row = item / heads;
  const int64_t h = item % heads;
  const int64_t base = row * heads * head_dim + h * head_dim;
  float sum = 0.0f;
  for (int64_t d = lane; d < head_dim; d += 32) {
    sum += ToFloat(out[base + d]) * ToFloat(d_out[base + d]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  }
  if (lane == 0) {
    const int64_t b = row / seq;
    const int64_t t = row % seq;
    delta[(b * heads + h) * seq + t] = sum;
  }
}

// The same with 16-byte loads, for head dims of G 16-byte pieces (G a power of
// two up to 32): G consecutive threads take a (row, head), one piece each, and
// add their partial dot products by shuffles in a fixed order. Reads out and
// d_out at close to the copy rate, where the warp-per-row kernel's two-byte
// loads reached a quarter of it (H200, head_dim 64).
template <typename T, int G>
__global__ void __launch_bounds__(256)
    DeltaVecKernel(const T* __restrict__ out, const T* __restrict__ d_out,
                   int64_t items, int64_t seq, int64_t heads,
                   float* __restrict__ delta) {
  constexpr int V = 16 / sizeof(T);
  const int64_t piece = static_cast<int64_t>(blockIdx.x) * blockDim.x +
                        threadIdx.x;  // [rows, heads, G] pieces
  const int64_t item = piece / G;
  float sum = 0.0f;
  if (item < items) {
    float a[V], b[V];
    cuda_chunks::LoadVectorAsFloats(out + piece * V, a);
    cuda_chunks::LoadVectorAsFloats(d_out + piece * V, b);
#pragma unroll
    for (int k = 0; k < V; ++k) sum += a[k] * b[k];
  }
  // Every lane takes part (past-the-end ones with 0): the groups tile the warp.
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (item < items && piece % G == 0) {
    const int64_t row = item / heads;
    const int64_t h = item % heads;
    delta[((row / seq) * heads + h) * seq + row % seq] = sum;
  }
}

template <typename T>
cudaError_t LaunchDeltaVec(const T* out, const T* d_out, int64_t items,
                           int64_t seq, int64_t heads, int pieces_per_item,
                           float* delta, cudaStream_t stream) {
  const int64_t threads = 256;
  const unsigned blocks =
      static_cast<unsigned>(CeilDiv(items * pieces_per_item, threads));
  switch (pieces_per_item) {
#define LOSSRT_DELTA_CASE(G)                                                 \
  case G:                                                                    \
    DeltaVecKernel<T, G><<<blocks, threads, 0, stream>>>(out, d_out, items,  \
                                                         seq, heads, delta); \
    break;
    LOSSRT_DELTA_CASE(1)
    LOSSRT_DELTA_CASE(2)
    LOSSRT_DELTA_CASE(4)
    LOSSRT_DELTA_CASE(8)
    LOSSRT_DELTA_CASE(16)
    LOSSRT_DELTA_CASE(32)
#undef LOSSRT_DELTA_CASE
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// (m, l) of a softmax partial: max m and sum l of exp(x - m). An empty partial
// is (-inf, 0); the guards keep -inf - -inf from making NaN.
__device__ __forceinline__ void MergeSoftmax(float& m, float& l, float m2,
                                             float l2) {
  const float merged = fmaxf(m, m2);
  const float left = m == -INFINITY ? 0.0f : l * expf(m - merged);
  const float right = m2 == -INFINITY ? 0.0f : l2 * expf(m2 - merged);
  m = merged;
  l = left + right;
}

// One warp per score row (group g, query i): the log-sum-exp over keys 0..i,
// then the probabilities of the whole row (0 for keys past i, so that the
// P V GEMM over all keys is causal), its padding up to ld included: the GEMMs'
// vector loads at the row's end read it (and a NaN there would reach them).
template <typename T>
__global__ void CausalSoftmaxKernel(const float* __restrict__ scores,
                                    int64_t ld, T* __restrict__ probs,
                                    float* __restrict__ lse, int64_t rows,
                                    int64_t seq) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  const int64_t query = row % seq;
  // Rows of the [groups, seq, ld] buffers are consecutive: group g's query i
  // is row g * seq + i.
  const float* score_row = scores + row * ld;
  T* prob_row = probs + row * ld;

  float m = -INFINITY;
  float l = 0.0f;
  for (int64_t key = lane; key <= query; key += 32) {
    MergeSoftmax(m, l, score_row[key], 1.0f);
  }
  // Butterfly: every lane ends with the same (m, l) (the merge is symmetric).
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float l2 = __shfl_xor_sync(kFullMask, l, offset);
    MergeSoftmax(m, l, m2, l2);
  }
  // Key 0 is always visible, so l >= 1 and the log-sum-exp is finite.
  const float row_lse = m + logf(l);
  if (lane == 0) lse[row] = row_lse;
  for (int64_t key = lane; key < ld; key += 32) {
    const float p = key <= query ? expf(score_row[key] - row_lse) : 0.0f;
    prob_row[key] = FromFloat<T>(p);
  }
}

// One block per score row: probabilities recomputed from the saved lse, and
// dscores = p * (dprobs - delta) (the softmax backward), 0 above the diagonal
// and in the row's padding up to ld (which the GEMMs' vector loads read).
template <typename T>
__global__ void SoftmaxBackwardKernel(const float* __restrict__ scores,
                                      const float* __restrict__ dprobs,
                                      int64_t ld, const float* __restrict__ lse,
                                      const float* __restrict__ delta,
                                      T* __restrict__ probs,
                                      T* __restrict__ dscores, int64_t seq) {
  const int64_t row = blockIdx.x;
  const int64_t query = row % seq;
  const float row_lse = lse[row];
  const float row_delta = delta[row];
  for (int64_t key = threadIdx.x; key < ld; key += blockDim.x) {
    const int64_t at = row * ld + key;
    float p = 0.0f;
    float ds = 0.0f;
    if (key <= query) {
      p = expf(scores[at] - row_lse);
      ds = p * (dprobs[at] - row_delta);
    }
    probs[at] = FromFloat<T>(p);
    dscores[at] = FromFloat<T>(ds);
  }
}

}  // namespace

cudaError_t LaunchDelta(const void* out, const void* d_out, bool bf16,
                        int64_t batch, int64_t seq, int64_t heads,
                        int64_t head_dim, float* delta, cudaStream_t stream) {
  const int64_t rows = batch * seq;
  const int64_t blocks = CeilDiv<int64_t>(rows * heads, kWarpsPerBlock);
  if (blocks == 0) return cudaSuccess;
  const int vec = bf16 ? 8 : 4;  // elements in 16 bytes
  const int64_t pieces = head_dim / vec;
  if (head_dim % vec == 0 && pieces >= 1 && pieces <= 32 &&
      (pieces & (pieces - 1)) == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(d_out) % 16 == 0) {
    return bf16 ? LaunchDeltaVec(static_cast<const __nv_bfloat16*>(out),
                                 static_cast<const __nv_bfloat16*>(d_out),
                                 rows * heads, seq, heads,
                                 static_cast<int>(pieces), delta, stream)
                : LaunchDeltaVec(static_cast<const float*>(out),
                                 static_cast<const float*>(d_out), rows * heads,
                                 seq, heads, static_cast<int>(pieces), delta,
                                 stream);
  }
  if (bf16) {
    DeltaKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                  stream>>>(static_cast<const __nv_bfloat16*>(out),
                            static_cast<const __nv_bfloat16*>(d_out), rows, seq,
                            heads, head_dim, delta);
  } else {
    DeltaKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                  stream>>>(static_cast<const float*>(out),
                            static_cast<const float*>(d_out), rows, seq, heads,
                            head_dim, delta);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmax(const float* scores, int64_t ld, void* probs,
                                bool bf16, float* lse, int64_t groups,
                                int64_t seq, cudaStream_t stream) {
  const int64_t rows = groups * seq;
  const int64_t blocks = CeilDiv<int64_t>(rows, kWarpsPerBlock);
  if (blocks == 0) return cudaSuccess;
  if (bf16) {
    CausalSoftmaxKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                          stream>>>(
        scores, ld, static_cast<__nv_bfloat16*>(probs), lse, rows, seq);
  } else {
    CausalSoftmaxKernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0,
                          stream>>>(scores, ld, static_cast<float*>(probs), lse,
                                    rows, seq);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxBackward(const float* scores, const float* dprobs,
                                  int64_t ld, const float* lse,
                                  const float* delta, void* probs,
                                  void* dscores, bool bf16, int64_t groups,
                                  int64_t seq, cudaStream_t stream) {
  const int64_t rows = groups * seq;
  if (rows == 0) return cudaSuccess;
  // Short rows waste fewer idle threads with a smaller block.
  const int threads = seq >= 256 ? 256 : seq >= 64 ? 64 : 32;
  if (bf16) {
    SoftmaxBackwardKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        scores, dprobs, ld, lse, delta, static_cast<__nv_bfloat16*>(probs),
        static_cast<__nv_bfloat16*>(dscores), seq);
  } else {
    SoftmaxBackwardKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        scores, dprobs, ld, lse, delta, static_cast<float*>(probs),
        static_cast<float*>(dscores), seq);
  }
  return cudaGetLastError();
}

}  // namespace attention
}  // namespace ops
}  // namespace lossrt
