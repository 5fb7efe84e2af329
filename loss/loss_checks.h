// The argument checks shared by the cross-entropy op (cross_entropy.cc) and the
// linear cross-entropy (linear_cross_entropy*.cc), so that both reject the
// same inputs with the same messages: tensors on the context, the loss-shaped
// tensors, the cross-entropy options, and the verdict on a target scan
// (ce::TargetStats) -- read back outside a CUDA graph capture, deferred to the
// context's count (Context::TakeDeferredErrorCount) inside one. Internal to
// //loss.
//
//   RETURN_IF_ERROR(ce::CheckCrossEntropyOptions(options, vocab, context));
//   RETURN_IF_ERROR(ce::CheckLossTensor(loss, options.reduction, tokens,
//                                       context, "loss"));
#ifndef LOSSRT_LOSS_LOSS_CHECKS_H_
#define LOSSRT_LOSS_LOSS_CHECKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_kernels.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lossrt {
namespace ce {

// The largest vocabulary: the kernels index within a row in 32 bits (rows
// themselves in 64).
inline constexpr int64_t kMaxVocab = (int64_t{1} << 30) - 1;

// OK when `tensor` is on the context's device, has data (unless it is empty)
// and, from rank 2, a row_stride of 0 or at least its row length; otherwise an
// InvalidArgument naming `name`.
absl::Status CheckOnContext(const Tensor& tensor, const Context& context,
                            absl::string_view name);

// A vocabulary of `vocab` classes that the kernels handle: [1, kMaxVocab].
// `what` names where it comes from ("logits", "weight").
absl::Status CheckVocab(int64_t vocab, absl::string_view what);

// `loss` or `grad_loss`: f32, [tokens] for Reduction::kNone, else a scalar
// ([] or [1]); CheckOnContext.
absl::Status CheckLossTensor(const Tensor& tensor, Reduction reduction,
                             int64_t tokens, const Context& context,
                             absl::string_view name);

// `lse` (or another per-token f32 array, such as a saved entropy, named
// `name`): f32 [tokens]; CheckOnContext.
absl::Status CheckLseTensor(const Tensor& tensor, int64_t tokens,
                            const Context& context,
                            absl::string_view name = "lse");

// The options' values (label_smoothing in [0, 1), z_loss and softcap finite
// and >= 0, entropy_weight finite) and the class weights' tensor (f32 [vocab]
// on the context). Their values (>= 0) are checked by the target scan:
// CheckTargetStats.
absl::Status CheckCrossEntropyOptions(const CrossEntropyOptions& options,
                                      int64_t vocab, const Context& context);

// A tensor and the name its messages give it.
struct NamedTensor {
  const Tensor* tensor;
  const char* name;
};

// The extras' tensors: predicted i32 or i64 [tokens], accuracy f32 [] or
// [1], entropy and target_logprob f32 [tokens], each on the context; none
// overlapping another extra or any of `others` (the call's inputs and outputs;
// null tensors are skipped).
absl::Status CheckExtras(const CrossEntropyExtras& extras, int64_t tokens,
                         const Context& context,
                         const std::vector<NamedTensor>& others);

// The extras' tensors that are given, named, for overlap checks.
std::vector<NamedTensor> NamedExtras(const CrossEntropyExtras& extras);

// Whether a call needs the target scan's verdict: the targets are validated,
// or class weights are given (their signs are always checked).
bool ChecksTargetStats(const CrossEntropyOptions& options);

// InvalidArgument for negative or NaN class weights and, when the options
// validate them, for targets outside [0, vocab) that are not ignore_index.
absl::Status CheckTargetStats(const TargetStats& stats,
                              const CrossEntropyOptions& options,
                              int64_t tokens, int64_t vocab);

#ifdef LOSSRT_WITH_CUDA
// Outside a capture: copies the scan's stats (device memory) to `host`, waits
// for the stream, and returns CheckTargetStats's verdict.
absl::Status ReadBackTargetStats(const TargetStats* stats, cudaStream_t stream,
                                 const CrossEntropyOptions& options,
                                 int64_t tokens, int64_t vocab,
                                 TargetStats* host);

// Inside a capture, in place of ReadBackTargetStats: the captured work adds
// what CheckTargetStats would reject (the invalid targets when validated, the
// negative class weights) to the context's deferred error count. Nothing is
// launched when !ChecksTargetStats(options).
absl::Status DeferTargetStatsCheck(Context& context, const TargetStats* stats,
                                   const CrossEntropyOptions& options,
                                   cudaStream_t stream);
#endif

}  // namespace ce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LOSS_CHECKS_H_
