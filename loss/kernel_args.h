// The cross-entropy kernels' launch arguments from the public options: the one
// place where a CrossEntropyOptions meets the kernels' plain fields. Used by
// the cross-entropy op, the linear cross-entropy's backends and the
// benchmarks. Internal to //loss.
//
//   ce::RowArgs args = ce::MakeRowArgs(logits.data, DType::kF32, stride, rows,
//                                      vocab, targets.data, true, options);
//   args.row_loss = ...;  // outputs, gradient and stats: the caller's
#ifndef LOSSRT_LOSS_KERNEL_ARGS_H_
#define LOSSRT_LOSS_KERNEL_ARGS_H_

#include <cstdint>

#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

// Copies the options into `args`: ce::RowArgs, lce::SliceArgs, or any struct
// with the same option fields.
template <typename Args>
void CopyOptions(const CrossEntropyOptions& options, Args* args) {
  args->ignore_index = options.ignore_index;
  args->label_smoothing = options.label_smoothing;
  args->z_loss = options.z_loss;
  args->softcap = options.softcap;
  args->entropy_weight = options.entropy_weight;
  args->class_weights = options.class_weights.has_value()
                            ? options.class_weights->data_as<const float>()
                            : nullptr;
  args->reduction = options.reduction == Reduction::kMean  ? kMean
                    : options.reduction == Reduction::kSum ? kSum
                                                           : kNone;
}

// The row kernels' inputs: `rows` rows of `vocab` logits of `logits_type`
// (DType::kF32, kBF16 or kF16), `logits_stride` elements apart, against `rows`
// targets (i64 or i32), with the options. Outputs, gradient, incoming gradient
// and stats stay unset for the caller.
inline RowArgs MakeRowArgs(const void* logits, DType logits_type,
                           int64_t logits_stride, int64_t rows, int64_t vocab,
                           const void* targets, bool targets_i64,
                           const CrossEntropyOptions& options) {
  RowArgs args;
  args.logits = logits;
  args.logits_type = logits_type;
  args.logits_stride = logits_stride;
  args.rows = rows;
  args.vocab = vocab;
  args.targets = targets;
  args.targets_i64 = targets_i64;
  CopyOptions(options, &args);
  return args;
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_KERNEL_ARGS_H_
