// The CUDA launcher of the random fills. Internal.
#ifndef LOSSRT_RUNTIME_RANDOM_CUDA_H_
#define LOSSRT_RUNTIME_RANDOM_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/random_kernels.h"

namespace lossrt {

// Fills `count` contiguous elements of type `dtype` on `stream`.
cudaError_t LaunchFillRandom(void* data, DType dtype, int64_t count,
                             RandomParams params, cudaStream_t stream);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_RANDOM_CUDA_H_
