// The cross-entropy forward's kernels for fp32 logits
// (loss/cross_entropy_forward.cuh).
#include <cuda_runtime.h>

#include "loss/cross_entropy_forward.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchForwardRowsF32(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream) {
  return LaunchForwardRowsOf<float>(args, tuning, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
