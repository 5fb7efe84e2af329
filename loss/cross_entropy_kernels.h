// The cross-entropy kernels' interface, shared by the CPU backend, the CUDA
// backend and the linear cross-entropy that runs them chunk by chunk. Internal
// to //loss: plain pointers, no CUDA types.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_KERNELS_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_KERNELS_H_

#include <cstdint>

#include "runtime/dtype.h"

namespace lossrt {
namespace ce {

// What a target scan finds: the denominators of the mean and whether any target
// is bad. Lives in device memory for the CUDA kernels.
struct TargetStats {
  double ce_denominator;  // sum of w[t] over counted tokens (their count
                          // without weights)
  double z_denominator;   // number of counted tokens
  double
      weight_total;  // sum_j w[j] over the vocabulary (vocab without weights)
  int64_t invalid;   // number of targets outside [0, vocab) that are not
                     // ignore_index
  int64_t negative_weights;  // number of class weights below 0 (or NaN)
};

enum ReductionKind : int { kMean = 0, kSum = 1, kNone = 2 };

// One launch of the row kernel: rows [0, rows) of a logits block.
struct RowArgs {
  const void* logits =
      nullptr;  // [rows, vocab], row stride logits_stride elements
  DType logits_type = DType::kF32;
  int64_t logits_stride = 0;
  int64_t rows = 0;
  int64_t vocab = 0;
  const void* targets = nullptr;  // [rows]
  bool targets_i64 = true;
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  const float* class_weights = nullptr;  // [vocab] or null
  float entropy_weight = 0.0f;           // -entropy_weight * H in the loss
  int reduction = kMean;
  // Denominators of the mean (device memory, from the target scan); used when
  // kMean.
  const TargetStats* stats = nullptr;
  // Incoming gradient: null = 1; else f32, one value or one per row.
  const float* grad_loss = nullptr;
  bool grad_loss_per_row = false;
  // Outputs. row_loss[i]: token i's loss, already divided by the mean's
  // denominators when kMean (so the loss is the plain sum of row_loss).
  float* row_loss = nullptr;  // [rows]
  float* lse = nullptr;       // [rows] or null
  // Extras (loss/cross_entropy.h), null when not asked for. predicted[i]:
  // the row's argmax (ties: the lowest index), i64 or i32. entropy[i]: H of
  // the row (0 when ignored); an input of the backward, which needs it when
  // entropy_weight != 0. target_logprob[i]: z_t - lse (0 when ignored).
  // row_hit[i]: w[t] / ce_denominator when predicted[i] == t on a counted row,
  // else 0 (the accuracy is their sum).
  void* predicted = nullptr;  // [rows]
  bool predicted_i64 = true;
  float* entropy = nullptr;         // [rows]
  float* target_logprob = nullptr;  // [rows]
  float* row_hit = nullptr;         // [rows]
  // Gradient (null: forward only) [rows, vocab] with row stride grad_stride
  // elements of grad_type. It may alias the logits when each grad row starts
  // where its logits row does.
  void* grad = nullptr;
  DType grad_type = DType::kF32;
  int64_t grad_stride = 0;
  // The launch comes right after LaunchTargetStats on the same stream (nothing
  // in between): on sm_90 the row kernel may then start while the scan runs,
  // reading the logits at once and the scan's results after
  // griddepcontrol.wait.
  bool follows_scan = false;
};

// Whether a forward pass computes the extras' statistics (argmax and the
// entropy sum), which the kernels compile out otherwise. target_logprob is not
// one: it comes from the loss's own statistics, in every kernel.
inline bool HasExtras(const RowArgs& args) {
  return args.predicted != nullptr || args.entropy != nullptr ||
         args.row_hit != nullptr || args.entropy_weight != 0.0f;
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_KERNELS_H_
