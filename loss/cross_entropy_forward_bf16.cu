// The cross-entropy forward's kernels for bf16 logits
// (loss/cross_entropy_forward.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "loss/cross_entropy_forward.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchForwardRowsBf16(const RowArgs& args,
                                  const LaunchTuning& tuning, int num_sms,
                                  cudaStream_t stream) {
  return LaunchForwardRowsOf<__nv_bfloat16>(args, tuning, num_sms, stream);
}

}  // namespace ce
}  // namespace lossrt
