// The cross-entropy's one-block scans, in a fixed order (deterministic): the
// target scan (the mean's denominators, bad targets and weights) and the final
// sum of the per-row losses.
#include <cstdint>

#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_row_stats.cuh"

namespace lossrt {
namespace ce {
namespace {

// The target scan's per-thread totals, reduced together in one block sum.
struct ScanSums {
  double weight_sum = 0.0;    // sum of w[t] over counted targets
  double weight_total = 0.0;  // sum of the class weights
  long long counted = 0, invalid = 0, negative = 0;
};

__device__ __forceinline__ ScanSums& operator+=(ScanSums& a,
                                                const ScanSums& b) {
  a.weight_sum += b.weight_sum;
  a.weight_total += b.weight_total;
  a.counted += b.counted;
  a.invalid += b.invalid;
  a.negative += b.negative;
  return a;
}

template <typename V>
__device__ __forceinline__ V ShuffleDown(const V& value, int offset) {
  return __shfl_down_sync(kFullMask, value, offset);
}

template <>
__device__ __forceinline__ ScanSums ShuffleDown(const ScanSums& value,
                                                int offset) {
  ScanSums out;
  out.weight_sum = __shfl_down_sync(kFullMask, value.weight_sum, offset);
  out.weight_total = __shfl_down_sync(kFullMask, value.weight_total, offset);
  out.counted = __shfl_down_sync(kFullMask, value.counted, offset);
  out.invalid = __shfl_down_sync(kFullMask, value.invalid, offset);
  out.negative = __shfl_down_sync(kFullMask, value.negative, offset);
  return out;
}

// Block-wide sum in a fixed tree order; the result is valid in thread 0.
template <typename V>
__device__ V BlockSum(V value, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    value += ShuffleDown(value, offset);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = threadIdx.x < (blockDim.x >> 5) ? scratch[threadIdx.x] : V{};
  if (warp == 0) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      value += ShuffleDown(value, offset);
  }
  __syncthreads();
  return value;
}

// The one-block scans read kScanLoads values a thread before using any, so
// that their loads are in flight together: a scan is latency-bound, and it
// sits on the critical path (the target scan before a row kernel's first
// statistics, the loss sum after its last row), where loop-carried loads
// measured several times slower.
constexpr int kScanThreads = 1024;
constexpr int kScanLoads = 16;

// This thread's kScanLoads values of a scan's chunk at `base`: value k is
// load(i) for i = base + k * blockDim.x + threadIdx.x, or `fill` from `count`.
template <typename V, typename Load>
__device__ __forceinline__ void LoadScanChunk(int64_t base, int64_t count,
                                              V fill, Load load,
                                              V (&out)[kScanLoads]) {
#pragma unroll
  for (int k = 0; k < kScanLoads; ++k) {
    const int64_t i = base + int64_t{k} * blockDim.x + threadIdx.x;
    out[k] = i < count ? load(i) : fill;
  }
}

__global__ void __launch_bounds__(kScanThreads)
    TargetStatsKernel(const void* targets, bool targets_i64, int64_t rows,
                      int64_t vocab, int64_t ignore_index, const float* weights,
                      TargetStats* stats) {
  LetDependentGridsLaunch();  // the row kernel may start on the logits now
  __shared__ ScanSums scratch[32];
  ScanSums sums;
  for (int64_t base = 0; base < rows;
       base += int64_t{kScanLoads} * blockDim.x) {
    int64_t t[kScanLoads];
    LoadScanChunk(
        base, rows, ignore_index,
        [&](int64_t i) -> int64_t {
          return targets_i64 ? static_cast<const int64_t*>(targets)[i]
                             : static_cast<const int32_t*>(targets)[i];
        },
        t);
    float w[kScanLoads];
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) {
      const bool valid = t[k] != ignore_index && t[k] >= 0 && t[k] < vocab;
      w[k] = weights != nullptr && valid ? weights[t[k]] : 1.0f;
    }
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) {
      if (t[k] == ignore_index) continue;
      if (t[k] < 0 || t[k] >= vocab) {
        ++sums.invalid;
        continue;
      }
      ++sums.counted;
      sums.weight_sum += static_cast<double>(w[k]);
    }
  }
  if (weights != nullptr) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float w = weights[j];
      if (!(w >= 0.0f)) ++sums.negative;
      sums.weight_total += w;
    }
  }
  sums = BlockSum(sums, scratch);
  if (threadIdx.x == 0) {
    stats->ce_denominator = weights != nullptr
                                ? sums.weight_sum
                                : static_cast<double>(sums.counted);
    stats->z_denominator = static_cast<double>(sums.counted);
    stats->weight_total =
        weights != nullptr ? sums.weight_total : static_cast<double>(vocab);
    stats->invalid = sums.invalid;
    stats->negative_weights = sums.negative;
  }
}

__global__ void __launch_bounds__(kScanThreads)
    SumRowsKernel(const float* row_loss, int64_t rows, float* loss) {
  WaitForPrerequisiteGrids();  // the row kernel's losses
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int64_t base = 0; base < rows;
       base += int64_t{kScanLoads} * blockDim.x) {
    float value[kScanLoads];
    LoadScanChunk(
        base, rows, 0.0f, [&](int64_t i) { return row_loss[i]; }, value);
#pragma unroll
    for (int k = 0; k < kScanLoads; ++k) sum += value[k];
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(sum);
}

}  // namespace

cudaError_t LaunchTargetStats(const void* targets, bool targets_i64,
                              int64_t rows, int64_t vocab, int64_t ignore_index,
                              const float* class_weights, TargetStats* stats,
                              cudaStream_t stream) {
  TargetStatsKernel<<<1, kScanThreads, 0, stream>>>(
      targets, targets_i64, rows, vocab, ignore_index, class_weights, stats);
  return cudaGetLastError();
}

cudaError_t LaunchSumRows(const float* row_loss, int64_t rows, float* loss,
                          cudaStream_t stream, bool follows_rows) {
  return LaunchDependent(follows_rows, SumRowsKernel, 1, kScanThreads, 0, 1,
                         stream, row_loss, rows, loss);
}

}  // namespace ce
}  // namespace lossrt
