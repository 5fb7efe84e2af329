// CUDA kernels of LayerNorm and RMSNorm.
//
// - ForwardWarpKernel / BackwardWarpKernel (the fast path: cols % 8 == 0,
//   cols <= 2048, 16-byte aligned tensors): one warp per row, lane l holding
//   chunks l, l + 32, ... of eight elements (one 16-byte vector of bf16, two of
//   f32) in registers, so each row is read once and written once and the row
//   reductions are warp shuffles without block barriers.
// - ForwardBlockKernel / BackwardBlockKernel (any shape or alignment): one
//   block per row with scalar accesses, re-reading the row for each pass.
// - The backward's d_gamma/d_beta: each first-stage block sums its rows'
//   contributions into one partial row ([blocks, cols] in the workspace; the
//   warp path keeps them in registers and combines its warps in shared memory
//   in warp order), then ColumnSumKernel adds the partials, in a fixed order,
//   to d_gamma/d_beta. No atomics: for a given grid the results are bitwise
//   reproducible. The grid is one wave of the GPU (NormBackwardBlocks), so it
//   is the same from run to run on one GPU model.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "graph/ops/cuda_chunks.h"
#include "graph/ops/norm_cuda.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace ops {
namespace cuda {
namespace {

using cuda_chunks::Aligned16;
using cuda_chunks::kChunk;
using device_convert::FromFloat;
using device_convert::ToFloat;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Chunks per lane the warp path holds in registers: up to 32 * 8 * 8 = 2048
// columns (GPT-2 XL's 1600 included).
constexpr int kMaxChunksPerLane = 8;
// The forward has one row per warp: eight warps a block give 256-thread
// blocks and plenty of rows in flight per SM.
constexpr int kForwardWarps = 8;
// The backward's warps loop over rows and keep d_gamma/d_beta partials in
// registers (about 4 x 8 floats a chunk): small blocks keep the shared-memory
// combine short and let several blocks share an SM.
constexpr int kBackwardWarps = 4;
constexpr int kBlockThreads = 256;  // the block path
constexpr int kBlockWarps = kBlockThreads / kWarpSize;

// kChunk elements of T in 16-byte words.
template <typename T>
struct RawChunk {
  static constexpr int kWords = sizeof(T) * kChunk / 16;
  uint4 words[kWords];
};

template <typename T>
__device__ __forceinline__ void LoadRaw(const T* p, RawChunk<T>& raw) {
#pragma unroll
  for (int w = 0; w < RawChunk<T>::kWords; ++w)
    raw.words[w] = reinterpret_cast<const uint4*>(p)[w];
}

template <typename T>
__device__ __forceinline__ void RawToFloats(const RawChunk<T>& raw,
                                            float (&v)[kChunk]) {
  const T* elements = reinterpret_cast<const T*>(raw.words);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) v[k] = ToFloat(elements[k]);
}

// kChunk elements at p (16-byte aligned) as floats, in whole 16-byte vectors.
template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&v)[kChunk]) {
  RawChunk<T> raw;
  LoadRaw(p, raw);
  RawToFloats(raw, v);
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kChunk]) {
  constexpr int kWords = sizeof(T) * kChunk / 16;
  uint4 raw[kWords];
  T* elements = reinterpret_cast<T*>(raw);
#pragma unroll
  for (int k = 0; k < kChunk; ++k) elements[k] = FromFloat<T>(v[k]);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
}

// Butterfly sum: every lane gets the same total, in a fixed order.
__device__ __forceinline__ float WarpSum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

// Sum over a kBlockThreads block, the same in every thread, in a fixed
// order. `scratch` holds kBlockWarps floats; the trailing barrier lets the
// caller reuse it.
__device__ __forceinline__ float BlockSum(float value, float* scratch) {
  value = WarpSum(value);
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = value;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kBlockWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// ---------------------------------------------------------------------------
// Forward.

template <typename T, int kCpl, bool kRms>
__global__ void __launch_bounds__(kForwardWarps* kWarpSize)
    ForwardWarpKernel(const T* __restrict__ x, const T* __restrict__ gamma,
                      const T* __restrict__ beta, int64_t rows, int cols,
                      float eps, T* __restrict__ y, float* __restrict__ mean,
                      float* __restrict__ rstd) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardWarps +
                      threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const T* x_row = x + row * cols;
  float v[kCpl][kChunk];
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < kCpl; ++p) {
    const int c = (lane + p * kWarpSize) * kChunk;
    if (c < cols) {
      LoadVec(x_row + c, v[p]);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) sum += v[p][k];
    }
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mu = kRms ? 0.0f : WarpSum(sum) * inv_cols;
  // Two passes over the registers: the variance of the centered values does
  // not cancel catastrophically as E[x^2] - E[x]^2 would.
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < kCpl; ++p) {
    const int c = (lane + p * kWarpSize) * kChunk;
    if (c < cols) {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        v[p][k] -= mu;
        squares += v[p][k] * v[p][k];
      }
    }
  }
  const float rs = rsqrtf(WarpSum(squares) * inv_cols + eps);
  if (lane == 0) {
    if (!kRms) mean[row] = mu;
    rstd[row] = rs;
  }
#pragma unroll
  for (int p = 0; p < kCpl; ++p) {
    const int c = (lane + p * kWarpSize) * kChunk;
    if (c < cols) {
      float g[kChunk];
      LoadVec(gamma + c, g);
      float b[kChunk] = {};
      if (!kRms && beta != nullptr) LoadVec(beta + c, b);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[p][k] = v[p][k] * rs * g[k] + b[k];
      StoreVec(y + row * cols + c, v[p]);
    }
  }
}

template <typename T, bool kRms>
__global__ void __launch_bounds__(kBlockThreads)
    ForwardBlockKernel(const T* __restrict__ x, const T* __restrict__ gamma,
                       const T* __restrict__ beta, int cols, float eps,
                       T* __restrict__ y, float* __restrict__ mean,
                       float* __restrict__ rstd) {
  __shared__ float scratch[kBlockWarps];
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float mu = 0.0f;
  if (!kRms) {
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
      sum += ToFloat(x_row[c]);
    }
    mu = BlockSum(sum, scratch) * inv_cols;
  }
  float squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
    const float d = ToFloat(x_row[c]) - mu;
    squares += d * d;
  }
  const float rs = rsqrtf(BlockSum(squares, scratch) * inv_cols + eps);
  if (threadIdx.x == 0) {
    if (!kRms) mean[row] = mu;
    rstd[row] = rs;
  }
  for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
    float value = (ToFloat(x_row[c]) - mu) * rs * ToFloat(gamma[c]);
    if (!kRms && beta != nullptr) value += ToFloat(beta[c]);
    y[row * cols + c] = FromFloat<T>(value);
  }
}

// ---------------------------------------------------------------------------
// Backward. With xhat = (x - mean) rstd and g = dy gamma:
//   LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat))
//   RMSNorm:   dx = rstd (g - xhat mean(g xhat))
// and d_gamma += sum over rows of dy xhat, d_beta += sum over rows of dy.

// Up to 768 columns (kCpl 3) the registers are capped for four blocks an SM
// (16 warps rather than 12): the kernel waits on memory, and more warps hide
// it (wider rows would spill).
//
// Each warp keeps its rows' x and dy as raw 16-bit or f32 words, not floats,
// and loads the next row's while it reduces and stores the current one: with
// a row held as floats and no prefetch, a warp had nothing in flight between
// its loads, and the SMs' 16 warps left the memory system half idle. xhat and
// dy * gamma are recomputed from the raw words for dx (the same operations,
// so the same values as in the sums). Wider rows (f32 past 256 columns, 16-bit
// past 768, or 512 when dx accumulates) have no registers for a second row
// (it would spill) and load each row as they reach it. kAccumulate: dx += the
// gradient (a template argument, so that the common case holds no registers
// for the old dx).
template <typename T, int kCpl, bool kRms, bool kAccumulate>
__global__ void __launch_bounds__(kBackwardWarps* kWarpSize, kCpl <= 3 ? 4 : 1)
    BackwardWarpKernel(const T* __restrict__ x, const T* __restrict__ gamma,
                       const float* __restrict__ mean,
                       const float* __restrict__ rstd, const T* __restrict__ dy,
                       int64_t rows, int cols, T* __restrict__ dx,
                       float* __restrict__ partial_gamma,
                       float* __restrict__ partial_beta) {
  constexpr bool kPrefetch = sizeof(T) * kCpl * (kAccumulate ? 3 : 2) <= 12;
  // [2, cols]: this block's d_gamma, then d_beta, partial row.
  extern __shared__ float block_partials[];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  float part_gamma[kCpl][kChunk] = {};
  float part_beta[kCpl][kChunk] = {};
  const float inv_cols = 1.0f / static_cast<float>(cols);
  // A fixed assignment of rows to warps for a given grid, so the partial
  // sums, and the results, are reproducible run to run.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBackwardWarps;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kBackwardWarps + warp;
  RawChunk<T> x_raw[kCpl];
  RawChunk<T> dy_raw[kCpl];
  float mu = 0.0f;
  float rs = 0.0f;
  // Row r's x, dy and statistics (the statistics too, so that no load of
  // the current row waits behind the reductions).
  const auto load_row = [&](int64_t r, RawChunk<T>(&x_to)[kCpl],
                            RawChunk<T>(&dy_to)[kCpl], float& mu_to,
                            float& rs_to) {
    mu_to = kRms ? 0.0f : mean[r];
    rs_to = rstd[r];
#pragma unroll
    for (int p = 0; p < kCpl; ++p) {
      const int c = (lane + p * kWarpSize) * kChunk;
      if (c < cols) {
        LoadRaw(x + r * cols + c, x_to[p]);
        LoadRaw(dy + r * cols + c, dy_to[p]);
      }
    }
  };
  if (kPrefetch && row < rows) load_row(row, x_raw, dy_raw, mu, rs);
  for (; row < rows; row += stride) {
    const int64_t next = row + stride;
    RawChunk<T> x_next[kCpl];
    RawChunk<T> dy_next[kCpl];
    float mu_next = 0.0f;
    float rs_next = 0.0f;
    if (!kPrefetch) {
      load_row(row, x_raw, dy_raw, mu, rs);
    } else if (next < rows) {
      load_row(next, x_next, dy_next, mu_next, rs_next);
    }
    // The gradient to add to, loaded before the reductions so that its
    // latency hides behind them.
    RawChunk<T> old_raw[kCpl];
    if (kAccumulate) {
#pragma unroll
      for (int p = 0; p < kCpl; ++p) {
        const int c = (lane + p * kWarpSize) * kChunk;
        if (c < cols) LoadRaw(dx + row * cols + c, old_raw[p]);
      }
    }
    float sum_g = 0.0f;
    float sum_gx = 0.0f;
#pragma unroll
    for (int p = 0; p < kCpl; ++p) {
      const int c = (lane + p * kWarpSize) * kChunk;
      if (c < cols) {
        float xv[kChunk];
        float d[kChunk];
        float gm[kChunk];
        RawToFloats(x_raw[p], xv);
        RawToFloats(dy_raw[p], d);
        LoadVec(gamma + c, gm);  // 2-3 KB, stays in L1 across rows
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          const float xh = (xv[k] - mu) * rs;
          part_gamma[p][k] += d[k] * xh;
          if (!kRms) part_beta[p][k] += d[k];
          const float g = d[k] * gm[k];
          sum_g += g;
          sum_gx += g * xh;
        }
      }
    }
    const float mean_g = kRms ? 0.0f : WarpSum(sum_g) * inv_cols;
    const float mean_gx = WarpSum(sum_gx) * inv_cols;
#pragma unroll
    for (int p = 0; p < kCpl; ++p) {
      const int c = (lane + p * kWarpSize) * kChunk;
      if (c < cols) {
        float xv[kChunk];
        float d[kChunk];
        float gm[kChunk];
        RawToFloats(x_raw[p], xv);
        RawToFloats(dy_raw[p], d);
        LoadVec(gamma + c, gm);
        float old[kChunk] = {};
        if (kAccumulate) RawToFloats(old_raw[p], old);
        float out[kChunk];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) {
          const float xh = (xv[k] - mu) * rs;
          const float g = d[k] * gm[k];
          out[k] = old[k] + rs * (g - mean_g - xh * mean_gx);
        }
        StoreVec(dx + row * cols + c, out);
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int p = 0; p < kCpl; ++p) {
        x_raw[p] = x_next[p];
        dy_raw[p] = dy_next[p];
      }
      mu = mu_next;
      rs = rs_next;
    }
  }
  // Combine the warps' partials in warp order (deterministic, no atomics).
  for (int w = 0; w < kBackwardWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int p = 0; p < kCpl; ++p) {
        const int c = (lane + p * kWarpSize) * kChunk;
        if (c < cols) {
#pragma unroll
          for (int k = 0; k < kChunk; ++k) {
            float* at = block_partials + c + k;
            *at = w == 0 ? part_gamma[p][k] : *at + part_gamma[p][k];
            if (!kRms) {
              at += cols;
              *at = w == 0 ? part_beta[p][k] : *at + part_beta[p][k];
            }
          }
        }
      }
    }
    __syncthreads();
  }
  float* out_gamma = partial_gamma + static_cast<int64_t>(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    out_gamma[c] = block_partials[c];
  }
  if (!kRms && partial_beta != nullptr) {
    float* out_beta = partial_beta + static_cast<int64_t>(blockIdx.x) * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      out_beta[c] = block_partials[cols + c];
    }
  }
}

// One row at a time per block; thread t owns columns t, t + 256, ... of the
// block's partial rows (read-modify-write in global memory, no races).
template <typename T, bool kRms>
__global__ void __launch_bounds__(kBlockThreads)
    BackwardBlockKernel(const T* __restrict__ x, const T* __restrict__ gamma,
                        const float* __restrict__ mean,
                        const float* __restrict__ rstd,
                        const T* __restrict__ dy, int64_t rows, int cols,
                        T* __restrict__ dx, bool accumulate_dx,
                        float* __restrict__ partial_gamma,
                        float* __restrict__ partial_beta) {
  __shared__ float scratch[kBlockWarps];
  float* part_gamma = partial_gamma + static_cast<int64_t>(blockIdx.x) * cols;
  float* part_beta =
      partial_beta == nullptr
          ? nullptr
          : partial_beta + static_cast<int64_t>(blockIdx.x) * cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  bool first = true;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * cols;
    const T* dy_row = dy + row * cols;
    const float mu = kRms ? 0.0f : mean[row];
    const float rs = rstd[row];
    float sum_g = 0.0f;
    float sum_gx = 0.0f;
    for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
      const float g = ToFloat(dy_row[c]) * ToFloat(gamma[c]);
      sum_g += g;
      sum_gx += g * (ToFloat(x_row[c]) - mu) * rs;
    }
    const float mean_g = kRms ? 0.0f : BlockSum(sum_g, scratch) * inv_cols;
    const float mean_gx = BlockSum(sum_gx, scratch) * inv_cols;
    for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
      const float d = ToFloat(dy_row[c]);
      const float xh = (ToFloat(x_row[c]) - mu) * rs;
      float value = rs * (d * ToFloat(gamma[c]) - mean_g - xh * mean_gx);
      T* dx_at = dx + row * cols + c;
      if (accumulate_dx) value = ToFloat(*dx_at) + value;
      *dx_at = FromFloat<T>(value);
      part_gamma[c] = first ? d * xh : part_gamma[c] + d * xh;
      if (part_beta != nullptr) part_beta[c] = first ? d : part_beta[c] + d;
    }
    first = false;
  }
  if (first) {  // no rows for this block
    for (int c = threadIdx.x; c < cols; c += kBlockThreads) {
      part_gamma[c] = 0.0f;
      if (part_beta != nullptr) part_beta[c] = 0.0f;
    }
  }
}

// The second stage: out[c] += sum over b of partial[b, c] in a fixed order.
// A 32 x 32 block takes 32 columns (coalesced rows of the partials); its
// 32 thread rows sum every 32nd partial row, then thread row 0 adds the 32.
// blockIdx.y picks d_gamma (0) or d_beta (1). There are few blocks (cols / 32),
// so each thread keeps several loads in flight (the unrolled loop issues them
// before the additions, which stay in order).
constexpr int kSumColumns = 32;
constexpr int kSumRows = 32;

__global__ void __launch_bounds__(kSumColumns* kSumRows)
    ColumnSumKernel(const float* __restrict__ partial_gamma,
                    const float* __restrict__ partial_beta, int blocks,
                    int cols, float* __restrict__ d_gamma,
                    float* __restrict__ d_beta) {
  __shared__ float tile[kSumRows][kSumColumns + 1];
  const float* partial = blockIdx.y == 0 ? partial_gamma : partial_beta;
  float* out = blockIdx.y == 0 ? d_gamma : d_beta;
  const int c = blockIdx.x * kSumColumns + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int b = threadIdx.y; b < blocks; b += kSumRows) {
      sum += partial[static_cast<int64_t>(b) * cols + c];
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = tile[0][threadIdx.x];
#pragma unroll
    for (int r = 1; r < kSumRows; ++r) total += tile[r][threadIdx.x];
    out[c] += total;
  }
}

// Chunks per lane of the warp path for `cols` (rounded up to an instantiated
// count), or 0 when the block path must run.
int ChunksPerLane(int64_t cols) {
  if (cols % kChunk != 0) return 0;
  const int64_t per_lane = CeilDiv<int64_t>(cols / kChunk, kWarpSize);
  if (per_lane > kMaxChunksPerLane) return 0;
  for (int instantiated : {1, 2, 3, 4, 6, 8}) {
    if (per_lane <= instantiated) return instantiated;
  }
  return 0;
}

template <typename T, bool kRms>
cudaError_t Forward(const NormForwardArgs& args, cudaStream_t stream) {
  const T* x = static_cast<const T*>(args.x);
  const T* gamma = static_cast<const T*>(args.gamma);
  const T* beta = static_cast<const T*>(args.beta);
  T* y = static_cast<T*>(args.y);
  const int cols = static_cast<int>(args.cols);
  const bool aligned = Aligned16(x) && Aligned16(gamma) && Aligned16(y) &&
                       (beta == nullptr || Aligned16(beta));
  const int cpl = aligned ? ChunksPerLane(args.cols) : 0;
  const unsigned warp_blocks =
      static_cast<unsigned>(CeilDiv<int64_t>(args.rows, kForwardWarps));
#define LOSSRT_NORM_FORWARD_WARP(kCpl)                               \
  case kCpl:                                                         \
    ForwardWarpKernel<T, kCpl, kRms>                                 \
        <<<warp_blocks, kForwardWarps * kWarpSize, 0, stream>>>(     \
            x, gamma, beta, args.rows, cols, args.eps, y, args.mean, \
            args.rstd);                                              \
    break;
  switch (cpl) {
    LOSSRT_NORM_FORWARD_WARP(1)
    LOSSRT_NORM_FORWARD_WARP(2)
    LOSSRT_NORM_FORWARD_WARP(3)
    LOSSRT_NORM_FORWARD_WARP(4)
    LOSSRT_NORM_FORWARD_WARP(6)
    LOSSRT_NORM_FORWARD_WARP(8)
    default:
      ForwardBlockKernel<T, kRms>
          <<<static_cast<unsigned>(args.rows), kBlockThreads, 0, stream>>>(
              x, gamma, beta, cols, args.eps, y, args.mean, args.rstd);
  }
#undef LOSSRT_NORM_FORWARD_WARP
  return cudaGetLastError();
}

// Which first-stage kernel runs for `args`: the warp path's chunks per lane,
// or 0 for the block path.
template <typename T>
int BackwardChunksPerLane(const NormBackwardArgs& args) {
  const bool aligned = Aligned16(args.x) && Aligned16(args.gamma) &&
                       Aligned16(args.dy) && Aligned16(args.dx);
  return aligned ? ChunksPerLane(args.cols) : 0;
}

size_t BackwardSharedBytes(const NormBackwardArgs& args) {
  return (args.rms ? 1 : 2) * args.cols * sizeof(float);
}

template <typename T, bool kRms>
cudaError_t BackwardOccupancy(const NormBackwardArgs& args, int* per_sm) {
  const size_t shared_bytes = BackwardSharedBytes(args);
#define LOSSRT_NORM_BACKWARD_OCCUPANCY(kCpl)                           \
  case kCpl:                                                           \
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(              \
        per_sm,                                                        \
        args.accumulate_dx ? BackwardWarpKernel<T, kCpl, kRms, true>   \
                           : BackwardWarpKernel<T, kCpl, kRms, false>, \
        kBackwardWarps * kWarpSize, shared_bytes);
  switch (BackwardChunksPerLane<T>(args)) {
    LOSSRT_NORM_BACKWARD_OCCUPANCY(1)
    LOSSRT_NORM_BACKWARD_OCCUPANCY(2)
    LOSSRT_NORM_BACKWARD_OCCUPANCY(3)
    LOSSRT_NORM_BACKWARD_OCCUPANCY(4)
    LOSSRT_NORM_BACKWARD_OCCUPANCY(6)
    LOSSRT_NORM_BACKWARD_OCCUPANCY(8)
    default:
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          per_sm, BackwardBlockKernel<T, kRms>, kBlockThreads, 0);
  }
#undef LOSSRT_NORM_BACKWARD_OCCUPANCY
}

template <typename T, bool kRms>
cudaError_t Backward(const NormBackwardArgs& args, cudaStream_t stream) {
  const T* x = static_cast<const T*>(args.x);
  const T* gamma = static_cast<const T*>(args.gamma);
  const T* dy = static_cast<const T*>(args.dy);
  T* dx = static_cast<T*>(args.dx);
  const int cols = static_cast<int>(args.cols);
  float* partial_gamma = args.partials;
  float* partial_beta =
      !kRms && args.d_beta != nullptr
          ? args.partials + static_cast<int64_t>(args.blocks) * cols
          : nullptr;
  const size_t shared_bytes = BackwardSharedBytes(args);
#define LOSSRT_NORM_BACKWARD_WARP(kCpl)                                   \
  case kCpl:                                                              \
    (args.accumulate_dx ? BackwardWarpKernel<T, kCpl, kRms, true>         \
                        : BackwardWarpKernel<T, kCpl, kRms, false>)<<<    \
        args.blocks, kBackwardWarps * kWarpSize, shared_bytes, stream>>>( \
        x, gamma, args.mean, args.rstd, dy, args.rows, cols, dx,          \
        partial_gamma, partial_beta);                                     \
    break;
  switch (BackwardChunksPerLane<T>(args)) {
    LOSSRT_NORM_BACKWARD_WARP(1)
    LOSSRT_NORM_BACKWARD_WARP(2)
    LOSSRT_NORM_BACKWARD_WARP(3)
    LOSSRT_NORM_BACKWARD_WARP(4)
    LOSSRT_NORM_BACKWARD_WARP(6)
    LOSSRT_NORM_BACKWARD_WARP(8)
    default:
      BackwardBlockKernel<T, kRms><<<args.blocks, kBlockThreads, 0, stream>>>(
          x, gamma, args.mean, args.rstd, dy, args.rows, cols, dx,
          args.accumulate_dx, partial_gamma, partial_beta);
  }
#undef LOSSRT_NORM_BACKWARD_WARP
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const dim3 sum_grid(CeilDiv(cols, kSumColumns),
                      partial_beta != nullptr ? 2 : 1);
  ColumnSumKernel<<<sum_grid, dim3(kSumColumns, kSumRows), 0, stream>>>(
      partial_gamma, partial_beta, args.blocks, cols, args.d_gamma,
      args.d_beta);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchNormForward(const NormForwardArgs& args,
                              cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.bf16) {
    return args.rms ? Forward<__nv_bfloat16, true>(args, stream)
                    : Forward<__nv_bfloat16, false>(args, stream);
  }
  return args.rms ? Forward<float, true>(args, stream)
                  : Forward<float, false>(args, stream);
}

cudaError_t NormBackwardBlocks(const NormBackwardArgs& args, int num_sms,
                               int max_blocks, int* blocks) {
  int per_sm = 0;
  cudaError_t error;
  if (args.bf16) {
    error = args.rms ? BackwardOccupancy<__nv_bfloat16, true>(args, &per_sm)
                     : BackwardOccupancy<__nv_bfloat16, false>(args, &per_sm);
  } else {
    error = args.rms ? BackwardOccupancy<float, true>(args, &per_sm)
                     : BackwardOccupancy<float, false>(args, &per_sm);
  }
  if (error != cudaSuccess) return error;
  // One wave: every block runs from the start, so the rows split evenly
  // (a partial second wave would leave most SMs idle at the end).
  const int64_t wave = static_cast<int64_t>(num_sms) * per_sm;
  *blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(wave, std::max(max_blocks, 1))));
  return cudaSuccess;
}

cudaError_t LaunchNormBackward(const NormBackwardArgs& args,
                               cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.bf16) {
    return args.rms ? Backward<__nv_bfloat16, true>(args, stream)
                    : Backward<__nv_bfloat16, false>(args, stream);
  }
  return args.rms ? Backward<float, true>(args, stream)
                  : Backward<float, false>(args, stream);
}

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt
