// The fused cross-entropy kernels for fp32 logits with f16 gradients: the
// linear cross-entropy's chunks, whose gradient is written in place over fp32
// logits for an f16 GEMM (loss/cross_entropy_fused.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsF32ToF16(const RowArgs& args,
                                    const LaunchTuning& tuning, int num_sms,
                                    cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<float, __half>>(args, tuning, num_sms,
                                                     stream);
}

}  // namespace ce
}  // namespace lossrt
