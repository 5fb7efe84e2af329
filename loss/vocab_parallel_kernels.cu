// CUDA kernels of the vocabulary-parallel ops (vocab_parallel_kernels.h): one
// block per row for the chunk kernels and the widening, one block for the
// record, one thread per column for d_bias. Every reduction runs in a fixed
// order (per-thread strided sums, then a shared-memory tree), so the results
// are the same run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "loss/vocab_parallel_kernels.h"
#include "runtime/device_convert.cuh"

namespace lossrt {
namespace vocab_parallel {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t LoadTarget(const void* targets, bool i64,
                                              int64_t i) {
  return i64 ? static_cast<const int64_t*>(targets)[i]
             : static_cast<const int32_t*>(targets)[i];
}

__device__ __forceinline__ void Store(void* base, DType type, int64_t i,
                                      float value) {
  switch (type) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(base)[i] =
          device_convert::FromFloat<__nv_bfloat16>(value);
      break;
    case DType::kF16:
      static_cast<__half*>(base)[i] = device_convert::FromFloat<__half>(value);
      break;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

// The block's sum (or max) of `value`, in a fixed order; every thread gets it.
template <typename T, bool kMax>
__device__ T BlockReduce(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const T other = shared[threadIdx.x + stride];
      shared[threadIdx.x] =
          kMax ? (other > shared[threadIdx.x] ? other : shared[threadIdx.x])
               : shared[threadIdx.x] + other;
    }
    __syncthreads();
  }
  const T result = shared[0];
  __syncthreads();
  return result;
}

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ int64_t DoubleBits(double value) {
  return __double_as_longlong(value);
}

__global__ void RecordKernel(RecordArgs args) {
  __shared__ double shared_f64[kThreads];
  __shared__ unsigned long long shared_u64[kThreads];
  if (!args.scan) {
    if (threadIdx.x == 0) {
      for (int k = 0; k < kFields; ++k) args.record[k] = args.fields[k];
    }
    return;
  }
  unsigned long long invalid = 0, counted = 0, hash = 0, negative = 0;
  double target_weights = 0.0, weights = 0.0;
  for (int64_t i = threadIdx.x; i < args.tokens; i += kThreads) {
    const int64_t t = LoadTarget(args.targets, args.targets_i64, i);
    // An order-free hash of (i, t_i): the ranks compare it, nothing else.
    hash += Mix(Mix(static_cast<uint64_t>(i)) ^ static_cast<uint64_t>(t));
    if (t == args.ignore_index) continue;
    if (t < 0 || t >= args.vocab) {
      ++invalid;
      continue;
    }
    ++counted;
    if (args.class_weights != nullptr && t >= args.offset &&
        t < args.offset + args.local_vocab) {
      target_weights += args.class_weights[t - args.offset];
    }
  }
  if (args.class_weights != nullptr) {
    for (int64_t j = threadIdx.x; j < args.local_vocab; j += kThreads) {
      const float w = args.class_weights[j];
      weights += w;
      if (!(w >= 0.0f)) ++negative;  // NaN counts as negative too
    }
  }
  invalid = BlockReduce<unsigned long long, false>(invalid, shared_u64);
  counted = BlockReduce<unsigned long long, false>(counted, shared_u64);
  hash = BlockReduce<unsigned long long, false>(hash, shared_u64);
  negative = BlockReduce<unsigned long long, false>(negative, shared_u64);
  target_weights = BlockReduce<double, false>(target_weights, shared_f64);
  weights = BlockReduce<double, false>(weights, shared_f64);
  if (threadIdx.x == 0) {
    for (int k = 0; k < kFields; ++k) args.record[k] = args.fields[k];
    args.record[kTargets] = static_cast<int64_t>(hash >> 1);
    args.record[kInvalid] = static_cast<int64_t>(invalid);
    args.record[kCounted] = static_cast<int64_t>(counted);
    args.record[kNegativeWeights] = static_cast<int64_t>(negative);
    args.record[kTargetWeightSum] = DoubleBits(target_weights);
    args.record[kWeightSum] = DoubleBits(weights);
  }
}

__global__ void TargetWeightKernel(TargetWeightArgs args) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= args.tokens) return;
  const int64_t t = LoadTarget(args.targets, args.targets_i64, i);
  args.target_weight[i] =
      t >= args.offset && t < args.offset + args.local_vocab
          ? static_cast<double>(args.class_weights[t - args.offset])
          : 0.0;
}

__global__ void RowMaxKernel(ChunkArgs args) {
  __shared__ float shared[kThreads];
  float* z = args.logits + blockIdx.x * args.ld;  // [cols]
  const float cap = args.softcap;
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  float best = -INFINITY;
  for (int64_t j = threadIdx.x; j < args.cols; j += kThreads) {
    float x = z[j];
    if (cap > 0.0f) {
      x = cap * tanhf(x * inv_cap);
      z[j] = x;
    }
    best = fmaxf(best, x);
  }
  best = BlockReduce<float, true>(best, shared);
  if (threadIdx.x == 0) args.row_max[blockIdx.x] = best;
}

__global__ void RowSumsKernel(ChunkArgs args) {
  __shared__ double shared[kThreads];
  const int64_t row = blockIdx.x;
  const float* z = args.logits + row * args.ld;  // [cols]
  const float m = args.row_max[row];
  const bool entropy = args.entropy_weight != 0.0f;
  const bool smoothing = args.label_smoothing > 0.0f;
  double sum_exp = 0.0, smooth = 0.0, centered = 0.0;
  for (int64_t j = threadIdx.x; j < args.cols; j += kThreads) {
    const float d = z[j] - m;
    const float e = expf(d);
    sum_exp += e;
    if (entropy && e > 0.0f) centered += static_cast<double>(e) * d;
    if (smoothing) {
      smooth += (args.class_weights != nullptr ? args.class_weights[j] : 1.0f) *
                static_cast<double>(m - z[j]);
    }
  }
  sum_exp = BlockReduce<double, false>(sum_exp, shared);
  smooth = BlockReduce<double, false>(smooth, shared);
  centered = BlockReduce<double, false>(centered, shared);
  if (threadIdx.x == 0) {
    const int64_t t = LoadTarget(args.targets, args.targets_i64, row);
    double gap = 0.0;
    if (t >= args.offset && t < args.offset + args.cols)
      gap = static_cast<double>(m) - z[t - args.offset];
    double* out = args.sums + row * kRowSums;
    out[kSumExp] = sum_exp;
    out[kSmoothSum] = smooth;
    out[kTargetGap] = gap;
    out[kCentered] = centered;
  }
}

// The row's constants of the gradient, computed by thread 0.
struct RowConstants {
  bool valid;
  bool ignored;
  bool owner;
  int64_t local_target;
  float shift;
  float log_sum;
  float coef;
  float smooth_w;
  bool smoothing;
  float ent;
  bool entropy;
  float row_entropy;
  float target_grad;
};

// One block per row. Thread 0 finishes the row's statistics; then the row is
// walked in tiles of kThreads columns: a tile is loaded, the block
// synchronizes, then the tile's gradient is stored. Why the barrier: a 16-bit
// gradient written in place lands at half the byte offset of its logit, so
// the stores of tile m overlap only the loads of tiles <= m.
__global__ void RowFinishKernel(ChunkArgs args) {
  __shared__ RowConstants k;
  const int64_t row = blockIdx.x;
  float* z = args.logits + row * args.ld;  // [cols] fp32, then grad_type
  const float cap = args.softcap;
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  if (threadIdx.x == 0) {
    const int64_t t = LoadTarget(args.targets, args.targets_i64, row);
    const bool ignored = t == args.ignore_index;
    const bool valid = !ignored && t >= 0 && t < args.vocab;
    const double s = args.label_smoothing;
    const bool entropy = args.entropy_weight != 0.0f;
    const double w_t =
        args.target_weight != nullptr ? args.target_weight[row] : 1.0;
    const double weight_total = args.weight_total;
    double shift = 0.0, log_sum = 0.0, lse = 0.0, row_entropy = 0.0;
    if (args.fused) {
      const double* sum = args.sums + row * kRowSums;
      shift = args.row_max[row];
      log_sum = log(sum[kSumExp]);
      lse = shift + log_sum;
      args.lse[row] = static_cast<float>(lse);
      if (entropy && valid) {
        row_entropy = args.row_max[row] == INFINITY
                          ? NAN
                          : log_sum - sum[kCentered] / sum[kSumExp];
      }
      if (!valid) {
        if (args.row_loss != nullptr) args.row_loss[row] = ignored ? 0.0f : NAN;
      } else {
        const double nll = sum[kTargetGap] + log_sum;
        double ce = (1.0 - s) * w_t * nll;
        if (s > 0.0) {
          ce += s / args.vocab * (weight_total * log_sum + sum[kSmoothSum]);
        }
        double zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0;
        if (entropy) zl -= args.entropy_weight * row_entropy;
        if (args.row_loss != nullptr) {
          args.row_loss[row] = static_cast<float>(
              args.mean ? ce * args.ce_scale + zl * args.z_scale : ce + zl);
        }
      }
    } else {
      shift = args.lse[row];
      lse = shift;
    }
    k.valid = valid;
    k.ignored = ignored;
    k.owner = false;
    if (args.backward && valid) {
      double g = 1.0;
      if (args.grad_loss != nullptr)
        g = args.grad_loss[args.grad_loss_per_row ? row : 0];
      g = static_cast<float>(args.dlogits_scale * g);
      const double ce_scale = g * args.ce_scale, z_scale = g * args.z_scale;
      const double target_coef = ce_scale * (1.0 - s) * w_t;
      const double smooth_w = ce_scale * s / args.vocab;
      const double z_term =
          args.z_loss > 0.0f ? 2.0 * z_scale * args.z_loss * lse : 0.0;
      const double coef_d = target_coef + smooth_w * weight_total + z_term;
      const double target_offset = smooth_w * (weight_total - w_t) + z_term;
      const double ent_coef = z_scale * args.entropy_weight;
      k.owner = t >= args.offset && t < args.offset + args.cols;
      k.local_target = t - args.offset;
      if (k.owner) {
        float x = z[t - args.offset];
        if (!args.fused && cap > 0.0f) x = cap * tanhf(x * inv_cap);
        const double z_t = x;
        const double d_t = (z_t - shift) - log_sum;
        double dz_t = coef_d * expm1(d_t) + target_offset;
        if (ent_coef != 0.0 && exp(d_t) > 0)
          dz_t += ent_coef * exp(d_t) * (d_t + row_entropy);
        if (cap > 0.0f) {
          const double q = z_t * inv_cap;
          dz_t *= 1.0 - q * q;
        }
        k.target_grad = static_cast<float>(dz_t);
      }
      k.shift = static_cast<float>(shift);
      k.log_sum = static_cast<float>(log_sum);
      k.coef = static_cast<float>(coef_d);
      k.smooth_w = static_cast<float>(smooth_w);
      k.smoothing = smooth_w != 0.0;
      k.ent = static_cast<float>(ent_coef);
      k.entropy = ent_coef != 0.0;
      k.row_entropy = static_cast<float>(row_entropy);
    }
  }
  __syncthreads();
  if (!args.backward) return;
  void* grad = z;  // [cols] of grad_type, same start
  for (int64_t begin = 0; begin < args.cols; begin += kThreads) {
    const int64_t j = begin + threadIdx.x;
    const bool inside = j < args.cols;
    const float x = inside ? z[j] : 0.0f;
    __syncthreads();
    if (!inside) continue;
    float dz;
    if (!k.valid) {
      dz = k.ignored ? 0.0f : NAN;
    } else if (k.owner && j == k.local_target) {
      dz = k.target_grad;
    } else {
      const float zj = !args.fused && cap > 0.0f ? cap * tanhf(x * inv_cap) : x;
      const float d = (zj - k.shift) - k.log_sum;
      const float e = expf(d);
      if (k.entropy) {
        dz = e > 0.0f ? e * (k.coef + k.ent * (d + k.row_entropy)) : 0.0f;
      } else {
        dz = k.coef * e;
      }
      if (k.smoothing) {
        dz -= k.smooth_w *
              (args.class_weights != nullptr ? args.class_weights[j] : 1.0f);
      }
      if (cap > 0.0f) dz *= 1.0f - (zj * inv_cap) * (zj * inv_cap);
    }
    Store(grad, args.grad_type, j, dz);
  }
}

__device__ __forceinline__ float Load(const void* base, DType type, int64_t i) {
  switch (type) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// One thread per column; neighbouring threads read neighbouring columns of a
// row (coalesced). The rows are summed in order in f64: no atomics, no split,
// so the bytes are the same run to run.
__global__ void ColumnSumKernel(ColumnSumArgs args) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= args.cols) return;
  double sum = 0.0;
  for (int64_t i = 0; i < args.rows; ++i)
    sum += Load(args.dlogits, args.type, i * args.ld + j);
  float value = static_cast<float>(static_cast<double>(args.alpha) * sum);
  if (args.accumulate) value += args.d_bias[j];
  args.d_bias[j] = value;
}

// One block per row, threads striding over its columns.
__global__ void WidenKernel(WidenArgs args) {
  const int64_t row = blockIdx.x;
  float* dst = args.dst + row * args.dst_ld;  // [cols]
  const int64_t base = row * args.src_ld;
  for (int64_t j = threadIdx.x; j < args.cols; j += kThreads)
    dst[j] = Load(args.src, args.type, base + j);
}

bool RowsFit(int64_t rows) { return rows <= INT32_MAX; }

}  // namespace

cudaError_t LaunchRecord(const RecordArgs& args, cudaStream_t stream) {
  RecordKernel<<<1, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchTargetWeights(const TargetWeightArgs& args,
                                cudaStream_t stream) {
  if (args.tokens == 0) return cudaSuccess;
  const int64_t blocks = (args.tokens + kThreads - 1) / kThreads;
  if (!RowsFit(blocks)) return cudaErrorInvalidValue;
  TargetWeightKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

cudaError_t LaunchRowMax(const ChunkArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (!RowsFit(args.rows)) return cudaErrorInvalidValue;
  RowMaxKernel<<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchRowSums(const ChunkArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (!RowsFit(args.rows)) return cudaErrorInvalidValue;
  RowSumsKernel<<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

cudaError_t LaunchRowFinish(const ChunkArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (!RowsFit(args.rows)) return cudaErrorInvalidValue;
  RowFinishKernel<<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSum(const ColumnSumArgs& args, cudaStream_t stream) {
  if (args.cols == 0) return cudaSuccess;
  const int64_t blocks = (args.cols + kThreads - 1) / kThreads;
  if (!RowsFit(blocks)) return cudaErrorInvalidValue;
  ColumnSumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchWiden(const WidenArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (!RowsFit(args.rows)) return cudaErrorInvalidValue;
  WidenKernel<<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace vocab_parallel
}  // namespace lossrt
