// Graph: running a compiled graph. The views of values, gradients and saved
// tensors in the arena and the parameter buffers (NodeRun, the inspection
// methods), inputs, and the forward and backward passes over the recorded
// nodes.
#include "graph/graph.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph_internal.h"
#include "graph/ops/elementwise.h"
#include "runtime/status.h"

namespace lossrt {
namespace graph {

using internal::ShapeText;

int64_t ValueInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

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
