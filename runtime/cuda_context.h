// Typed access to a Context's CUDA objects for code built with the CUDA
// toolkit. Internal.
#ifndef LOSSRT_RUNTIME_CUDA_CONTEXT_H_
#define LOSSRT_RUNTIME_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "runtime/context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/status.h"

namespace lossrt {

inline absl::StatusOr<cudaStream_t> CudaStreamOf(Context& context) {
  ASSIGN_OR_RETURN(void* stream, context.stream());
  return static_cast<cudaStream_t>(stream);
}

inline absl::StatusOr<cublasHandle_t> CublasHandleOf(Context& context) {
  ASSIGN_OR_RETURN(void* handle, context.cublas_handle());
  return static_cast<cublasHandle_t>(handle);
}

inline absl::StatusOr<cublasLtHandle_t> CublasLtHandleOf(Context& context) {
  ASSIGN_OR_RETURN(void* handle, context.cublaslt_handle());
  return static_cast<cublasLtHandle_t>(handle);
}

// The context's cuBLASLt plan cache (fp32 accumulation), bound to its handle
// and workspace; run its GEMMs on the context's stream.
inline absl::StatusOr<GemmRunner*> ContextGemmRunner(Context& context) {
  ASSIGN_OR_RETURN(void* runner, context.gemm_runner());
  return static_cast<GemmRunner*>(runner);
}

// The context's table of tuned GEMM algorithms, for runners that an op makes
// with its own workspace size or compute type.
inline absl::StatusOr<GemmTuning*> ContextGemmTuning(Context& context) {
  ASSIGN_OR_RETURN(void* tuning, context.gemm_tuning());
  return static_cast<GemmTuning*>(tuning);
}

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CUDA_CONTEXT_H_
