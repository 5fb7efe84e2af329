// Turns CUDA runtime, cuBLAS and NCCL return codes into absl::Status naming the
// call, file and line. Internal to the libraries: include only from code built
// with the CUDA toolkit.
#ifndef LOSSRT_RUNTIME_CUDA_STATUS_H_
#define LOSSRT_RUNTIME_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace lossrt {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file,
                        int line);
absl::Status CublasStatus(cublasStatus_t status, const char* call,
                          const char* file, int line);
// `result` is an ncclResult_t taken as an int, so that this header and its
// library need neither nccl.h nor libnccl (only code that calls NCCL does).
absl::Status NcclStatus(int result, const char* call, const char* file,
                        int line);

}  // namespace lossrt

#define CUDA_RETURN_IF_ERROR(call)                                    \
  do {                                                                \
    cudaError_t lossrt_cuda_error = (call);                           \
    if (lossrt_cuda_error != cudaSuccess) {                           \
      return ::lossrt::CudaStatus(lossrt_cuda_error, #call, __FILE__, \
                                  __LINE__);                          \
    }                                                                 \
  } while (false)

#define CUBLAS_RETURN_IF_ERROR(call)                                       \
  do {                                                                     \
    cublasStatus_t lossrt_cublas_status = (call);                          \
    if (lossrt_cublas_status != CUBLAS_STATUS_SUCCESS) {                   \
      return ::lossrt::CublasStatus(lossrt_cublas_status, #call, __FILE__, \
                                    __LINE__);                             \
    }                                                                      \
  } while (false)

// For NCCL calls (ncclResult_t; ncclSuccess is 0).
#define NCCL_RETURN_IF_ERROR(call)                                     \
  do {                                                                 \
    const int lossrt_nccl_result = static_cast<int>(call);             \
    if (lossrt_nccl_result != 0) {                                     \
      return ::lossrt::NcclStatus(lossrt_nccl_result, #call, __FILE__, \
                                  __LINE__);                           \
    }                                                                  \
  } while (false)

#endif  // LOSSRT_RUNTIME_CUDA_STATUS_H_
