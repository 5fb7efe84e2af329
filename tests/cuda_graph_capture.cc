// CapturedGraph (tests/cuda_graph_capture.h).
#include "tests/cuda_graph_capture.h"

#include "absl/strings/str_cat.h"
#include "runtime/cuda_status.h"

namespace lossrt {
namespace test {

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status CapturedGraph::Capture(
    cudaStream_t stream, cudaStreamCaptureMode mode,
    const std::function<absl::Status()>& calls) {
  if (exec_ != nullptr) {
    return absl::FailedPreconditionError("CapturedGraph: already captured");
  }
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, mode));
  const absl::Status status = calls();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!status.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture's error is not sticky
    if (!status.ok()) return status;
    return absl::InternalError(
        absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorString(ended)));
  }
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(made);
  return absl::OkStatus();
}

absl::Status CapturedGraph::Replay(cudaStream_t stream) {
  if (exec_ == nullptr) {
    return absl::FailedPreconditionError("CapturedGraph: nothing captured");
  }
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace test
}  // namespace lossrt
