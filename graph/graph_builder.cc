// Graph: the builder. Each builder method checks its operands' shapes (the
// first inconsistency becomes the graph's build error), records a node of
// graph/nodes.h and returns the node's output Value.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "graph/graph_internal.h"
#include "graph/nodes.h"

namespace lossrt {
namespace graph {

using internal::ShapeText;

Graph::Graph(DType activation_dtype) : activation_dtype_(activation_dtype) {}

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

Value Graph::AddAccuracyOutput(Value loss) {
  if (!loss.valid()) return loss;
  const int index = values_[loss.id].producer;
  ValueInfo out;
  out.name = absl::StrCat(nodes_[index]->type(), index, ":accuracy");
  out.kind = ValueKind::kActivation;
  out.dtype = DType::kF32;
  out.producer = index;
  // No consumer and no gradient: the memory plan keeps it to the end of the
  // pass, like the loss, so that it can be read after Forward().
  nodes_[index]->outputs.push_back(AddValue(std::move(out)));
  return loss;
}

Value Graph::HeadAccuracy(Value loss) const {
  if (!loss.valid() || loss.id >= static_cast<int>(values_.size()) ||
      values_[loss.id].producer < 0) {
    return Value{};
  }
  const Node& node = *nodes_[values_[loss.id].producer];
  const bool head = std::strcmp(node.type(), "LinearCrossEntropy") == 0 ||
                    std::strcmp(node.type(), "CrossEntropy") == 0;
  if (!head || node.outputs.size() < 2 || node.outputs[0].id != loss.id) {
    return Value{};
  }
  return node.outputs[1];
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
  auto node = MakeEmbeddingNode(seq, position_table.has_value(), rows,
                                table.shape[0], width);
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
                             int64_t heads,
                             const ops::CausalAttentionOptions& options) {
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
  auto node = MakeAttentionNode(batch, seq, heads, width / heads,
                                activation_dtype_, options);
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
  // Trainable parameters with f32 gradients take d_weight (and d_bias)
  // directly in the training forward.
  auto trainable = [&](Value value) {
    const ValueInfo& info = values_[value.id];
    return info.kind == ValueKind::kParameter && info.requires_grad;
  };
  const bool direct = accumulator_dtype() == DType::kF32 && trainable(weight) &&
                      (!bias || trainable(*bias));
  auto node = MakeLinearCrossEntropyNode(options, bias.has_value(), direct);
  node->inputs = {hidden, weight};
  if (bias) node->inputs.push_back(*bias);
  node->inputs.push_back(targets);
  node->aux = {AuxSpec{hs, activation_dtype_}};
  if (!direct) {
    node->aux.push_back(AuxSpec{ws, accumulator_dtype()});
    if (bias) node->aux.push_back(AuxSpec{{ws[0]}, accumulator_dtype()});
  }
  return AddAccuracyOutput(AddNode(std::move(node), "loss", {}, DType::kF32));
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
  return AddAccuracyOutput(AddNode(std::move(node), "loss", {}, DType::kF32));
}

}  // namespace graph
}  // namespace lossrt
