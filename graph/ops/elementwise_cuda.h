// CUDA launchers of the element-wise ops (graph/ops/elementwise_cuda.cu).
// Internal to //graph/ops:elementwise. Pointers are device memory; element
// counts are at most 2^31 - 1 (checked by the caller). Each launcher queues its
// kernel on `stream` and returns the launch's error.
#ifndef LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_
#define LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace lossrt {
namespace ops {
namespace cuda {

// The element types the element-wise kernels read and write.
enum class ElementType { kF32, kBF16, kF64 };

// y[i] = a[i] + b[i] for f32 (bf16 false) or bf16 (bf16 true) elements; y may
// equal a or b.
cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n,
                      bool bf16, cudaStream_t stream);

// dst[i] = src[i] or dst[i] += src[i], converting between the element types.
cudaError_t LaunchAccumulate(const void* src, ElementType src_type, void* dst,
                             ElementType dst_type, int64_t n, bool accumulate,
                             cudaStream_t stream);

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_
