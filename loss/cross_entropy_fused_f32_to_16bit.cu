// The fused cross-entropy kernels for fp32 logits with bf16 or f16 gradients:
// the linear cross-entropy's chunks, whose gradient is written in place over
// fp32 logits for a 16-bit GEMM (loss/cross_entropy_fused.cuh). Their rows
// are always 16-byte aligned, so these pairs have no unaligned kernels
// (DispatchRowKernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "loss/cross_entropy_fused.cuh"

namespace lossrt {
namespace ce {

cudaError_t LaunchFusedRowsF32ToBf16(const RowArgs& args,
                                     const LaunchTuning& tuning, int num_sms,
                                     cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<float, __nv_bfloat16>>(args, tuning,
                                                            num_sms, stream);
}

cudaError_t LaunchFusedRowsF32ToF16(const RowArgs& args,
                                    const LaunchTuning& tuning, int num_sms,
                                    cudaStream_t stream) {
  return LaunchFusedRowsOf<std::pair<float, __half>>(args, tuning, num_sms,
                                                     stream);
}

}  // namespace ce
}  // namespace lossrt
