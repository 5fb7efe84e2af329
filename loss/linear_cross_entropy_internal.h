// Internals of the linear cross-entropy shared by its driver
// (linear_cross_entropy.cc) and its CPU and CUDA backends: the validated
// problem, the plan (schedule, chunk sizes, workspace layout), the blocks the
// schedule runs, and the backend interface. Internal to //loss (tests and
// benchmarks read plans to check and report the schedule).
//
// A block is rows [row_begin, row_end) x vocabulary columns
// [col_begin, col_end) of the logits. Running it means:
// - G1: logits[rows, cols] = hidden[rows] @ weight[cols]^T + bias[cols], in
//   fp32 in the workspace buffer;
// - CE: the cross-entropy kernel on the block, writing dlogits in place in the
//   operand dtype (whole rows: cross_entropy_cuda.h / cross_entropy_cpu.h; a
//   vocabulary slice: SliceBackward of linear_cross_entropy_kernels.h);
// - G2: d_hidden[rows] (+)= dlogits @ weight[cols] (written once over whole
//   rows; the kVocabSlices schedule accumulates the slices in fp32);
// - G3: d_weight[cols] (+)= dlogits^T @ hidden[rows] and
//   d_bias[cols] (+)= the column sums of dlogits, accumulated in fp32.
// The kVocabSlices schedule's first sweep runs G1 and a statistics kernel per
// slice (CeMode::kSliceStats), then finishes the rows' loss and lse
// (kSliceFinish, no GEMM).
#ifndef LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_INTERNAL_H_
#define LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/linear_cross_entropy.h"
#include "loss/linear_cross_entropy_kernels.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace lce {

enum class Pass { kForward, kForwardBackward, kBackward };

// One call, validated by the driver before the plan. Pointers refer to the
// caller's arguments; null = not given.
struct Problem {
  Pass pass = Pass::kForward;
  int64_t tokens = 0;  // N
  int64_t hidden = 0;  // H
  int64_t vocab = 0;   // V
  const LinearCrossEntropyInputs* inputs = nullptr;
  const LinearCrossEntropyOptions* options = nullptr;
  const Tensor* loss = nullptr;  // output (forward, fused)
  const Tensor* lse = nullptr;   // output (forward, fused) or input (backward)
  const Tensor* grad_loss = nullptr;  // optional (fused), required (backward)
  const LinearCrossEntropyGradients* gradients = nullptr;  // fused, backward
  const CrossEntropyExtras* extras = nullptr;  // optional (forward, fused)
  // The context's stream is being captured into a CUDA graph: one stream, no
  // wait for it (the target scan's verdict goes to the context's deferred
  // error count).
  bool capturing = false;

  DType operand_type() const { return inputs->hidden.dtype; }
  bool has_bias() const { return inputs->bias.has_value(); }
  bool backward() const { return pass != Pass::kForward; }
};

// The facts about a call that the plan depends on.
struct PlanInput {
  Pass pass = Pass::kForward;
  DeviceKind device = DeviceKind::kCpu;
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  DType operand_type = DType::kBF16;
  DType d_hidden_type = DType::kBF16;
  DType d_weight_type = DType::kF32;
  bool has_bias = false;
  bool bias_f32 = true;  // the bias is f32 (else a converted copy is needed)
  bool d_bias_f32 =
      true;  // d_bias is f32 (else token chunks need an fp32 accumulator)
  bool reduction_none = false;
  bool lse_given =
      false;  // the caller's lse (output or input) can hold the per-token lse
  int64_t max_workspace_bytes = 0;
  int64_t chunk_rows = 0;  // the caller's chunk rows; 0: the planner's
  bool use_tf32 = false;
  bool overlap_streams = true;
  LinearCrossEntropySchedule schedule = LinearCrossEntropySchedule::kAuto;
  bool accuracy = false;  // the accuracy's per-token terms need [N] floats
  bool target_logprob_given =
      false;  // the caller asked for target_logprob: [N] floats of its own
  // The entropy's gradient: the fused pass keeps to token chunks.
  bool entropy_gradient = false;
  // entropy_weight != 0, or extras that need whole rows (predicted, accuracy,
  // entropy): no kVocabSlices.
  bool whole_row_statistics = false;
  bool softcap = false;  // softcap > 0: no kCompactChunks
  // LinearCrossEntropyOptions::fp32_gradient_accumulation: false, no fp32
  // accumulators for 16-bit d_weight and d_bias.
  bool fp32_gradient_accumulation = true;
  // LinearCrossEntropyOptions::operand_dtype_logits: token chunks hold 16-bit
  // logits (the other schedules keep fp32 ones).
  bool operand_dtype_logits = false;
  // LinearCrossEntropyGradients::accumulate: every d_weight block adds to
  // the caller's values (the first token chunk reads them too).
  bool accumulate_gradients = false;
};

PlanInput PlanInputOf(const Problem& problem, DeviceKind device);

struct Plan {
  // kTokenChunks, kTwoPass or kVocabSlices (the forward pass runs token
  // chunks or vocabulary slices).
  LinearCrossEntropySchedule schedule =
      LinearCrossEntropySchedule::kTokenChunks;
  // Token chunks: rows per chunk (the last may be shorter) and the buffer's row
  // stride (floats; the vocabulary rounded up to 8 so that rows stay 32-byte
  // aligned).
  int64_t chunk_rows = 0;
  int64_t num_chunks = 0;
  int64_t chunk_ld = 0;
  // Token chunks of kVocabSlices: rows per token block (chunk_rows,
  // num_chunks). Vocabulary slices of the two-pass and kVocabSlices
  // schedules: columns per slice and row stride (floats).
  int64_t slice_cols = 0;
  int64_t num_slices = 0;
  int64_t slice_ld = 0;

  // Layout of the one workspace block (byte offsets, 256-aligned; -1 = not
  // needed).
  int64_t logits_offset = 0;  // fp32 logits / in-place dlogits
  int64_t logits_bytes = 0;
  // Bytes of a logit in the buffer: 4, or 2 for token chunks of 16-bit logits
  // (operand_dtype_logits; chunk_ld then counts 16-bit elements).
  int64_t logit_bytes = 4;
  int64_t d_weight_acc_offset =
      -1;  // fp32 [V, H] when token chunks write a 16-bit d_weight
  int64_t d_bias_acc_offset =
      -1;                    // fp32 [V] when token chunks write a 16-bit d_bias
  int64_t bias_offset = -1;  // fp32 [V] copy of a 16-bit bias
  int64_t row_loss_offset = -1;  // fp32 [N] per-token losses (mean, sum)
  int64_t row_hit_offset = -1;   // fp32 [N] the accuracy's per-token terms
  int64_t lse_offset = -1;  // fp32 [N] when the caller's lse cannot hold it
  // fp32 [N] the targets' log-probabilities for the two-pass slices, when the
  // caller did not ask for them.
  int64_t target_logprob_offset = -1;
  int64_t grad_scale_offset =
      -1;  // fp32 [1] or [N]: scaled incoming gradient (f16 dlogits)
  int64_t ones_offset =
      -1;  // [N] ones in the operand dtype: d_bias as a GEMV (CUDA)
  int64_t stats_offset = 0;  // ce::TargetStats
  // kVocabSlices: the rows' running max (fp32 [N]) and statistics (f64
  // [N, kStats], linear_cross_entropy_kernels.h); an fp32 [chunk_rows, H]
  // d_hidden accumulator when d_hidden is 16-bit and the slices are several.
  int64_t row_max_offset = -1;
  int64_t row_stats_offset = -1;
  int64_t d_hidden_acc_offset = -1;
  // kCompactChunks: the chunk's fp16 probabilities, then its dlogits in place
  // ([chunk_rows, chunk_ld] 16-bit; the logits buffer holds one slice), and
  // the rows' slice maxima (fp32 [chunk_rows, num_slices]); with row_max and
  // row_stats as kVocabSlices.
  int64_t compact_offset = -1;
  int64_t slice_max_offset = -1;
  int64_t block_bytes = 0;  // bytes allocated from the context's allocator
  int64_t gemm_workspace_bytes =
      0;                    // share of the context's cuBLASLt workspace used
  int64_t total_bytes = 0;  // block_bytes + gemm_workspace_bytes <= the budget

  // GPU: run the cross-entropy beside the GEMMs on a second stream (the option
  // asks for it and the GEMMs are long enough to hide it).
  bool overlap_streams = false;
  double estimated_seconds = 0;  // the cost model's estimate (H200-like rates)
  std::string ToString() const;
};

// The fastest schedule that fits the budget (or the requested one);
// InvalidArgument when none fits, naming the smallest budget that would.
absl::StatusOr<Plan> MakePlan(const PlanInput& input);

enum class CeMode {
  kForward,          // loss and lse of full rows (ce::LaunchRows without grad)
  kForwardBackward,  // loss, lse and dlogits of full rows (ce::LaunchRows)
  kBackward,  // dlogits of full rows from the saved lse (ce::LaunchBackward)
  kSliceBackward,    // dlogits of a vocabulary slice from the saved lse
                     // (SliceBackward)
  kSliceStats,       // a slice merged into its rows' statistics (SliceStats)
  kSliceFinish,      // the rows' loss and lse from their statistics (no GEMM)
  kCompactStats,     // kSliceStats, keeping the slice's fp16 probabilities
  kCompactBackward,  // dlogits of full rows from them (no G1; then G2, G3)
};

struct Block {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t col_begin = 0;
  int64_t col_end = 0;
  int64_t ld = 0;  // row stride of the block's logits in the buffer (floats)
  CeMode mode = CeMode::kForward;
  bool d_hidden = false;  // G2 into d_hidden[rows]
  bool d_weight =
      false;  // G3 into d_weight[cols] and, with a bias, d_bias[cols]
  // G3 adds to what earlier blocks wrote; kSliceStats: merges into the rows'
  // statistics of earlier slices.
  bool accumulate = false;
  // kVocabSlices: the buffer still holds this block's logits (the first
  // sweep's last slice): no G1.
  bool logits_ready = false;
  // kVocabSlices: G2 adds to the d_hidden rows of earlier slices, and after
  // this block's G2 the rows are done (the fp32 accumulator, if any, is
  // rounded into d_hidden).
  bool d_hidden_accumulate = false;
  bool d_hidden_done = false;
};

// The blocks of a plan, in execution order.
std::vector<Block> MakeBlocks(const PlanInput& input, const Plan& plan);

// A device's implementation of the blocks.
class Backend {
 public:
  virtual ~Backend() = default;
  // Scans the targets (the mean's denominators), rejects invalid ones and
  // prepares per-call state. Writes nothing the caller can see.
  virtual absl::Status Begin() = 0;
  virtual absl::Status RunBlock(const Block& block) = 0;
  // Sums the loss, rounds fp32 accumulators to the output dtypes, joins
  // streams.
  virtual absl::Status End() = 0;
};

absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const Problem& problem,
                                                        const Plan& plan,
                                                        Context& context);
#ifdef LOSSRT_WITH_CUDA
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const Problem& problem,
                                                         const Plan& plan,
                                                         Context& context);
#endif

// Points the cross-entropy arguments of a block of full rows from `row` at
// the call's extras (problem.extras, offset by `row`); `row_hit` is the plan's
// [N] array of the accuracy's terms (row_hit_offset) or null.
void SetChunkExtras(const Problem& problem, int64_t row, float* row_hit,
                    ce::RowArgs& args);

// [N] where the two-pass schedule's first pass, or the kVocabSlices
// schedule's finish, writes the targets' log-probabilities for the slices'
// gradient: `workspace` (the plan's target_logprob_offset) when the plan has
// one, else the caller's target_logprob when it asked for one; null for the
// token-chunk schedule and the split backward, which need none.
float* SliceTargetLogprob(const Problem& problem, const Plan& plan,
                          float* workspace);

// The kernel arguments of a kSliceStats or kSliceFinish block (both backends).
// The [N] arrays are the call's (row 0); `logits` is the buffer holding the
// block's slice; `row_loss` is the plan's [N] per-token losses, replaced by
// the caller's loss with the reduction none.
SliceStatsArgs MakeSliceStatsArgs(const Problem& problem, const Block& block,
                                  const float* logits, float* row_max,
                                  double* row_stats);
// The arguments of a kSliceBackward block's rows [row_begin, row_end) (both
// backends): `logits` holds row_begin's slice; grad_loss, lse and
// target_logprob (null: none) are the call's [N] arrays (row 0), grad_loss as
// the backend scaled it.
SliceArgs MakeSliceArgs(const Problem& problem, const Block& block,
                        int64_t row_begin, int64_t row_end, float* logits,
                        const ce::TargetStats* stats, const float* grad_loss,
                        bool grad_loss_per_row, const float* lse,
                        const float* target_logprob);
// kCompactStats and kCompactBackward blocks (both backends): `compact` is the
// chunk's fp16 rows (plan.compact_offset), `slice_max` its [chunk_rows,
// num_slices] maxima; grad_loss, lse and target_logprob are the call's [N]
// arrays (row 0), grad_loss as the backend scaled it.
CompactStatsArgs MakeCompactStatsArgs(const Problem& problem, const Plan& plan,
                                      const Block& block, const float* logits,
                                      float* row_max, double* row_stats,
                                      uint16_t* compact, float* slice_max);
CompactArgs MakeCompactArgs(const Problem& problem, const Plan& plan,
                            const Block& block, uint16_t* compact,
                            const float* slice_max,
                            const ce::TargetStats* stats,
                            const float* grad_loss, bool grad_loss_per_row,
                            const float* lse, const float* target_logprob);
SliceFinishArgs MakeSliceFinishArgs(const Problem& problem, const Block& block,
                                    const ce::TargetStats* stats,
                                    const float* row_max,
                                    const double* row_stats, float* lse,
                                    float* row_loss, float* target_logprob);

// Power-of-two factor by which 16-bit f16 dlogits are scaled to stay clear of
// underflow (the mean divides them by up to N): 1 for bf16 and f32, and for
// sum/none reductions.
float DlogitsScale(DType operand_type, int reduction, double ce_denominator);

// The operands' checks shared by the single-device and the vocabulary-parallel
// ops, for hidden [tokens, hidden] and weight [vocab, hidden] (vocab: the rows
// the caller holds): sizes, dtypes, the targets' and the bias's shapes, and
// that every operand is on the context's device.
absl::Status CheckOperands(const LinearCrossEntropyInputs& in, int64_t tokens,
                           int64_t hidden, int64_t vocab,
                           const Context& context);

}  // namespace lce
}  // namespace lossrt

#endif  // LOSSRT_LOSS_LINEAR_CROSS_ENTROPY_INTERNAL_H_
