// The cross-entropy kernels' entry points (loss/cross_entropy_cuda.h and, for
// the benchmark's sweep, loss/cross_entropy_tuning.h): argument checks, then
// the kernel family: the warp-per-row forward, the fused register/cluster
// kernel or the backward, each split by element types over files. Host code
// only (the families' .cu files hold the kernels), so the C++ compiler builds
// it; only with the CUDA toolkit (LOSSRT_WITH_CUDA).
#ifdef LOSSRT_WITH_CUDA
#include "loss/cross_entropy_launch.cuh"

#include <cuda_runtime.h>

#include <cstdint>

#include "loss/cross_entropy_cuda.h"
#include "loss/cross_entropy_tuning.h"

namespace lossrt {
namespace ce {

cudaError_t LaunchRowsTuned(const RowArgs& args, const LaunchTuning& tuning,
                            int num_sms, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  if (args.vocab <= 0 || args.vocab > INT32_MAX / 2)
    return cudaErrorInvalidValue;
  // Each family's file holds one type (pair): the others return
  // cudaErrorInvalidValue, as do pairs that no file holds.
  if (args.grad == nullptr) {
    switch (args.logits_type) {
      case DType::kF32:
        return LaunchForwardRowsF32(args, tuning, num_sms, stream);
      case DType::kBF16:
        return LaunchForwardRowsBf16(args, tuning, num_sms, stream);
      default:
        return LaunchForwardRowsF16(args, tuning, num_sms, stream);
    }
  }
  switch (args.logits_type) {
    case DType::kBF16:
      return LaunchFusedRowsBf16(args, tuning, num_sms, stream);
    case DType::kF16:
      return LaunchFusedRowsF16(args, tuning, num_sms, stream);
    default:
      break;
  }
  switch (args.grad_type) {
    case DType::kF32:
      return LaunchFusedRowsF32(args, tuning, num_sms, stream);
    case DType::kBF16:
      return LaunchFusedRowsF32ToBf16(args, tuning, num_sms, stream);
    default:
      return LaunchFusedRowsF32ToF16(args, tuning, num_sms, stream);
  }
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

#endif  // LOSSRT_WITH_CUDA
