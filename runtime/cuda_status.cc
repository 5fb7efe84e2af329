// Status conversions for CUDA runtime and cuBLAS errors.
#include "runtime/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace lossrt {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file,
                        int line) {
  std::string message =
      absl::StrCat(call, " failed: ", cudaGetErrorName(error), " (",
                   cudaGetErrorString(error), ") at ", file, ":", line);
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, const char* call,
                          const char* file, int line) {
  std::string message =
      absl::StrCat(call, " failed: ", cublasGetStatusName(status), " (",
                   cublasGetStatusString(status), ") at ", file, ":", line);
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace lossrt
