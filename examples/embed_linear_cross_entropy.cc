// Embedding the fused linear cross-entropy in a trainer: a language-model head
// (weight and bias) trained by plain SGD on fixed random hidden states and
// targets. Each step is one call that returns the loss and the head's gradients
// without materializing the [tokens, vocab] logits; the update runs on the host
// to keep the example to the public headers (a real trainer would apply its
// optimizer on the device).
//
// clang-format off
//   bazel run //examples:embed_linear_cross_entropy          # the GPU if there is one
//   bazel run //examples:embed_linear_cross_entropy -- cpu
// clang-format on
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "loss/linear_cross_entropy.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace {

constexpr int64_t kTokens = 512;  // N
constexpr int64_t kHidden = 64;   // H
constexpr int64_t kVocab = 2000;  // V
constexpr int kSteps = 10;
constexpr float kLearningRate = 20.0f;

absl::Status Train(const lossrt::Device& device) {
  using lossrt::DType;
  using lossrt::Tensor;
  ASSIGN_OR_RETURN(std::unique_ptr<lossrt::Context> context,
                   lossrt::Context::Create(device));
  lossrt::Allocator& allocator = context->allocator();
  std::printf("training a %lld x %lld head on %lld tokens on %s\n",
              static_cast<long long>(kVocab), static_cast<long long>(kHidden),
              static_cast<long long>(kTokens), device.ToString().c_str());

  // Host copies: the inputs, and the parameters that SGD updates.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> hidden(kTokens * kHidden);  // [N, H]
  std::vector<float> weight(kVocab * kHidden);   // [V, H]
  std::vector<float> bias(kVocab, 0.0f);         // [V]
  std::vector<int64_t> targets(kTokens);         // [N]
  for (float& x : hidden) x = normal(rng);
  for (float& x : weight)
    x = normal(rng) / std::sqrt(static_cast<float>(kHidden));
  for (int64_t& t : targets)
    t = std::uniform_int_distribution<int64_t>(0, kVocab - 1)(rng);
  const lossrt::Device cpu = lossrt::Device::Cpu();
  auto host = [&](void* data, DType dtype, lossrt::Shape shape) {
    return Tensor::Of(data, dtype, std::move(shape), cpu);
  };

  // The same tensors on the device, and the outputs.
  ASSIGN_OR_RETURN(lossrt::OwnedTensor d_hidden_in,
                   EmptyTensor(allocator, DType::kF32, {kTokens, kHidden}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor d_weight_in,
                   EmptyTensor(allocator, DType::kF32, {kVocab, kHidden}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor d_bias_in,
                   EmptyTensor(allocator, DType::kF32, {kVocab}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor d_targets,
                   EmptyTensor(allocator, DType::kI64, {kTokens}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor loss,
                   EmptyTensor(allocator, DType::kF32, {}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor grad_hidden,
                   EmptyTensor(allocator, DType::kF32, {kTokens, kHidden}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor grad_weight,
                   EmptyTensor(allocator, DType::kF32, {kVocab, kHidden}));
  ASSIGN_OR_RETURN(lossrt::OwnedTensor grad_bias,
                   EmptyTensor(allocator, DType::kF32, {kVocab}));
  RETURN_IF_ERROR(
      CopyTensor(host(hidden.data(), DType::kF32, {kTokens, kHidden}),
                 d_hidden_in.view, *context));
  RETURN_IF_ERROR(CopyTensor(host(targets.data(), DType::kI64, {kTokens}),
                             d_targets.view, *context));

  // Mean over the tokens, at most 1 GiB of temporaries.
  lossrt::LinearCrossEntropyOptions options;
  options.cross_entropy.label_smoothing = 0.05f;
  const lossrt::LinearCrossEntropyInputs inputs{
      d_hidden_in.view, d_weight_in.view, d_bias_in.view, d_targets.view};
  const lossrt::LinearCrossEntropyGradients gradients{
      grad_hidden.view, grad_weight.view, grad_bias.view};
  std::vector<float> dw(weight.size()), db(bias.size());
  float loss_value = 0;
  for (int step = 0; step < kSteps; ++step) {
    RETURN_IF_ERROR(
        CopyTensor(host(weight.data(), DType::kF32, {kVocab, kHidden}),
                   d_weight_in.view, *context));
    RETURN_IF_ERROR(CopyTensor(host(bias.data(), DType::kF32, {kVocab}),
                               d_bias_in.view, *context));
    // One call: loss, d_hidden, d_weight and d_bias.
    RETURN_IF_ERROR(lossrt::LinearCrossEntropyForwardBackward(
        *context, inputs, options, loss.view,
        /*lse=*/nullptr, gradients));
    RETURN_IF_ERROR(
        CopyTensor(loss.view, host(&loss_value, DType::kF32, {}), *context));
    RETURN_IF_ERROR(CopyTensor(grad_weight.view,
                               host(dw.data(), DType::kF32, {kVocab, kHidden}),
                               *context));
    RETURN_IF_ERROR(CopyTensor(
        grad_bias.view, host(db.data(), DType::kF32, {kVocab}), *context));
    std::printf("step %2d  loss %.4f\n", step, loss_value);
    for (size_t i = 0; i < weight.size(); ++i)
      weight[i] -= kLearningRate * dw[i];
    for (size_t i = 0; i < bias.size(); ++i) bias[i] -= kLearningRate * db[i];
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<lossrt::Device> device =
      argc > 1 ? lossrt::ParseDevice(argv[1]) : lossrt::DefaultDevice();
  absl::Status status = device.ok() ? Train(*device) : device.status();
  if (!status.ok()) {
    std::fprintf(stderr, "embed_linear_cross_entropy: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
