// Linear cross-entropy: the language-model head's projection fused with the
// cross-entropy, so that the [tokens, vocab] logits never exist in full. logits
// = hidden @ weight^T (+ bias) is computed a bounded chunk at a time (fp32, by
// cuBLASLt on a GPU, Eigen on the CPU), the cross-entropy kernels of
// loss/cross_entropy.h run on each chunk, and the gradients of hidden, weight
// and bias are accumulated in fp32 from the chunk's dlogits, which are stored
// in the operand dtype (see Precision).
//
// clang-format off
//   // Mean over non-ignored tokens, at most 1 GiB of temporaries.
//   lossrt::LinearCrossEntropyOptions options;
//   options.cross_entropy.label_smoothing = 0.1f;
//   RETURN_IF_ERROR(lossrt::LinearCrossEntropyForwardBackward(
//       *context, {hidden, weight, /*bias=*/std::nullopt, targets}, options,
//       loss, /*lse=*/nullptr, {d_hidden, d_weight, /*d_bias=*/std::nullopt}));
// clang-format on
//
// The loss and its options are exactly those of CrossEntropyForward on the full
// logits (loss/cross_entropy.h), with logits[i, v] = sum_h hidden[i, h] *
// weight[v, h] + bias[v]; so are the extras (CrossEntropyExtras: predicted
// token, accuracy, entropy, target log-probability), computed chunk by chunk
// with the loss (the accuracy reduced over all chunks). With entropy_weight !=
// 0, LinearCrossEntropyForwardBackward runs the token-chunk schedule (kTwoPass
// is refused) and LinearCrossEntropyBackward is refused (InvalidArgument: its
// chunks would need the per-token entropy); the forward takes token chunks.
// kVocabSlices computes the loss, lse and target_logprob only: it is refused
// with entropy_weight != 0 or the predicted, accuracy or entropy extras, and
// kAuto does not pick it then.
//
// Tensors: hidden [N, H] and weight [V, H] of one dtype, f32, bf16 or f16 (rows
// may be strided); bias [V] f32 or the weight's dtype; targets i64 or i32 [N];
// loss f32 [] (mean, sum) or [N] (none); lse f32 [N]; grad_loss f32 [] or [N]
// (none); d_hidden [N, H] in f32 or the hidden dtype; d_weight [V, H] in f32 or
// the weight dtype; d_bias [V] in f32 or the bias dtype. All on the context's
// device.
//
// Precision, the same on both backends and on every schedule but
// kCompactChunks (at the end): logits are fp32 (fp32
// accumulation; f32 operands with use_tf32 go through TF32 on the GPU; with
// operand_dtype_logits, where the plan runs token chunks, they are then rounded
// to the operand dtype, and the loss, lse and dlogits are those of the rounded
// logits), and so are the dlogits computed from them, which are then stored in
// the operand dtype: with bf16 or f16 operands each dlogit is rounded to it
// (f16 with the mean reduction: after scaling by a power of two no larger than
// the mean's denominator, undone exactly by the gradient GEMMs' alpha).
// d_hidden = dlogits @ weight, d_weight = dlogits^T @ hidden and d_bias = the
// column sums of dlogits all come from those stored dlogits (d_bias too: on the
// GPU a GEMV of them with a vector of ones), with fp32 accumulation: cuBLASLt
// with fp32 compute on the GPU, Eigen in fp32 on the CPU (from exact fp32
// copies of 16-bit operands); products of 16-bit values are exact. With token
// chunks d_weight and d_bias are summed over the chunks in fp32 (in the output
// itself when it is f32, else in an fp32 accumulator); the two-pass schedule
// writes each vocabulary slice's once; kVocabSlices sums d_hidden over the
// slices and d_weight and d_bias over the token blocks in fp32 the same way.
// Every gradient is rounded once to its output dtype (but a 16-bit d_weight and
// d_bias with fp32_gradient_accumulation off: once a chunk). So with 16-bit
// operands, f32 gradient outputs spare only that final rounding: they carry the
// dlogits' (up to 2^-8 relative per dlogit for bf16, 2^-11 for f16, and nearly
// alike for all target entries, so it does not average out), typically 1e-4 to
// 4e-3 relative (Frobenius) from the exact gradients for bf16 and a few 1e-4
// for f16, while they agree with the products of the rounded dlogits to fp32
// accumulation error (pinned by tests/loss/linear_cross_entropy_test.cc). With
// f32 operands (TF32 off) the dlogits stay fp32 and the gradients are
// fp32-accurate. A target's dlogit keeps p_t - 1 even when it is below an f32
// ulp of the lse (near-certain targets): the fused call computes it from the
// row max and log-sum on every schedule (the two-pass and kVocabSlices slices
// read the target's log-probability from the first pass, which keeps the
// target's term apart from the other exponentials); the split backward, which
// has only the saved f32 lse, cannot. kCompactChunks forms each dlogit from its
// logit's exp(z - slice max) held in fp16 (2^-11 relative) rather than from the
// fp32 logit, so its dlogits carry that rounding before their own: its
// gradients stay within 1.5 times the other schedules' distance from the exact
// ones (pinned by the same test); its loss, lse and target entries are computed
// from the fp32 logits as everywhere else.
//
// Memory: every temporary of a call (logits chunk, fp32 accumulators,
// per-token scratch and the share of the cuBLASLt workspace it uses) fits in
// `max_workspace_bytes` and comes from the context's allocator (the CPU backend
// also keeps fp32 copies of 16-bit operands, outside the budget).
//
// Errors: InvalidArgument, with nothing written, for invalid inputs (shapes,
// dtypes, devices, null data, overlapping outputs, targets outside [0, V) that
// are not ignore_index, negative class weights; inside a CUDA graph capture
// these last two are counted instead, see below) and for a budget that cannot
// hold a single chunk (the message names the smallest that can). Results are
// bitwise the same from run to run for the same shapes, options and device,
// on a context's first call as on later ones, and with its GEMM tuning on or
// off (Context::set_gemm_tuning).
//
// Optional tensors follow loss/cross_entropy.h: an optional argument of a call
// (lse, grad_loss) is a `const Tensor*`, nullptr when not given; an optional
// member of a struct (bias, d_bias, class_weights) is a
// `std::optional<Tensor>`, std::nullopt when not given.
//
// CUDA graphs: as the cross-entropy (loss/cross_entropy.h), the calls may be
// captured by themselves. Inside a capture of the context's stream they wait
// for nothing: the target scan's verdict goes to the context's deferred error
// count (Context::TakeDeferredErrorCount) instead of an InvalidArgument, and
// the cross-entropy runs on the context's stream only (overlap_streams is
// ignored: no second stream or event is created). The backward of f16 operands
// with the mean reduction needs the number of counted tokens on the host (its
// gradient scale) and fails there (FailedPrecondition). The workspace block
// comes from the context's allocator: run a call of the same shape before
// capturing, so that the allocator's cache holds it (a miss inside a capture
// calls cudaMalloc, which only a capture in cudaStreamCaptureModeRelaxed
// allows).
#ifndef LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_H_
#define LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "loss/cross_entropy.h"
#include "runtime/context.h"
#include "runtime/tensor.h"

namespace lossrt {

// How the work is cut into chunks (kAuto picks the faster that fits the
// budget).
enum class LinearCrossEntropySchedule {
  kAuto,
  // Chunks of tokens with all of the vocabulary: one GEMM per chunk for each of
  // logits, d_hidden and d_weight; d_weight accumulates over chunks (fp32
  // read-modify-write per chunk).
  kTokenChunks,
  // A token-chunk pass (logits, cross-entropy, d_hidden) then a
  // vocabulary-slice pass that recomputes each slice's logits over all tokens
  // and writes its d_weight rows once: a fourth GEMM instead of d_weight
  // traffic, and no fp32 accumulator. For small budgets.
  kTwoPass,
  // Blocks of tokens, each swept over vocabulary slices twice: the first sweep
  // computes each slice's logits and merges their row statistics (max, sum of
  // exponentials, the target's logit) into the rows' lse and loss; the second
  // (backward) recomputes each slice's logits but the last one's, for its
  // dlogits, its d_weight rows and the block's d_hidden (accumulated over the
  // slices in fp32). The weight is read once per block rather than once per
  // chunk of a few rows, so the GEMMs stay large at the smallest budgets, and
  // the forward can use it too. No entropy_weight, and no predicted, accuracy
  // or entropy extras (target_logprob is computed); +inf logits give NaN.
  kVocabSlices,
  // Token chunks whose logits are held as 16-bit probabilities: each chunk's
  // logits are computed a vocabulary slice at a time into a small fp32
  // buffer, whose row statistics are merged as kVocabSlices merges them and
  // whose exp(z - slice max) are kept in fp16 for the whole chunk; the
  // gradient is then formed from them in place, for one d_hidden and one
  // d_weight GEMM a chunk. Half the bytes a logit of kTokenChunks: about twice
  // the tokens a chunk in the same budget, so half the d_weight accumulations,
  // and no GEMM recomputed. 16-bit operands only; no soft cap, none of
  // kVocabSlices's refused options, no split backward (its forward alone is
  // kVocabSlices'). kAuto chooses it where the cost model expects it faster
  // (bench/RESULTS.md: the H = 4096 shapes at 256-384 MiB).
  kCompactChunks,
};

struct LinearCrossEntropyOptions {
  CrossEntropyOptions cross_entropy;
  // Bound on all temporary memory of one call, in bytes.
  int64_t max_workspace_bytes = int64_t{1} << 30;
  // Tokens a chunk (token chunks, the two-pass schedule's first pass) or a
  // token block (kVocabSlices), the last one shorter; 0: as many as the
  // budget and the planner's cost model choose. A value the budget cannot
  // hold is an InvalidArgument. QuACK calls it the chunk size.
  int64_t chunk_rows = 0;
  // f32 operands: let the GEMMs use TF32 tensor cores (faster, about 1e-3
  // relative error).
  bool use_tf32 = false;
  LinearCrossEntropySchedule schedule = LinearCrossEntropySchedule::kAuto;
  // How a 16-bit d_weight or d_bias is summed over token chunks (or token
  // blocks). true: in an fp32 accumulator in the workspace (4 bytes per
  // element: 2 GB for V = 128256, H = 4096), rounded to the output once.
  // false: straight into the output, whose running sum is rounded to its
  // dtype after every chunk, as Liger-Kernel's accum_dtype=None does: no
  // accumulator, so token chunks fit budgets that cannot hold one, at up to
  // sqrt(chunks) times the rounding error (pinned by
  // tests/loss/linear_cross_entropy_test.cc). f32 outputs and d_hidden are
  // unaffected; the vocabulary-parallel ops refuse false.
  bool fp32_gradient_accumulation = true;
  // 16-bit operands: the logits GEMM writes the logits rounded to the operand
  // dtype (bf16 or f16), as PyTorch's 16-bit matmul does, and the
  // cross-entropy runs on them: 2 bytes a logit instead of 4, so twice the
  // tokens fit a chunk and its pass moves 4 bytes a logit instead of 6. The
  // loss, lse and gradients are then those of the rounded logits (a logit's
  // rounding is up to 2^-8 relative for bf16, 2^-11 for f16), not of the fp32
  // ones. The token chunks take 16-bit logits; kAuto weighs them against the
  // other schedules, which keep fp32 logits, and takes whichever its cost
  // model expects faster or alone fits (small budgets; a bf16 d_weight's fp32
  // accumulator beside token chunks), so a call's logits are 16-bit only where
  // its plan runs token chunks. Each call plans for itself: a split backward
  // may pair its logits with an lse of the other precision (pass kTokenChunks
  // to both to keep them alike). kTokenChunks always rounds; kTwoPass,
  // kVocabSlices and kCompactChunks, a bias and f32 operands are refused
  // (InvalidArgument); the vocabulary-parallel ops refuse the option.
  bool operand_dtype_logits = false;
  // GPU: run the cross-entropy kernels on a second stream, concurrently with
  // the GEMMs (where the plan expects it to pay; never inside a CUDA graph
  // capture).
  bool overlap_streams = true;
};

// The operands of a call.
struct LinearCrossEntropyInputs {
  Tensor hidden;               // [N, H]
  Tensor weight;               // [V, H]
  std::optional<Tensor> bias;  // [V]
  Tensor targets;              // [N]
};

// Where the gradients go (outputs, written through the views). d_bias is
// required exactly when the inputs have a bias.
struct LinearCrossEntropyGradients {
  Tensor d_hidden;               // [N, H]
  Tensor d_weight;               // [V, H]
  std::optional<Tensor> d_bias;  // [V]
  // d_weight and d_bias get the gradient added to what they hold, as PyTorch
  // accumulates .grad, instead of written over it (d_hidden is always
  // written): a trainer passes its parameters' gradient buffers and spares a
  // [V, H] temporary and its addition. f32 d_weight and d_bias only
  // (InvalidArgument otherwise); every schedule adds in the same fp32 GEMMs
  // (beta = 1) that otherwise sum the chunks.
  bool accumulate = false;
};

// Loss only (evaluation), and the per-token lse when `lse` is given (the split
// forward saves it for LinearCrossEntropyBackward). One pass of logits GEMMs,
// no gradients.
absl::Status LinearCrossEntropyForward(
    Context& context, const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse = nullptr, const CrossEntropyExtras* extras = nullptr);

// The training path: loss (and lse if given) and all gradients in one call.
// `grad_loss` (optional) scales the gradients as in LinearCrossEntropyBackward.
absl::Status LinearCrossEntropyForwardBackward(
    Context& context, const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse, const LinearCrossEntropyGradients& gradients,
    const Tensor* grad_loss = nullptr,
    const CrossEntropyExtras* extras = nullptr);

// The split backward: gradients from the lse saved by LinearCrossEntropyForward
// and the incoming gradient of the loss (f32 [] for mean/sum, [N] for none);
// the logits are recomputed chunk by chunk.
absl::Status LinearCrossEntropyBackward(
    Context& context, const LinearCrossEntropyInputs& inputs, const Tensor& lse,
    const Tensor& grad_loss, const LinearCrossEntropyOptions& options,
    const LinearCrossEntropyGradients& gradients);

}  // namespace lossrt

#endif  // LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_H_
