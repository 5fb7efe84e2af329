// The linear cross-entropy's own kernels, shared by the CPU twins
// (linear_cross_entropy_cpu.cc) and the CUDA kernels
// (linear_cross_entropy_kernels.cu): the gradient of a vocabulary slice of the
// logits and dtype conversions. Internal to //loss: plain pointers, no CUDA
// types; the per-element math is inline here so that both sides run the same
// code.
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

}  // namespace lce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_KERNELS_H_
