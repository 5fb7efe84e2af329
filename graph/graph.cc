// Graph: building (shape checks), compiling (parameter layout and the arena's
// memory plan) and running forward and backward.
#include "graph/graph.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/nodes.h"
#include "graph/ops/elementwise.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

namespace lossrt {
namespace graph {
namespace {

// Parameters start on multiples of this many elements (256 bytes of bf16), so
// every view is aligned for vector loads and cuBLASLt.
constexpr int64_t kParameterAlignment = 128;
constexpr int64_t kArenaAlignment = 256;

std::string ShapeText(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// One buffer of the memory plan: alive over [birth, death] (inclusive) on the
// timeline forward node i = i, backward node i = 2 N - 1 - i.
struct Interval {
  int64_t bytes;
  int64_t birth;
  int64_t death;
  int64_t* offset;  // where the plan writes the result
};

// Greedy placement, largest first: each buffer goes to the lowest offset that
// no buffer alive at the same time covers. Returns the arena size.
int64_t PlaceIntervals(std::vector<Interval>& intervals) {
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) {
              if (a.bytes != b.bytes) return a.bytes > b.bytes;
              return a.birth < b.birth;
            });
  std::vector<const Interval*> placed;
  int64_t total = 0;
  for (Interval& interval : intervals) {
    std::vector<std::pair<int64_t, int64_t>> taken;  // [begin, end)
    for (const Interval* other : placed) {
      if (other->death < interval.birth || interval.death < other->birth) {
        continue;
      }
      taken.emplace_back(*other->offset, *other->offset + other->bytes);
    }
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (offset + interval.bytes <= begin) break;
      offset = std::max(offset, end);
    }
    *interval.offset = offset;
    total = std::max(total, offset + interval.bytes);
    placed.push_back(&interval);
  }
  return total;
}

}  // namespace

int64_t ValueInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- NodeRun ----

Tensor NodeRun::input(int i) const {
  return graph_.tensor(graph_.nodes_[node_]->inputs[i]);
}

Tensor NodeRun::output(int i) const {
  return graph_.tensor(graph_.nodes_[node_]->outputs[i]);
}

Tensor NodeRun::aux(int i) const {
  const AuxSpec& spec = graph_.nodes_[node_]->aux[i];
  return graph_.ArenaTensor(spec.offset, spec.shape, spec.dtype);
}

const Tensor* NodeRun::input_grad(int i) {
  const Value value = graph_.nodes_[node_]->inputs[i];
  if (!graph_.values_[value.id].requires_grad) return nullptr;
  if (grads_.empty()) grads_.resize(graph_.nodes_[node_]->inputs.size());
  grads_[i] = graph_.grad(value);
  return &grads_[i];
}

bool NodeRun::accumulate(int i) const {
  const std::vector<Value>& inputs = graph_.nodes_[node_]->inputs;
  const ValueInfo& info = graph_.values_[inputs[i].id];
  if (info.kind == ValueKind::kParameter || graph_.grad_written_[inputs[i].id])
    return true;
  // The same value in an earlier slot of this node: written just before
  // (nodes write their input gradients in input order).
  for (int j = 0; j < i; ++j) {
    if (inputs[j].id == inputs[i].id) return true;
  }
  return false;
}

bool NodeRun::grad_shares_output(int i) const {
  return (graph_.grad_shares_output_[node_] >> i) & 1u;
}

Tensor NodeRun::output_grad(int i) const {
  return graph_.grad(graph_.nodes_[node_]->outputs[i]);
}

Tensor NodeRun::loss_scale() const { return graph_.loss_scale_.view; }

// ---- Building ----

Graph::Graph(DType activation_dtype) : activation_dtype_(activation_dtype) {}

Graph::~Graph() {
#ifdef LOSSRT_WITH_CUDA
  if (cuda_graph_exec_ != nullptr) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(cuda_graph_exec_));
  }
#endif
}

DType Graph::accumulator_dtype() const {
  return activation_dtype_ == DType::kF64 ? DType::kF64 : DType::kF32;
}

Value Graph::AddValue(ValueInfo info) {
  values_.push_back(std::move(info));
  return Value{static_cast<int>(values_.size()) - 1};
}

bool Graph::Require(bool condition, const std::string& message) {
  if (!condition && build_status_.ok()) {
    build_status_ = absl::InvalidArgumentError(message);
  }
  return condition && build_status_.ok();
}

bool Graph::CheckValue(Value value, const char* what) {
  return Require(value.id >= 0 && value.id < static_cast<int>(values_.size()),
                 absl::StrCat(what, ": not a value of this graph"));
}

Value Graph::Input(std::string name, Shape shape, DType dtype, int64_t limit,
                   bool allow_ignore, int64_t ignore_index) {
  if (!Require(dtype == DType::kI32,
               absl::StrCat("input ", name, ": only i32 inputs")) ||
      !Require(limit > 0,
               absl::StrCat("input ", name, ": limit must be positive"))) {
    return Value{};
  }
  ValueInfo info;
  info.name = std::move(name);
  info.kind = ValueKind::kInput;
  info.shape = std::move(shape);
  info.dtype = dtype;
  info.limit = limit;
  info.allow_ignore = allow_ignore;
  info.ignore_index = ignore_index;
  return AddValue(std::move(info));
}

Value Graph::Parameter(std::string name, Shape shape, bool decay) {
  for (int64_t d : shape) {
    if (!Require(d > 0, absl::StrCat("parameter ", name, ": shape ",
                                     ShapeText(shape), " has a zero size"))) {
      return Value{};
    }
  }
  ValueInfo info;
  info.name = std::move(name);
  info.kind = ValueKind::kParameter;
  info.shape = std::move(shape);
  info.dtype = activation_dtype_;
  info.requires_grad = true;
  info.decay = decay;
  return AddValue(std::move(info));
}

Value Graph::AddNode(std::unique_ptr<Node> node, std::string name, Shape shape,
                     DType dtype) {
  if (!build_status_.ok()) return Value{};
  const int index = static_cast<int>(nodes_.size());
  ValueInfo out;
  out.name = absl::StrCat(node->type(), index, ":", name);
  out.kind = ValueKind::kActivation;
  out.shape = std::move(shape);
  out.dtype = dtype;
  out.producer = index;
  for (const Value& input : node->inputs) {
    values_[input.id].consumers.push_back(index);
    out.requires_grad |= values_[input.id].requires_grad;
  }
  const Value value = AddValue(std::move(out));
  node->outputs = {value};
  nodes_.push_back(std::move(node));
  return value;
}

Value Graph::Embedding(Value ids, Value token_table,
                       std::optional<Value> position_table, int64_t seq) {
  if (!CheckValue(ids, "Embedding ids") ||
      !CheckValue(token_table, "Embedding table") ||
      (position_table && !CheckValue(*position_table, "Embedding positions"))) {
    return Value{};
  }
  const ValueInfo& id_info = values_[ids.id];
  const ValueInfo& table = values_[token_table.id];
  const int64_t rows = id_info.numel();
  if (!Require(id_info.kind == ValueKind::kInput && table.shape.size() == 2,
               "Embedding: ids must be an input and the table 2-D") ||
      !Require(seq > 0 && rows % seq == 0,
               absl::StrCat("Embedding: ", rows,
                            " ids are not a multiple of "
                            "seq ",
                            seq)) ||
      !Require(id_info.limit <= table.shape[0],
               absl::StrCat("Embedding: ids go up to ", id_info.limit,
                            ", the table has ", table.shape[0], " rows"))) {
    return Value{};
  }
  const int64_t width = table.shape[1];
  auto node = MakeEmbeddingNode(seq, position_table.has_value());
  node->inputs = {ids, token_table};
  if (position_table) {
    const ValueInfo& positions = values_[position_table->id];
    if (!Require(positions.shape.size() == 2 && positions.shape[0] >= seq &&
                     positions.shape[1] == width,
                 absl::StrCat("Embedding: position table ",
                              ShapeText(positions.shape), " for seq ", seq,
                              " and width ", width))) {
      return Value{};
    }
    node->inputs.push_back(*position_table);
  }
  return AddNode(std::move(node), "embedding", {rows, width},
                 activation_dtype_);
}

bool Graph::CheckResidual(const std::optional<Value>& residual,
                          const Shape& shape, const char* what) {
  if (!residual) return true;
  if (!CheckValue(*residual, what)) return false;
  const ValueInfo& info = values_[residual->id];
  return Require(
      info.shape == shape && info.kind == ValueKind::kActivation,
      absl::StrCat(what, ": an activation of shape ", ShapeText(shape),
                   ", got ", ShapeText(info.shape)));
}
Value Graph::Linear(Value x, Value weight, std::optional<Value> bias,
                    std::optional<Value> residual) {
  if (!CheckValue(x, "Linear x") || !CheckValue(weight, "Linear weight") ||
      (bias && !CheckValue(*bias, "Linear bias"))) {
    return Value{};
  }
  const Shape& xs = values_[x.id].shape;
  const Shape& ws = values_[weight.id].shape;
  if (!Require(xs.size() == 2 && ws.size() == 2 && xs[1] == ws[1],
               absl::StrCat("Linear: x ", ShapeText(xs), " and weight ",
                            ShapeText(ws), " do not match")) ||
      (bias && !Require(values_[bias->id].shape == Shape{ws[0]},
                        absl::StrCat("Linear: bias ",
                                     ShapeText(values_[bias->id].shape),
                                     " for ", ws[0], " outputs")))) {
    return Value{};
  }
  if (!CheckResidual(residual, {xs[0], ws[0]}, "Linear residual")) {
    return Value{};
  }
  auto node =
      MakeLinearNode(bias.has_value(), residual.has_value(), xs[0], ws[0]);
  node->inputs = {x, weight};
  if (bias) node->inputs.push_back(*bias);
  if (residual) node->inputs.push_back(*residual);
  return AddNode(std::move(node), "linear", {xs[0], ws[0]}, activation_dtype_);
}

Value Graph::LayerNorm(Value x, Value gamma, std::optional<Value> beta,
                       float eps) {
  if (!CheckValue(x, "LayerNorm x") || !CheckValue(gamma, "LayerNorm gamma") ||
      (beta && !CheckValue(*beta, "LayerNorm beta"))) {
    return Value{};
  }
  const Shape xs = values_[x.id].shape;
  if (!Require(xs.size() == 2 && values_[gamma.id].shape == Shape{xs[1]} &&
                   (!beta || values_[beta->id].shape == Shape{xs[1]}),
               absl::StrCat("LayerNorm: x ", ShapeText(xs),
                            " and its gamma/beta do not match"))) {
    return Value{};
  }
  auto node = MakeLayerNormNode(eps, beta.has_value(), xs[0], xs[1]);
  node->inputs = {x, gamma};
  if (beta) node->inputs.push_back(*beta);
  node->aux = {AuxSpec{{xs[0]}, accumulator_dtype()},
               AuxSpec{{xs[0]}, accumulator_dtype()}};
  return AddNode(std::move(node), "layer_norm", xs, activation_dtype_);
}

Value Graph::RmsNorm(Value x, Value gamma, float eps) {
  if (!CheckValue(x, "RmsNorm x") || !CheckValue(gamma, "RmsNorm gamma")) {
    return Value{};
  }
  const Shape xs = values_[x.id].shape;
  if (!Require(xs.size() == 2 && values_[gamma.id].shape == Shape{xs[1]},
               absl::StrCat("RmsNorm: x ", ShapeText(xs),
                            " and gamma do not match"))) {
    return Value{};
  }
  auto node = MakeRmsNormNode(eps, xs[0], xs[1]);
  node->inputs = {x, gamma};
  node->aux = {AuxSpec{{xs[0]}, accumulator_dtype()}};
  return AddNode(std::move(node), "rms_norm", xs, activation_dtype_);
}

Value Graph::Gelu(Value x) {
  if (!CheckValue(x, "Gelu x")) return Value{};
  auto node = MakeGeluNode();
  node->inputs = {x};
  return AddNode(std::move(node), "gelu", values_[x.id].shape,
                 activation_dtype_);
}

Value Graph::GeluMlp(Value x, Value w1, std::optional<Value> b1, Value w2,
                     std::optional<Value> b2, std::optional<Value> residual) {
  if (!CheckValue(x, "GeluMlp x") || !CheckValue(w1, "GeluMlp w1") ||
      !CheckValue(w2, "GeluMlp w2") || (b1 && !CheckValue(*b1, "GeluMlp b1")) ||
      (b2 && !CheckValue(*b2, "GeluMlp b2"))) {
    return Value{};
  }
  const Shape& xs = values_[x.id].shape;
  const Shape& w1s = values_[w1.id].shape;
  const Shape& w2s = values_[w2.id].shape;
  if (!Require(
          xs.size() == 2 && w1s.size() == 2 && w2s.size() == 2 &&
              xs[1] == w1s[1] && w2s[1] == w1s[0],
          absl::StrCat("GeluMlp: x ", ShapeText(xs), ", w1 ", ShapeText(w1s),
                       " and w2 ", ShapeText(w2s), " do not match")) ||
      !Require(b1.has_value() == b2.has_value(),
               "GeluMlp: give both biases or neither") ||
      (b1 && !Require(values_[b1->id].shape == Shape{w1s[0]} &&
                          values_[b2->id].shape == Shape{w2s[0]},
                      "GeluMlp: a bias does not match its weight"))) {
    return Value{};
  }
  if (!CheckResidual(residual, {xs[0], w2s[0]}, "GeluMlp residual")) {
    return Value{};
  }
  auto node = MakeGeluMlpNode(b1.has_value(), residual.has_value(), xs[0],
                              w1s[0], w2s[0]);
  node->inputs = {x, w1};
  if (b1) node->inputs.push_back(*b1);
  node->inputs.push_back(w2);
  if (b2) node->inputs.push_back(*b2);
  if (residual) node->inputs.push_back(*residual);
  node->aux = {AuxSpec{{xs[0], w1s[0]}, activation_dtype_},
               AuxSpec{{xs[0], w1s[0]}, activation_dtype_}};
  return AddNode(std::move(node), "gelu_mlp", {xs[0], w2s[0]},
                 activation_dtype_);
}

Value Graph::SwiGlu(Value x) {
  if (!CheckValue(x, "SwiGlu x")) return Value{};
  const Shape xs = values_[x.id].shape;
  if (!Require(
          xs.size() == 2 && xs[1] % 2 == 0,
          absl::StrCat("SwiGlu: x ", ShapeText(xs), " must be [rows, 2F]"))) {
    return Value{};
  }
  auto node = MakeSwiGluNode();
  node->inputs = {x};
  return AddNode(std::move(node), "swiglu", {xs[0], xs[1] / 2},
                 activation_dtype_);
}

Value Graph::Add(Value a, Value b) {
  if (!CheckValue(a, "Add a") || !CheckValue(b, "Add b")) return Value{};
  if (!Require(values_[a.id].shape == values_[b.id].shape &&
                   values_[a.id].kind == ValueKind::kActivation &&
                   values_[b.id].kind == ValueKind::kActivation,
               absl::StrCat("Add: activations of one shape, got ",
                            ShapeText(values_[a.id].shape), " and ",
                            ShapeText(values_[b.id].shape)))) {
    return Value{};
  }
  auto node = MakeAddNode();
  node->inputs = {a, b};
  return AddNode(std::move(node), "add", values_[a.id].shape,
                 activation_dtype_);
}

Value Graph::CausalAttention(Value qkv, int64_t batch, int64_t seq,
                             int64_t heads) {
  if (!CheckValue(qkv, "CausalAttention qkv")) return Value{};
  const Shape qs = values_[qkv.id].shape;
  if (!Require(batch > 0 && seq > 0 && heads > 0 && qs.size() == 2 &&
                   qs[0] == batch * seq && qs[1] % (3 * heads) == 0,
               absl::StrCat("CausalAttention: qkv ", ShapeText(qs),
                            " is not [batch * seq, 3 * heads * head_dim] for "
                            "batch ",
                            batch, ", seq ", seq, ", heads ", heads))) {
    return Value{};
  }
  const int64_t width = qs[1] / 3;
  auto node =
      MakeAttentionNode(batch, seq, heads, width / heads, activation_dtype_);
  node->inputs = {qkv};
  node->aux = {AuxSpec{{batch, heads, seq}, accumulator_dtype()}};
  return AddNode(std::move(node), "attention", {qs[0], width},
                 activation_dtype_);
}

Value Graph::LinearCrossEntropy(Value hidden, Value weight,
                                std::optional<Value> bias, Value targets,
                                const LinearCrossEntropyOptions& options) {
  if (!CheckValue(hidden, "LinearCrossEntropy hidden") ||
      !CheckValue(weight, "LinearCrossEntropy weight") ||
      !CheckValue(targets, "LinearCrossEntropy targets") ||
      (bias && !CheckValue(*bias, "LinearCrossEntropy bias"))) {
    return Value{};
  }
  const Shape hs = values_[hidden.id].shape;
  const Shape ws = values_[weight.id].shape;
  if (!Require(hs.size() == 2 && ws.size() == 2 && hs[1] == ws[1] &&
                   values_[targets.id].shape == Shape{hs[0]} &&
                   values_[targets.id].kind == ValueKind::kInput,
               absl::StrCat("LinearCrossEntropy: hidden ", ShapeText(hs),
                            ", weight ", ShapeText(ws), " and targets ",
                            ShapeText(values_[targets.id].shape),
                            " do not match")) ||
      !Require(options.cross_entropy.reduction != Reduction::kNone,
               "LinearCrossEntropy: the graph's loss must be a scalar")) {
    return Value{};
  }
  auto node = MakeLinearCrossEntropyNode(options, bias.has_value());
  node->inputs = {hidden, weight};
  if (bias) node->inputs.push_back(*bias);
  node->inputs.push_back(targets);
  node->aux = {AuxSpec{hs, activation_dtype_},
               AuxSpec{ws, accumulator_dtype()}};
  if (bias) node->aux.push_back(AuxSpec{{ws[0]}, accumulator_dtype()});
  return AddNode(std::move(node), "loss", {}, DType::kF32);
}

Value Graph::CrossEntropy(Value logits, Value targets,
                          const CrossEntropyOptions& options) {
  if (!CheckValue(logits, "CrossEntropy logits") ||
      !CheckValue(targets, "CrossEntropy targets")) {
    return Value{};
  }
  const Shape ls = values_[logits.id].shape;
  if (!Require(ls.size() == 2 && values_[targets.id].shape == Shape{ls[0]} &&
                   values_[targets.id].kind == ValueKind::kInput,
               absl::StrCat("CrossEntropy: logits ", ShapeText(ls),
                            " and targets do not match")) ||
      !Require(options.reduction != Reduction::kNone,
               "CrossEntropy: the graph's loss must be a scalar")) {
    return Value{};
  }
  auto node = MakeCrossEntropyNode(options, ls[0], ls[1]);
  node->inputs = {logits, targets};
  node->aux = {AuxSpec{{ls[0]}, DType::kF32}};
  return AddNode(std::move(node), "loss", {}, DType::kF32);
}

// ---- Compiling ----

void Graph::PlanMemory() {
  const int64_t n = static_cast<int64_t>(nodes_.size());
  const int64_t end = 2 * n;
  std::vector<Interval> intervals;
  auto bytes_of = [](const Shape& shape, DType dtype) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    return RoundUp(std::max<int64_t>(count * DTypeSize(dtype), 1),
                   kArenaAlignment);
  };
  // Gradients. Each is written first by the backward of its value's last
  // consumer and read last by its producer's backward. A pass-through input's
  // gradient (Node::PassThroughInputs: an add's operand, a residual added in
  // a GEMM's epilogue) may be the node's output gradient buffer itself: the
  // node's backward then copies nothing. Groups of values sharing one buffer
  // (a whole residual stream) get one interval spanning their members'.
  std::vector<int> group(values_.size());
  for (size_t v = 0; v < values_.size(); ++v) group[v] = static_cast<int>(v);
  auto root = [&](int v) {
    while (group[v] != v) v = group[v] = group[group[v]];
    return v;
  };
  auto has_grad = [&](const ValueInfo& info) {
    return info.kind == ValueKind::kActivation && info.requires_grad &&
           !info.consumers.empty();
  };
  grad_shares_output_.assign(n, 0);
  for (int a = 0; a < n; ++a) {
    const Node& node = *nodes_[a];
    const uint32_t through = node.PassThroughInputs();
    const ValueInfo& out = values_[node.outputs[0].id];
    if (through == 0 || !has_grad(out)) continue;
    // Inputs that may share: pass-through, and not also another input of the
    // node (whose gradient the node would then write into dy's buffer).
    std::vector<int> candidates;
    for (int i = 0; i < static_cast<int>(node.inputs.size()); ++i) {
      int uses = 0;
      for (const Value& v : node.inputs) uses += v.id == node.inputs[i].id;
      if ((through >> i & 1u) && uses == 1) candidates.push_back(i);
    }
    // The node must write the input's gradient first (it is the input's last
    // consumer); everything else only adds to it later.
    auto first_writer = [&](const Value& v) {
      const ValueInfo& info = values_[v.id];
      return has_grad(info) && info.consumers.back() == a &&
             info.shape == out.shape && info.dtype == out.dtype;
    };
    int first = -1;
    for (int i : candidates) {
      if (first_writer(node.inputs[i])) {
        first = i;
        break;
      }
    }
    if (first < 0) continue;
    const Value shared = node.inputs[first];
    grad_shares_output_[a] |= 1u << first;
    group[root(shared.id)] = root(node.outputs[0].id);
    // One more input (an add's other operand) too, when its producer reads
    // its gradient before anything else writes the buffer: the node is its
    // only consumer, and its producer comes after the first input's producer
    // and every other consumer of it.
    const ValueInfo& s = values_[shared.id];
    for (int i : candidates) {
      if (i == first) continue;
      const Value other = node.inputs[i];
      const ValueInfo& o = values_[other.id];
      bool other_too = first_writer(other) && o.consumers.size() == 1 &&
                       o.producer > s.producer;
      for (int c : s.consumers)
        other_too = other_too && (c == a || c < o.producer);
      if (other_too) {
        grad_shares_output_[a] |= 1u << i;
        group[root(other.id)] = root(node.outputs[0].id);
        break;
      }
    }
  }
  // A node whose backward can write an input's gradient over the input
  // (Node::InPlaceGradientInput): the gradient then lives in the input's own
  // buffer, kept until the producer's backward, when the node is the input's
  // only consumer, the producer's backward does not read it, and no other
  // value shares its gradient.
  std::vector<int> group_size(values_.size(), 0);
  for (size_t v = 0; v < values_.size(); ++v) {
    if (has_grad(values_[v])) ++group_size[root(static_cast<int>(v))];
  }
  grad_in_data_.assign(values_.size(), false);
  for (int a = 0; a < n; ++a) {
    const Node& node = *nodes_[a];
    const int i = node.InPlaceGradientInput();
    if (i < 0) continue;
    const Value v = node.inputs[i];
    const ValueInfo& info = values_[v.id];
    int uses = 0;
    for (const Value& input : node.inputs) uses += input.id == v.id;
    grad_in_data_[v.id] = has_grad(info) && info.consumers.size() == 1 &&
                          uses == 1 && root(v.id) == v.id &&
                          group_size[v.id] == 1 &&
                          !BackwardReadsOutput(*nodes_[info.producer]);
  }
  for (size_t v = 0; v < values_.size(); ++v) {
    ValueInfo& info = values_[v];
    info.data_offset = info.grad_offset = -1;
    if (info.kind == ValueKind::kParameter) continue;
    const int64_t bytes = bytes_of(info.shape, info.dtype);
    if (info.kind == ValueKind::kInput) {
      intervals.push_back({bytes, 0, end, &info.data_offset});
      continue;
    }
    const int64_t p = info.producer;
    int64_t death = info.consumers.empty() ? end : p;
    for (int c : info.consumers) {
      // Alive through the consumer's forward and its backward.
      death = std::max<int64_t>(death, 2 * n - 1 - c);
    }
    if (BackwardReadsOutput(*nodes_[p]) || grad_in_data_[v]) {
      death = std::max(death, 2 * n - 1 - p);
    }
    intervals.push_back({bytes, p, death, &info.data_offset});
  }

  struct Span {
    int64_t bytes = 0, birth = 0, death = -1;
  };
  std::vector<Span> spans(values_.size());
  for (size_t v = 0; v < values_.size(); ++v) {
    const ValueInfo& info = values_[v];
    if (!has_grad(info) || grad_in_data_[v]) continue;
    Span& span = spans[root(static_cast<int>(v))];
    const int64_t birth = 2 * n - 1 - info.consumers.back();
    const int64_t death = 2 * n - 1 - info.producer;
    if (span.death < 0) {
      span = {bytes_of(info.shape, info.dtype), birth, death};
    } else {
      span.birth = std::min(span.birth, birth);
      span.death = std::max(span.death, death);
    }
  }
  for (size_t v = 0; v < values_.size(); ++v) {
    if (spans[v].death >= 0) {
      intervals.push_back({spans[v].bytes, spans[v].birth, spans[v].death,
                           &values_[v].grad_offset});
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (AuxSpec& spec : nodes_[i]->aux) {
      intervals.push_back(
          {bytes_of(spec.shape, spec.dtype), i, 2 * n - 1 - i, &spec.offset});
    }
  }
  arena_bytes_ = PlaceIntervals(intervals);
  for (size_t v = 0; v < values_.size(); ++v) {
    if (grad_in_data_[v]) {
      values_[v].grad_offset = values_[v].data_offset;
    } else if (has_grad(values_[v])) {
      values_[v].grad_offset = values_[root(static_cast<int>(v))].grad_offset;
    }
  }
}

absl::Status Graph::Compile(Context& context) {
  RETURN_IF_ERROR(build_status_);
  if (context_ != nullptr) {
    return absl::FailedPreconditionError("Graph::Compile called twice");
  }
  if (nodes_.empty()) return InvalidArgument("Graph::Compile: no nodes");
  if (activation_dtype_ == DType::kBF16 && context.device().is_cpu()) {
    return InvalidArgument("bf16 activations need a GPU; use f32 on the CPU");
  }
  if (activation_dtype_ == DType::kF64 && context.device().is_cuda()) {
    return InvalidArgument("f64 activations run on the CPU only");
  }
  // Parameters: decayed first, each aligned.
  int64_t offset = 0;
  for (bool decay : {true, false}) {
    for (ValueInfo& info : values_) {
      if (info.kind != ValueKind::kParameter || info.decay != decay) continue;
      info.param_offset = offset;
      offset += RoundUp(info.numel(), kParameterAlignment);
    }
    if (decay) params_.decay_count = offset;
  }
  params_.count = offset;
  const DType master_dtype = accumulator_dtype();
  const int64_t master_bytes = offset * DTypeSize(master_dtype);
  Allocator& allocator = context.allocator();
  ASSIGN_OR_RETURN(master_buffer_, allocator.Allocate(master_bytes));
  ASSIGN_OR_RETURN(grad_buffer_, allocator.Allocate(master_bytes));
  params_.master = Tensor::Of(master_buffer_.data(), master_dtype, {offset},
                              context.device());
  params_.grad =
      Tensor::Of(grad_buffer_.data(), master_dtype, {offset}, context.device());
  if (activation_dtype_ != master_dtype) {
    ASSIGN_OR_RETURN(compute_buffer_,
                     allocator.Allocate(offset * DTypeSize(activation_dtype_)));
    params_.compute = Tensor::Of(compute_buffer_.data(), activation_dtype_,
                                 {offset}, context.device());
  } else {
    params_.compute = params_.master;
  }
  PlanMemory();
  ASSIGN_OR_RETURN(arena_, allocator.Allocate(arena_bytes_));
  for (const auto& node : nodes_) {
    workspace_bytes_ =
        std::max(workspace_bytes_, node->WorkspaceBytes(context.device()));
  }
  RETURN_IF_ERROR(context.ReserveWorkspace(workspace_bytes_));
  ASSIGN_OR_RETURN(loss_scale_, EmptyTensor(allocator, DType::kF32, {}));
  context_ = &context;
  grad_written_.assign(values_.size(), false);
  RETURN_IF_ERROR(SetLossScale(1.0f));
  RETURN_IF_ERROR(ops::Zero(context, params_.master));
  if (params_.compute.data != params_.master.data) {
    RETURN_IF_ERROR(ops::Zero(context, params_.compute));
  }
  return ZeroGradients();
}

// ---- Running ----

Tensor Graph::ArenaTensor(int64_t offset, const Shape& shape,
                          DType dtype) const {
  return Tensor::Of(static_cast<char*>(arena_.data()) + offset, dtype, shape,
                    context_->device());
}

Tensor Graph::tensor(Value value) const {
  const ValueInfo& info = values_[value.id];
  if (info.kind == ValueKind::kParameter) {
    return Tensor::Of(static_cast<char*>(params_.compute.data) +
                          info.param_offset * DTypeSize(params_.compute.dtype),
                      params_.compute.dtype, info.shape, context_->device());
  }
  return ArenaTensor(info.data_offset, info.shape, info.dtype);
}

Tensor Graph::grad(Value value) const {
  const ValueInfo& info = values_[value.id];
  if (info.kind == ValueKind::kParameter) {
    return Tensor::Of(static_cast<char*>(params_.grad.data) +
                          info.param_offset * DTypeSize(params_.grad.dtype),
                      params_.grad.dtype, info.shape, context_->device());
  }
  return ArenaTensor(info.grad_offset, info.shape, info.dtype);
}

Tensor Graph::master(Value value) const {
  const ValueInfo& info = values_[value.id];
  return Tensor::Of(static_cast<char*>(params_.master.data) +
                        info.param_offset * DTypeSize(params_.master.dtype),
                    params_.master.dtype, info.shape, context_->device());
}

std::vector<Value> Graph::parameters() const {
  std::vector<Value> result;
  for (int i = 0; i < static_cast<int>(values_.size()); ++i) {
    if (values_[i].kind == ValueKind::kParameter) result.push_back(Value{i});
  }
  return result;
}

absl::Status Graph::SetInput(Value input, absl::Span<const int32_t> values) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("SetInput before Compile");
  }
  if (!input.valid() || input.id >= static_cast<int>(values_.size()) ||
      values_[input.id].kind != ValueKind::kInput) {
    return InvalidArgument("SetInput: not an input of this graph");
  }
  const ValueInfo& info = values_[input.id];
  if (static_cast<int64_t>(values.size()) != info.numel()) {
    return InvalidArgument("SetInput ", info.name, ": ", values.size(),
                           " values for shape ", ShapeText(info.shape));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    if ((v < 0 || v >= info.limit) &&
        !(info.allow_ignore && v == info.ignore_index)) {
      return InvalidArgument("SetInput ", info.name, ": value ", v,
                             " at position ", i, " is outside [0, ", info.limit,
                             ")");
    }
  }
  const Tensor host = Tensor::Of(const_cast<int32_t*>(values.data()),
                                 DType::kI32, info.shape, Device::Cpu());
  return CopyTensor(host, tensor(input), *context_);
}

absl::Status Graph::Forward(bool training) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("Forward before Compile");
  }
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    NodeRun run(*this, *context_, i);
    if (observer_) RETURN_IF_ERROR(observer_(i, false, true));
    absl::Status status = nodes_[i]->Forward(run, training);
    if (observer_ && status.ok()) status = observer_(i, false, false);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(values_[nodes_[i]->outputs[0].id].name,
                                       " forward: ", status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Graph::Backward() {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("Backward before Compile");
  }
  std::fill(grad_written_.begin(), grad_written_.end(), false);
  for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i) {
    Node& node = *nodes_[i];
    const ValueInfo& out = values_[node.outputs[0].id];
    if (!out.requires_grad) continue;
    // An output nobody propagated into (no consumer needs it) gets a zero
    // gradient rather than stale bytes.
    if (out.grad_offset >= 0 && !grad_written_[node.outputs[0].id]) {
      RETURN_IF_ERROR(ops::Zero(*context_, grad(node.outputs[0])));
    }
    NodeRun run(*this, *context_, i);
    if (observer_) RETURN_IF_ERROR(observer_(i, true, true));
    absl::Status status = node.Backward(run);
    if (observer_ && status.ok()) status = observer_(i, true, false);
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat(out.name, " backward: ", status.message()));
    }
    for (const Value& input : node.inputs) {
      if (values_[input.id].kind == ValueKind::kActivation &&
          values_[input.id].requires_grad) {
        grad_written_[input.id] = true;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Graph::ForwardBackward(bool use_cuda_graph) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("ForwardBackward before Compile");
  }
  if (!use_cuda_graph || !context_->device().is_cuda()) {
    RETURN_IF_ERROR(Forward(/*training=*/true));
    return Backward();
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

absl::Status Graph::SetLossScale(float scale) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("SetLossScale before Compile");
  }
  const Tensor host = Tensor::Of(&scale, DType::kF32, {}, Device::Cpu());
  RETURN_IF_ERROR(CopyTensor(host, loss_scale_.view, *context_));
  // `scale` lives on this stack frame: the copy must finish before return.
  return context_->Synchronize();
}

absl::Status Graph::ZeroGradients() {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("ZeroGradients before Compile");
  }
  return ops::Zero(*context_, params_.grad);
}

absl::Status Graph::SyncComputeCopy() {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("SyncComputeCopy before Compile");
  }
  if (params_.compute.data == params_.master.data) return absl::OkStatus();
  return ops::AccumulateInto(*context_, params_.master, params_.compute,
                             /*accumulate=*/false);
}

absl::StatusOr<float> Graph::ReadScalar(Value value) {
  if (context_ == nullptr) {
    return absl::FailedPreconditionError("ReadScalar before Compile");
  }
  const Tensor source = tensor(value);
  if (source.dtype != DType::kF32 || source.numel() != 1) {
    return InvalidArgument("ReadScalar: ", source.ShapeString(),
                           " is not an f32 scalar");
  }
  float result = 0;
  RETURN_IF_ERROR(CopyTensor(
      source, Tensor::Of(&result, DType::kF32, source.shape, Device::Cpu()),
      *context_));
  return result;
}

}  // namespace graph
}  // namespace lossrt
