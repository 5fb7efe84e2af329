// CUDA kernels of the AdamW step:
//
// - GradNormPartialsKernel / GradNormFinishKernel: the global gradient norm in
//   two deterministic stages (a grid fixed by n alone writes one double partial
//   sum per block; one block adds them in a fixed tree order).
// - AdamWKernel: the fused update, four elements per thread with 16-byte loads
//   and stores where the pointers allow. It reads the norm from device memory,
//   so the step never waits for the host.
//
// The update uses explicitly rounded intrinsics (__fmul_rn, __fadd_rn, ...):
// they keep nvcc from contracting into FMAs, so the GPU computes exactly the
// float operations of the CPU backend (built with -ffp-contract=off) and the
// two agree bit for bit given the same norm.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "graph/optim/adamw_cuda.h"
#include "runtime/device_convert.cuh"
#include "runtime/int_math.h"

namespace lossrt {
namespace optim {
namespace {

constexpr int kNormThreads = 512;
constexpr int kFinishThreads = 1024;
constexpr int kUpdateThreads = 256;
constexpr int kVec = 4;  // elements per thread of the update
constexpr unsigned kFullMask = 0xffffffffu;

// Block-wide sum in a fixed tree order; the result is valid in thread 0.
__device__ double BlockSum(double value, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_down_sync(kFullMask, value, offset);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = threadIdx.x < (blockDim.x >> 5) ? scratch[threadIdx.x] : 0.0;
  if (warp == 0) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      value += __shfl_down_sync(kFullMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ double Square(float x) {
  const double wide = static_cast<double>(x);
  return wide * wide;
}

// Squares are summed in double: exact enough that the order of summation does
// not show in the f32 norm, and no overflow for any finite f32 gradients.
__global__ void __launch_bounds__(kNormThreads)
    GradNormPartialsKernel(const float* __restrict__ grads, int64_t n,
                           bool vectorized, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double sum = 0.0;
  int64_t tail = 0;  // first element the scalar loop handles
  if (vectorized) {
    const int64_t vecs = n / kVec;
    const float4* grads4 = reinterpret_cast<const float4*>(grads);
#pragma unroll 4
    for (int64_t i = first; i < vecs; i += stride) {
      const float4 g = grads4[i];
      sum += Square(g.x);
      sum += Square(g.y);
      sum += Square(g.z);
      sum += Square(g.w);
    }
    tail = vecs * kVec;
  }
  for (int64_t i = tail + first; i < n; i += stride) sum += Square(grads[i]);
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block sums the partials; writes the norm (f32, the square root) or,
// with `sum_squares` non-null, the sum itself in double instead.
__global__ void __launch_bounds__(kFinishThreads)
    GradNormFinishKernel(const double* __restrict__ partials, int num_partials,
                         float* __restrict__ norm,
                         double* __restrict__ sum_squares) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += blockDim.x)
    sum += partials[i];
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) {
    if (sum_squares != nullptr) {
      sum_squares[0] = sum;
    } else {
      norm[0] = static_cast<float>(sqrt(sum));
    }
  }
}

__global__ void NormFromSumOfSquaresKernel(const double* __restrict__ sum,
                                           float* __restrict__ norm) {
  norm[0] = static_cast<float>(sqrt(sum[0]));
}

// min(1, max_norm / (norm + 1e-6)), or 1 without clipping. fminf returns 1 for
// a NaN norm, as std::fmin does on the CPU.
__device__ __forceinline__ float ClipScale(float norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  return fminf(1.0f, __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f)));
}

// One element: returns the new master weight and updates m and v in place.
__device__ __forceinline__ float UpdateOne(const AdamWKernelArgs& a, float p,
                                           float g, float& m, float& v,
                                           float scale, bool decay) {
  g = __fmul_rn(g, scale);
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(a.beta2, v),
                __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
  if (decay) p = __fmul_rn(p, a.decay_factor);
  const float denom =
      __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_sqrt_bias2), a.eps);
  return __fadd_rn(p, -__fmul_rn(a.step_size, __fdiv_rn(m, denom)));
}

using device_convert::FromFloat;

// C: the compute copy's element type (void: none). kVectorized: every pointer
// is aligned for kVec-element accesses (16 bytes of f32, 8 of bf16).
template <typename C, bool kVectorized>
__global__ void __launch_bounds__(kUpdateThreads)
    AdamWKernel(const AdamWKernelArgs args) {
  const int64_t base =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (base >= args.n) return;
  const float scale = ClipScale(*args.norm, args.max_grad_norm);
  if (kVectorized && base + kVec <= args.n) {
    float4 p = *reinterpret_cast<const float4*>(args.params + base);
    const float4 g = *reinterpret_cast<const float4*>(args.grads + base);
    float4 m = *reinterpret_cast<const float4*>(args.m + base);
    float4 v = *reinterpret_cast<const float4*>(args.v + base);
    p.x =
        UpdateOne(args, p.x, g.x, m.x, v.x, scale, base + 0 < args.decay_count);
    p.y =
        UpdateOne(args, p.y, g.y, m.y, v.y, scale, base + 1 < args.decay_count);
    p.z =
        UpdateOne(args, p.z, g.z, m.z, v.z, scale, base + 2 < args.decay_count);
    p.w =
        UpdateOne(args, p.w, g.w, m.w, v.w, scale, base + 3 < args.decay_count);
    *reinterpret_cast<float4*>(args.params + base) = p;
    *reinterpret_cast<float4*>(args.m + base) = m;
    *reinterpret_cast<float4*>(args.v + base) = v;
    if constexpr (std::is_same<C, float>::value) {
      *reinterpret_cast<float4*>(static_cast<float*>(args.compute_copy) +
                                 base) = p;
    } else if constexpr (std::is_same<C, __nv_bfloat16>::value) {
      union {
        uint2 raw;
        __nv_bfloat16 elements[kVec];
      } copy;
      copy.elements[0] = FromFloat<C>(p.x);
      copy.elements[1] = FromFloat<C>(p.y);
      copy.elements[2] = FromFloat<C>(p.z);
      copy.elements[3] = FromFloat<C>(p.w);
      *reinterpret_cast<uint2*>(static_cast<C*>(args.compute_copy) + base) =
          copy.raw;
    }
    return;
  }
  // The ragged end, or pointers not aligned for vectors.
  const int64_t end = base + kVec < args.n ? base + kVec : args.n;
  for (int64_t i = base; i < end; ++i) {
    float m = args.m[i], v = args.v[i];
    const float p = UpdateOne(args, args.params[i], args.grads[i], m, v, scale,
                              i < args.decay_count);
    args.params[i] = p;
    args.m[i] = m;
    args.v[i] = v;
    if constexpr (!std::is_void<C>::value) {
      static_cast<C*>(args.compute_copy)[i] = FromFloat<C>(p);
    }
  }
}

bool Aligned(const void* ptr, int bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

template <typename C>
cudaError_t LaunchAdamWTyped(const AdamWKernelArgs& args, cudaStream_t stream) {
  int copy_bytes = 0;
  if constexpr (!std::is_void<C>::value) copy_bytes = sizeof(C) * kVec;
  const bool vectorized =
      Aligned(args.params, 16) && Aligned(args.grads, 16) &&
      Aligned(args.m, 16) && Aligned(args.v, 16) &&
      (copy_bytes == 0 || Aligned(args.compute_copy, copy_bytes));
  const int64_t threads = CeilDiv<int64_t>(args.n, kVec);
  const int64_t blocks = CeilDiv<int64_t>(threads, kUpdateThreads);
  if (vectorized) {
    AdamWKernel<C, true>
        <<<static_cast<unsigned>(blocks), kUpdateThreads, 0, stream>>>(args);
  } else {
    AdamWKernel<C, false>
        <<<static_cast<unsigned>(blocks), kUpdateThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGradNorm(const float* grads, int64_t n, double* partials,
                           int num_partials, float* norm, cudaStream_t stream) {
  if (num_partials > 0) {
    GradNormPartialsKernel<<<num_partials, kNormThreads, 0, stream>>>(
        grads, n, Aligned(grads, 16), partials);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  GradNormFinishKernel<<<1, kFinishThreads, 0, stream>>>(partials, num_partials,
                                                         norm, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchGradSumOfSquares(const float* grads, int64_t n,
                                   double* partials, int num_partials,
                                   double* sum_squares, cudaStream_t stream) {
  if (num_partials > 0) {
    GradNormPartialsKernel<<<num_partials, kNormThreads, 0, stream>>>(
        grads, n, Aligned(grads, 16), partials);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  GradNormFinishKernel<<<1, kFinishThreads, 0, stream>>>(partials, num_partials,
                                                         nullptr, sum_squares);
  return cudaGetLastError();
}

cudaError_t LaunchNormFromSumOfSquares(const double* sum_squares, float* norm,
                                       cudaStream_t stream) {
  NormFromSumOfSquaresKernel<<<1, 1, 0, stream>>>(sum_squares, norm);
  return cudaGetLastError();
}

cudaError_t LaunchAdamW(const AdamWKernelArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  if (args.compute_copy == nullptr) return LaunchAdamWTyped<void>(args, stream);
  switch (args.copy_dtype) {
    case DType::kF32:
      return LaunchAdamWTyped<float>(args, stream);
    case DType::kBF16:
      return LaunchAdamWTyped<__nv_bfloat16>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace optim
}  // namespace lossrt
