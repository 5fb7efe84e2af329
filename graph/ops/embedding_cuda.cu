// CUDA kernels of the embedding: an id range check, the gather (+ position
// add), and the backward's scatter-add into the token table (fp32 atomics) and
// per-position sums over the batch (deterministic). Each thread handles eight
// consecutive elements, moved as whole 16-byte vectors when the width is a
// multiple of eight and the tensors are 16-byte aligned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "graph/ops/cuda_chunks.h"
#include "graph/ops/embedding_cuda.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

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
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The first element of the calling thread's chunk.
__device__ __forceinline__ int64_t ThreadChunk() {
  return (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kChunk;
}

// Integer atomics commute exactly, so the count is deterministic.
__global__ void __launch_bounds__(kThreads)
    CountInvalidKernel(const int32_t* __restrict__ ids, int64_t rows,
                       int64_t vocab, int32_t* __restrict__ invalid) {
  int32_t count = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < rows; i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int32_t id = ids[i];
    count += (id < 0 || id >= vocab) ? 1 : 0;
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    count += __shfl_xor_sync(kFullMask, count, offset);
  }
  if (threadIdx.x % kWarpSize == 0 && count != 0) atomicAdd(invalid, count);
}

// `vec`: cols % kChunk == 0 and every table 16-byte aligned, so a chunk lies in
// one row and is whole vectors in the tables too.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const int32_t* __restrict__ ids,
                  const T* __restrict__ token_table,
                  const T* __restrict__ position_table, int64_t rows,
                  int64_t cols, int64_t seq, T* __restrict__ out, bool vec) {
  const int64_t n = rows * cols;
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  float v[kChunk];
  if (vec) {
    const int64_t row = i / cols;
    const int64_t c = i - row * cols;
    LoadChunk(token_table + ids[row] * cols + c, 0, kChunk, true, v);
    if (position_table != nullptr) {
      float p[kChunk];
      LoadChunk(position_table + (row % seq) * cols + c, 0, kChunk, true, p);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] += p[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const int64_t j = i + k;
      v[k] = 0.0f;
      if (j < n) {
        const int64_t row = j / cols;
        const int64_t c = j - row * cols;
        v[k] = ToFloat(token_table[ids[row] * cols + c]);
        if (position_table != nullptr) {
          v[k] += ToFloat(position_table[(row % seq) * cols + c]);
        }
      }
    }
  }
  StoreChunk(out, i, n, vec, v);
}

// Scatter-add of d_out rows into their ids' rows. fp32 atomics: the order in
// which repeated ids meet is the hardware's, so the sums' rounding can differ
// run to run (documented in embedding.h). On sm_90 a vector atomic adds four
// floats at once.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    TokenGradKernel(const int32_t* __restrict__ ids,
                    const T* __restrict__ d_out, int64_t rows, int64_t cols,
                    float* __restrict__ d_token_table, bool vec) {
  const int64_t n = rows * cols;
  const int64_t i = ThreadChunk();
  if (i >= n) return;
  if (vec) {
    const int64_t row = i / cols;
    const int64_t c = i - row * cols;
    float v[kChunk];
    LoadChunk(d_out, i, n, true, v);
    float* dst = d_token_table + ids[row] * cols + c;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(dst),
              make_float4(v[0], v[1], v[2], v[3]));
    atomicAdd(reinterpret_cast<float4*>(dst + 4),
              make_float4(v[4], v[5], v[6], v[7]));
#else
#pragma unroll
    for (int k = 0; k < kChunk; ++k) atomicAdd(dst + k, v[k]);
#endif
    return;
  }
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const int64_t j = i + k;
    if (j < n) {
      const int64_t row = j / cols;
      atomicAdd(d_token_table + ids[row] * cols + (j - row * cols),
                ToFloat(d_out[j]));
    }
  }
}

// d_out [batch, seq * cols] summed over the batch, in order, then added to
// d_position_table [seq * cols, ...]: element i of a sequence's slab is
// position i / cols, column i % cols. `vec`: seq * cols % kChunk == 0 and both
// tensors 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PositionGradKernel(const T* __restrict__ d_out, int64_t batch, int64_t slab,
                       float* __restrict__ d_position_table, bool vec) {
  const int64_t i = ThreadChunk();
  if (i >= slab) return;
  float sum[kChunk] = {};
#pragma unroll 4
  for (int64_t b = 0; b < batch; ++b) {
    float v[kChunk];
    LoadChunk(d_out + b * slab, i, slab, vec, v);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) sum[k] += v[k];
  }
  float old[kChunk];
  LoadChunk(d_position_table, i, slab, vec, old);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) old[k] += sum[k];
  StoreChunk(d_position_table, i, slab, vec, old);
}

template <typename T>
cudaError_t Forward(const int32_t* ids, const void* token_table,
                    const void* position_table, int64_t rows, int64_t cols,
                    int64_t seq, void* out, cudaStream_t stream) {
  const bool vec = cols % kChunk == 0 && Aligned16(token_table) &&
                   (position_table == nullptr || Aligned16(position_table)) &&
                   Aligned16(out);
  ForwardKernel<<<ChunkBlocks(rows * cols, kThreads), kThreads, 0, stream>>>(
      ids, static_cast<const T*>(token_table),
      static_cast<const T*>(position_table), rows, cols, seq,
      static_cast<T*>(out), vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Backward(const int32_t* ids, const void* d_out, int64_t rows,
                     int64_t cols, int64_t seq, float* d_token_table,
                     float* d_position_table, cudaStream_t stream) {
  const T* grad = static_cast<const T*>(d_out);
  const bool vec =
      cols % kChunk == 0 && Aligned16(d_out) && Aligned16(d_token_table);
  TokenGradKernel<<<ChunkBlocks(rows * cols, kThreads), kThreads, 0, stream>>>(
      ids, grad, rows, cols, d_token_table, vec);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || d_position_table == nullptr) return error;
  const int64_t slab = seq * cols;
  const bool slab_vec =
      slab % kChunk == 0 && Aligned16(d_out) && Aligned16(d_position_table);
  PositionGradKernel<<<ChunkBlocks(slab, kThreads), kThreads, 0, stream>>>(
      grad, rows / seq, slab, d_position_table, slab_vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCountInvalidIds(const int32_t* ids, int64_t rows,
                                  int64_t vocab, int32_t* invalid,
                                  cudaStream_t stream) {
  cudaError_t error = cudaMemsetAsync(invalid, 0, sizeof(int32_t), stream);
  if (error != cudaSuccess || rows == 0) return error;
  // A grid-stride loop: a few hundred blocks read any number of ids.
  const int64_t blocks =
      std::min<int64_t>(CeilDiv<int64_t>(rows, kThreads), 512);
  CountInvalidKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      ids, rows, vocab, invalid);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const int32_t* ids, const void* token_table,
                                   const void* position_table, int64_t rows,
                                   int64_t cols, int64_t seq, bool bf16,
                                   void* out, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return bf16 ? Forward<__nv_bfloat16>(ids, token_table, position_table, rows,
                                       cols, seq, out, stream)
              : Forward<float>(ids, token_table, position_table, rows, cols,
                               seq, out, stream);
}

cudaError_t LaunchEmbeddingBackward(const int32_t* ids, const void* d_out,
                                    int64_t rows, int64_t cols, int64_t seq,
                                    bool bf16, float* d_token_table,
                                    float* d_position_table,
                                    cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return bf16 ? Backward<__nv_bfloat16>(ids, d_out, rows, cols, seq,
                                        d_token_table, d_position_table, stream)
              : Backward<float>(ids, d_out, rows, cols, seq, d_token_table,
                                d_position_table, stream);
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
