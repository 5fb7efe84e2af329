// CUDA launcher of the loss checks' one kernel (loss_checks_kernels.cu): the
// deferred verdict on a target scan inside a CUDA graph capture
// (ce::DeferTargetStatsCheck in loss_checks.h). Internal to //loss.
#ifndef LOSSRT_LOSS_LOSS_CHECKS_CUDA_H_
#define LOSSRT_LOSS_LOSS_CHECKS_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

// *count += (count_invalid ? stats->invalid : 0) +
//           (count_negative_weights ? stats->negative_weights : 0),
// by one thread in stream order. `stats` is device memory; `count` may be
// mapped pinned host memory.
cudaError_t LaunchAddDeferredErrors(const TargetStats* stats,
                                    bool count_invalid,
                                    bool count_negative_weights, int64_t* count,
                                    cudaStream_t stream);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LOSS_CHECKS_CUDA_H_
