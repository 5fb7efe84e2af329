// CUDA fill kernel for runtime/random.h: one thread per element, grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/device_convert.cuh"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/random_cuda.h"

namespace lossrt {
namespace {

using device_convert::Convert;

template <typename T>
__global__ void FillRandomKernel(T* data, int64_t count, RandomParams params) {
  const bool uniform = params.kind == RandomKind::kUniform;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T value = Convert<T>(RandomValue(params, static_cast<uint64_t>(i)));
    // Keep uniform draws below b after rounding to T, as the host fill does.
    if (uniform && Convert<double>(value) >= params.b)
      value = Convert<T>(params.below_b);
    data[i] = value;
  }
}

template <typename T>
cudaError_t Launch(void* data, int64_t count, RandomParams params,
                   cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = CeilDiv<int64_t>(count, threads);
  FillRandomKernel<T>
      <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0,
         stream>>>(static_cast<T*>(data), count, params);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFillRandom(void* data, DType dtype, int64_t count,
                             RandomParams params, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kF32:
      return Launch<float>(data, count, params, stream);
    case DType::kF64:
      return Launch<double>(data, count, params, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(data, count, params, stream);
    case DType::kF16:
      return Launch<__half>(data, count, params, stream);
    case DType::kI32:
      return Launch<int32_t>(data, count, params, stream);
    case DType::kI64:
      return Launch<int64_t>(data, count, params, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lossrt
