// CUDA kernels of the linear cross-entropy: the gradient of a vocabulary slice
// of the logits (written in place over the fp32 logits, possibly as 16-bit
// values), the row statistics merged over slices and finished into the loss,
// and dtype conversions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loss/linear_cross_entropy_cuda.h"
#include "loss/linear_cross_entropy_kernels.h"
#include "runtime/device_convert.cuh"

namespace lossrt {
namespace lce {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // one float4 of logits per thread and tile
constexpr int kTile = kThreads * kPerThread;

using device_convert::FromFloat;
using device_convert::ToFloat;

// Element i of a row of `type` (DType::kF32, kBF16 or kF16), as a float.
__device__ __forceinline__ float Load(const void* base, DType type, int64_t i) {
  switch (type) {
    case DType::kBF16:
      return ToFloat(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16:
      return ToFloat(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void Store(void* base, DType type, int64_t i,
                                      float value) {
  switch (type) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(base)[i] = FromFloat<__nv_bfloat16>(value);
      break;
    case DType::kF16:
      static_cast<__half*>(base)[i] = FromFloat<__half>(value);
      break;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

// One block per row. The row is walked in tiles of kTile columns; a tile is
// loaded into registers, the block synchronizes, then the tile's gradient is
// stored. Why the barrier: a 16-bit gradient written in place lands at half the
// byte offset of its logit, so the stores of tile m overlap the loads of tile m
// (for m = 0) and never the loads of later tiles, which lie at higher
// addresses.
__global__ void SliceBackwardKernel(SliceArgs args) {
  const int64_t row = blockIdx.x;
  float* logits = args.logits + row * args.ld;  // [cols]
  void* grad = logits;  // [cols] of grad_type, same start
  const SliceRow coefficients = MakeSliceRow(args, row);
  for (int64_t begin = 0; begin < args.cols; begin += kTile) {
    const int64_t j0 = begin + static_cast<int64_t>(threadIdx.x) * kPerThread;
    float x[kPerThread];
    const bool full = j0 + kPerThread <= args.cols;
    if (full) {
      const float4 v = *reinterpret_cast<const float4*>(logits + j0);
      x[0] = v.x;
      x[1] = v.y;
      x[2] = v.z;
      x[3] = v.w;
    } else {
      for (int k = 0; k < kPerThread; ++k)
        x[k] = j0 + k < args.cols ? logits[j0 + k] : 0.0f;
    }
    __syncthreads();
    // Only the slice's own columns: the tail of the last tile lies past the
    // slice (and, in the vocabulary's last slice, past the class weights),
    // where there is neither a logit nor a weight to read.
    float g[kPerThread];
    for (int k = 0; k < kPerThread; ++k) {
      g[k] = j0 + k < args.cols ? SliceGradient(args, coefficients, x[k],
                                                args.col_begin + j0 + k)
                                : 0.0f;
    }
    if (full && args.grad_type == DType::kBF16) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(g[0], g[1]);
      __nv_bfloat162 hi = __floats2bfloat162_rn(g[2], g[3]);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(grad) + j0) =
          packed;
    } else if (full && args.grad_type == DType::kF16) {
      __half2 lo = __floats2half2_rn(g[0], g[1]);
      __half2 hi = __floats2half2_rn(g[2], g[3]);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<__half*>(grad) + j0) = packed;
    } else if (full) {
      *reinterpret_cast<float4*>(logits + j0) =
          make_float4(g[0], g[1], g[2], g[3]);
    } else {
      for (int k = 0; k < kPerThread; ++k) {
        if (j0 + k < args.cols) Store(grad, args.grad_type, j0 + k, g[k]);
      }
    }
  }
}

// (max, sum of exp(z - max)) pairs combined: the sums rescaled to the larger
// max (a -inf max has sum 0 and contributes nothing).
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float max = fmaxf(a.max, b.max);
  if (max == -INFINITY) return {max, 0.0f};
  return {max, a.sum * __expf(a.max - max) + b.sum * __expf(b.max - max)};
}

// One block per row of the slice. Each thread keeps an online (max, sum) over
// its columns, rescaling its sum when its max grows, so that the logits are
// read once; then the block combines the threads' pairs and one thread merges
// the slice's values into the row's running statistics.
// kCompact: the block also shares the slice's max and writes each logit's
// exp(z - max) in fp16, re-reading the row (just read: from L1 or L2).
template <bool kCompact>
__global__ void SliceStatsKernel(CompactStatsArgs compact) {
  const SliceStatsArgs& args = compact.stats;
  const int64_t row = blockIdx.x;
  const float* x = args.logits + row * args.ld;  // [cols]
  const int64_t skip =
      SliceTargetColumn(args.targets, args.targets_i64, row, args.ignore_index,
                        args.col_begin, args.cols);
  MaxSum local = {-INFINITY, 0.0f};
  double smooth = 0.0;
  auto take = [&](float logit, int64_t j) {
    const float z = SoftcapLogit(logit, args.softcap);
    if (z > local.max) {
      local.sum =
          local.max == -INFINITY ? 0.0f : local.sum * __expf(local.max - z);
      local.max = z;
    }
    if (j != skip && z != -INFINITY) local.sum += __expf(z - local.max);
    if (args.smoothing) {
      const float w = args.class_weights != nullptr
                          ? args.class_weights[args.col_begin + j]
                          : 1.0f;
      smooth += static_cast<double>(w) * z;
    }
  };
  for (int64_t j0 = static_cast<int64_t>(threadIdx.x) * kPerThread;
       j0 < args.cols; j0 += kTile) {
    if (j0 + kPerThread <= args.cols) {
      const float4 v = *reinterpret_cast<const float4*>(x + j0);
      take(v.x, j0);
      take(v.y, j0 + 1);
      take(v.z, j0 + 2);
      take(v.w, j0 + 3);
    } else {
      for (int64_t j = j0; j < args.cols; ++j) take(x[j], j);
    }
  }
  // Warps, then the block's warps through shared memory.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other = {__shfl_xor_sync(0xffffffffu, local.max, offset),
                          __shfl_xor_sync(0xffffffffu, local.sum, offset)};
    local = Combine(local, other);
    smooth += __shfl_xor_sync(0xffffffffu, smooth, offset);
  }
  __shared__ MaxSum warp_pairs[kThreads / 32];
  __shared__ double warp_smooth[kThreads / 32];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_pairs[warp] = local;
    warp_smooth[warp] = smooth;
  }
  __syncthreads();
  // Thread 0 combines the block's values (the only thread that uses them).
  MaxSum total = warp_pairs[0];
  double smooth_total = warp_smooth[0];
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      total = Combine(total, warp_pairs[w]);
      smooth_total += warp_smooth[w];
    }
  }
  if constexpr (kCompact) {
    __shared__ float slice_max;
    if (threadIdx.x == 0) {
      slice_max = total.max;
      compact.slice_max[row * compact.slice_max_ld] = total.max;
    }
    __syncthreads();
    const float m = slice_max;
    uint16_t* probs = compact.probs + row * compact.probs_ld;  // [cols]
    auto prob = [m](float z) {
      return m == -INFINITY ? __float2half_rn(0.0f)
                            : __float2half_rn(__expf(z - m));
    };
    for (int64_t j0 = static_cast<int64_t>(threadIdx.x) * kPerThread;
         j0 < args.cols; j0 += kTile) {
      if (j0 + kPerThread <= args.cols) {
        const float4 v = *reinterpret_cast<const float4*>(x + j0);
        __half2 lo = __halves2half2(prob(v.x), prob(v.y));
        __half2 hi = __halves2half2(prob(v.z), prob(v.w));
        uint2 packed;
        packed.x = *reinterpret_cast<uint32_t*>(&lo);
        packed.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(probs + j0) = packed;
      } else {
        for (int64_t j = j0; j < args.cols; ++j) {
          const __half h = prob(x[j]);
          probs[j] = *reinterpret_cast<const uint16_t*>(&h);
        }
      }
    }
  }
  if (threadIdx.x != 0) return;
  const double target_z = skip >= 0 ? SoftcapLogit(x[skip], args.softcap) : 0.0;
  MergeSliceStats(args.merge, total.max, total.sum, skip >= 0, target_z,
                  smooth_total, args.row_max + row,
                  args.row_stats + row * kStats);
}

// kCompactChunks' gradient: one block per row, slice by slice, so that each
// slice's factor exp(m - lse) is taken once a row and a logit costs an FMA;
// eight fp16 values (one 16-byte load) in, eight gradient values out in place
// by each thread (a thread rewrites only what it read).
constexpr int kCompactPerThread = 8;
constexpr int kCompactTile = kThreads * kCompactPerThread;

__global__ void CompactBackwardKernel(CompactArgs args) {
  const int64_t row = blockIdx.x;
  const SliceArgs& slice = args.slice;
  const SliceRow coefficients = MakeSliceRow(slice, row);
  uint16_t* probs = args.probs + row * args.probs_ld;  // [vocab]
  const float* maxima = args.slice_max + row * args.slice_max_ld;
  const bool weighted = slice.class_weights != nullptr;
  for (int64_t begin = 0; begin < slice.vocab; begin += args.slice_cols) {
    const int64_t cols = min(args.slice_cols, slice.vocab - begin);
    const float m = maxima[begin / args.slice_cols];
    const float factor = coefficients.ignored || m == -INFINITY
                             ? 0.0f
                             : coefficients.a * __expf(m - coefficients.lse);
    // The target's element, and every element of ignored rows, the general
    // way; the rest as factor * e - coefficient e * w.
    auto gradient = [&](float e, int64_t col) {
      if (coefficients.ignored) return 0.0f;
      if (col == coefficients.target)
        return CompactGradient(slice, coefficients, e, m, col);
      const float w = weighted ? slice.class_weights[col] : 1.0f;
      return fmaf(factor, e, -coefficients.e * w);
    };
    uint16_t* p = probs + begin;
    for (int64_t j0 = static_cast<int64_t>(threadIdx.x) * kCompactPerThread;
         j0 < cols; j0 += kCompactTile) {
      if (j0 + kCompactPerThread <= cols) {
        uint4 packed = *reinterpret_cast<const uint4*>(p + j0);
        uint32_t* words = reinterpret_cast<uint32_t*>(&packed);
        const int64_t col = begin + j0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 e =
              __half22float2(*reinterpret_cast<__half2*>(&words[w]));
          const float g0 = gradient(e.x, col + 2 * w);
          const float g1 = gradient(e.y, col + 2 * w + 1);
          if (slice.grad_type == DType::kBF16) {
            __nv_bfloat162 out = __floats2bfloat162_rn(g0, g1);
            words[w] = *reinterpret_cast<uint32_t*>(&out);
          } else {
            __half2 out = __floats2half2_rn(g0, g1);
            words[w] = *reinterpret_cast<uint32_t*>(&out);
          }
        }
        *reinterpret_cast<uint4*>(p + j0) = packed;
      } else {
        for (int64_t j = j0; j < cols; ++j) {
          const __half h = *reinterpret_cast<const __half*>(p + j);
          Store(p, slice.grad_type, j, gradient(__half2float(h), begin + j));
        }
      }
    }
  }
}

__global__ void SliceFinishKernel(SliceFinishArgs args) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < args.rows) FinishSliceRow(args, i);
}

// One block per row, threads striding over the columns.
__global__ void ConvertKernel(ConvertArgs args) {
  const int64_t row = blockIdx.x;
  for (int64_t j = threadIdx.x; j < args.cols; j += blockDim.x) {
    const float value =
        args.src == nullptr
            ? args.scale
            : args.scale * Load(args.src, args.src_type, row * args.src_ld + j);
    Store(args.dst, args.dst_type, row * args.dst_ld + j, value);
  }
}

}  // namespace

cudaError_t LaunchSliceBackward(const SliceArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return cudaSuccess;
  // float4 loads: rows must start 16-byte aligned.
  if (args.ld % 4 != 0 || reinterpret_cast<uintptr_t>(args.logits) % 16 != 0 ||
      args.rows > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  SliceBackwardKernel<<<static_cast<unsigned>(args.rows), kThreads, 0,
                        stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchSliceStats(const SliceStatsArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return cudaSuccess;
  if (args.ld % 4 != 0 || reinterpret_cast<uintptr_t>(args.logits) % 16 != 0 ||
      args.rows > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  CompactStatsArgs compact;
  compact.stats = args;
  SliceStatsKernel<false>
      <<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(compact);
  return cudaGetLastError();
}

cudaError_t LaunchCompactStats(const CompactStatsArgs& args,
                               cudaStream_t stream) {
  const SliceStatsArgs& stats = args.stats;
  if (stats.rows == 0 || stats.cols == 0) return cudaSuccess;
  // float4 loads, 8-byte stores of four fp16 values; no soft cap.
  if (stats.ld % 4 != 0 ||
      reinterpret_cast<uintptr_t>(stats.logits) % 16 != 0 ||
      args.probs_ld % 4 != 0 ||
      reinterpret_cast<uintptr_t>(args.probs) % 8 != 0 ||
      stats.softcap != 0.0f || stats.rows > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  SliceStatsKernel<true>
      <<<static_cast<unsigned>(stats.rows), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchCompactBackward(const CompactArgs& args,
                                  cudaStream_t stream) {
  const SliceArgs& slice = args.slice;
  if (slice.rows == 0 || slice.vocab == 0) return cudaSuccess;
  // 16-byte accesses of eight values from each slice's start.
  if (args.probs_ld % 8 != 0 || args.slice_cols <= 0 ||
      (args.slice_cols % 8 != 0 && args.slice_cols < slice.vocab) ||
      reinterpret_cast<uintptr_t>(args.probs) % 16 != 0 ||
      (slice.grad_type != DType::kBF16 && slice.grad_type != DType::kF16) ||
      slice.softcap != 0.0f || slice.target_logprob == nullptr ||
      slice.rows > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  CompactBackwardKernel<<<static_cast<unsigned>(slice.rows), kThreads, 0,
                          stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchSliceFinish(const SliceFinishArgs& args,
                              cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  const int64_t blocks = (args.rows + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  SliceFinishKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const ConvertArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return cudaSuccess;
  if (args.rows > INT32_MAX) return cudaErrorInvalidValue;
  const int threads = args.cols >= 512 ? 512 : 128;
  ConvertKernel<<<static_cast<unsigned>(args.rows), threads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace lce
}  // namespace lossrt
