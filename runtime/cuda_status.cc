// Status conversions for CUDA runtime, cuBLAS and NCCL errors.
#include "runtime/cuda_status.h"

#include <string>

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

absl::Status NcclStatus(int result, const char* call, const char* file,
                        int line) {
  // ncclResult_t's values (nccl.h; stable across NCCL 2 releases), named here
  // so that this file does not link libnccl.
  static constexpr const char* kNames[] = {
      "ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
      "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
      "ncclRemoteError",   "ncclInProgress"};
  const std::string name = result >= 0 && result < 8
                               ? std::string(kNames[result])
                               : absl::StrCat("NCCL error ", result);
  std::string message = absl::StrCat(call, " failed: ", name, " at ", file, ":",
                                     line, " (NCCL_DEBUG=WARN tells more)");
  switch (result) {
    case 4:  // ncclInvalidArgument
    case 5:  // ncclInvalidUsage
      return absl::InvalidArgumentError(message);
    case 6:  // ncclRemoteError: a peer failed or went away
      return absl::UnavailableError(message);
    case 7:  // ncclInProgress
      return absl::DeadlineExceededError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace lossrt
