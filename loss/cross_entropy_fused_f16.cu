// The fused cross-entropy kernels for f16 logits and gradients
// (loss/cross_entropy_fused.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsF16(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<__half, __half>>(args, tuning, num_sms,
                                                      stream);
}

}  // namespace ce
}  // namespace lossrt
