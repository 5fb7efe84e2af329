// The cuDNN backend of the GELU MLP's first GEMM (linear_cudnn.h): the
// frontend graph matmul + bias + GELU (tanh) with the pre-activation as a
// second output, its zero-workspace plans, the bit-preserving choice among
// them, and a per-context cache. With attention_cudnn.cc, one of the two
// files that include the cuDNN frontend (through cudnn_common.h).
#include "graph/ops/linear_cudnn.h"

#ifdef LOSSRT_WITH_CUDNN

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/cudnn_common.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/gemm_checksum.h"
#include "runtime/status.h"

namespace lossrt {
namespace ops {
namespace linear_cudnn {
namespace {

namespace fe = cudnn_frontend;
using cudnn_common::RelaxedCaptureMode;

// Uids of the graph's tensors; the sorted-pointer execute takes the device
// pointers in increasing uid order (x, weight, [bias,] h, a).
enum Uid : int64_t { kX = 1, kWeight = 2, kBias = 3, kH = 4, kA = 5 };

// Tunings whose h was all zeros tell the plans apart by nothing: after this
// many the shape keeps its first plan (as the GEMM tuning does).
constexpr int kMaxUninformativeTunings = 3;
constexpr int kTimedRuns = 3;

struct Key {
  int64_t rows, in, out;
  bool bias;
  auto Tie() const { return std::tie(rows, in, out, bias); }
  bool operator<(const Key& other) const { return Tie() < other.Tie(); }
};

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<int64_t> plans;  // built, no workspace, the heuristic's order
  int64_t chosen = 0;          // index into plans
  bool tuned = false;
  int uninformative_tunings = 0;
  // Unimplemented where cuDNN has no plan for the shape (no graph kept).
  absl::Status unsupported;
};

// A [1, rows, cols] bf16 tensor with the given strides of rows and columns.
std::shared_ptr<fe::graph::Tensor_attributes> Matrix(fe::graph::Graph& graph,
                                                     const char* name, Uid uid,
                                                     int64_t rows, int64_t cols,
                                                     int64_t row_stride,
                                                     int64_t col_stride) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, rows, cols})
                          .set_stride({rows * cols, row_stride, col_stride})
                          .set_data_type(fe::DataType_t::BFLOAT16));
}

std::shared_ptr<fe::graph::Graph> DescribeGraph(const Key& key) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // x [rows, in]; weight [out, in] row-major read as the [in, out] operand.
  auto x = Matrix(*graph, "x", kX, key.rows, key.in, key.in, 1);
  auto weight_t =
      Matrix(*graph, "weight_t", kWeight, key.in, key.out, 1, key.in);
  auto product =
      graph->matmul(x, weight_t,
                    fe::graph::Matmul_attributes().set_compute_data_type(
                        fe::DataType_t::FLOAT));
  std::shared_ptr<fe::graph::Tensor_attributes> h = product;
  if (key.bias) {
    auto bias = Matrix(*graph, "bias", kBias, 1, key.out, key.out, 1);
    h = graph->pointwise(product, bias,
                         fe::graph::Pointwise_attributes()
                             .set_mode(fe::PointwiseMode_t::ADD)
                             .set_compute_data_type(fe::DataType_t::FLOAT));
  }
  // h is saved in bf16, and a computed from its fp32 value (as cuBLASLt's
  // GELU_AUX epilogue does).
  h->set_output(true).set_uid(kH).set_data_type(fe::DataType_t::BFLOAT16);
  auto a = graph->pointwise(
      h, fe::graph::Pointwise_attributes()
             .set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD)
             .set_compute_data_type(fe::DataType_t::FLOAT));
  a->set_output(true).set_uid(kA).set_data_type(fe::DataType_t::BFLOAT16);
  return graph;
}

// Lowers the graph and builds each plan the heuristics (mode A, then the
// fallback list) offer that builds and needs no workspace.
absl::Status BuildPlans(cudnnHandle_t handle, BuiltGraph& built) {
  fe::graph::Graph& graph = *built.graph;
  CUDNN_FE_RETURN_IF_ERROR(graph.validate());
  CUDNN_FE_RETURN_IF_ERROR(graph.build_operation_graph(handle));
  // No engine for the graph, whatever the code says, is no plan for the
  // shape: the caller may fall back.
  auto no_engine = [](fe::error_t error) {
    return absl::UnimplementedError(
        absl::StrCat("linear-gelu on cuDNN: no engine for this shape: ",
                     cudnn_common::FrontendCodeName(error.get_code()), " (",
                     error.get_message(), ")"));
  };
  fe::error_t plans = graph.create_execution_plans(
      {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (plans.is_bad()) return no_engine(plans);
  fe::error_t support = graph.check_support(handle);
  if (support.is_bad()) return no_engine(support);
  const int64_t count = graph.get_execution_plan_count();
  for (int64_t p = 0; p < count; ++p) {
    if (graph.build_plan_at_index(p).is_bad()) continue;
    int64_t workspace_bytes = -1;
    if (graph.get_workspace_size_plan_at_index(p, workspace_bytes).is_bad() ||
        workspace_bytes != 0) {
      continue;
    }
    built.plans.push_back(p);
  }
  if (built.plans.empty()) {
    return absl::UnimplementedError(
        "linear-gelu on cuDNN: no plan without workspace for this shape");
  }
  return absl::OkStatus();
}

// The context's cuDNN state for the GELU GEMM: a handle, two timing events,
// 16 bytes of device memory for the tuning's checksums, and the built graphs.
class LinearCudnnState final : public ContextResource {
 public:
  static absl::StatusOr<std::unique_ptr<LinearCudnnState>> Create(
      Context& context) {
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(context));
    ASSIGN_OR_RETURN(RelaxedCaptureMode relaxed,
                     RelaxedCaptureMode::Enter(capturing));
    auto state = std::unique_ptr<LinearCudnnState>(new LinearCudnnState);
    CUDNN_RETURN_IF_ERROR(cudnnCreate(&state->handle_));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&state->start_));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&state->stop_));
    CUDA_RETURN_IF_ERROR(
        cudaMalloc(&state->checksums_, 2 * sizeof(unsigned long long)));
    // As the GEMM runner and the attention backend: under compute-sanitizer's
    // initcheck, which does not see the TMA stores of cuDNN's Hopper kernels,
    // the outputs are zeroed before each run; never set otherwise.
    state->zero_outputs_first_ = InitcheckZeroingRequested();
    return state;
  }
  // The context destroys it with its device current, after its stream's work.
  ~LinearCudnnState() override {
    graphs_.clear();
    if (checksums_ != nullptr) cudaFree(checksums_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (handle_ != nullptr) cudnnDestroy(handle_);
  }

  absl::Status Run(Context& context, const Key& key, void** sorted_pointers,
                   int count, void* a, void* h) {
    ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
    CUDNN_RETURN_IF_ERROR(cudnnSetStream(handle_, stream));
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(context));
    ASSIGN_OR_RETURN(BuiltGraph * built, FindOrBuild(key, capturing));
    if (!built->unsupported.ok()) return built->unsupported;
    const int64_t output_bytes = key.rows * key.out * 2;
    if (zero_outputs_first_) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a, 0, output_bytes, stream));
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(h, 0, output_bytes, stream));
    }
    if (!built->tuned && !capturing && built->plans.size() > 1) {
      ASSIGN_OR_RETURN(GemmTuning * tuning, ContextGemmTuning(context));
      if (tuning->enabled()) {
        return Tune(*built, key, sorted_pointers, count, a, h, stream);
      }
    }
    return Execute(*built, built->plans[built->chosen], sorted_pointers, count);
  }

 private:
  LinearCudnnState() = default;

  absl::StatusOr<BuiltGraph*> FindOrBuild(const Key& key, bool capturing) {
    auto found = graphs_.find(key);
    if (found != graphs_.end()) return &found->second;
    ASSIGN_OR_RETURN(RelaxedCaptureMode relaxed,
                     RelaxedCaptureMode::Enter(capturing));
    BuiltGraph built;
    try {
      built.graph = DescribeGraph(key);
      const absl::Status status = BuildPlans(handle_, built);
      if (absl::IsUnimplemented(status)) {
        // Kept, so that later calls of the shape fall back at once.
        built.graph.reset();
        built.plans.clear();
        built.unsupported = status;
      } else if (!status.ok()) {
        return status;
      }
    } catch (const std::exception& e) {
      // The frontend's descriptor builders may throw; nothing escapes an op.
      return absl::InternalError(absl::StrCat(
          "building the cuDNN linear-gelu graph threw: ", e.what()));
    }
    return &graphs_.emplace(key, std::move(built)).first->second;
  }

  absl::Status Execute(const BuiltGraph& built, int64_t plan,
                       void** sorted_pointers, int count) {
    try {
      CUDNN_FE_RETURN_IF_ERROR(built.graph->execute_plan_at_index(
          handle_, sorted_pointers, count, /*workspace=*/nullptr, plan));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(
          "executing the cuDNN linear-gelu graph threw: ", e.what()));
    }
    return absl::OkStatus();
  }

  // Checksums of h and a (rows of out bf16 words each), synchronizing.
  absl::StatusOr<std::pair<unsigned long long, unsigned long long>> Checksums(
      const Key& key, const void* a, const void* h, cudaStream_t stream) {
    const int64_t row_bytes = key.out * 2;
    CUDA_RETURN_IF_ERROR(LaunchGemmChecksum(h, row_bytes, key.rows, row_bytes,
                                            checksums_, stream));
    CUDA_RETURN_IF_ERROR(LaunchGemmChecksum(a, row_bytes, key.rows, row_bytes,
                                            checksums_ + 1, stream));
    unsigned long long host[2] = {0, 0};
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, checksums_, sizeof(host),
                                         cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return std::make_pair(host[0], host[1]);
  }

  // Runs every plan on the call (safe to repeat: h and a overlap no input),
  // keeps the fastest whose outputs are bitwise the first plan's, and leaves
  // h and a as the first plan writes them.
  absl::Status Tune(BuiltGraph& built, const Key& key, void** sorted_pointers,
                    int count, void* a, void* h, cudaStream_t stream) {
    std::pair<unsigned long long, unsigned long long> reference;
    float best_ms = 0;
    size_t best = 0;
    for (size_t i = 0; i < built.plans.size(); ++i) {
      const int64_t plan = built.plans[i];
      // A plan that fails to run is skipped; the first must work.
      const absl::Status first = Execute(built, plan, sorted_pointers, count);
      if (!first.ok()) {
        if (i == 0) return first;
        continue;
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
      for (int run = 0; run < kTimedRuns; ++run) {
        RETURN_IF_ERROR(Execute(built, plan, sorted_pointers, count));
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream));
      ASSIGN_OR_RETURN(const auto sums, Checksums(key, a, h, stream));
      float ms = 0;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
      if (i == 0) {
        if (sums.first == GemmChecksumOfZeros(key.out * 2, key.rows)) {
          // h (and so a) all zeros: nothing to tell the plans apart by. The
          // outputs are the first plan's, the call's result.
          if (++built.uninformative_tunings >= kMaxUninformativeTunings) {
            built.tuned = true;
          }
          return absl::OkStatus();
        }
        reference = sums;
        best_ms = ms;
      } else if (sums == reference && ms < best_ms) {
        best_ms = ms;
        best = i;
      }
    }
    built.chosen = static_cast<int64_t>(best);
    built.tuned = true;
    // The outputs hold the last plan's run: write the call's result with the
    // chosen plan (bitwise the first plan's).
    return Execute(built, built.plans[best], sorted_pointers, count);
  }

  cudnnHandle_t handle_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  unsigned long long* checksums_ = nullptr;  // device, 2
  bool zero_outputs_first_ = false;          // LOSSRT_INITCHECK_GEMM_OUTPUTS=1
  std::map<Key, BuiltGraph> graphs_;
};

}  // namespace

absl::Status CheckBuiltWithCudnn() { return absl::OkStatus(); }

absl::Status GeluForward(Context& context, const GeluForwardShape& shape,
                         const void* x, const void* weight, const void* bias,
                         void* a, void* h) {
  ASSIGN_OR_RETURN(LinearCudnnState * state,
                   context.GetOrCreateResource<LinearCudnnState>(
                       [&] { return LinearCudnnState::Create(context); }));
  const Key key{shape.rows, shape.in, shape.out, shape.bias};
  // The graph only reads x, weight and bias; the frontend's pointers are not
  // const.
  void* with_bias[] = {const_cast<void*>(x), const_cast<void*>(weight),
                       const_cast<void*>(bias), h, a};
  void* without_bias[] = {const_cast<void*>(x), const_cast<void*>(weight), h,
                          a};
  return shape.bias ? state->Run(context, key, with_bias, 5, a, h)
                    : state->Run(context, key, without_bias, 4, a, h);
}

}  // namespace linear_cudnn
}  // namespace ops
}  // namespace lossrt

#else  // !LOSSRT_WITH_CUDNN

namespace lossrt {
namespace ops {
namespace linear_cudnn {

absl::Status CheckBuiltWithCudnn() {
  return absl::UnimplementedError(
      "linear-gelu: the cuDNN engine (GeluGemmEngine::kCudnn) was not built: "
      "cuDNN 9 or the cuDNN frontend headers were not found at build time "
      "(./bazelw fetches the frontend; see third_party/repositories.bzl)");
}

absl::Status GeluForward(Context&, const GeluForwardShape&, const void*,
                         const void*, const void*, void*, void*) {
  return CheckBuiltWithCudnn();
}

}  // namespace linear_cudnn
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_WITH_CUDNN
