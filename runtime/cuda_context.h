// Typed access to a Context's CUDA objects for code built with the CUDA
// toolkit. Internal.
#ifndef LOSSRT_RUNTIME_CUDA_CONTEXT_H_
#define LOSSRT_RUNTIME_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
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

// Whether the context's stream is being captured into a CUDA graph: ops then
// skip what a capture cannot record (waits for the stream, read-backs, other
// streams and events) and defer value checks to DeferredErrorCountOf.
inline absl::StatusOr<bool> StreamIsCapturing(Context& context) {
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

// The context's cuBLASLt plan cache (fp32 accumulation), bound to its handle
// and workspace (created on first use); run its GEMMs on the context's stream.
absl::StatusOr<GemmRunner*> ContextGemmRunner(Context& context);

// A plan cache like ContextGemmRunner's with another compute type and a share
// of the context's cuBLASLt workspace (its first `workspace_bytes`), kept by
// the context and handed to every later call with the same pair: an op that
// runs GEMMs every call makes its plans (descriptors, layouts, the heuristic's
// candidates) once. Run its GEMMs on the context's stream.
absl::StatusOr<GemmRunner*> ContextGemmRunnerFor(Context& context,
                                                 int compute_type,
                                                 int64_t workspace_bytes);
inline absl::StatusOr<GemmRunner*> ContextGemmRunnerFor(
    Context& context, cublasComputeType_t compute_type,
    int64_t workspace_bytes) {
  return ContextGemmRunnerFor(context, static_cast<int>(compute_type),
                              workspace_bytes);
}

// The context's second stream (non-blocking, the device's highest priority;
// created on first use, destroyed with the context), for ops that overlap two
// kinds of work. An op that uses it orders it against the context's stream
// with events before it returns, so the context's stream stays the one that
// callers synchronize with.
absl::StatusOr<void*> ContextSideStreamHandle(Context& context);
inline absl::StatusOr<cudaStream_t> ContextSideStream(Context& context) {
  ASSIGN_OR_RETURN(void* stream, ContextSideStreamHandle(context));
  return static_cast<cudaStream_t>(stream);
}

// `count` events (cudaEventDisableTiming) of the context, created on first use
// and shared by every call: an op records and waits on them within one call
// and holds none across calls. At most 64.
absl::StatusOr<void* const*> ContextEventHandles(Context& context, int count);
inline absl::StatusOr<const cudaEvent_t*> ContextEvents(Context& context,
                                                        int count) {
  ASSIGN_OR_RETURN(void* const* events, ContextEventHandles(context, count));
  return reinterpret_cast<const cudaEvent_t*>(events);
}

// The context's table of tuned GEMM algorithms (created on first use; see
// Context::set_gemm_tuning), for runners that an op makes with its own
// workspace size or compute type.
absl::StatusOr<GemmTuning*> ContextGemmTuning(Context& context);

// The context's deferred error count (Context::TakeDeferredErrorCount): one
// int64_t in mapped pinned host memory, which kernels on the context's stream
// may add to through this pointer.
absl::StatusOr<int64_t*> DeferredErrorCountOf(Context& context);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CUDA_CONTEXT_H_
