// The cross-entropy kernels' entry points (loss/cross_entropy_cuda.h and, for
// the benchmark's sweep, loss/cross_entropy_tuning.h): argument checks, then
// the kernel family: the warp-per-row forward, the fused register/cluster
// kernel (split by element types over three files) or the backward.
#include <cuda_runtime.h>

#include <cstdint>

#include "loss/cross_entropy_cuda.h"
#include "loss/cross_entropy_launch.cuh"
#include "loss/cross_entropy_tuning.h"

namespace lossrt {
namespace ce {

cudaError_t LaunchRowsTuned(const RowArgs& args, const LaunchTuning& tuning,
                            int num_sms, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.vocab <= 0 || args.vocab > INT32_MAX / 2)
    return cudaErrorInvalidValue;
  if (args.grad == nullptr)
    return LaunchForwardRows(args, tuning, num_sms, stream);
  if (args.logits_type != DType::kF32)
    return LaunchFusedRows16Bit(args, tuning, num_sms, stream);
  return args.grad_type == DType::kF32
             ? LaunchFusedRowsF32(args, tuning, num_sms, stream)
             : LaunchFusedRowsF32To16Bit(args, tuning, num_sms, stream);
}

cudaError_t LaunchRows(const RowArgs& args, int num_sms, cudaStream_t stream) {
  return LaunchRowsTuned(args, LaunchTuning{}, num_sms, stream);
}

cudaError_t LaunchBackwardTuned(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.vocab <= 0 || args.vocab > INT32_MAX / 2 || args.lse == nullptr ||
      args.grad == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchBackwardRows(args, tuning, num_sms, stream);
}

cudaError_t LaunchBackward(const RowArgs& args, int num_sms,
                           cudaStream_t stream) {
  return LaunchBackwardTuned(args, LaunchTuning{}, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
