// The cross-entropy forward's kernels for f16 logits
// (loss/cross_entropy_forward.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "loss/cross_entropy_forward.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchForwardRowsF16(const RowArgs& args,
                                 const LaunchTuning& tuning, int num_sms,
                                 cudaStream_t stream) {
  return LaunchForwardRowsOf<__half>(args, tuning, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
