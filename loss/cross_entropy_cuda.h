// CUDA launchers of the cross-entropy kernels (loss/cross_entropy_launch.cc,
// _scan.cu and the kernel families they call). Internal to //loss; used by the
// cross-entropy op and, chunk by chunk, by the linear cross-entropy.
#ifndef LOSSRT_LOSS_CROSS_ENTROPY_CUDA_H_
#define LOSSRT_LOSS_CROSS_ENTROPY_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "loss/cross_entropy_kernels.h"

namespace lossrt {
namespace ce {

// Scans the targets on the GPU in one block (fixed order, so deterministic):
// writes the mean's denominators and the count of invalid targets to `stats`
// (device memory).
cudaError_t LaunchTargetStats(const void* targets, bool targets_i64,
                              int64_t rows, int64_t vocab, int64_t ignore_index,
                              const float* class_weights, TargetStats* stats,
                              cudaStream_t stream);

// Forward (args.grad == null) or fused forward+backward over args.rows rows;
// each row is read from device memory once. `num_sms` is the device's
// multiprocessor count.
cudaError_t LaunchRows(const RowArgs& args, int num_sms, cudaStream_t stream);

// Backward from a saved lse (args.lse is an input here; row_loss is not
// written): one read of the logits, one write of the gradient.
cudaError_t LaunchBackward(const RowArgs& args, int num_sms,
                           cudaStream_t stream);

// loss[0] = sum of row_loss[0..rows) as f32, summed in double in a fixed order.
// `follows_rows`: the launch comes right after the LaunchRows that writes
// row_loss, on the same stream, and may overlap its tail (sm_90).
cudaError_t LaunchSumRows(const float* row_loss, int64_t rows, float* loss,
                          cudaStream_t stream, bool follows_rows = false);

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_CROSS_ENTROPY_CUDA_H_
