// The fused cross-entropy kernels for fp32 logits with bf16 or f16 gradients:
// the linear cross-entropy's chunks, whose gradient is written in place over
// fp32 logits for a 16-bit GEMM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsF32To16Bit(const RowArgs& args,
                                      const LaunchTuning& tuning, int num_sms,
                                      cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<float, __nv_bfloat16>,
                           std::pair<float, __half>>(args, tuning, num_sms,
                                                     stream);
}

}  // namespace ce
}  // namespace lossrt
