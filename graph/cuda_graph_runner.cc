// Graph: the CUDA-graph runner. ForwardBackward(/*use_cuda_graph=*/true)
// captures one forward and backward pass on the context's stream into a CUDA
// graph on its first call and replays it after that; the destructor releases
// the instantiated graph.
#include "absl/status/status.h"
#include "graph/graph.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

namespace lossrt {
namespace graph {

Graph::~Graph() {
#ifdef LOSSRT_WITH_CUDA
  if (cuda_graph_exec_ != nullptr) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(cuda_graph_exec_));
  }
#endif
}

absl::Status Graph::ForwardBackward(
    bool use_cuda_graph, const std::function<absl::Status()>& after_backward) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("ForwardBackward before Compile");
  }
  if (!use_cuda_graph || !context_->device().is_cuda()) {
    RETURN_IF_ERROR(Forward(/*training=*/true));
    RETURN_IF_ERROR(Backward());
    return after_backward ? after_backward() : absl::OkStatus();
  }
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(*context_));
  if (cuda_graph_exec_ == nullptr) {
    // Relaxed: a call the capture cannot record (none is expected) runs
    // instead of invalidating the capture.
    CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    absl::Status status = Forward(/*training=*/true);
    if (status.ok()) status = Backward();
    if (status.ok() && after_backward) status = after_backward();
    cudaGraph_t captured = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &captured);
    if (status.ok() && end != cudaSuccess) {
      status = CudaStatus(end, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    cudaGraphExec_t exec = nullptr;
    if (status.ok()) {
      const cudaError_t made = cudaGraphInstantiate(&exec, captured, 0);
      if (made != cudaSuccess) {
        status = CudaStatus(made, "cudaGraphInstantiate", __FILE__, __LINE__);
      }
    }
    if (captured != nullptr) cudaGraphDestroy(captured);
    if (!status.ok()) {
      cudaGetLastError();  // a failed capture leaves a sticky-free error
      return status;
    }
    cuda_graph_exec_ = exec;
  }
  CUDA_RETURN_IF_ERROR(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(cuda_graph_exec_), stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError("CUDA graphs: built without CUDA");
#endif
}

}  // namespace graph
}  // namespace lossrt
