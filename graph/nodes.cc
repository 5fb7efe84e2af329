// Node types of the graph: thin adapters from NodeRun's tensors to the ops.
#include "graph/nodes.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "graph/ops/activation.h"
#include "graph/ops/attention.h"
#include "graph/ops/elementwise.h"
#include "graph/ops/embedding.h"
#include "graph/ops/linear.h"
#include "graph/ops/norm.h"
#include "runtime/status.h"

namespace lossrt {
namespace graph {
namespace {

// An activation input without a gradient where the op always produces one.
absl::Status NeedsGrad(const char* node, const Tensor* grad) {
  if (grad != nullptr) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(node, ": the backward needs the gradient of its input"));
}

// Input i's gradient when it is the output's gradient unchanged (a residual
// operand): dy written or added to it, or nothing when the memory plan made it
// dy's own buffer.
absl::Status PassGradientThrough(NodeRun& run, int i) {
  const Tensor* dx = run.input_grad(i);
  if (dx == nullptr || run.grad_shares_output(i)) return absl::OkStatus();
  return ops::AccumulateInto(run.context(), run.output_grad(0), *dx,
                             run.accumulate(i));
}

class EmbeddingNode final : public Node {
 public:
  EmbeddingNode(int64_t seq, bool with_positions, int64_t rows, int64_t vocab,
                int64_t width)
      : seq_(seq),
        with_positions_(with_positions),
        rows_(rows),
        vocab_(vocab),
        width_(width) {}
  const char* type() const override { return "Embedding"; }
  int64_t WorkspaceBytes(const Device& device) const override {
    return ops::EmbeddingBackwardWorkspaceBytes(device, rows_, vocab_, width_);
  }
  // inputs: ids, token_table[, position_table]
  absl::Status Forward(NodeRun& run, bool) override {
    const Tensor positions = with_positions_ ? run.input(2) : Tensor();
    // Graph::SetInput checked the ids on the host.
    return ops::EmbeddingForward(run.context(), run.input(0), run.input(1),
                                 with_positions_ ? &positions : nullptr, seq_,
                                 run.output(0), /*check_ids=*/false);
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* d_table = run.input_grad(1);
    const Tensor* d_positions = with_positions_ ? run.input_grad(2) : nullptr;
    RETURN_IF_ERROR(NeedsGrad("Embedding", d_table));
    return ops::EmbeddingBackward(run.context(), run.input(0),
                                  run.output_grad(0), seq_, *d_table,
                                  d_positions, /*check_ids=*/false);
  }

 private:
  int64_t seq_;
  bool with_positions_;
  int64_t rows_, vocab_, width_;
};

class LinearNode final : public Node {
 public:
  LinearNode(bool with_bias, bool with_residual, int64_t rows, int64_t out)
      : with_bias_(with_bias),
        with_residual_(with_residual),
        rows_(rows),
        out_(out) {}
  const char* type() const override { return "Linear"; }
  int64_t WorkspaceBytes(const Device& device) const override {
    return with_bias_ ? ops::LinearBackwardWorkspaceBytes(device, rows_, out_)
                      : 0;
  }
  uint32_t PassThroughInputs() const override {
    return with_residual_ ? 1u << Residual() : 0u;
  }
  // inputs: x, weight[, bias][, residual]
  absl::Status Forward(NodeRun& run, bool) override {
    const Tensor bias = with_bias_ ? run.input(2) : Tensor();
    const Tensor* b = with_bias_ ? &bias : nullptr;
    if (with_residual_) {
      return ops::LinearResidualForward(run.context(), run.input(0),
                                        run.input(1), b, run.input(Residual()),
                                        run.output(0));
    }
    return ops::LinearForward(run.context(), run.input(0), run.input(1), b,
                              run.output(0));
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* d_weight = run.input_grad(1);
    RETURN_IF_ERROR(NeedsGrad("Linear", d_weight));
    RETURN_IF_ERROR(ops::LinearBackward(
        run.context(), run.input(0), run.input(1), run.output_grad(0),
        run.input_grad(0), run.accumulate(0), *d_weight,
        with_bias_ ? run.input_grad(2) : nullptr));
    return with_residual_ ? PassGradientThrough(run, Residual())
                          : absl::OkStatus();
  }

 private:
  int Residual() const { return with_bias_ ? 3 : 2; }
  bool with_bias_, with_residual_;
  int64_t rows_, out_;
};

class LayerNormNode final : public Node {
 public:
  LayerNormNode(float eps, bool with_beta, int64_t rows, int64_t cols)
      : eps_(eps), with_beta_(with_beta), rows_(rows), cols_(cols) {}
  const char* type() const override { return "LayerNorm"; }
  int64_t WorkspaceBytes(const Device& device) const override {
    return ops::NormBackwardWorkspaceBytes(device, rows_, cols_);
  }
  // inputs: x, gamma[, beta]; aux: mean, rstd
  absl::Status Forward(NodeRun& run, bool) override {
    const Tensor beta = with_beta_ ? run.input(2) : Tensor();
    return ops::LayerNormForward(run.context(), run.input(0), run.input(1),
                                 with_beta_ ? &beta : nullptr, eps_,
                                 run.output(0), run.aux(0), run.aux(1));
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* dx = run.input_grad(0);
    const Tensor* d_gamma = run.input_grad(1);
    RETURN_IF_ERROR(NeedsGrad("LayerNorm", dx));
    RETURN_IF_ERROR(NeedsGrad("LayerNorm", d_gamma));
    return ops::LayerNormBackward(run.context(), run.input(0), run.input(1),
                                  run.aux(0), run.aux(1), run.output_grad(0),
                                  *dx, run.accumulate(0), *d_gamma,
                                  with_beta_ ? run.input_grad(2) : nullptr);
  }

 private:
  float eps_;
  bool with_beta_;
  int64_t rows_, cols_;
};

class RmsNormNode final : public Node {
 public:
  RmsNormNode(float eps, int64_t rows, int64_t cols)
      : eps_(eps), rows_(rows), cols_(cols) {}
  const char* type() const override { return "RmsNorm"; }
  int64_t WorkspaceBytes(const Device& device) const override {
    return ops::NormBackwardWorkspaceBytes(device, rows_, cols_);
  }
  // inputs: x, gamma; aux: rstd
  absl::Status Forward(NodeRun& run, bool) override {
    return ops::RmsNormForward(run.context(), run.input(0), run.input(1), eps_,
                               run.output(0), run.aux(0));
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* dx = run.input_grad(0);
    const Tensor* d_gamma = run.input_grad(1);
    RETURN_IF_ERROR(NeedsGrad("RmsNorm", dx));
    RETURN_IF_ERROR(NeedsGrad("RmsNorm", d_gamma));
    return ops::RmsNormBackward(run.context(), run.input(0), run.input(1),
                                run.aux(0), run.output_grad(0), *dx,
                                run.accumulate(0), *d_gamma);
  }

 private:
  float eps_;
  int64_t rows_, cols_;
};

// GELU and SwiGLU: y = f(x), dx from x and dy.
class ActivationNode final : public Node {
 public:
  explicit ActivationNode(bool swiglu) : swiglu_(swiglu) {}
  const char* type() const override { return swiglu_ ? "SwiGlu" : "Gelu"; }
  absl::Status Forward(NodeRun& run, bool) override {
    return swiglu_
               ? ops::SwiGluForward(run.context(), run.input(0), run.output(0))
               : ops::GeluForward(run.context(), run.input(0), run.output(0));
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* dx = run.input_grad(0);
    RETURN_IF_ERROR(NeedsGrad(type(), dx));
    return swiglu_
               ? ops::SwiGluBackward(run.context(), run.input(0),
                                     run.output_grad(0), *dx, run.accumulate(0))
               : ops::GeluBackward(run.context(), run.input(0),
                                   run.output_grad(0), *dx, run.accumulate(0));
  }

 private:
  bool swiglu_;
};

// The GELU MLP, y = gelu(x w1^T + b1) w2^T + b2, as one node so that the GELU
// runs in the GEMMs' epilogues (ops::LinearGeluForward and
// ops::LinearGeluBackwardInput): no GELU kernel, no pass over the hidden
// activations for it either way.
class GeluMlpNode final : public Node {
 public:
  GeluMlpNode(bool with_bias, bool with_residual, int64_t rows, int64_t hidden,
              int64_t out)
      : with_bias_(with_bias),
        with_residual_(with_residual),
        rows_(rows),
        hidden_(hidden),
        out_(out) {}
  const char* type() const override { return "GeluMlp"; }
  uint32_t PassThroughInputs() const override {
    return with_residual_ ? 1u << Residual() : 0u;
  }
  int64_t WorkspaceBytes(const Device& device) const override {
    if (!with_bias_) return 0;
    return std::max(ops::LinearBackwardWorkspaceBytes(device, rows_, hidden_),
                    ops::LinearBackwardWorkspaceBytes(device, rows_, out_));
  }
  // inputs: x, w1[, b1], w2[, b2][, residual]; aux: h = x w1^T + b1 and
  // a = gelu(h), both [rows, hidden].
  absl::Status Forward(NodeRun& run, bool) override {
    const Tensor b1 = with_bias_ ? run.input(2) : Tensor();
    const Tensor b2 = with_bias_ ? run.input(4) : Tensor();
    RETURN_IF_ERROR(ops::LinearGeluForward(
        run.context(), run.input(0), run.input(1), with_bias_ ? &b1 : nullptr,
        run.aux(1), run.aux(0)));
    if (with_residual_) {
      return ops::LinearResidualForward(
          run.context(), run.aux(1), run.input(W2()),
          with_bias_ ? &b2 : nullptr, run.input(Residual()), run.output(0));
    }
    return ops::LinearForward(run.context(), run.aux(1), run.input(W2()),
                              with_bias_ ? &b2 : nullptr, run.output(0));
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* d_w1 = run.input_grad(1);
    const Tensor* d_w2 = run.input_grad(W2());
    RETURN_IF_ERROR(NeedsGrad("GeluMlp", d_w1));
    RETURN_IF_ERROR(NeedsGrad("GeluMlp", d_w2));
    const Tensor dy = run.output_grad(0);
    const Tensor a = run.aux(1);
    // The second layer's weights first: they read a, whose buffer then takes
    // the gradient of h.
    RETURN_IF_ERROR(ops::LinearBackward(
        run.context(), a, run.input(W2()), dy, nullptr, false, *d_w2,
        with_bias_ ? run.input_grad(W2() + 1) : nullptr));
    RETURN_IF_ERROR(ops::LinearGeluBackwardInput(run.context(), run.input(W2()),
                                                 dy, run.aux(0), a));
    RETURN_IF_ERROR(ops::LinearBackward(
        run.context(), run.input(0), run.input(1), a, run.input_grad(0),
        run.accumulate(0), *d_w1, with_bias_ ? run.input_grad(2) : nullptr));
    return with_residual_ ? PassGradientThrough(run, Residual())
                          : absl::OkStatus();
  }

 private:
  int W2() const { return with_bias_ ? 3 : 2; }
  int Residual() const { return with_bias_ ? 5 : 3; }
  bool with_bias_, with_residual_;
  int64_t rows_, hidden_, out_;
};

class AddNode final : public Node {
 public:
  const char* type() const override { return "Add"; }
  uint32_t PassThroughInputs() const override { return 0b11u; }
  absl::Status Forward(NodeRun& run, bool) override {
    return ops::Add(run.context(), run.input(0), run.input(1), run.output(0));
  }
  absl::Status Backward(NodeRun& run) override {
    RETURN_IF_ERROR(PassGradientThrough(run, 0));
    return PassGradientThrough(run, 1);
  }
};

class AttentionNode final : public Node {
 public:
  AttentionNode(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                DType dtype, const ops::CausalAttentionOptions& options)
      : batch_(batch),
        seq_(seq),
        heads_(heads),
        head_dim_(head_dim),
        dtype_(dtype),
        options_(options) {}
  const char* type() const override { return "CausalAttention"; }
  // For kCudnn an estimate that covers cuDNN's own figure (the op's tests
  // check it); the exact one needs the graphs built on a context.
  int64_t WorkspaceBytes(const Device& device) const override {
    return ops::CausalAttentionWorkspaceBytes(device, dtype_, batch_, seq_,
                                              heads_, head_dim_, options_);
  }
  // inputs: qkv; aux: lse
  absl::Status Forward(NodeRun& run, bool) override {
    return ops::CausalAttentionForward(run.context(), run.input(0), batch_,
                                       seq_, heads_, run.output(0), run.aux(0),
                                       options_);
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* d_qkv = run.input_grad(0);
    RETURN_IF_ERROR(NeedsGrad("CausalAttention", d_qkv));
    return ops::CausalAttentionBackward(
        run.context(), run.input(0), run.output(0), run.aux(0),
        run.output_grad(0), batch_, seq_, heads_, *d_qkv, run.accumulate(0),
        options_);
  }

 private:
  int64_t batch_, seq_, heads_, head_dim_;
  DType dtype_;
  ops::CausalAttentionOptions options_;
};

class LinearCrossEntropyNode final : public Node {
 public:
  LinearCrossEntropyNode(const LinearCrossEntropyOptions& options,
                         bool with_bias, bool weight_grads_direct)
      : options_(options),
        with_bias_(with_bias),
        weight_grads_direct_(weight_grads_direct) {}
  const char* type() const override { return "LinearCrossEntropy"; }
  // inputs: hidden, weight[, bias], targets; outputs: loss, accuracy
  // (evaluation only); aux: d_hidden[, d_weight[, d_bias]] (d_weight and
  // d_bias unless weight_grads_direct)
  absl::Status Forward(NodeRun& run, bool training) override {
    const int targets = with_bias_ ? 3 : 2;
    LinearCrossEntropyInputs in{run.input(0), run.input(1), std::nullopt,
                                run.input(targets)};
    if (with_bias_) in.bias = run.input(2);
    if (!training) {
      // Evaluation: the accuracy (output 1) in the same pass as the loss.
      CrossEntropyExtras extras;
      extras.accuracy = run.output(1);
      return LinearCrossEntropyForward(run.context(), in, options_,
                                       run.output(0), nullptr, &extras);
    }
    // The training forward computes the gradients while the logits chunks
    // are on chip; Backward() only hands them on. The parameters' gradients,
    // which always accumulate, take d_weight and d_bias directly: no [V, C]
    // temporary, no addition after (the graph's gradients are cleared before
    // the forward, ZeroGradients()).
    LinearCrossEntropyGradients gradients;
    gradients.d_hidden = run.aux(0);
    if (weight_grads_direct_) {
      gradients.d_weight = *run.input_grad(1);
      if (with_bias_) gradients.d_bias = *run.input_grad(2);
      gradients.accumulate = true;
    } else {
      gradients.d_weight = run.aux(1);
      if (with_bias_) gradients.d_bias = run.aux(2);
    }
    const Tensor scale = run.loss_scale();
    return LinearCrossEntropyForwardBackward(
        run.context(), in, options_, run.output(0), nullptr, gradients, &scale);
  }
  absl::Status Backward(NodeRun& run) override {
    const int parts = weight_grads_direct_ ? 1 : with_bias_ ? 3 : 2;
    for (int i = 0; i < parts; ++i) {
      const Tensor* grad = run.input_grad(i);
      if (grad == nullptr) continue;
      RETURN_IF_ERROR(ops::AccumulateInto(run.context(), run.aux(i), *grad,
                                          run.accumulate(i)));
    }
    return absl::OkStatus();
  }

 private:
  LinearCrossEntropyOptions options_;
  bool with_bias_;
  bool weight_grads_direct_;
};

class CrossEntropyNode final : public Node {
 public:
  CrossEntropyNode(const CrossEntropyOptions& options, int64_t rows,
                   int64_t vocab)
      : options_(options),
        workspace_(CrossEntropyWorkspaceBytes(rows, vocab)) {}
  const char* type() const override { return "CrossEntropy"; }
  int64_t WorkspaceBytes(const Device&) const override { return workspace_; }
  // The logits' gradient may be written over the logits (the op works in
  // place): no second [rows, V] buffer when nothing else reads them.
  int InPlaceGradientInput() const override { return 0; }
  // inputs: logits, targets; outputs: loss, accuracy (evaluation only); aux:
  // lse
  absl::Status Forward(NodeRun& run, bool training) override {
    const Tensor lse = run.aux(0);
    CrossEntropyExtras extras;
    if (!training) extras.accuracy = run.output(1);
    return CrossEntropyForward(run.context(), run.input(0), run.input(1),
                               options_, run.output(0), &lse,
                               training ? nullptr : &extras);
  }
  absl::Status Backward(NodeRun& run) override {
    const Tensor* grad = run.input_grad(0);
    if (grad == nullptr) return absl::OkStatus();
    if (run.accumulate(0)) {
      return absl::UnimplementedError(
          "CrossEntropy: logits consumed elsewhere too (their gradient "
          "would have to accumulate)");
    }
    return CrossEntropyBackward(run.context(), run.input(0), run.input(1),
                                run.aux(0), run.loss_scale(), options_, *grad);
  }

 private:
  CrossEntropyOptions options_;
  int64_t workspace_;
};

}  // namespace

std::unique_ptr<Node> MakeEmbeddingNode(int64_t seq, bool with_positions,
                                        int64_t rows, int64_t vocab,
                                        int64_t width) {
  return std::make_unique<EmbeddingNode>(seq, with_positions, rows, vocab,
                                         width);
}
std::unique_ptr<Node> MakeLinearNode(bool with_bias, bool with_residual,
                                     int64_t rows, int64_t out) {
  return std::make_unique<LinearNode>(with_bias, with_residual, rows, out);
}
std::unique_ptr<Node> MakeLayerNormNode(float eps, bool with_beta, int64_t rows,
                                        int64_t cols) {
  return std::make_unique<LayerNormNode>(eps, with_beta, rows, cols);
}
std::unique_ptr<Node> MakeRmsNormNode(float eps, int64_t rows, int64_t cols) {
  return std::make_unique<RmsNormNode>(eps, rows, cols);
}
std::unique_ptr<Node> MakeGeluNode() {
  return std::make_unique<ActivationNode>(false);
}
std::unique_ptr<Node> MakeSwiGluNode() {
  return std::make_unique<ActivationNode>(true);
}
std::unique_ptr<Node> MakeGeluMlpNode(bool with_bias, bool with_residual,
                                      int64_t rows, int64_t hidden,
                                      int64_t out) {
  return std::make_unique<GeluMlpNode>(with_bias, with_residual, rows, hidden,
                                       out);
}
std::unique_ptr<Node> MakeAddNode() { return std::make_unique<AddNode>(); }
std::unique_ptr<Node> MakeAttentionNode(
    int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, DType dtype,
    const ops::CausalAttentionOptions& options) {
  return std::make_unique<AttentionNode>(batch, seq, heads, head_dim, dtype,
                                         options);
}
std::unique_ptr<Node> MakeLinearCrossEntropyNode(
    const LinearCrossEntropyOptions& options, bool with_bias,
    bool weight_grads_direct) {
  return std::make_unique<LinearCrossEntropyNode>(options, with_bias,
                                                  weight_grads_direct);
}
std::unique_ptr<Node> MakeCrossEntropyNode(const CrossEntropyOptions& options,
                                           int64_t rows, int64_t vocab) {
  return std::make_unique<CrossEntropyNode>(options, rows, vocab);
}

bool BackwardReadsOutput(const Node& node) {
  return std::strcmp(node.type(), "CausalAttention") == 0;
}

}  // namespace graph
}  // namespace lossrt
