// The argument checks shared by the cross-entropy and the linear
// cross-entropy: one set of messages (loss_checks.h).
#include "loss/loss_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "loss/loss_checks_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#endif

namespace lossrt {
namespace ce {

absl::Status CheckOnContext(const Tensor& tensor, const Context& context,
                            absl::string_view name) {
  if (tensor.device != context.device()) {
    return InvalidArgument(name, " is on ", tensor.device.ToString(),
                           " but the context is on ",
                           context.device().ToString());
  }
  if (tensor.data == nullptr && tensor.numel() > 0)
    return InvalidArgument(name, ": null data");
  if (tensor.rank() >= 2 && tensor.row_stride != 0 &&
      tensor.row_stride < tensor.row_elements()) {
    return InvalidArgument(name, ": row_stride ", tensor.row_stride,
                           " is below the row length ", tensor.row_elements());
  }
  return absl::OkStatus();
}

absl::Status CheckVocab(int64_t vocab, absl::string_view what) {
  if (vocab < 1 || vocab > kMaxVocab) {
    return InvalidArgument(what, ": the vocabulary (", vocab,
                           ") must be in [1, ", kMaxVocab,
                           "] (the kernels index a row in 32 bits)");
  }
  return absl::OkStatus();
}

absl::Status CheckLossTensor(const Tensor& tensor, Reduction reduction,
                             int64_t tokens, const Context& context,
                             absl::string_view name) {
  RETURN_IF_ERROR(CheckDType(tensor, {DType::kF32}, name));
  if (reduction == Reduction::kNone) {
    RETURN_IF_ERROR(CheckShape(tensor, {tokens}, name));
  } else if (tensor.numel() != 1 || tensor.rank() > 1) {
    return InvalidArgument(
        name, ": expected a scalar ([] or [1]) for mean/sum reduction, got ",
        tensor.ShapeString());
  }
  return CheckOnContext(tensor, context, name);
}

absl::Status CheckLseTensor(const Tensor& tensor, int64_t tokens,
                            const Context& context, absl::string_view name) {
  RETURN_IF_ERROR(CheckDType(tensor, {DType::kF32}, name));
  RETURN_IF_ERROR(CheckShape(tensor, {tokens}, name));
  return CheckOnContext(tensor, context, name);
}

absl::Status CheckCrossEntropyOptions(const CrossEntropyOptions& options,
                                      int64_t vocab, const Context& context) {
  // Written so that NaN fails every range.
  if (!(options.label_smoothing >= 0.0f && options.label_smoothing < 1.0f)) {
    return InvalidArgument("label_smoothing must be in [0, 1), got ",
                           options.label_smoothing);
  }
  if (!(options.z_loss >= 0.0f) || !std::isfinite(options.z_loss)) {
    return InvalidArgument("z_loss must be finite and >= 0, got ",
                           options.z_loss);
  }
  if (!(options.softcap >= 0.0f) || !std::isfinite(options.softcap)) {
    return InvalidArgument("softcap must be finite and >= 0 (0 = off), got ",
                           options.softcap);
  }
  if (!std::isfinite(options.entropy_weight)) {
    return InvalidArgument("entropy_weight must be finite, got ",
                           options.entropy_weight);
  }
  if (options.class_weights.has_value()) {
    const Tensor& weights = *options.class_weights;
    RETURN_IF_ERROR(CheckDType(weights, {DType::kF32}, "class_weights"));
    RETURN_IF_ERROR(CheckShape(weights, {vocab}, "class_weights"));
    RETURN_IF_ERROR(CheckOnContext(weights, context, "class_weights"));
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> NamedExtras(const CrossEntropyExtras& extras) {
  std::vector<NamedTensor> named;
  if (extras.predicted.has_value())
    named.push_back({&*extras.predicted, "predicted"});
  if (extras.accuracy.has_value())
    named.push_back({&*extras.accuracy, "accuracy"});
  if (extras.entropy.has_value())
    named.push_back({&*extras.entropy, "entropy"});
  if (extras.target_logprob.has_value())
    named.push_back({&*extras.target_logprob, "target_logprob"});
  return named;
}

absl::Status CheckExtras(const CrossEntropyExtras& extras, int64_t tokens,
                         const Context& context,
                         const std::vector<NamedTensor>& others) {
  if (extras.predicted.has_value()) {
    const Tensor& predicted = *extras.predicted;
    RETURN_IF_ERROR(
        CheckDType(predicted, {DType::kI64, DType::kI32}, "predicted"));
    RETURN_IF_ERROR(CheckShape(predicted, {tokens}, "predicted"));
  }
  if (extras.accuracy.has_value()) {
    const Tensor& accuracy = *extras.accuracy;
    RETURN_IF_ERROR(CheckDType(accuracy, {DType::kF32}, "accuracy"));
    if (accuracy.numel() != 1 || accuracy.rank() > 1) {
      return InvalidArgument("accuracy: expected a scalar ([] or [1]), got ",
                             accuracy.ShapeString());
    }
  }
  for (const std::optional<Tensor>* per_token :
       {&extras.entropy, &extras.target_logprob}) {
    if (!per_token->has_value()) continue;
    const char* name =
        per_token == &extras.entropy ? "entropy" : "target_logprob";
    RETURN_IF_ERROR(CheckDType(**per_token, {DType::kF32}, name));
    RETURN_IF_ERROR(CheckShape(**per_token, {tokens}, name));
  }
  const std::vector<NamedTensor> named = NamedExtras(extras);
  for (size_t i = 0; i < named.size(); ++i) {
    RETURN_IF_ERROR(CheckOnContext(*named[i].tensor, context, named[i].name));
    for (const NamedTensor& other : others) {
      if (other.tensor != nullptr && Overlaps(*named[i].tensor, *other.tensor))
        return InvalidArgument(named[i].name, " overlaps ", other.name);
    }
    for (size_t j = 0; j < i; ++j) {
      if (Overlaps(*named[i].tensor, *named[j].tensor))
        return InvalidArgument(named[i].name, " overlaps ", named[j].name);
    }
  }
  return absl::OkStatus();
}

bool ChecksTargetStats(const CrossEntropyOptions& options) {
  return options.validate_targets || options.class_weights.has_value();
}

absl::Status CheckTargetStats(const TargetStats& stats,
                              const CrossEntropyOptions& options,
                              int64_t tokens, int64_t vocab) {
  if (stats.negative_weights > 0) {
    return InvalidArgument("class_weights: ", stats.negative_weights, " of ",
                           vocab, " weights are negative or NaN");
  }
  if (options.validate_targets && stats.invalid > 0) {
    return InvalidArgument(
        "targets: ", stats.invalid, " of ", tokens, " are outside [0, ", vocab,
        ") and not ignore_index (", options.ignore_index, ")");
  }
  return absl::OkStatus();
}

#ifdef LOSSRT_WITH_CUDA
absl::Status ReadBackTargetStats(const TargetStats* stats, cudaStream_t stream,
                                 const CrossEntropyOptions& options,
                                 int64_t tokens, int64_t vocab,
                                 TargetStats* host) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, stats, sizeof(*host),
                                       cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return CheckTargetStats(*host, options, tokens, vocab);
}

absl::Status DeferTargetStatsCheck(Context& context, const TargetStats* stats,
                                   const CrossEntropyOptions& options,
                                   cudaStream_t stream) {
  if (!ChecksTargetStats(options)) return absl::OkStatus();
  ASSIGN_OR_RETURN(int64_t * count, DeferredErrorCountOf(context));
  CUDA_RETURN_IF_ERROR(LaunchAddDeferredErrors(
      stats, options.validate_targets, options.class_weights.has_value(), count,
      stream));
  return absl::OkStatus();
}
#endif

}  // namespace ce
}  // namespace lossrt
