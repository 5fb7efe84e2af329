// The cuDNN backend of the causal attention op (attention_cudnn.h): cuDNN
// frontend SDPA graphs (forward with softmax stats; a backward with cuDNN's
// deterministic algorithm or its atomic dQ)
// over strided views of the op's tensors and a per-context cache of the built
// graphs. With linear_cudnn.cc, one of the two files that include the cuDNN
// frontend (through cudnn_common.h, which also turns its errors into Status).
#include "graph/ops/attention_cudnn.h"

#ifdef LOSSRT_WITH_CUDNN

#include <array>
#include <cmath>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/cudnn_common.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/status.h"

namespace lossrt {
namespace ops {
namespace attention_cudnn {
namespace {

namespace fe = cudnn_frontend;
using cudnn_common::RelaxedCaptureMode;

// ---------------------------------------------------------------------------
// Graphs.

// Uids of the graphs' tensors. The sorted-pointer execute takes the graph's
// device pointers in increasing uid order: Q, K, V, O, Stats (forward) and Q,
// K, V, O, Stats, dO, dQ, dK, dV (backward).
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kDO = 6,
  kDQ = 7,
  kDK = 8,
  kDV = 9,
};

using Dims = std::array<int64_t, 4>;  // [batch, heads, seq, head_dim] order

// What a built graph depends on: the direction (and the backward's
// algorithm), the sizes, the dtype and the strides of the views (those of q,
// k, v, d_qkv's parts; of out and d_out; of lse).
struct GraphKey {
  bool backward = false;
  bool deterministic = true;  // the backward's; always true for a forward
  Dims dims{};
  fe::DataType_t dtype = fe::DataType_t::BFLOAT16;
  Dims qkv_stride{};
  Dims out_stride{};
  Dims stats_stride{};

  auto Tie() const {
    return std::tie(backward, deterministic, dims, dtype, qkv_stride,
                    out_stride, stats_stride);
  }
  bool operator<(const GraphKey& other) const { return Tie() < other.Tie(); }
};

// The op's layout as [batch, heads, seq, head_dim] views: q, k and v are
// strided views into qkv [batch * seq, 3C] (k and v C and 2C elements on), out
// and d_out into [batch * seq, C], lse [batch, heads, seq] dense.
GraphKey KeyOf(const Shape& s, bool backward) {
  const int64_t c = s.heads * s.head_dim;
  GraphKey key;
  key.backward = backward;
  // One forward graph serves both backward algorithms.
  key.deterministic = !backward || s.deterministic;
  key.dims = {s.batch, s.heads, s.seq, s.head_dim};
  key.qkv_stride = {s.seq * 3 * c, s.head_dim, 3 * c, 1};
  key.out_stride = {s.seq * c, s.head_dim, c, 1};
  key.stats_stride = {s.heads * s.seq, s.seq, 1, 1};
  return key;
}

std::vector<int64_t> Vector(const Dims& d) { return {d[0], d[1], d[2], d[3]}; }

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// The frontend graph of `key`, not yet built.
std::shared_ptr<fe::graph::Graph> DescribeGraph(const GraphKey& key) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(key.dtype)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> dims = Vector(key.dims);
  const std::vector<int64_t> stats_dims = {key.dims[0], key.dims[1],
                                           key.dims[2], 1};
  auto tensor = [&](const char* name, Uid uid, const Dims& stride) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim(dims)
                             .set_stride(Vector(stride)));
  };
  auto q = tensor("Q", kQ, key.qkv_stride);
  auto k = tensor("K", kK, key.qkv_stride);
  auto v = tensor("V", kV, key.qkv_stride);
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(key.dims[3])));
  if (!key.backward) {
    // The training forward: O and the softmax Stats (max + ln(sum exp), in
    // natural log, of the scaled and masked scores: the op's lse). Top-left
    // causal mask with right bound 0: query t sees keys 0..t (what
    // set_causal_mask sets).
    auto options =
        fe::graph::SDPA_attributes()
            .set_name("causal_attention")
            .set_generate_stats(true)
            .set_attn_scale(scale)
            .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
            .set_diagonal_band_right_bound(0);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(dims).set_stride(
        Vector(key.out_stride));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dims)
        .set_stride(Vector(key.stats_stride));
    return graph;
  }
  auto o = tensor("O", kO, key.out_stride);
  auto d_o = tensor("dO", kDO, key.out_stride);
  auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stats_dims)
                                 .set_stride(Vector(key.stats_stride))
                                 .set_data_type(fe::DataType_t::FLOAT));
  // Deterministic: dQ's partial sums are added in a fixed order, so a run's
  // bits do not depend on the scheduling. Otherwise cuDNN adds them with
  // atomics into an fp32 accumulator (no dP buffer).
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("causal_attention_backward")
                     .set_attn_scale(scale)
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0)
                     .set_deterministic_algorithm(key.deterministic);
  auto [d_q, d_k, d_v] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
  d_q->set_output(true).set_uid(kDQ).set_dim(dims).set_stride(
      Vector(key.qkv_stride));
  d_k->set_output(true).set_uid(kDK).set_dim(dims).set_stride(
      Vector(key.qkv_stride));
  d_v->set_output(true).set_uid(kDV).set_dim(dims).set_stride(
      Vector(key.qkv_stride));
  return graph;
}

// Validates `graph`, lowers it to cuDNN and builds the heuristic's first plan
// that cuDNN supports.
absl::Status BuildGraph(cudnnHandle_t handle, fe::graph::Graph& graph) {
  CUDNN_FE_RETURN_IF_ERROR(graph.validate());
  CUDNN_FE_RETURN_IF_ERROR(graph.build_operation_graph(handle));
  CUDNN_FE_RETURN_IF_ERROR(graph.create_execution_plans({fe::HeurMode_t::A}));
  CUDNN_FE_RETURN_IF_ERROR(graph.check_support());
  CUDNN_FE_RETURN_IF_ERROR(graph.build_plans());
  return absl::OkStatus();
}

// The context's cuDNN state: a handle and the graphs built on it, one per key.
class CudnnState final : public ContextResource {
 public:
  static absl::StatusOr<std::unique_ptr<CudnnState>> Create(Context& context) {
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(context));
    ASSIGN_OR_RETURN(RelaxedCaptureMode relaxed,
                     RelaxedCaptureMode::Enter(capturing));
    auto state = std::unique_ptr<CudnnState>(new CudnnState);
    CUDNN_RETURN_IF_ERROR(cudnnCreate(&state->handle_));
    // As the GEMM runner's (runtime/cuda_gemm.h): compute-sanitizer's
    // initcheck does not see the TMA stores of cuDNN's Hopper kernels, so
    // under it the outputs and the workspace are zeroed before each graph
    // runs (ZeroForInitcheck); never set otherwise.
    state->zero_outputs_first_ = InitcheckZeroingRequested();
    return state;
  }
  // The context destroys it with its device current, after its stream's work.
  ~CudnnState() override {
    graphs_.clear();
    if (handle_ != nullptr) cudnnDestroy(handle_);
  }

  cudnnHandle_t handle() const { return handle_; }
  bool zero_outputs_first() const { return zero_outputs_first_; }

  // The built graph of `key`, building it on the first call.
  absl::StatusOr<const BuiltGraph*> FindOrBuild(Context& context,
                                                const GraphKey& key) {
    auto found = graphs_.find(key);
    if (found != graphs_.end()) return &found->second;
    ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(context));
    ASSIGN_OR_RETURN(RelaxedCaptureMode relaxed,
                     RelaxedCaptureMode::Enter(capturing));
    BuiltGraph built;
    try {
      built.graph = DescribeGraph(key);
      RETURN_IF_ERROR(BuildGraph(handle_, *built.graph));
      CUDNN_FE_RETURN_IF_ERROR(
          built.graph->get_workspace_size(built.workspace_bytes));
    } catch (const std::exception& e) {
      // The frontend's descriptor builders may throw; nothing escapes an op.
      return absl::InternalError(
          absl::StrCat("building the cuDNN attention graph threw: ", e.what()));
    }
    if (built.workspace_bytes < 0) {
      return absl::InternalError(
          absl::StrCat("cuDNN attention graph: workspace of ",
                       built.workspace_bytes, " bytes"));
    }
    return &graphs_.emplace(key, std::move(built)).first->second;
  }

 private:
  CudnnState() = default;
  cudnnHandle_t handle_ = nullptr;
  bool zero_outputs_first_ = false;  // LOSSRT_INITCHECK_GEMM_OUTPUTS=1
  std::map<GraphKey, BuiltGraph> graphs_;
};

// The context's cuDNN state and the built graph of `shape`, with the handle's
// stream set to the context's (cheap; the context's stream can be a caller's).
struct Prepared {
  cudnnHandle_t handle;
  const BuiltGraph* graph;
  cudaStream_t stream;
  bool zero_outputs_first;
};

absl::StatusOr<Prepared> Prepare(Context& context, const Shape& shape,
                                 bool backward) {
  ASSIGN_OR_RETURN(CudnnState * state,
                   context.GetOrCreateResource<CudnnState>(
                       [&] { return CudnnState::Create(context); }));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  CUDNN_RETURN_IF_ERROR(cudnnSetStream(state->handle(), stream));
  ASSIGN_OR_RETURN(const BuiltGraph* graph,
                   state->FindOrBuild(context, KeyOf(shape, backward)));
  return Prepared{state->handle(), graph, stream, state->zero_outputs_first()};
}

// Runs `prepared` with the device pointers in increasing uid order.
absl::Status Execute(const Prepared& prepared, void** sorted_pointers,
                     int count, void* workspace) {
  try {
    CUDNN_FE_RETURN_IF_ERROR(prepared.graph->graph->execute(
        prepared.handle, sorted_pointers, count, workspace));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("executing the cuDNN attention graph threw: ", e.what()));
  }
  return absl::OkStatus();
}

// For initcheck runs only (see CudnnState::Create): zeroes each output
// region {pointer, bytes} and the graph's workspace on the stream.
absl::Status ZeroForInitcheck(
    const Prepared& prepared,
    std::initializer_list<std::pair<void*, int64_t>> outputs, void* workspace) {
  if (!prepared.zero_outputs_first) return absl::OkStatus();
  for (const auto& [pointer, bytes] : outputs) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pointer, 0, bytes, prepared.stream));
  }
  if (workspace != nullptr && prepared.graph->workspace_bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        workspace, 0, prepared.graph->workspace_bytes, prepared.stream));
  }
  return absl::OkStatus();
}

// Element offsets, in bf16, of k and v in a row of qkv.
const char* Offset(const void* base, int64_t elements) {
  return static_cast<const char*>(base) + elements * 2;
}
char* Offset(void* base, int64_t elements) {
  return static_cast<char*>(base) + elements * 2;
}

}  // namespace

absl::Status CheckBuiltWithCudnn() { return absl::OkStatus(); }

absl::StatusOr<int64_t> ForwardWorkspaceBytes(Context& context,
                                              const Shape& shape) {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(context, shape, false));
  return prepared.graph->workspace_bytes;
}

absl::StatusOr<int64_t> BackwardWorkspaceBytes(Context& context,
                                               const Shape& shape) {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(context, shape, true));
  return prepared.graph->workspace_bytes;
}

absl::Status Forward(Context& context, const Shape& shape, const void* qkv,
                     void* out, float* lse, void* workspace) {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(context, shape, false));
  const int64_t c = shape.heads * shape.head_dim;
  // The graph only reads Q, K and V; the frontend's pointers are not const.
  void* q = const_cast<void*>(qkv);
  void* pointers[] = {q, Offset(q, c), Offset(q, 2 * c), out, lse};
  const int64_t rows = shape.batch * shape.seq;
  RETURN_IF_ERROR(ZeroForInitcheck(
      prepared,
      {{out, rows * c * 2},
       {lse, rows * shape.heads * static_cast<int64_t>(sizeof(float))}},
      workspace));
  return Execute(prepared, pointers, 5, workspace);
}

absl::Status Backward(Context& context, const Shape& shape, const void* qkv,
                      const void* out, const float* lse, const void* d_out,
                      void* d_qkv, void* workspace) {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(context, shape, true));
  const int64_t c = shape.heads * shape.head_dim;
  void* q = const_cast<void*>(qkv);
  void* pointers[] = {q,
                      Offset(q, c),
                      Offset(q, 2 * c),
                      const_cast<void*>(out),
                      const_cast<float*>(lse),
                      const_cast<void*>(d_out),
                      d_qkv,
                      Offset(d_qkv, c),
                      Offset(d_qkv, 2 * c)};
  RETURN_IF_ERROR(ZeroForInitcheck(
      prepared, {{d_qkv, shape.batch * shape.seq * 3 * c * 2}}, workspace));
  return Execute(prepared, pointers, 9, workspace);
}

}  // namespace attention_cudnn
}  // namespace ops
}  // namespace lossrt

#else  // !LOSSRT_WITH_CUDNN

namespace lossrt {
namespace ops {
namespace attention_cudnn {
namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "attention: the cuDNN kernel (AttentionKernel::kCudnn) was not built: "
      "cuDNN 9 or the cuDNN frontend headers were not found at build time "
      "(./bazelw fetches the frontend; see third_party/repositories.bzl)");
}

}  // namespace

absl::Status CheckBuiltWithCudnn() { return NotBuilt(); }

absl::StatusOr<int64_t> ForwardWorkspaceBytes(Context&, const Shape&) {
  return NotBuilt();
}

absl::StatusOr<int64_t> BackwardWorkspaceBytes(Context&, const Shape&) {
  return NotBuilt();
}

absl::Status Forward(Context&, const Shape&, const void*, void*, float*,
                     void*) {
  return NotBuilt();
}

absl::Status Backward(Context&, const Shape&, const void*, const void*,
                      const float*, const void*, void*, void*) {
  return NotBuilt();
}

}  // namespace attention_cudnn
}  // namespace ops
}  // namespace lossrt

#endif  // LOSSRT_WITH_CUDNN
