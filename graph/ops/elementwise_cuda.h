// CUDA launchers of the element-wise ops (graph/ops/elementwise_cuda.cu).
// Internal to //graph/ops:elementwise. Pointers are device memory; element
// counts are at most 2^31 - 1 (checked by the caller). Each launcher queues its
// kernel on `stream` and returns the launch's error.
#ifndef LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_
#define LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"

namespace lossrt {
namespace ops {
namespace cuda {

// y[i] = a[i] + b[i] for f32 (bf16 false) or bf16 (bf16 true) elements; y may
// equal a or b.
cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n,
                      bool bf16, cudaStream_t stream);

// dst[i] = src[i] or dst[i] += src[i], converting between the dtypes (each
// f32, bf16 or f64; any other is cudaErrorInvalidValue).
cudaError_t LaunchAccumulate(const void* src, DType src_dtype, void* dst,
                             DType dst_dtype, int64_t n, bool accumulate,
                             cudaStream_t stream);

}  // namespace cuda
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_OPS_ELEMENTWISE_CUDA_H_
