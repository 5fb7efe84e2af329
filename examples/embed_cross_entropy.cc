// The loss module embedded in a few lines: the cross-entropy of random logits
// against random targets, forward then backward from the saved lse, on the
// default device (the first GPU if there is one, else the CPU), through
// loss/cross_entropy.h alone. Prints the loss and checks that every gradient
// row sums to ~0 (softmax minus one-hot, smoothed).
//
//   bazel run //examples:embed_cross_entropy
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "loss/cross_entropy.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace {

absl::Status Run() {
  constexpr int64_t kTokens = 256;
  constexpr int64_t kVocab = 32000;
  const lossrt::Device device = lossrt::DefaultDevice();
  ASSIGN_OR_RETURN(std::unique_ptr<lossrt::Context> context,
                   lossrt::Context::Create(device));
  lossrt::Allocator& allocator = context->allocator();

  // Inputs: logits like a language model's (stddev 3) and uniform targets.
  ASSIGN_OR_RETURN(lossrt::OwnedTensor logits,
                   lossrt::EmptyTensor(allocator, lossrt::DType::kF32,
                                       {kTokens, kVocab}));  // [tokens, vocab]
  ASSIGN_OR_RETURN(lossrt::OwnedTensor targets,
                   lossrt::EmptyTensor(allocator, lossrt::DType::kI64,
                                       {kTokens}));  // [tokens]
  RETURN_IF_ERROR(
      lossrt::FillNormal(logits.view, /*seed=*/1, 0.0f, 3.0f, *context));
  RETURN_IF_ERROR(
      lossrt::FillRandomInt(targets.view, /*seed=*/2, 0, kVocab, *context));

  // Outputs: the mean loss, the lse saved for the backward pass, the gradient.
  ASSIGN_OR_RETURN(
      lossrt::OwnedTensor loss,
      lossrt::EmptyTensor(allocator, lossrt::DType::kF32, {}));  // []
  ASSIGN_OR_RETURN(lossrt::OwnedTensor lse,
                   lossrt::EmptyTensor(allocator, lossrt::DType::kF32,
                                       {kTokens}));  // [tokens]
  ASSIGN_OR_RETURN(lossrt::OwnedTensor grad_logits,
                   lossrt::EmptyTensor(allocator, lossrt::DType::kF32,
                                       {kTokens, kVocab}));  // [tokens, vocab]
  ASSIGN_OR_RETURN(
      lossrt::OwnedTensor grad_loss,
      lossrt::EmptyTensor(allocator, lossrt::DType::kF32, {}));  // []
  float one = 1.0f;
  RETURN_IF_ERROR(lossrt::CopyTensor(
      lossrt::Tensor::Of(&one, lossrt::DType::kF32, {}, lossrt::Device::Cpu()),
      grad_loss.view, *context));

  lossrt::CrossEntropyOptions options;  // mean over the tokens
  options.label_smoothing = 0.1f;
  RETURN_IF_ERROR(lossrt::CrossEntropyForward(
      *context, logits.view, targets.view, options, loss.view, &lse.view));
  RETURN_IF_ERROR(lossrt::CrossEntropyBackward(
      *context, logits.view, targets.view, lse.view, grad_loss.view, options,
      grad_logits.view));

  // Back to the host (CopyTensor waits for the device).
  float loss_value = 0.0f;
  std::vector<float> grad(kTokens * kVocab);  // [tokens, vocab]
  RETURN_IF_ERROR(
      lossrt::CopyTensor(loss.view,
                         lossrt::Tensor::Of(&loss_value, lossrt::DType::kF32,
                                            {}, lossrt::Device::Cpu()),
                         *context));
  RETURN_IF_ERROR(lossrt::CopyTensor(
      grad_logits.view,
      lossrt::Tensor::Of(grad.data(), lossrt::DType::kF32, {kTokens, kVocab},
                         lossrt::Device::Cpu()),
      *context));

  // Without class weights or z-loss, each gradient row sums to 0 (up to
  // rounding); the largest element of a row is at most 1 / tokens.
  double worst_row_sum = 0.0;
  for (int64_t i = 0; i < kTokens; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < kVocab; ++j) sum += grad[i * kVocab + j];
    worst_row_sum = std::fmax(worst_row_sum, std::fabs(sum));
  }
  std::printf("device %s: %lld tokens x %lld classes, label smoothing %.2f\n",
              device.ToString().c_str(), static_cast<long long>(kTokens),
              static_cast<long long>(kVocab), options.label_smoothing);
  std::printf("mean cross-entropy loss %.6f (log(vocab) = %.6f)\n", loss_value,
              std::log(double{kVocab}));
  std::printf("largest |sum of a gradient row| %.3g (expected ~0)\n",
              worst_row_sum);
  if (!std::isfinite(loss_value) || !(worst_row_sum < 1e-6)) {
    return absl::InternalError(
        "check failed: non-finite loss or gradient rows that do not sum to 0");
  }
  std::printf("check passed\n");
  return absl::OkStatus();
}

}  // namespace

int main() {
  const absl::Status status = Run();
  if (!status.ok()) {
    std::fprintf(stderr, "embed_cross_entropy: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
