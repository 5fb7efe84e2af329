// The fused cross-entropy kernels for bf16 logits and gradients
// (loss/cross_entropy_fused.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsBf16(const RowArgs& args, const LaunchTuning& tuning,
                                int num_sms, cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<__nv_bfloat16, __nv_bfloat16>>(
      args, tuning, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
