// CapturedGraph: for GPU tests of calls inside a CUDA graph capture. Capture()
// records calls on a stream (ending the capture whatever they return) and
// instantiates the graph; Replay() launches it and waits for it. Only in
// builds with CUDA (it uses the runtime's types).
//
//   CapturedGraph graph;
//   ASSERT_OK(graph.Capture(stream, cudaStreamCaptureModeGlobal,
//                           [&] { return SomeOp(*context, ...); }));
//   ASSERT_OK(graph.Replay(stream));
#ifndef LOSSRT_TESTS_CUDA_GRAPH_CAPTURE_H_
#define LOSSRT_TESTS_CUDA_GRAPH_CAPTURE_H_

#include <cuda_runtime.h>

#include <functional>

#include "absl/status/status.h"

namespace lossrt {
namespace test {

class CapturedGraph {
 public:
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph();

  // Captures `calls` on `stream` in `mode`. Their error if they fail, else the
  // capture's or the instantiation's; the graph is kept only when all worked.
  absl::Status Capture(cudaStream_t stream, cudaStreamCaptureMode mode,
                       const std::function<absl::Status()>& calls);

  // Launches the captured graph on `stream` and waits for it.
  absl::Status Replay(cudaStream_t stream);

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_CUDA_GRAPH_CAPTURE_H_
