// Graph: define-then-run reverse-mode autodiff over the runtime's tensors.
//
// A model is described once (per shape) by calling the builder methods, which
// record nodes and return Values; Compile() then plans memory for every
// activation, saved statistic and activation gradient in one arena, reusing
// bytes between values whose lifetimes do not overlap (the plan covers a
// forward and a backward pass), and lays all parameters out in flat buffers.
// Forward() and Backward() run the recorded nodes in order and in reverse;
// nothing is allocated after the first step.
//
//   lossrt::graph::Graph graph(lossrt::DType::kBF16);
//   Value ids = graph.Input("ids", {rows}, DType::kI32, /*limit=*/vocab);
//   Value table = graph.Parameter("wte", {vocab, width}, /*decay=*/false);
//   ...
//   Value loss = graph.LinearCrossEntropy(hidden, table, std::nullopt,
//                                         targets, {});
//   RETURN_IF_ERROR(graph.Compile(*context));
//   RETURN_IF_ERROR(graph.SetInput(ids, host_ids));
//   RETURN_IF_ERROR(graph.Forward(/*training=*/true));
//   RETURN_IF_ERROR(graph.Backward());
//
// Parameters: an fp32 master copy (f64 for f64 graphs), an accumulator-dtype
// gradient and, when the activations are 16-bit, a compute copy in the
// activation dtype that ops read; all three are flat, with the weight-decayed
// parameters first (ParameterBuffers::decay_count). Parameter gradients always
// accumulate: ZeroGradients() clears them, micro-batches add up. The fused
// head (LinearCrossEntropy) adds its weight's gradient during the training
// Forward(), so clear them before that, not between Forward and Backward.
//
// Errors: a builder call with inconsistent operands records the first error
// and returns an invalid Value; Compile() reports it (InvalidArgument).
#ifndef LOSSRT_GRAPH_GRAPH_H_
#define LOSSRT_GRAPH_GRAPH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/ops/attention.h"
#include "loss/cross_entropy.h"
#include "loss/linear_cross_entropy.h"
#include "runtime/allocator.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace graph {

// A value of the graph (an input, a parameter or an op's output).
struct Value {
  int id = -1;
  bool valid() const { return id >= 0; }
};

enum class ValueKind { kInput, kParameter, kActivation };

struct ValueInfo {
  std::string name;
  ValueKind kind = ValueKind::kActivation;
  Shape shape;
  DType dtype = DType::kF32;
  bool requires_grad = false;
  int producer = -1;           // node index (activations)
  std::vector<int> consumers;  // node indices, in order
  int64_t limit = 0;           // inputs: integer values must be < limit
  bool allow_ignore = false;   // inputs: ... or equal the ignore index
  int64_t ignore_index = -100;
  // Parameters.
  bool decay = false;
  int64_t param_offset = 0;  // elements into the flat parameter buffers
  // Memory plan (activations and inputs): byte offsets into the arena, -1 for
  // none.
  int64_t data_offset = -1;
  int64_t grad_offset = -1;

  int64_t numel() const;
};

// A saved tensor of a node: written by its forward, read by its backward.
struct AuxSpec {
  Shape shape;
  DType dtype;
  int64_t offset = -1;  // planned
};

class Graph;

// What a node sees while it runs.
class NodeRun {
 public:
  NodeRun(Graph& graph, Context& context, int node)
      : graph_(graph), context_(context), node_(node) {}
  Context& context() { return context_; }
  // The forward tensor of the node's input i / output i / aux tensor i.
  Tensor input(int i) const;
  Tensor output(int i) const;
  Tensor aux(int i) const;
  // The gradient of input i (null when it needs none) and whether the node
  // must add to it (true for parameters, for activations whose gradient
  // another node has already written in this backward pass, and for a value
  // the node also takes in an earlier slot: nodes write their input
  // gradients in input order).
  const Tensor* input_grad(int i);
  bool accumulate(int i) const;
  // Whether input i's gradient is the output's gradient buffer itself (a
  // pass-through input, Node::PassThroughInputs, that Graph::PlanMemory gave
  // the buffer): the node leaves it as it is.
  bool grad_shares_output(int i) const;
  Tensor output_grad(int i) const;
  // f32 [] on the device: the gradient of the loss (1 / micro-batches).
  Tensor loss_scale() const;

 private:
  Graph& graph_;
  Context& context_;
  int node_;
  std::vector<Tensor> grads_;
};

// One recorded op.
class Node {
 public:
  virtual ~Node() = default;
  virtual const char* type() const = 0;
  // Scratch the node takes from context.Workspace (reserved by Compile).
  virtual int64_t WorkspaceBytes(const Device& device) const { return 0; }
  virtual absl::Status Forward(NodeRun& run, bool training) = 0;
  virtual absl::Status Backward(NodeRun& run) = 0;
  // A bit per input whose gradient is the output's gradient unchanged (an
  // add's operands, a residual added in a GEMM's epilogue): the memory plan
  // may give that input's gradient the output gradient's buffer.
  virtual uint32_t PassThroughInputs() const { return 0; }
  // An input whose gradient the node's backward can write over the input
  // itself (a loss head whose op works in place), or -1. The memory plan then
  // gives the gradient the input's buffer when nothing else reads the input
  // and its producer's backward does not either.
  virtual int InPlaceGradientInput() const { return -1; }

  std::vector<Value> inputs;
  std::vector<Value> outputs;
  std::vector<AuxSpec> aux;
};

// The flat parameter buffers of a compiled graph, all [count].
struct ParameterBuffers {
  Tensor master;   // f32 (f64 for f64 graphs)
  Tensor grad;     // master's dtype
  Tensor compute;  // activation dtype (== master when equal)
  int64_t count = 0;
  int64_t decay_count = 0;  // [0, decay_count) are weight-decayed
};

class Graph {
 public:
  explicit Graph(DType activation_dtype);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  DType activation_dtype() const { return activation_dtype_; }
  // f64 for f64 graphs, f32 otherwise.
  DType accumulator_dtype() const;

  // ---- Building ----
  // An integer input ([rows] ids or targets): values must lie in [0, limit),
  // or equal `ignore_index` when allow_ignore.
  Value Input(std::string name, Shape shape, DType dtype, int64_t limit,
              bool allow_ignore = false, int64_t ignore_index = -100);
  // A trainable parameter; `decay` puts it under weight decay.
  Value Parameter(std::string name, Shape shape, bool decay);

  // out [rows, C] = token_table[ids] (+ positions[r % seq]).
  Value Embedding(Value ids, Value token_table,
                  std::optional<Value> position_table, int64_t seq);
  // y [rows, out] = x w^T (+ b) (+ residual [rows, out], added in the GEMM's
  // epilogue on a GPU).
  Value Linear(Value x, Value weight, std::optional<Value> bias,
               std::optional<Value> residual = std::nullopt);
  Value LayerNorm(Value x, Value gamma, std::optional<Value> beta, float eps);
  Value RmsNorm(Value x, Value gamma, float eps);
  Value Gelu(Value x);
  // The GELU MLP as one node: y [rows, out] = gelu(x w1^T + b1) w2^T + b2, with
  // w1 [hidden, in], w2 [out, hidden]; the GELU runs in the GEMMs' epilogues.
  // The biases come both or neither. A residual [rows, out] is added in the
  // second GEMM's epilogue.
  Value GeluMlp(Value x, Value w1, std::optional<Value> b1, Value w2,
                std::optional<Value> b2,
                std::optional<Value> residual = std::nullopt);
  // x [rows, 2F] = [gate | up] -> [rows, F].
  Value SwiGlu(Value x);
  Value Add(Value a, Value b);
  // qkv [rows, 3C] -> [rows, C], causal, rows = batch * seq.
  // `options` picks the GPU kernel (ignored on the CPU).
  Value CausalAttention(Value qkv, int64_t batch, int64_t seq, int64_t heads,
                        const ops::CausalAttentionOptions& options = {});
  // The fused head: loss [] f32 of hidden [rows, C] against weight [V, C];
  // the logits never exist in full (loss/linear_cross_entropy.h).
  Value LinearCrossEntropy(Value hidden, Value weight,
                           std::optional<Value> bias, Value targets,
                           const LinearCrossEntropyOptions& options);
  // The unfused head's loss: loss [] f32 of full logits [rows, V].
  Value CrossEntropy(Value logits, Value targets,
                     const CrossEntropyOptions& options);
  // The next-token accuracy [] f32 of the head whose loss is `loss` (either
  // head above records it as its second output): the share of counted targets
  // that are the argmax of their logits (ties to the lowest index; weighted by
  // the class weights as the loss is; 0 when no target counts). The head's op
  // computes it in the loss's own pass (CrossEntropyExtras::accuracy) during
  // Forward(/*training=*/false) only: a training forward leaves it as it was.
  // Invalid when `loss` is not a head's loss.
  Value HeadAccuracy(Value loss) const;

  // ---- Compiling ----
  // Checks the recorded graph, plans the arena and allocates the parameter
  // buffers and the arena from the context's allocator. The context must
  // outlive the graph.
  absl::Status Compile(Context& context);
  bool compiled() const { return context_ != nullptr; }

  // ---- Running ----
  // Copies host integers into an input (checking their range first; nothing
  // is written on error).
  absl::Status SetInput(Value input, absl::Span<const int32_t> values);
  // Runs every node forward. `training` lets nodes keep what their backward
  // needs (the heads compute their gradients here, scaled by loss_scale).
  absl::Status Forward(bool training);
  // Runs every node backward, accumulating into the parameter gradients.
  absl::Status Backward();
  // Forward(true) then Backward(). With `use_cuda_graph` on a GPU the pair is
  // captured into a CUDA graph on the first call and replayed after that, so
  // a step costs one launch instead of hundreds; every node reads its inputs,
  // the loss scale and its parameters from device memory at replay time, so
  // SetInput, SetLossScale and optimizer steps between calls stay valid. The
  // nodes must not allocate, synchronize or read back during the capture:
  // the loss ops notice the capture themselves, skip their host checks and
  // count bad targets on the device (Context::TakeDeferredErrorCount), and ids
  // and targets are checked by SetInput.
  //
  // `after_backward` (optional) runs after the backward, on the same terms:
  // inside the capture when there is one (its work is then part of the graph
  // and replays with it; e.g. collectives on another stream, forked from and
  // joined back into the context's stream with events), and it is not called
  // on replays.
  absl::Status ForwardBackward(
      bool use_cuda_graph,
      const std::function<absl::Status()>& after_backward = nullptr);
  bool has_cuda_graph() const { return cuda_graph_exec_ != nullptr; }
  // The gradient of the loss fed to the heads: 1 / micro-batches when
  // accumulating.
  absl::Status SetLossScale(float scale);
  absl::Status ZeroGradients();
  // master -> compute copy (after initializing or loading the masters).
  absl::Status SyncComputeCopy();
  // The loss value (waits for the stream).
  absl::StatusOr<float> ReadScalar(Value value);

  // Called before (begin = true) and after each node's forward or backward,
  // e.g. to time the nodes with events; empty by default.
  using NodeObserver =
      std::function<absl::Status(int node, bool backward, bool begin)>;
  void set_node_observer(NodeObserver observer) {
    observer_ = std::move(observer);
  }

  // ---- Inspection ----
  const ValueInfo& info(Value value) const { return values_[value.id]; }
  Tensor tensor(Value value) const;
  // The gradient of a parameter (a view into ParameterBuffers::grad) or of an
  // activation (valid during Backward).
  Tensor grad(Value value) const;
  // A parameter's master view.
  Tensor master(Value value) const;
  std::vector<Value> parameters() const;
  const ParameterBuffers& parameter_buffers() const { return params_; }
  int64_t arena_bytes() const { return arena_bytes_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  Context& context() { return *context_; }

 private:
  friend class NodeRun;
  Value AddValue(ValueInfo info);
  Value AddNode(std::unique_ptr<Node> node, std::string name, Shape shape,
                DType dtype);
  // Gives the head that produced `loss` its second output, the accuracy
  // [] f32 (HeadAccuracy); returns `loss`.
  Value AddAccuracyOutput(Value loss);
  bool Require(bool condition, const std::string& message);
  bool CheckValue(Value value, const char* what);
  // True when there is no residual, or it is a valid activation of `shape`.
  bool CheckResidual(const std::optional<Value>& residual, const Shape& shape,
                     const char* what);
  Tensor ArenaTensor(int64_t offset, const Shape& shape, DType dtype) const;
  void PlanMemory();

  DType activation_dtype_;
  std::vector<ValueInfo> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  absl::Status build_status_;
  Context* context_ = nullptr;

  ParameterBuffers params_;
  Buffer master_buffer_, grad_buffer_, compute_buffer_;
  Buffer arena_;
  int64_t arena_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
  OwnedTensor loss_scale_;
  NodeObserver observer_;
  void* cuda_graph_exec_ = nullptr;  // cudaGraphExec_t
  // Backward bookkeeping: which activation gradients have been written.
  std::vector<bool> grad_written_;
  // Per node, a bit per input whose gradient shares the output's buffer.
  std::vector<uint32_t> grad_shares_output_;
  // Per value, whether its gradient lives in its data buffer.
  std::vector<bool> grad_in_data_;
};

}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_GRAPH_H_
