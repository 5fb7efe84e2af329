// The fused cross-entropy kernels for bf16 and f16 logits and gradients
// (loss/cross_entropy_fused.cuh). One file for both, as for the forward: an
// nvcc action has a fixed cost of its own (the headers' front end and host
// compile, about 4 s over three GPU targets).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

cudaError_t LaunchFusedRowsF16(const RowArgs& args, const LaunchTuning& tuning,
                               int num_sms, cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<__half, __half>>(args, tuning, num_sms,
                                                      stream);
}

}  // namespace ce
}  // namespace lossrt
