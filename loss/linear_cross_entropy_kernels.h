// The linear cross-entropy's own kernels, shared by the CPU twins
// (linear_cross_entropy_cpu.cc) and the CUDA kernels
// (linear_cross_entropy_kernels.cu): the gradient of a vocabulary slice of the
// logits, the row statistics merged over slices, and dtype conversions.
// Internal to //loss: plain pointers, no CUDA types; the per-element math is
// inline here so that both sides run the same code.
//
// Why a slice kernel of its own: ce::RowArgs describes whole rows (its `vocab`
// is both the row length and the V of the label smoothing, and targets index
// the row), so a slice [col_begin, col_begin + cols) of a row cannot be
// expressed with it.
#ifndef LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_KERNELS_H_
#define LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_KERNELS_H_

#include <cmath>
#include <cstdint>

#include "loss/cross_entropy_kernels.h"

#ifdef __CUDACC__
#define LCE_HOST_DEVICE __host__ __device__
#else
#define LCE_HOST_DEVICE
#endif

namespace lossrt {
namespace lce {

// dlogits of columns [col_begin, col_begin + cols) of `rows` rows, from the
// saved lse of the whole rows. Same definitions as the cross-entropy
// (loss/cross_entropy.h).
struct SliceArgs {
  // [rows, cols] fp32 logits, row stride ld floats. The gradient is written in
  // place in grad_type: row i of the gradient starts where row i of the logits
  // does.
  float* logits = nullptr;
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t col_begin = 0;
  int64_t vocab = 0;
  DType grad_type = DType::kF32;
  const void* targets = nullptr;  // [rows]
  bool targets_i64 = true;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  // Copied with the options; the driver refuses entropy_weight != 0 where a
  // slice would need it (the two-pass schedule, the split backward).
  float entropy_weight = 0.0f;
  const float* class_weights =
      nullptr;  // [vocab] (the whole vocabulary) or null
  int reduction = ce::kMean;
  const ce::TargetStats* stats = nullptr;  // device memory for the CUDA kernel
  const float* grad_loss = nullptr;  // null = 1; else one value or one per row
  bool grad_loss_per_row = false;
  const float* lse = nullptr;  // [rows]
  // [rows] z_t - lse of each row's target as the first pass computed it from
  // the row max and log-sum, or null (the split backward): then the target's
  // gradient comes from the lse, which loses p_t - 1 once it is below an f32
  // ulp of the lse (near-certain targets).
  const float* target_logprob = nullptr;
};

// Row statistics over vocabulary slices (the kVocabSlices schedule), merged
// slice by slice into per-row running values: row_max[i] = M, the max of the
// soft-capped logits z seen so far, and row_stats[i] (f64):
//   [kStatRest]   sum of exp(z_j - M) over the columns seen but the target's;
//   [kStatTarget] z_t once the target's slice has been seen (NaN before, and
//                 for ignored rows, whose target column counts in the rest);
//   [kStatSmooth] sum of w_j z_j (label smoothing only).
// The target's term stays out of the rest for the reason the cross-entropy's
// row kernels keep it out of their block sums: when p_t is near 1 it would
// swallow the low bits of the others, of which 1 - p_t is made.
constexpr int kStatRest = 0;
constexpr int kStatTarget = 1;
constexpr int kStatSmooth = 2;
constexpr int kStats = 3;

struct SliceStatsArgs {
  // [rows, cols] fp32 logits (not soft-capped), row stride ld floats; read
  // only.
  const float* logits = nullptr;
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t col_begin = 0;
  const void* targets = nullptr;  // [rows]
  bool targets_i64 = true;
  int64_t ignore_index = -100;
  float softcap = 0.0f;
  const float* class_weights = nullptr;  // [vocab] or null
  bool smoothing = false;                // accumulate kStatSmooth
  bool merge = false;        // false: the rows' first slice starts the values
  float* row_max = nullptr;  // [rows]
  double* row_stats = nullptr;  // [rows, kStats]
};

// kCompactChunks: SliceStats, and each logit of the slice kept as
// e = exp(z - m) in fp16, m the row's max over the slice (e = 0 where m is
// -inf), with m itself kept per row and slice. e is in [0, 1]: fp16 holds it
// to 2^-11 relative above 6e-5 and to 3e-8 absolute below, under the 16-bit
// dlogits' own rounding. No soft cap (its derivative needs z).
struct CompactStatsArgs {
  SliceStatsArgs stats;       // softcap 0
  uint16_t* probs = nullptr;  // [rows, cols] fp16, row stride probs_ld
  int64_t probs_ld = 0;
  float* slice_max = nullptr;  // [rows] m, row stride slice_max_ld floats
  int64_t slice_max_ld = 0;
};

// kCompactChunks: the dlogits of whole rows from their fp16 e (in place, in
// grad_type: element j of row i stays where its e was) and the rows' slice
// maxima, with the coefficients of SliceArgs (whose logits, ld, cols and
// col_begin are unused; softcap 0; target_logprob required): p_j =
// e_j exp(m_s(j) - lse).
struct CompactArgs {
  SliceArgs slice;  // rows, vocab, grad_type, targets, options, lse, ...
  uint16_t* probs = nullptr;  // [rows, vocab] fp16 in, grad_type out
  int64_t probs_ld = 0;
  const float* slice_max = nullptr;  // [rows, num_slices]
  int64_t slice_max_ld = 0;
  int64_t slice_cols = 0;  // columns of a slice (the last may be shorter)
};

// Each row's lse, loss (as ce::RowArgs::row_loss: divided by the mean's
// denominators when kMean) and target log-probability from its statistics
// after the last slice. Same definitions as the cross-entropy
// (loss/cross_entropy.h); ignored rows get loss 0 and target_logprob 0, an
// out-of-range target (validate_targets off) a NaN loss.
struct SliceFinishArgs {
  int64_t rows = 0;
  int64_t vocab = 0;
  const void* targets = nullptr;  // [rows]
  bool targets_i64 = true;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss = 0.0f;
  const float* class_weights = nullptr;  // [vocab] or null
  int reduction = ce::kMean;
  const ce::TargetStats* stats = nullptr;  // device memory for the CUDA kernel
  const float* row_max = nullptr;          // [rows]
  const double* row_stats = nullptr;       // [rows, kStats]
  float* lse = nullptr;                    // [rows] or null
  float* row_loss = nullptr;               // [rows] or null
  float* target_logprob = nullptr;         // [rows] or null
};

LCE_HOST_DEVICE inline float SoftcapLogit(float x, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
}

// The column of the target inside a slice of `cols` columns from `col_begin`,
// or -1 (ignored, elsewhere, out of range).
LCE_HOST_DEVICE inline int64_t SliceTargetColumn(const void* targets,
                                                 bool targets_i64, int64_t row,
                                                 int64_t ignore_index,
                                                 int64_t col_begin,
                                                 int64_t cols) {
  const int64_t target = targets_i64
                             ? static_cast<const int64_t*>(targets)[row]
                             : static_cast<const int32_t*>(targets)[row];
  if (target == ignore_index) return -1;
  const int64_t local = target - col_begin;
  return local >= 0 && local < cols ? local : -1;
}

// Merges one slice's values of a row (its max m, rest relative to m, the
// target's z or NaN when the target is not in the slice, the smoothing sum)
// into the row's running statistics.
LCE_HOST_DEVICE inline void MergeSliceStats(bool merge, float m, double rest,
                                            bool has_target, double target_z,
                                            double smooth, float* row_max,
                                            double* stats) {
  if (!merge) {
    *row_max = m;
    stats[kStatRest] = rest;
    stats[kStatTarget] = has_target ? target_z : NAN;
    stats[kStatSmooth] = smooth;
    return;
  }
  const float old_max = *row_max;
  const float new_max = old_max > m ? old_max : m;
  // exp(-inf - finite) = 0; both -inf (rows of -inf logits so far): nothing.
  const double scale_old =
      old_max == new_max ? 1.0 : exp(static_cast<double>(old_max) - new_max);
  const double scale_new =
      m == new_max ? 1.0 : exp(static_cast<double>(m) - new_max);
  *row_max = new_max;
  stats[kStatRest] = stats[kStatRest] * scale_old + rest * scale_new;
  if (has_target) stats[kStatTarget] = target_z;
  stats[kStatSmooth] += smooth;
}

// Row i of SliceFinishArgs.
LCE_HOST_DEVICE inline void FinishSliceRow(const SliceFinishArgs& args,
                                           int64_t i) {
  const int64_t target = args.targets_i64
                             ? static_cast<const int64_t*>(args.targets)[i]
                             : static_cast<const int32_t*>(args.targets)[i];
  const bool ignored = target == args.ignore_index;
  const double max = args.row_max[i];
  const double* stats = args.row_stats + i * kStats;
  const double target_z = stats[kStatTarget];
  // ignored: the target's column is in the rest; else NaN (out of range) or
  // the target's term.
  const double target_term = ignored ? 0.0 : exp(target_z - max);
  const double log_sum = log(stats[kStatRest] + target_term);
  const double lse = max + log_sum;
  if (args.lse != nullptr) args.lse[i] = static_cast<float>(lse);
  if (ignored) {
    if (args.row_loss != nullptr) args.row_loss[i] = 0.0f;
    if (args.target_logprob != nullptr) args.target_logprob[i] = 0.0f;
    return;
  }
  // lse - z_t as (max - z_t) + log S, as the row kernels: exact max - z_t.
  const double nll = (max - target_z) + log_sum;
  if (args.target_logprob != nullptr)
    args.target_logprob[i] = static_cast<float>(-nll);
  if (args.row_loss == nullptr) return;
  const bool valid = target >= 0 && target < args.vocab;
  const double w_t = !valid ? NAN
                     : args.class_weights != nullptr
                         ? args.class_weights[target]
                         : 1.0;
  const double weight_total = args.stats->weight_total;
  // A zero denominator (no counted token, or only zero-weight ones)
  // contributes 0.
  const double ce_den = args.stats->ce_denominator;
  const double z_den = args.stats->z_denominator;
  const double mean_ce = ce_den > 0 ? 1.0 / ce_den : 0.0;
  const double mean_z = z_den > 0 ? 1.0 / z_den : 0.0;
  const double s = args.label_smoothing;
  double ce = (1.0 - s) * w_t * nll;
  if (s > 0.0) {
    // sum_j w_j (lse - z_j) = W log S + (W max - sum_j w_j z_j).
    ce += s / static_cast<double>(args.vocab) *
          (weight_total * log_sum + (weight_total * max - stats[kStatSmooth]));
  }
  const double zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0;
  args.row_loss[i] = static_cast<float>(
      args.reduction == ce::kMean ? ce * mean_ce + zl * mean_z : ce + zl);
}

// dst[i, j] = scale * src[i, j] with conversion (src null: dst = scale).
struct ConvertArgs {
  const void* src =
      nullptr;  // [rows, cols], row stride src_ld elements of src_type
  DType src_type = DType::kF32;
  int64_t src_ld = 0;
  void* dst = nullptr;  // [rows, cols], row stride dst_ld elements of dst_type
  DType dst_type = DType::kF32;
  int64_t dst_ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float scale = 1.0f;
};

void SliceBackwardCpu(const SliceArgs& args);
void SliceStatsCpu(const SliceStatsArgs& args);
void CompactStatsCpu(const CompactStatsArgs& args);
void CompactBackwardCpu(const CompactArgs& args);
void SliceFinishCpu(const SliceFinishArgs& args);
void ConvertCpu(const ConvertArgs& args);

// Per-row constants of the slice gradient. With p_j = exp(z_j - lse), the
// gradient of the loss with respect to z_j (loss/cross_entropy.h's definitions)
// is
//   ce_scale * [(1 - s) w_t (p_j - [j == t]) + s / V (W p_j - w_j)] + z_scale *
//   2 z lse p_j = a * p_j - e * w_j - [j == t] * c,
// with W = sum_j w_j, ce_scale and z_scale the incoming gradient over the
// mean's denominators; then times dz/dx = 1 - (z / softcap)^2 when
// soft-capping. a = c + b, b = e * W + z_scale * 2 z lse, so that the target's
// element can be written c * (p_t - 1) + b * p_t - e * w_t with p_t - 1 from
// expm1 of its log-probability.
struct SliceRow {
  bool ignored = true;
  int64_t target = 0;
  float lse = 0.0f;
  float a = 0.0f;
  float b = 0.0f;
  float c = 0.0f;
  float e = 0.0f;
  float target_logprob = NAN;  // NaN: from the lse
  bool has_target_logprob = false;
};

LCE_HOST_DEVICE inline SliceRow MakeSliceRow(const SliceArgs& args,
                                             int64_t row) {
  SliceRow out;
  const int64_t target = args.targets_i64
                             ? static_cast<const int64_t*>(args.targets)[row]
                             : static_cast<const int32_t*>(args.targets)[row];
  if (target == args.ignore_index) return out;
  out.ignored = false;
  out.target = target;
  out.lse = args.lse[row];
  const float g = args.grad_loss == nullptr
                      ? 1.0f
                      : args.grad_loss[args.grad_loss_per_row ? row : 0];
  float ce_scale = g;
  float z_scale = g;
  if (args.reduction == ce::kMean) {
    // No counted token (or only zero weights): those parts have no gradient.
    const double ce_den = args.stats->ce_denominator;
    const double z_den = args.stats->z_denominator;
    ce_scale = ce_den > 0 ? static_cast<float>(g / ce_den) : 0.0f;
    z_scale = z_den > 0 ? static_cast<float>(g / z_den) : 0.0f;
  }
  // An out-of-range target (only possible with validate_targets off) gives NaN,
  // not a read outside the weights.
  const bool valid = target >= 0 && target < args.vocab;
  const float w_t = !valid                          ? NAN
                    : args.class_weights != nullptr ? args.class_weights[target]
                                                    : 1.0f;
  const float s = args.label_smoothing;
  const float inv_v = 1.0f / static_cast<float>(args.vocab);
  const float weight_total = static_cast<float>(args.stats->weight_total);
  out.c = ce_scale * (1.0f - s) * w_t;
  out.e = ce_scale * s * inv_v;
  out.b = out.e * weight_total + z_scale * 2.0f * args.z_loss * out.lse;
  out.a = out.c + out.b;
  if (args.target_logprob != nullptr) {
    out.has_target_logprob = true;
    out.target_logprob = args.target_logprob[row];
  }
  return out;
}

// The gradient of column `col` (of the whole vocabulary) given its logit x.
// `col` must be a column of the slice, [col_begin, col_begin + cols), inside
// [0, vocab): it indexes the class weights. Callers that walk a slice in
// fixed-size tiles skip the columns past its end rather than clamp them here.
LCE_HOST_DEVICE inline float SliceGradient(const SliceArgs& args,
                                           const SliceRow& row, float x,
                                           int64_t col) {
  if (row.ignored) return 0.0f;
  float z = x;
  float cap_derivative = 1.0f;
  if (args.softcap > 0.0f) {
    const float t = tanhf(x / args.softcap);
    z = args.softcap * t;
    cap_derivative = 1.0f - t * t;
  }
  const float w =
      args.class_weights != nullptr ? args.class_weights[col] : 1.0f;
  float dz;
  if (col != row.target) {
    dz = row.a * expf(z - row.lse) - row.e * w;
  } else {
    // d = log p_t. Near p_t = 1, c * (p_t - 1) is c * expm1(d), exact where
    // a * p_t - c would cancel; below d = -1 there is nothing to cancel.
    const float d = row.has_target_logprob ? row.target_logprob : z - row.lse;
    dz = d > -1.0f ? row.c * expm1f(d) + row.b * expf(d) - row.e * w
                   : row.a * expf(d) - row.e * w - row.c;
  }
  return dz * cap_derivative;
}

// The gradient of column `col` of a compact row (CompactArgs) from its fp16
// value e (as a float) and its slice's max m: SliceGradient without the soft
// cap, p = e exp(m - lse); the target's element from the row's
// target_logprob (required: CompactArgs::slice.target_logprob non-null).
LCE_HOST_DEVICE inline float CompactGradient(const SliceArgs& args,
                                             const SliceRow& row, float e,
                                             float m, int64_t col) {
  if (row.ignored) return 0.0f;
  const float w =
      args.class_weights != nullptr ? args.class_weights[col] : 1.0f;
  if (col != row.target) {
    // m = -inf: every logit of the slice is -inf, e = 0, and so is p.
    const float p = m == -INFINITY ? 0.0f : e * expf(m - row.lse);
    return row.a * p - row.e * w;
  }
  // The compact chunks always have the target's log-probability (their
  // finish writes it): no fallback to e and m.
  const float d = row.target_logprob;
  return d > -1.0f ? row.c * expm1f(d) + row.b * expf(d) - row.e * w
                   : row.a * expf(d) - row.e * w - row.c;
}

}  // namespace lce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_KERNELS_H_
