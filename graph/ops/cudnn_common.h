// What the graph ops' cuDNN backends share (attention_cudnn.cc and
// linear_cudnn.cc, the only files that include the cuDNN frontend): cuDNN and
// frontend errors as absl::Status with file and line, and the stream-capture
// scope in which a graph is built. Header-only, so that the frontend's slow
// headers are compiled by those two files alone. Internal to graph/ops;
// include it only where LOSSRT_WITH_CUDNN is defined.
#ifndef LOSSRT_GRAPH_OPS_CUDNN_COMMON_H_
#define LOSSRT_GRAPH_OPS_CUDNN_COMMON_H_

#ifndef LOSSRT_WITH_CUDNN
#error "graph/ops/cudnn_common.h needs cuDNN and its frontend"
#endif

// The frontend without its JSON library: graph serialization is not used, and
// the header compiles faster.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cuda_runtime.h>
#include <cudnn.h>
// The weak NVRTC references go before the frontend.
// clang-format off
#include "third_party/cudnn_frontend_weak_nvrtc.h"
#include <cudnn_frontend.h>
// clang-format on

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda_status.h"

static_assert(CUDNN_MAJOR >= 9, "the cuDNN backends need cuDNN 9");
static_assert(CUDNN_FRONTEND_VERSION >= 13200,
              "the cuDNN backends need cuDNN frontend 1.32 or later");

namespace lossrt {
namespace ops {
namespace cudnn_common {

inline absl::Status CudnnStatus(cudnnStatus_t status, const char* call,
                                const char* file, int line) {
  char detail[512] = "";
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message =
      absl::StrCat(call, " failed: ", cudnnGetErrorString(status), " (",
                   static_cast<int>(status), ") at ", file, ":", line);
  if (detail[0] != '\0') absl::StrAppend(&message, ": ", detail);
  switch (static_cast<int>(status) / 1000) {  // cuDNN 9's status classes
    case 1:  // not initialized, sub-library missing or mismatched
      return absl::UnavailableError(message);
    case 2:
      return absl::InvalidArgumentError(message);
    case 3:
      return absl::UnimplementedError(message);
    default:
      if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
          status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
        return absl::ResourceExhaustedError(message);
      }
      return absl::InternalError(message);
  }
}

inline const char* FrontendCodeName(cudnn_frontend::error_code_t code) {
  using cudnn_frontend::error_code_t;
  switch (code) {
    case error_code_t::OK:
      return "OK";
    case error_code_t::ATTRIBUTE_NOT_SET:
      return "ATTRIBUTE_NOT_SET";
    case error_code_t::SHAPE_DEDUCTION_FAILED:
      return "SHAPE_DEDUCTION_FAILED";
    case error_code_t::INVALID_TENSOR_NAME:
      return "INVALID_TENSOR_NAME";
    case error_code_t::INVALID_VARIANT_PACK:
      return "INVALID_VARIANT_PACK";
    case error_code_t::GRAPH_NOT_SUPPORTED:
      return "GRAPH_NOT_SUPPORTED";
    case error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case error_code_t::GRAPH_EXECUTION_FAILED:
      return "GRAPH_EXECUTION_FAILED";
    case error_code_t::HEURISTIC_QUERY_FAILED:
      return "HEURISTIC_QUERY_FAILED";
    case error_code_t::UNSUPPORTED_GRAPH_FORMAT:
      return "UNSUPPORTED_GRAPH_FORMAT";
    case error_code_t::CUDA_API_FAILED:
      return "CUDA_API_FAILED";
    case error_code_t::CUDNN_BACKEND_API_FAILED:
      return "CUDNN_BACKEND_API_FAILED";
    case error_code_t::INVALID_CUDA_DEVICE:
      return "INVALID_CUDA_DEVICE";
    case error_code_t::HANDLE_ERROR:
      return "HANDLE_ERROR";
    case error_code_t::INVALID_VALUE:
      return "INVALID_VALUE";
    case error_code_t::NVRTC_COMPILATION_FAILED:
      return "NVRTC_COMPILATION_FAILED";
  }
  return "unknown cuDNN frontend error";
}

// GRAPH_NOT_SUPPORTED becomes Unimplemented (callers may fall back), anything
// else Internal.
inline absl::Status FrontendStatus(cudnn_frontend::error_t error,
                                   const char* call, const char* file,
                                   int line) {
  std::string message =
      absl::StrCat(call, " failed: ", FrontendCodeName(error.get_code()), " (",
                   error.get_message(), ") at ", file, ":", line, " (cuDNN ",
                   cudnnGetVersion(),
                   "; CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr "
                   "tells more)");
  switch (error.get_code()) {
    case cudnn_frontend::error_code_t::GRAPH_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Sets this thread's CUDA stream-capture mode to relaxed for its lifetime when
// `relax` (a graph built inside a capture: cuDNN allocates and compiles, which
// the global and thread-local modes forbid), and restores it after.
class RelaxedCaptureMode {
 public:
  static absl::StatusOr<RelaxedCaptureMode> Enter(bool relax) {
    RelaxedCaptureMode scope;
    if (relax) {
      scope.mode_ = cudaStreamCaptureModeRelaxed;
      CUDA_RETURN_IF_ERROR(cudaThreadExchangeStreamCaptureMode(&scope.mode_));
      scope.restore_ = true;
    }
    return scope;
  }
  RelaxedCaptureMode(RelaxedCaptureMode&& other) noexcept
      : mode_(other.mode_), restore_(other.restore_) {
    other.restore_ = false;
  }
  RelaxedCaptureMode& operator=(RelaxedCaptureMode&&) = delete;
  ~RelaxedCaptureMode() {
    if (restore_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }

 private:
  RelaxedCaptureMode() = default;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeGlobal;
  bool restore_ = false;
};

}  // namespace cudnn_common
}  // namespace ops
}  // namespace lossrt

// For calls returning cudnnStatus_t.
#define CUDNN_RETURN_IF_ERROR(call)                        \
  do {                                                     \
    const cudnnStatus_t lossrt_cudnn_status = (call);      \
    if (lossrt_cudnn_status != CUDNN_STATUS_SUCCESS) {     \
      return ::lossrt::ops::cudnn_common::CudnnStatus(     \
          lossrt_cudnn_status, #call, __FILE__, __LINE__); \
    }                                                      \
  } while (false)

// For frontend calls returning cudnn_frontend::error_t.
#define CUDNN_FE_RETURN_IF_ERROR(call)                            \
  do {                                                            \
    ::cudnn_frontend::error_t lossrt_fe_error = (call);           \
    if (lossrt_fe_error.is_bad()) {                               \
      return ::lossrt::ops::cudnn_common::FrontendStatus(         \
          std::move(lossrt_fe_error), #call, __FILE__, __LINE__); \
    }                                                             \
  } while (false)

#endif  // LOSSRT_GRAPH_OPS_CUDNN_COMMON_H_
