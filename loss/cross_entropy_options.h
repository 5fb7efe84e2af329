// Copies a CrossEntropyOptions into the kernels' launch arguments (ce::RowArgs,
// or any struct with the same option fields). Internal to //loss: the one place
// where the public options meet the kernels' plain fields.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_OPTIONS_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_OPTIONS_H_

#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

template <typename Args>
void CopyOptions(const CrossEntropyOptions& options, Args* args) {
  args->ignore_index = options.ignore_index;
  args->label_smoothing = options.label_smoothing;
  args->z_loss = options.z_loss;
  args->softcap = options.softcap;
  args->class_weights = options.class_weights.has_value()
                            ? options.class_weights->data_as<const float>()
                            : nullptr;
  args->reduction = options.reduction == Reduction::kMean  ? kMean
                    : options.reduction == Reduction::kSum ? kSum
                                                           : kNone;
}

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_OPTIONS_H_
