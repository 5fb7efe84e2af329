// The fused cross-entropy kernels for fp32 logits and gradients.
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsF32(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<float, float>>(args, tuning, num_sms,
                                                    stream);
}

}  // namespace ce
}  // namespace lossrt
