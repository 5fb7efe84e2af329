// CUDA launchers of the linear cross-entropy's own kernels
// (linear_cross_entropy_kernels.cu); contracts in
// linear_cross_entropy_kernels.h. Internal to //loss.
#ifndef LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_CUDA_H_
#define LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_CUDA_H_

#include <cuda_runtime.h>

#include "loss/linear_cross_entropy_kernels.h"

namespace lossrt {
namespace lce {

// One block per row; args.stats, lse, targets and weights in device memory.
cudaError_t LaunchSliceBackward(const SliceArgs& args, cudaStream_t stream);

// One block per row: merges a slice into the rows' statistics.
cudaError_t LaunchSliceStats(const SliceStatsArgs& args, cudaStream_t stream);
// One thread per row.
cudaError_t LaunchSliceFinish(const SliceFinishArgs& args, cudaStream_t stream);

// kCompactChunks, one block per row: LaunchSliceStats plus the slice's fp16
// probabilities and max; then the dlogits of whole rows from them.
cudaError_t LaunchCompactStats(const CompactStatsArgs& args,
                               cudaStream_t stream);
cudaError_t LaunchCompactBackward(const CompactArgs& args, cudaStream_t stream);

cudaError_t LaunchConvert(const ConvertArgs& args, cudaStream_t stream);

}  // namespace lce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_CUDA_H_
