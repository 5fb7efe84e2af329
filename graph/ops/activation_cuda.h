// CUDA launchers of the activation kernels (graph/ops/activation_cuda.cu).
// Internal to //graph/ops:activation. Pointers are device memory holding f32
// (bf16 false) or bf16 (bf16 true) elements; sizes are at most 2^31 - 1
// elements (checked by the caller). Each launcher queues its kernel on
// `stream` and returns the launch's error.
#ifndef LOSSRT_GRAPH_OPS_ACTIVATION_CUDA_H_
#define LOSSRT_GRAPH_OPS_ACTIVATION_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace ops {
namespace cuda {

// y = gelu(x) over n elements (y may be x).
cudaError_t LaunchGeluForward(const void* x, void* y, int64_t n, bool bf16,
                              cudaStream_t stream);
// dx (+)= dy * gelu'(x) over n elements (dx may be x or dy).
cudaError_t LaunchGeluBackward(const void* x, const void* dy, void* dx,
                               int64_t n, bool accumulate, bool bf16,
                               cudaStream_t stream);
// y [rows, width] = silu(x[:, :width]) * x[:, width:] with x [rows, 2 width].
cudaError_t LaunchSwiGluForward(const void* x, void* y, int64_t rows,
                                int64_t width, bool bf16, cudaStream_t stream);
// dx [rows, 2 width] (+)= the SwiGLU gradient from x [rows, 2 width] and
// dy [rows, width] (dx may be x).
cudaError_t LaunchSwiGluBackward(const void* x, const void* dy, void* dx,
                                 int64_t rows, int64_t width, bool accumulate,
                                 bool bf16, cudaStream_t stream);

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ACTIVATION_CUDA_H_
