// The cross-entropy forward's kernels for bf16 and f16 logits
// (loss/cross_entropy_forward.cuh). One file for both: each type's kernels
// are few, and an nvcc action has a fixed cost of its own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "loss/cross_entropy_forward.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchForwardRowsBf16(const RowArgs& args,
                                  const LaunchTuning& tuning, int num_sms,
                                  cudaStream_t stream) {
  return LaunchForwardRowsOf<__nv_bfloat16>(args, tuning, num_sms, stream);
}

cudaError_t LaunchForwardRowsF16(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream) {
  return LaunchForwardRowsOf<__half>(args, tuning, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
