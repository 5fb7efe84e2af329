// The CUDA kernels of the two vocabulary-parallel ops
// (vocab_parallel_kernels.cu) and their arguments, used by the CUDA paths of
// vocab_parallel_cross_entropy.cc and vocab_parallel_linear_cross_entropy.cc:
// the rank's record (the checks' verdict and the target sums exchanged before
// anything is written), the target weights from their owners, and per row of
// a token chunk of fp32 logits the local max, the sums relative to the global
// max, and the loss, lse and dlogits; the logits widened to fp32 and the
// d_bias column sums. Internal to //loss. The per-row math mirrors the CPU
// twins of vocab_parallel_internal.h term for term (same f32/f64 types).
#ifndef LOSSRT_LOSS_VOCAB_PARALLEL_KERNELS_H_
#define LOSSRT_LOSS_VOCAB_PARALLEL_KERNELS_H_

#include <cstdint>

#include "runtime/dtype.h"

// The launchers: for nvcc and for host code built with the toolkit.
#if defined(LOSSRT_WITH_CUDA) || defined(__CUDACC__)
#define LOSSRT_VOCAB_PARALLEL_LAUNCHERS 1
#include <cuda_runtime.h>
#endif

namespace lossrt {
namespace vocab_parallel {

// The exchanged record of a rank (i64). The fields from kInvalid on are
// written by the device (CUDA path; 0 on the CPU, whose ranks check their
// targets before the exchange).
enum Field : int64_t {
  kOk,
  kOffset,
  kLocalVocab,
  kVocab,
  kTokens,
  kHidden,
  kChunkRows,  // the most rows a chunk may have on this rank
  kPass,
  kOptions,  // a hash of the options that decide the collectives and results
  kTargets,  // a hash of the targets (the same on every rank)
  kInvalid,  // targets outside [0, V) that are not ignore_index
  kCounted,  // tokens neither ignored nor invalid
  kNegativeWeights,  // this rank's class weights below 0 or NaN
  kTargetWeightSum,  // f64 bits: sum of w[t] over counted tokens this rank owns
  kWeightSum,        // f64 bits: sum of this rank's class weights
  kFields,
};

// Per-row sums exchanged with kSum (f64): S = sum_j exp(z_j - M), the
// smoothing's sum_j w_j (M - z_j), the owner's M - z_t, and the entropy's
// centered sum sum_j exp(z_j - M) (z_j - M).
constexpr int64_t kSumExp = 0;
constexpr int64_t kSmoothSum = 1;
constexpr int64_t kTargetGap = 2;
constexpr int64_t kCentered = 3;
constexpr int64_t kRowSums = 4;

// The record: `fields` (host-known, kOk .. kOptions) copied to `record`, then
// (scan) the target fields computed from the targets and class weights.
struct RecordArgs {
  int64_t fields[kFields] = {};
  int64_t* record = nullptr;      // [kFields], device
  bool scan = false;              // false: a rank that rejected its inputs
  const void* targets = nullptr;  // [tokens]
  bool targets_i64 = true;
  int64_t tokens = 0;
  int64_t vocab = 0;
  int64_t ignore_index = -100;
  int64_t offset = 0;                    // this rank's first row
  int64_t local_vocab = 0;               // V_r
  const float* class_weights = nullptr;  // [V_r] or null
};

// target_weight[i] = w[t_i - offset] where this rank owns t_i, else 0.
struct TargetWeightArgs {
  const void* targets = nullptr;  // [tokens]
  bool targets_i64 = true;
  int64_t tokens = 0;
  int64_t offset = 0;
  int64_t local_vocab = 0;
  const float* class_weights = nullptr;  // [V_r]
  double* target_weight = nullptr;       // [tokens]
};

// One token chunk of `rows` rows (pointers already at the chunk's first row).
struct ChunkArgs {
  float* logits = nullptr;  // [rows, ld] fp32; dlogits in place (grad_type)
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;  // V_r
  int64_t offset = 0;
  int64_t vocab = 0;
  const void* targets = nullptr;  // [rows]
  bool targets_i64 = true;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  float entropy_weight = 0.0f;
  const float* class_weights = nullptr;   // [V_r] or null
  const double* target_weight = nullptr;  // [rows]; null: 1
  float* row_max = nullptr;               // [rows]
  double* sums = nullptr;                 // [rows, kRowSums]
  float* lse = nullptr;                   // [rows]: out (fused) or in
  float* row_loss = nullptr;              // [rows] or null
  bool mean = false;
  double ce_scale = 1.0;  // 1 / ce_denominator (mean), else 1
  double z_scale = 1.0;
  double weight_total = 0.0;
  // The finishing kernel: forward (loss and lse from max and sums; the logits
  // were soft-capped in place by the max kernel) and/or backward.
  bool fused = true;
  bool backward = false;
  DType grad_type = DType::kF32;
  const float* grad_loss = nullptr;  // null: 1; else [1] or [rows]
  bool grad_loss_per_row = false;
  float dlogits_scale = 1.0f;
};

// d_bias[j] (+)= alpha * sum over the chunk's rows of dlogits[i, j]: one
// thread per column summing its rows in order (f64), so the result does not
// depend on a GEMM algorithm choice or on atomics, and is the same run to run.
struct ColumnSumArgs {
  const void* dlogits = nullptr;  // [rows, ld] of `type`
  DType type = DType::kF32;
  int64_t ld = 0;  // the dlogits' row stride (elements of `type`)
  int64_t rows = 0;
  int64_t cols = 0;  // V_r
  float alpha = 1.0f;
  bool accumulate = false;  // false: d_bias = the sum (its old bytes unread)
  float* d_bias = nullptr;  // [cols] fp32
};

// dst = src widened to fp32: a token chunk of the logits for the row kernels.
struct WidenArgs {
  const void* src = nullptr;  // [rows, cols] of `type`, row stride src_ld
  DType type = DType::kF32;
  int64_t src_ld = 0;
  float* dst = nullptr;  // [rows, cols] fp32, row stride dst_ld
  int64_t dst_ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

#ifdef LOSSRT_VOCAB_PARALLEL_LAUNCHERS
cudaError_t LaunchRecord(const RecordArgs& args, cudaStream_t stream);
cudaError_t LaunchTargetWeights(const TargetWeightArgs& args,
                                cudaStream_t stream);
// Soft-caps the logits in place and writes each row's local max.
cudaError_t LaunchRowMax(const ChunkArgs& args, cudaStream_t stream);
// The row sums relative to row_max (the global max by then).
cudaError_t LaunchRowSums(const ChunkArgs& args, cudaStream_t stream);
// Loss and lse (fused) and the dlogits in place (backward).
cudaError_t LaunchRowFinish(const ChunkArgs& args, cudaStream_t stream);
cudaError_t LaunchColumnSum(const ColumnSumArgs& args, cudaStream_t stream);
cudaError_t LaunchWiden(const WidenArgs& args, cudaStream_t stream);
#endif

}  // namespace vocab_parallel
}  // namespace lossrt

#endif  // LOSSRT_LOSS_VOCAB_PARALLEL_KERNELS_H_
