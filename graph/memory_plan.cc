// Graph: compiling. The parameters' flat layout (decayed first, each aligned)
// and the memory plan of the arena, which places every activation, activation
// gradient and saved tensor at an offset that no buffer alive at the same time
// covers, over one forward and one backward pass.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "graph/nodes.h"
#include "graph/ops/elementwise.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

namespace lossrt {
namespace graph {
namespace {

// Parameters start on multiples of this many elements (256 bytes of bf16), so
// every view is aligned for vector loads and cuBLASLt.
constexpr int64_t kParameterAlignment = 128;
constexpr int64_t kArenaAlignment = 256;

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

}  // namespace graph
}  // namespace lossrt
