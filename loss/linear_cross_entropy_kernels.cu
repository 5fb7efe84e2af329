// CUDA kernels of the linear cross-entropy: the gradient of a vocabulary slice
// of the logits (written in place over the fp32 logits, possibly as 16-bit
// values) and dtype conversions.
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

cudaError_t LaunchConvert(const ConvertArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return cudaSuccess;
  if (args.rows > INT32_MAX) return cudaErrorInvalidValue;
  const int threads = args.cols >= 512 ? 512 : 128;
  ConvertKernel<<<static_cast<unsigned>(args.rows), threads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace lce
}  // namespace lossrt
