// The linear cross-entropy's driver: argument checks (loss_checks.h for what it
// shares with the cross-entropy op), the plan (which schedule, how large the
// chunks, where each temporary lives in the one workspace block), and the loop
// over blocks that the CPU or CUDA backend runs.
#include "loss/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/kernel_args.h"
#include "loss/linear_cross_entropy_internal.h"
#include "loss/linear_cross_entropy_kernels.h"
#include "loss/loss_checks.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#endif

namespace lossrt {
namespace lce {
namespace {

constexpr int64_t kAlignment = 256;
constexpr int64_t kMiB = int64_t{1} << 20;
// The most of the context's cuBLASLt workspace a call uses (out of its budget):
// enough for the split-K and stream-K kernels of these shapes, small next to a
// logits chunk. Below that, a share of the budget: 1/64 for token chunks, whose
// GEMMs' fastest candidates use at most a few bytes of workspace, so that the
// rest goes to fewer, larger logits chunks; 1/16 for the two-pass schedule,
// whose GEMMs ran slower with less (bench/RESULTS.md, What was tried and
// dropped).
constexpr int64_t kGemmWorkspaceBytes = 16 * kMiB;
constexpr int64_t kTokenChunksGemmWorkspaceShare = 64;
// The cuBLASLt workspace of a plan that needs the room for its buffers.
constexpr int64_t kSmallGemmWorkspaceBytes = 4 * kMiB;
constexpr int64_t kTwoPassGemmWorkspaceShare = 16;

int64_t RoundDown(int64_t value, int64_t multiple) {
  return value / multiple * multiple;
}

// What the runtime allocator hands out (and counts) for a request of `bytes`:
// small blocks round to 256 B, large ones to 2 MiB (runtime/allocator.cc).
int64_t AllocatedBytes(int64_t bytes) {
  return RoundUp(bytes, bytes < kMiB ? kAlignment : 2 * kMiB);
}

// The largest request whose allocation fits in `bytes`.
int64_t LargestRequest(int64_t bytes) {
  if (bytes >= 2 * kMiB) return RoundDown(bytes, 2 * kMiB);
  return std::min(RoundDown(bytes, kAlignment), kMiB - kAlignment);
}

std::string Bytes(int64_t bytes) {
  if (bytes >= kMiB)
    return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / kMiB);
  return absl::StrCat(bytes, " B");
}

// Sub-buffers of the workspace block, each 256-byte aligned.
class Layout {
 public:
  int64_t Add(int64_t bytes) {
    const int64_t offset = size_;
    size_ += RoundUp(bytes, kAlignment);
    return offset;
  }
  int64_t AddIf(bool needed, int64_t bytes) { return needed ? Add(bytes) : -1; }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

// Rough H200 rates for choosing between schedules (only their ratios matter).
// The cross-entropy kernels' rate is about what they reached there on fp32
// logits in and a 16-bit gradient out, below the copy rate.
struct Rates {
  double flops;
  double bytes_per_second = 3.8e12;
  double ce_bytes_per_second = 1.8e12;
  double launch_seconds = 6e-6;
};

// Overlapping the cross-entropy with the GEMMs pays (measured on the H200)
// only when the GEMMs of a block take several times longer than its
// cross-entropy: per logit, 2H flops per GEMM against 4 + dlogits bytes. Even
// then it saved only 3-5%, so the estimates below assume it hides nothing.
constexpr double kOverlapMinGemmToCeRatio = 3.0;

// With tuned GEMMs (H200, bf16, H = 4096), the second stream paid only where
// the token chunks were at most two; over more chunks it was slower than one
// stream (bench/RESULTS.md, What was tried and dropped).
constexpr int64_t kOverlapMaxTokenChunks = 2;

// The two-pass schedule ran about 8% above its estimate on the H200 (its
// second pass's launches and slice kernels): a tie goes to token chunks.
constexpr double kTwoPassOverhead = 1.08;

Rates RatesFor(const PlanInput& in) {
  Rates rates;
  if (in.operand_type != DType::kF32) {
    rates.flops = 6.6e14;
  } else {
    rates.flops = in.use_tf32 ? 3.8e14 : 5.0e13;
  }
  return rates;
}

// A GEMM over `token_rows` tokens: compute- or memory-bound, with the token
// dimension padded to the 128-row tiles of the GEMM kernels.
// `accumulator_bytes` (beta = 1: C read and written again) do not hide under
// the GEMM's compute, as measured: they add.
double GemmSeconds(const Rates& rates, int64_t token_rows, double flops,
                   double bytes, double accumulator_bytes = 0) {
  const double efficiency =
      static_cast<double>(token_rows) /
      static_cast<double>(RoundUp(token_rows, int64_t{128}));
  return std::max(flops / (rates.flops * efficiency),
                  bytes / rates.bytes_per_second) +
         accumulator_bytes / rates.bytes_per_second + rates.launch_seconds;
}

// Bytes a d_weight element's running sum over token chunks takes: fp32 (the
// output itself or an fp32 accumulator) unless a 16-bit output accumulates in
// its own dtype (fp32_gradient_accumulation off).
double RunningSumBytes(const PlanInput& in) {
  return in.d_weight_type != DType::kF32 && !in.fp32_gradient_accumulation
             ? static_cast<double>(DTypeSize(in.d_weight_type))
             : 4.0;
}

struct Costs {
  double logit;   // bytes of a logit in the buffer (4, or 2: 16-bit logits)
  double e;       // operand bytes
  double ge;      // dlogits bytes
  double dh;      // d_hidden bytes
  double dw;      // d_weight bytes as written by the GEMM
  double hidden;  // H
  double vocab;   // V
};

// A token chunk of c rows over the whole vocabulary.
double TokenChunkSeconds(const PlanInput& in, const Rates& r, const Costs& k,
                         int64_t c, bool d_weight, bool first) {
  const double rows = static_cast<double>(c);
  const double flops = 2.0 * rows * k.vocab * k.hidden;
  const double vh = k.vocab * k.hidden;
  double seconds = GemmSeconds(
      r, c, flops, k.e * (vh + rows * k.hidden) + k.logit * rows * k.vocab);
  if (in.pass == Pass::kForward) {
    return seconds + k.logit * rows * k.vocab / r.ce_bytes_per_second +
           r.launch_seconds;
  }
  seconds += (k.logit + k.ge) * rows * k.vocab / r.ce_bytes_per_second;
  seconds += GemmSeconds(
      r, c, flops, k.e * vh + k.ge * rows * k.vocab + k.dh * rows * k.hidden);
  if (d_weight) {
    // The first chunk writes the running sum; the others (and every chunk
    // with accumulate) read and write it.
    const bool overwrite = first && !in.accumulate_gradients;
    seconds += GemmSeconds(r, c, flops,
                           k.e * rows * k.hidden + k.ge * rows * k.vocab +
                               (overwrite ? RunningSumBytes(in) * vh : 0),
                           overwrite ? 0 : 2 * RunningSumBytes(in) * vh);
  }
  return seconds;
}

// A vocabulary slice of v columns over all tokens (two-pass schedule).
double SliceSeconds(const PlanInput& in, const Rates& r, const Costs& k,
                    int64_t v) {
  const double n = static_cast<double>(in.tokens);
  const double cols = static_cast<double>(v);
  const double flops = 2.0 * n * cols * k.hidden;
  double seconds =
      GemmSeconds(r, in.tokens, flops,
                  k.e * (n * k.hidden + cols * k.hidden) + 4 * n * cols);
  seconds += (4 + k.ge) * n * cols / r.ce_bytes_per_second;
  seconds += GemmSeconds(
      r, in.tokens, flops,
      k.e * n * k.hidden + k.ge * n * cols + k.dw * cols * k.hidden);
  return seconds;
}

// Rows per token chunk: as many as fit, balanced over the chunks and rounded to
// GEMM tiles.
int64_t ChunkRows(int64_t tokens, int64_t max_rows) {
  if (tokens == 0) return 0;
  max_rows = std::min(max_rows, tokens);
  const int64_t chunks = CeilDiv(tokens, max_rows);
  const int64_t balanced = CeilDiv(tokens, chunks);
  return max_rows >= 64 ? std::min(max_rows, RoundUp(balanced, int64_t{64}))
                        : balanced;
}

struct Candidate {
  bool feasible = false;
  Plan plan;
};

// The share of the context's cuBLASLt workspace a plan uses (1/share of the
// budget, at most kGemmWorkspaceBytes; none on the CPU).
int64_t GemmWorkspaceBytes(const PlanInput& in, int64_t share) {
  if (in.device != DeviceKind::kCuda) return 0;
  return std::min<int64_t>(
      kGemmWorkspaceBytes,
      RoundDown(in.max_workspace_bytes / share, kAlignment));
}

// Vocabulary slices of at most `max_cols` columns (>= 8) covering the
// vocabulary: whole GEMM tiles when they are large; 8 columns keep rows
// 32-byte aligned.
void SetSlices(int64_t max_cols, int64_t vocab, Plan& plan) {
  if (max_cols >= plan.chunk_ld) {
    plan.slice_cols = vocab;
    plan.slice_ld = plan.chunk_ld;
  } else {
    const int64_t granule = max_cols >= 256 ? 128 : 8;
    const int64_t cols = RoundDown(max_cols, granule);
    plan.slice_cols =
        std::min(cols, RoundUp(CeilDiv(vocab, CeilDiv(vocab, cols)), granule));
    plan.slice_ld = plan.slice_cols;
  }
  plan.num_slices = CeilDiv(vocab, plan.slice_cols);
}

// The logits buffer of `logits_floats` floats first in the block, the `fixed`
// regions after it; the block's size and whether it fits the budget.
void PlaceAfterLogits(const Layout& fixed, int64_t logits_floats,
                      int64_t budget, Candidate& out) {
  Plan& plan = out.plan;
  plan.logits_offset = 0;
  plan.logits_bytes = 4 * logits_floats;
  const int64_t fixed_begin = RoundUp(plan.logits_bytes, kAlignment);
  for (int64_t* offset :
       {&plan.stats_offset, &plan.row_loss_offset, &plan.row_hit_offset,
        &plan.lse_offset, &plan.target_logprob_offset, &plan.row_max_offset,
        &plan.row_stats_offset, &plan.grad_scale_offset, &plan.bias_offset,
        &plan.ones_offset, &plan.d_bias_acc_offset, &plan.d_weight_acc_offset,
        &plan.d_hidden_acc_offset, &plan.compact_offset,
        &plan.slice_max_offset}) {
    if (*offset >= 0) *offset += fixed_begin;
  }
  plan.block_bytes = fixed_begin + fixed.size();
  plan.total_bytes =
      AllocatedBytes(plan.block_bytes) + plan.gemm_workspace_bytes;
  out.feasible = plan.total_bytes <= budget;
}

Candidate PlanSchedule(const PlanInput& in,
                       LinearCrossEntropySchedule schedule) {
  const bool token_chunks =
      schedule == LinearCrossEntropySchedule::kTokenChunks;
  const bool backward = in.pass != Pass::kForward;
  const int64_t n = in.tokens;
  const int64_t v = in.vocab;
  const int64_t e = DTypeSize(in.operand_type);
  Candidate out;
  Plan& plan = out.plan;
  plan.schedule = schedule;
  plan.chunk_ld = RoundUp(v, int64_t{8});
  plan.gemm_workspace_bytes =
      GemmWorkspaceBytes(in, token_chunks ? kTokenChunksGemmWorkspaceShare
                                          : kTwoPassGemmWorkspaceShare);

  // Everything but the logits buffer, which comes first.
  Layout fixed;
  plan.stats_offset = fixed.Add(sizeof(ce::TargetStats));
  plan.row_loss_offset =
      fixed.AddIf(in.pass != Pass::kBackward && !in.reduction_none, 4 * n);
  plan.row_hit_offset = fixed.AddIf(in.accuracy, 4 * n);
  plan.lse_offset = fixed.AddIf(
      !in.lse_given && !token_chunks && in.pass == Pass::kForwardBackward,
      4 * n);
  plan.target_logprob_offset =
      fixed.AddIf(!in.target_logprob_given && !token_chunks &&
                      in.pass == Pass::kForwardBackward,
                  4 * n);
  plan.grad_scale_offset =
      fixed.AddIf(in.operand_type == DType::kF16 && backward,
                  4 * (in.reduction_none ? n : 1));
  plan.bias_offset = fixed.AddIf(in.has_bias && !in.bias_f32, 4 * v);
  plan.ones_offset = fixed.AddIf(
      in.has_bias && backward && in.device == DeviceKind::kCuda, e * n);
  const bool accumulators = token_chunks && in.fp32_gradient_accumulation;
  plan.d_bias_acc_offset = fixed.AddIf(
      in.has_bias && backward && !in.d_bias_f32 && accumulators, 4 * v);
  plan.d_weight_acc_offset =
      fixed.AddIf(backward && in.d_weight_type != DType::kF32 && accumulators,
                  4 * v * in.hidden);

  // The logits buffer: a chunk of full rows, and (two-pass) a slice of all
  // tokens. 16-bit logits (token chunks only) take half the bytes a row.
  plan.logit_bytes = token_chunks && in.operand_dtype_logits ? e : 4;
  const int64_t lb = plan.logit_bytes;
  const int64_t min_logits =
      token_chunks ? lb * plan.chunk_ld : 4 * std::max(plan.chunk_ld, 8 * n);
  const int64_t room =
      LargestRequest(in.max_workspace_bytes - plan.gemm_workspace_bytes) -
      fixed.size();
  if (n > 0 && room < min_logits) return out;
  const int64_t buffer =
      std::min(std::max<int64_t>(room, 0), lb * n * plan.chunk_ld);
  plan.chunk_rows = in.chunk_rows > 0
                        ? std::min(in.chunk_rows, n)
                        : ChunkRows(n, buffer / (lb * plan.chunk_ld));
  plan.num_chunks = n == 0 ? 0 : CeilDiv(n, plan.chunk_rows);
  // (chunk_ld is a multiple of 8: 16-bit rows fill whole floats.)
  int64_t logits_floats = plan.chunk_rows * plan.chunk_ld * lb / 4;
  if (!token_chunks && n > 0) {
    SetSlices(buffer / (4 * n), v, plan);
    logits_floats = std::max(logits_floats, n * plan.slice_ld);
  }
  PlaceAfterLogits(fixed, logits_floats, in.max_workspace_bytes, out);

  // Cost estimate.
  const Rates rates = RatesFor(in);
  Costs costs;
  costs.logit = static_cast<double>(lb);
  costs.e = static_cast<double>(e);
  costs.ge = static_cast<double>(e);  // dlogits in the operand dtype
  costs.dh = static_cast<double>(DTypeSize(in.d_hidden_type));
  costs.dw = static_cast<double>(DTypeSize(in.d_weight_type));
  costs.hidden = static_cast<double>(in.hidden);
  costs.vocab = static_cast<double>(v);
  const double gemm_per_logit = 2.0 * in.hidden / rates.flops;
  const double ce_per_logit =
      (backward ? costs.logit + costs.ge : costs.logit) /
      rates.ce_bytes_per_second;
  plan.overlap_streams =
      in.overlap_streams && in.device == DeviceKind::kCuda &&
      gemm_per_logit >= kOverlapMinGemmToCeRatio * ce_per_logit &&
      (!token_chunks || plan.num_chunks <= kOverlapMaxTokenChunks);
  // The first chunk, the full ones after it and the last (the same for slices).
  double seconds = 0;
  if (plan.num_chunks > 0) {
    const int64_t last = n - (plan.num_chunks - 1) * plan.chunk_rows;
    seconds += TokenChunkSeconds(in, rates, costs,
                                 plan.num_chunks == 1 ? last : plan.chunk_rows,
                                 token_chunks, true);
    if (plan.num_chunks > 2) {
      seconds += (plan.num_chunks - 2) * TokenChunkSeconds(in, rates, costs,
                                                           plan.chunk_rows,
                                                           token_chunks, false);
    }
    if (plan.num_chunks > 1)
      seconds += TokenChunkSeconds(in, rates, costs, last, token_chunks, false);
  }
  if (plan.num_slices > 0) {
    const int64_t last = v - (plan.num_slices - 1) * plan.slice_cols;
    seconds += (plan.num_slices - 1) *
                   SliceSeconds(in, rates, costs, plan.slice_cols) +
               SliceSeconds(in, rates, costs, last);
  }
  if (plan.d_weight_acc_offset >= 0) {
    seconds += 6.0 * v * in.hidden /
               rates.bytes_per_second;  // the final rounding pass
  }
  plan.estimated_seconds = token_chunks ? seconds : kTwoPassOverhead * seconds;
  return out;
}

// The kVocabSlices schedule with token blocks of `block_rows` rows (the last
// may be shorter): per block, a sweep of G1 and the statistics kernel over the
// vocabulary slices, the finish, and (backward) a second sweep in reverse order
// that recomputes each slice's logits but the last one's, its dlogits, G2 into
// the block's d_hidden rows (fp32, accumulated over the slices) and G3 into
// d_weight (accumulated over the blocks).
Candidate PlanVocabSlicesWith(const PlanInput& in, int64_t block_rows) {
  const bool backward = in.pass != Pass::kForward;
  const bool stats = in.pass != Pass::kBackward;
  const int64_t n = in.tokens;
  const int64_t v = in.vocab;
  const int64_t h = in.hidden;
  const int64_t e = DTypeSize(in.operand_type);
  Candidate out;
  Plan& plan = out.plan;
  plan.schedule = LinearCrossEntropySchedule::kVocabSlices;
  plan.chunk_ld = RoundUp(v, int64_t{8});
  plan.gemm_workspace_bytes =
      GemmWorkspaceBytes(in, kTwoPassGemmWorkspaceShare);
  plan.chunk_rows = block_rows;
  plan.num_chunks = CeilDiv(n, block_rows);
  const bool several_blocks = plan.num_chunks > 1;

  Layout fixed;
  plan.stats_offset = fixed.Add(sizeof(ce::TargetStats));
  plan.row_loss_offset = fixed.AddIf(stats && !in.reduction_none, 4 * n);
  plan.lse_offset = fixed.AddIf(!in.lse_given && backward, 4 * n);
  plan.target_logprob_offset = fixed.AddIf(
      !in.target_logprob_given && in.pass == Pass::kForwardBackward, 4 * n);
  plan.row_max_offset = fixed.AddIf(stats, 4 * n);
  plan.row_stats_offset = fixed.AddIf(stats, 8 * kStats * n);
  plan.grad_scale_offset =
      fixed.AddIf(in.operand_type == DType::kF16 && backward,
                  4 * (in.reduction_none ? n : 1));
  plan.bias_offset = fixed.AddIf(in.has_bias && !in.bias_f32, 4 * v);
  plan.ones_offset = fixed.AddIf(
      in.has_bias && backward && in.device == DeviceKind::kCuda, e * n);
  const bool accumulators = several_blocks && in.fp32_gradient_accumulation;
  plan.d_bias_acc_offset = fixed.AddIf(
      in.has_bias && backward && !in.d_bias_f32 && accumulators, 4 * v);
  plan.d_weight_acc_offset = fixed.AddIf(
      backward && in.d_weight_type != DType::kF32 && accumulators, 4 * v * h);

  // The logits buffer: a slice of the block's rows. Several slices of a
  // 16-bit d_hidden add up in an fp32 accumulator of the block's rows.
  const int64_t usable =
      LargestRequest(in.max_workspace_bytes - plan.gemm_workspace_bytes);
  int64_t max_cols = (usable - fixed.size()) / (4 * block_rows);
  if (max_cols < plan.chunk_ld && backward && in.d_hidden_type != DType::kF32) {
    plan.d_hidden_acc_offset = fixed.Add(4 * block_rows * h);
    max_cols = (usable - fixed.size()) / (4 * block_rows);
  }
  if (max_cols < 8) return out;
  SetSlices(max_cols, v, plan);
  PlaceAfterLogits(fixed, block_rows * plan.slice_ld, in.max_workspace_bytes,
                   out);

  // Cost estimate, in closed form over the full and last blocks and slices.
  const Rates r = RatesFor(in);
  const double hd = static_cast<double>(h);
  const double ge = static_cast<double>(e);  // dlogits in the operand dtype
  const double dh_bytes = static_cast<double>(DTypeSize(in.d_hidden_type));
  const double dw_bytes = static_cast<double>(DTypeSize(in.d_weight_type));
  auto slice_seconds = [&](int64_t rows, int64_t cols, bool last_slice,
                           bool first_block) {
    const double rd = static_cast<double>(rows);
    const double cd = static_cast<double>(cols);
    const double flops = 2.0 * rd * cd * hd;
    const double g1 =
        GemmSeconds(r, rows, flops, ge * (rd * hd + cd * hd) + 4 * rd * cd);
    double seconds = 0;
    if (stats) seconds += g1 + 4 * rd * cd / r.ce_bytes_per_second;
    if (!backward) return seconds + r.launch_seconds;
    if (!(stats && last_slice)) seconds += g1;
    seconds += (4 + ge) * rd * cd / r.ce_bytes_per_second + r.launch_seconds;
    const bool d_hidden_adds = !last_slice;
    seconds += GemmSeconds(
        r, rows, flops,
        ge * cd * hd + ge * rd * cd +
            (d_hidden_adds
                 ? 0
                 : (plan.d_hidden_acc_offset >= 0 ? 4 : dh_bytes) * rd * hd),
        d_hidden_adds ? 8 * rd * hd : 0);
    seconds += GemmSeconds(
        r, rows, flops,
        ge * rd * hd + ge * rd * cd + (first_block ? dw_bytes * cd * hd : 0),
        first_block ? 0 : 2 * RunningSumBytes(in) * cd * hd);
    return seconds;
  };
  const int64_t last_cols = v - (plan.num_slices - 1) * plan.slice_cols;
  auto block_seconds = [&](int64_t rows, bool first_block) {
    double seconds =
        (plan.num_slices - 1) *
            slice_seconds(rows, plan.slice_cols, false, first_block) +
        slice_seconds(rows, last_cols, true, first_block);
    if (stats) seconds += r.launch_seconds;  // the finish
    if (plan.d_hidden_acc_offset >= 0) {
      seconds += (4.0 + dh_bytes) * rows * hd / r.bytes_per_second;
    }
    return seconds;
  };
  const int64_t last_rows = n - (plan.num_chunks - 1) * block_rows;
  double seconds =
      block_seconds(plan.num_chunks == 1 ? last_rows : block_rows, true);
  if (plan.num_chunks > 2)
    seconds += (plan.num_chunks - 2) * block_seconds(block_rows, false);
  if (plan.num_chunks > 1) seconds += block_seconds(last_rows, false);
  if (plan.d_weight_acc_offset >= 0) {
    seconds += 6.0 * v * h / r.bytes_per_second;  // the final rounding pass
  }
  // Unlike the two-pass schedule's, no overhead factor: the slices ran at
  // 0.82-0.95 of these estimates (H100 and H200, bench/RESULTS.md), and with
  // it the planner took compact chunks where the slices were faster.
  plan.estimated_seconds = seconds;
  return out;
}

// The fastest feasible kVocabSlices plan over token blocks of N, N/2, N/4, ...
// rows.
Candidate PlanVocabSlices(const PlanInput& in) {
  if (in.chunk_rows > 0)
    return PlanVocabSlicesWith(in, std::min(in.chunk_rows, in.tokens));
  Candidate best;
  int64_t max_rows = in.tokens;
  int64_t previous = 0;
  while (max_rows >= 1) {
    const int64_t rows = ChunkRows(in.tokens, max_rows);
    if (rows != previous) {
      Candidate candidate = PlanVocabSlicesWith(in, rows);
      if (candidate.feasible &&
          (!best.feasible ||
           candidate.plan.estimated_seconds < best.plan.estimated_seconds)) {
        best = candidate;
      }
      previous = rows;
    }
    max_rows = std::min(rows, max_rows) / 2;
  }
  return best;
}

// kCompactChunks' fp32 slice buffer holds at most this much: the G1 output
// that the statistics kernel reads back, small enough to stay mostly in L2.
constexpr int64_t kCompactSliceBytes = 32 * kMiB;

// The kCompactChunks schedule (forward and backward) with token chunks of
// `chunk_rows` rows: per chunk, G1 and the compact statistics kernel slice by
// slice (the slice's logits in the fp32 buffer, the chunk's fp16
// probabilities kept), the finish, the gradient kernel over the chunk's rows,
// then G2 and G3 (accumulated over chunks) as the token chunks run them.
Candidate PlanCompactChunksWith(const PlanInput& in, int64_t chunk_rows,
                                int64_t gemm_workspace_bytes) {
  const int64_t n = in.tokens;
  const int64_t v = in.vocab;
  const int64_t h = in.hidden;
  const int64_t e = DTypeSize(in.operand_type);
  Candidate out;
  Plan& plan = out.plan;
  plan.schedule = LinearCrossEntropySchedule::kCompactChunks;
  plan.chunk_ld = RoundUp(v, int64_t{8});
  plan.gemm_workspace_bytes = gemm_workspace_bytes;
  plan.chunk_rows = chunk_rows;
  plan.num_chunks = CeilDiv(n, chunk_rows);
  const bool several_chunks = plan.num_chunks > 1;

  Layout fixed;
  plan.stats_offset = fixed.Add(sizeof(ce::TargetStats));
  plan.row_loss_offset = fixed.AddIf(!in.reduction_none, 4 * n);
  plan.lse_offset = fixed.AddIf(!in.lse_given, 4 * n);
  plan.target_logprob_offset = fixed.AddIf(!in.target_logprob_given, 4 * n);
  plan.row_max_offset = fixed.Add(4 * n);
  plan.row_stats_offset = fixed.Add(8 * kStats * n);
  plan.grad_scale_offset = fixed.AddIf(in.operand_type == DType::kF16,
                                       4 * (in.reduction_none ? n : 1));
  plan.bias_offset = fixed.AddIf(in.has_bias && !in.bias_f32, 4 * v);
  plan.ones_offset =
      fixed.AddIf(in.has_bias && in.device == DeviceKind::kCuda, e * n);
  const bool accumulators = several_chunks && in.fp32_gradient_accumulation;
  plan.d_bias_acc_offset =
      fixed.AddIf(in.has_bias && !in.d_bias_f32 && accumulators, 4 * v);
  plan.d_weight_acc_offset =
      fixed.AddIf(in.d_weight_type != DType::kF32 && accumulators, 4 * v * h);
  plan.compact_offset = fixed.Add(2 * chunk_rows * plan.chunk_ld);

  // The slice buffer takes what is left, up to kCompactSliceBytes; each slice
  // adds a float a row for its max.
  const int64_t usable =
      LargestRequest(in.max_workspace_bytes - plan.gemm_workspace_bytes);
  int64_t room = usable - fixed.size() - kAlignment;
  room = std::min(room, kCompactSliceBytes);
  int64_t max_cols = room / (4 * chunk_rows);
  if (max_cols < 8) return out;
  SetSlices(max_cols, v, plan);
  while (plan.num_slices > 1 &&
         4 * chunk_rows * (plan.slice_ld + plan.num_slices) > room) {
    max_cols = plan.slice_cols - 8;
    if (max_cols < 8) return out;
    SetSlices(max_cols, v, plan);
  }
  plan.slice_max_offset = fixed.Add(4 * chunk_rows * plan.num_slices);
  PlaceAfterLogits(fixed, chunk_rows * plan.slice_ld, in.max_workspace_bytes,
                   out);

  // Cost estimate.
  const Rates r = RatesFor(in);
  const double hd = static_cast<double>(h);
  const double vd = static_cast<double>(v);
  const double ge = static_cast<double>(e);
  const double dh_bytes = static_cast<double>(DTypeSize(in.d_hidden_type));
  const double dw_bytes = static_cast<double>(DTypeSize(in.d_weight_type));
  auto chunk_seconds = [&](int64_t rows, bool first) {
    const double rd = static_cast<double>(rows);
    double seconds = 0;
    for (int64_t s = 0; s < plan.num_slices; ++s) {
      const int64_t cols = std::min(plan.slice_cols, v - s * plan.slice_cols);
      const double cd = static_cast<double>(cols);
      seconds += GemmSeconds(r, rows, 2.0 * rd * cd * hd,
                             ge * (rd * hd + cd * hd) + 4 * rd * cd);
      seconds += 6 * rd * cd / r.ce_bytes_per_second + r.launch_seconds;
    }
    seconds += r.launch_seconds;  // the finish
    seconds += 4 * rd * vd / r.ce_bytes_per_second + r.launch_seconds;  // dz
    const double flops = 2.0 * rd * vd * hd;
    seconds += GemmSeconds(r, rows, flops,
                           ge * vd * hd + ge * rd * vd + dh_bytes * rd * hd);
    seconds += GemmSeconds(
        r, rows, flops,
        ge * rd * hd + ge * rd * vd + (first ? dw_bytes * vd * hd : 0),
        first ? 0 : 2 * RunningSumBytes(in) * vd * hd);
    return seconds;
  };
  const int64_t last_rows = n - (plan.num_chunks - 1) * chunk_rows;
  double seconds =
      chunk_seconds(plan.num_chunks == 1 ? last_rows : chunk_rows, true);
  if (plan.num_chunks > 2)
    seconds += (plan.num_chunks - 2) * chunk_seconds(chunk_rows, false);
  if (plan.num_chunks > 1) seconds += chunk_seconds(last_rows, false);
  if (plan.d_weight_acc_offset >= 0) {
    seconds += 6.0 * v * h / r.bytes_per_second;  // the final rounding pass
  }
  plan.estimated_seconds = seconds;
  return out;
}

// The plan with the token-chunk share of the budget as cuBLASLt workspace, or,
// where that leaves no room for the slice buffer, with a smaller one: the
// probabilities of a whole chunk take nearly all of the budget when one chunk
// holds every token (no d_weight accumulation at all), and the GEMMs of these
// shapes lose nothing with 4 MiB.
Candidate PlanCompactChunksWith(const PlanInput& in, int64_t chunk_rows) {
  const int64_t share = GemmWorkspaceBytes(in, kTokenChunksGemmWorkspaceShare);
  Candidate candidate = PlanCompactChunksWith(in, chunk_rows, share);
  if (candidate.feasible || share <= kSmallGemmWorkspaceBytes) return candidate;
  return PlanCompactChunksWith(in, chunk_rows, kSmallGemmWorkspaceBytes);
}

// The fastest feasible kCompactChunks plan among chunks of the most rows that
// fit (found by bisection: the more rows, the more bytes) and fewer.
Candidate PlanCompactChunks(const PlanInput& in) {
  if (in.chunk_rows > 0)
    return PlanCompactChunksWith(in, std::min(in.chunk_rows, in.tokens));
  int64_t fits = 0;  // PlanCompactChunksWith(fits) is feasible (or fits = 0)
  if (PlanCompactChunksWith(in, in.tokens).feasible) {
    fits = in.tokens;
  } else {
    int64_t too_many = in.tokens;
    while (too_many - fits > 1) {
      const int64_t middle = fits + (too_many - fits) / 2;
      (PlanCompactChunksWith(in, middle).feasible ? fits : too_many) = middle;
    }
  }
  // More rows leave less room for the slice buffer, and tiny slices cost
  // launches: fractions of the most rows, by the cost model.
  Candidate best;
  for (const double fraction :
       {1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.35, 0.25}) {
    const int64_t max_rows = static_cast<int64_t>(fraction * fits);
    if (max_rows < 1) break;
    Candidate candidate =
        PlanCompactChunksWith(in, ChunkRows(in.tokens, max_rows));
    if (candidate.feasible &&
        (!best.feasible ||
         candidate.plan.estimated_seconds < best.plan.estimated_seconds)) {
      best = candidate;
    }
  }
  return best;
}

const char* ScheduleName(LinearCrossEntropySchedule schedule) {
  switch (schedule) {
    case LinearCrossEntropySchedule::kAuto:
      return "auto";
    case LinearCrossEntropySchedule::kTokenChunks:
      return "token chunks";
    case LinearCrossEntropySchedule::kTwoPass:
      return "two-pass";
    case LinearCrossEntropySchedule::kVocabSlices:
      return "vocab slices";
    case LinearCrossEntropySchedule::kCompactChunks:
      return "compact chunks";
  }
  return "?";
}

}  // namespace

std::string Plan::ToString() const {
  std::string text = absl::StrCat(ScheduleName(schedule), ": ", num_chunks,
                                  " x ", chunk_rows, " tokens");
  if (schedule != LinearCrossEntropySchedule::kTokenChunks) {
    absl::StrAppend(&text, ", ", num_slices, " x ", slice_cols, " vocab");
  }
  absl::StrAppend(&text, "; workspace ", Bytes(total_bytes), " (logits ",
                  Bytes(logits_bytes),
                  logit_bytes != 4 ? ", 16-bit logits" : "",
                  d_weight_acc_offset >= 0 ? ", fp32 d_weight" : "",
                  d_hidden_acc_offset >= 0 ? ", fp32 d_hidden" : "", ")",
                  overlap_streams ? "; 2 streams" : "");
  return text;
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input) {
  if (input.max_workspace_bytes <= 0) {
    return InvalidArgument("max_workspace_bytes must be positive, got ",
                           input.max_workspace_bytes);
  }
  if (input.chunk_rows < 0) {
    return InvalidArgument(
        "chunk_rows must be >= 0 (0: the planner's choice), got ",
        input.chunk_rows);
  }
  using Schedule = LinearCrossEntropySchedule;
  const bool slices_possible = input.tokens > 0 && !input.whole_row_statistics;
  const bool compact_possible =
      slices_possible && input.pass == Pass::kForwardBackward &&
      input.operand_type != DType::kF32 && !input.softcap;
  if (input.schedule == Schedule::kCompactChunks && input.tokens > 0 &&
      input.pass != Pass::kForward && !compact_possible) {
    return InvalidArgument(
        "kCompactChunks runs the fused forward and backward of 16-bit operands "
        "without a soft cap or whole-row statistics; use kAuto or another "
        "schedule");
  }
  std::vector<Schedule> schedules;
  if (input.tokens == 0) {
    schedules = {Schedule::kTokenChunks};
  } else if (input.schedule == Schedule::kVocabSlices ||
             (input.schedule == Schedule::kCompactChunks &&
              input.pass == Pass::kForward)) {
    // The driver refuses them where they cannot run (whole-row statistics;
    // kCompactChunks: f32 operands, the soft cap, the split backward). The
    // forward alone of kCompactChunks is kVocabSlices' forward.
    schedules = {Schedule::kVocabSlices};
  } else if (input.pass == Pass::kForward || input.entropy_gradient) {
    schedules = {Schedule::kTokenChunks};
    if (input.schedule == Schedule::kAuto && slices_possible)
      schedules.push_back(Schedule::kVocabSlices);
  } else if (input.schedule == Schedule::kAuto) {
    schedules = {Schedule::kTokenChunks, Schedule::kTwoPass};
    if (slices_possible) schedules.push_back(Schedule::kVocabSlices);
    if (compact_possible) schedules.push_back(Schedule::kCompactChunks);
  } else {
    schedules = {input.schedule};
  }
  auto plan_for = [](const PlanInput& in, Schedule schedule) {
    switch (schedule) {
      case Schedule::kVocabSlices:
        return PlanVocabSlices(in);
      case Schedule::kCompactChunks:
        return PlanCompactChunks(in);
      default:
        return PlanSchedule(in, schedule);
    }
  };
  Candidate best;
  for (LinearCrossEntropySchedule schedule : schedules) {
    Candidate candidate = plan_for(input, schedule);
    if (candidate.feasible &&
        (!best.feasible ||
         candidate.plan.estimated_seconds < best.plan.estimated_seconds)) {
      best = candidate;
    }
  }
  if (!best.feasible) {
    // The smallest budget that fits (feasibility grows with the budget):
    // bisection.
    auto fits = [&](int64_t budget) {
      PlanInput larger = input;
      larger.max_workspace_bytes = budget;
      for (LinearCrossEntropySchedule schedule : schedules) {
        if (plan_for(larger, schedule).feasible) return true;
      }
      return false;
    };
    int64_t low = input.max_workspace_bytes;
    int64_t high = std::max<int64_t>(2 * low, 4096);
    while (!fits(high) && high < (int64_t{1} << 60)) high *= 2;
    while (high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      (fits(middle) ? high : low) = middle;
    }
    const int64_t needed = high;
    return InvalidArgument(
        "max_workspace_bytes = ", input.max_workspace_bytes,
        " is too small for one chunk of this problem (N = ", input.tokens,
        ", H = ", input.hidden, ", V = ", input.vocab,
        schedules.size() == 1 ? absl::StrCat(", ", ScheduleName(schedules[0]))
                              : "",
        input.chunk_rows > 0 ? absl::StrCat(", chunk_rows = ", input.chunk_rows)
                             : "",
        "): it needs at least ", needed, " bytes");
  }
  return best.plan;
}

std::vector<Block> MakeVocabSliceBlocks(const PlanInput& input,
                                        const Plan& plan) {
  std::vector<Block> blocks;
  const bool backward = input.pass != Pass::kForward;
  const bool stats = input.pass != Pass::kBackward;
  for (int64_t c = 0; c < plan.num_chunks; ++c) {
    Block block;
    block.row_begin = c * plan.chunk_rows;
    block.row_end = std::min(input.tokens, block.row_begin + plan.chunk_rows);
    block.ld = plan.slice_ld;
    auto slice = [&](int64_t s) {
      block.col_begin = s * plan.slice_cols;
      block.col_end = std::min(input.vocab, block.col_begin + plan.slice_cols);
    };
    if (stats) {
      for (int64_t s = 0; s < plan.num_slices; ++s) {
        slice(s);
        block.mode = CeMode::kSliceStats;
        block.accumulate = s > 0;
        blocks.push_back(block);
      }
      block.col_begin = block.col_end = 0;
      block.mode = CeMode::kSliceFinish;
      block.accumulate = false;
      blocks.push_back(block);
    }
    if (backward) {
      for (int64_t s = plan.num_slices - 1; s >= 0; --s) {
        slice(s);
        block.mode = CeMode::kSliceBackward;
        block.logits_ready = stats && s == plan.num_slices - 1;
        block.d_hidden = true;
        block.d_hidden_accumulate = s != plan.num_slices - 1;
        block.d_hidden_done = s == 0;
        block.d_weight = true;
        block.accumulate = c > 0;
        blocks.push_back(block);
      }
    }
  }
  return blocks;
}

// Per chunk: its slices' G1 and compact statistics, the finish, then one
// block of the whole rows: the gradient kernel, G2 and G3 (accumulated over
// the chunks).
std::vector<Block> MakeCompactBlocks(const PlanInput& input, const Plan& plan) {
  std::vector<Block> blocks;
  for (int64_t c = 0; c < plan.num_chunks; ++c) {
    Block block;
    block.row_begin = c * plan.chunk_rows;
    block.row_end = std::min(input.tokens, block.row_begin + plan.chunk_rows);
    block.ld = plan.slice_ld;
    for (int64_t s = 0; s < plan.num_slices; ++s) {
      block.col_begin = s * plan.slice_cols;
      block.col_end = std::min(input.vocab, block.col_begin + plan.slice_cols);
      block.mode = CeMode::kCompactStats;
      block.accumulate = s > 0;
      blocks.push_back(block);
    }
    block.col_begin = block.col_end = 0;
    block.mode = CeMode::kSliceFinish;
    block.accumulate = false;
    blocks.push_back(block);
    block.col_begin = 0;
    block.col_end = input.vocab;
    block.ld = plan.chunk_ld;  // 16-bit elements of the compact rows
    block.mode = CeMode::kCompactBackward;
    block.d_hidden = true;
    block.d_weight = true;
    block.accumulate = c > 0;
    blocks.push_back(block);
  }
  return blocks;
}

std::vector<Block> MakeScheduleBlocks(const PlanInput& input,
                                      const Plan& plan) {
  if (plan.schedule == LinearCrossEntropySchedule::kVocabSlices)
    return MakeVocabSliceBlocks(input, plan);
  if (plan.schedule == LinearCrossEntropySchedule::kCompactChunks)
    return MakeCompactBlocks(input, plan);
  std::vector<Block> blocks;
  const bool backward = input.pass != Pass::kForward;
  const bool two_pass = plan.schedule == LinearCrossEntropySchedule::kTwoPass;
  const CeMode mode = input.pass == Pass::kForward ? CeMode::kForward
                      : input.pass == Pass::kForwardBackward
                          ? CeMode::kForwardBackward
                          : CeMode::kBackward;
  for (int64_t c = 0; c < plan.num_chunks; ++c) {
    Block block;
    block.row_begin = c * plan.chunk_rows;
    block.row_end = std::min(input.tokens, block.row_begin + plan.chunk_rows);
    block.col_begin = 0;
    block.col_end = input.vocab;
    block.ld = plan.chunk_ld;
    block.mode = mode;
    block.d_hidden = backward;
    block.d_weight = backward && !two_pass;
    block.accumulate = c > 0;
    blocks.push_back(block);
  }
  if (backward && two_pass) {
    for (int64_t s = 0; s < plan.num_slices; ++s) {
      Block block;
      block.row_begin = 0;
      block.row_end = input.tokens;
      block.col_begin = s * plan.slice_cols;
      block.col_end = std::min(input.vocab, block.col_begin + plan.slice_cols);
      block.ld = plan.slice_ld;
      block.mode = CeMode::kSliceBackward;
      block.d_weight = true;
      blocks.push_back(block);
    }
  }
  return blocks;
}

std::vector<Block> MakeBlocks(const PlanInput& input, const Plan& plan) {
  std::vector<Block> blocks = MakeScheduleBlocks(input, plan);
  if (input.accumulate_gradients) {
    // G3 (and the d_bias GEMV) add to the caller's values from the first
    // block on (f32 outputs: no accumulator; CheckGradients).
    for (Block& block : blocks) {
      if (block.d_weight) block.accumulate = true;
    }
  }
  return blocks;
}

PlanInput PlanInputOf(const Problem& problem, DeviceKind device) {
  const LinearCrossEntropyOptions& options = *problem.options;
  PlanInput in;
  in.pass = problem.pass;
  in.device = device;
  in.tokens = problem.tokens;
  in.hidden = problem.hidden;
  in.vocab = problem.vocab;
  in.operand_type = problem.operand_type();
  if (problem.gradients != nullptr) {
    in.d_hidden_type = problem.gradients->d_hidden.dtype;
    in.d_weight_type = problem.gradients->d_weight.dtype;
    in.d_bias_f32 = !problem.gradients->d_bias.has_value() ||
                    problem.gradients->d_bias->dtype == DType::kF32;
    in.accumulate_gradients = problem.gradients->accumulate;
  }
  in.has_bias = problem.has_bias();
  in.bias_f32 = !in.has_bias || problem.inputs->bias->dtype == DType::kF32;
  in.reduction_none = options.cross_entropy.reduction == Reduction::kNone;
  in.lse_given = problem.lse != nullptr;
  in.max_workspace_bytes = options.max_workspace_bytes;
  in.chunk_rows = options.chunk_rows;
  in.use_tf32 = options.use_tf32;
  // A captured stream records no second stream (nor its events).
  in.overlap_streams = options.overlap_streams && !problem.capturing;
  in.schedule = options.schedule;
  in.accuracy =
      problem.extras != nullptr && problem.extras->accuracy.has_value();
  in.target_logprob_given =
      problem.extras != nullptr && problem.extras->target_logprob.has_value();
  in.entropy_gradient = options.cross_entropy.entropy_weight != 0.0f &&
                        problem.pass == Pass::kForwardBackward;
  in.whole_row_statistics =
      options.cross_entropy.entropy_weight != 0.0f ||
      (problem.extras != nullptr && (problem.extras->predicted.has_value() ||
                                     problem.extras->accuracy.has_value() ||
                                     problem.extras->entropy.has_value()));
  in.softcap = options.cross_entropy.softcap > 0.0f;
  in.fp32_gradient_accumulation = options.fp32_gradient_accumulation;
  in.operand_dtype_logits =
      options.operand_dtype_logits && in.operand_type != DType::kF32;
  return in;
}

void SetChunkExtras(const Problem& problem, int64_t row, float* row_hit,
                    ce::RowArgs& args) {
  const CrossEntropyExtras* extras = problem.extras;
  if (extras == nullptr) return;
  if (extras->predicted.has_value()) {
    const Tensor& predicted = *extras->predicted;
    args.predicted_i64 = predicted.dtype == DType::kI64;
    args.predicted =
        static_cast<char*>(predicted.data) + row * (args.predicted_i64 ? 8 : 4);
  }
  if (extras->accuracy.has_value()) args.row_hit = row_hit + row;
  if (extras->entropy.has_value())
    args.entropy = extras->entropy->data_as<float>() + row;
  if (extras->target_logprob.has_value())
    args.target_logprob = extras->target_logprob->data_as<float>() + row;
}

float* SliceTargetLogprob(const Problem& problem, const Plan& plan,
                          float* workspace) {
  const bool needed =
      plan.schedule == LinearCrossEntropySchedule::kVocabSlices
          ? problem.pass != Pass::kBackward
          : (plan.schedule == LinearCrossEntropySchedule::kTwoPass ||
             plan.schedule == LinearCrossEntropySchedule::kCompactChunks) &&
                problem.pass == Pass::kForwardBackward;
  if (!needed) return nullptr;
  if (workspace != nullptr) return workspace;
  return problem.extras != nullptr && problem.extras->target_logprob.has_value()
             ? problem.extras->target_logprob->data_as<float>()
             : nullptr;
}

SliceStatsArgs MakeSliceStatsArgs(const Problem& problem, const Block& block,
                                  const float* logits, float* row_max,
                                  double* row_stats) {
  const CrossEntropyOptions& ce = problem.options->cross_entropy;
  const Tensor& targets = problem.inputs->targets;
  const int64_t row = block.row_begin;
  SliceStatsArgs args;
  args.logits = logits;
  args.ld = block.ld;
  args.rows = block.row_end - row;
  args.cols = block.col_end - block.col_begin;
  args.col_begin = block.col_begin;
  args.targets_i64 = targets.dtype == DType::kI64;
  args.targets =
      static_cast<const char*>(targets.data) + row * DTypeSize(targets.dtype);
  args.ignore_index = ce.ignore_index;
  args.softcap = ce.softcap;
  args.class_weights = ce.class_weights.has_value()
                           ? ce.class_weights->data_as<float>()
                           : nullptr;
  args.smoothing = ce.label_smoothing > 0.0f;
  args.merge = block.accumulate;
  args.row_max = row_max + row;
  args.row_stats = row_stats + row * kStats;
  return args;
}

CompactStatsArgs MakeCompactStatsArgs(const Problem& problem, const Plan& plan,
                                      const Block& block, const float* logits,
                                      float* row_max, double* row_stats,
                                      uint16_t* compact, float* slice_max) {
  CompactStatsArgs args;
  args.stats = MakeSliceStatsArgs(problem, block, logits, row_max, row_stats);
  args.probs = compact + block.col_begin;
  args.probs_ld = plan.chunk_ld;
  args.slice_max = slice_max + block.col_begin / plan.slice_cols;
  args.slice_max_ld = plan.num_slices;
  return args;
}

SliceArgs MakeSliceArgs(const Problem& problem, const Block& block,
                        int64_t row_begin, int64_t row_end, float* logits,
                        const ce::TargetStats* stats, const float* grad_loss,
                        bool grad_loss_per_row, const float* lse,
                        const float* target_logprob) {
  const Tensor& targets = problem.inputs->targets;
  SliceArgs args;
  args.logits = logits;
  args.ld = block.ld;
  args.rows = row_end - row_begin;
  args.cols = block.col_end - block.col_begin;
  args.col_begin = block.col_begin;
  args.vocab = problem.vocab;
  args.grad_type = problem.operand_type();
  args.targets = static_cast<const char*>(targets.data) +
                 row_begin * DTypeSize(targets.dtype);
  args.targets_i64 = targets.dtype == DType::kI64;
  ce::CopyOptions(problem.options->cross_entropy, &args);
  args.stats = stats;
  args.grad_loss = grad_loss == nullptr
                       ? nullptr
                       : grad_loss + (grad_loss_per_row ? row_begin : 0);
  args.grad_loss_per_row = grad_loss_per_row;
  args.lse = lse + row_begin;
  args.target_logprob =
      target_logprob != nullptr ? target_logprob + row_begin : nullptr;
  return args;
}

CompactArgs MakeCompactArgs(const Problem& problem, const Plan& plan,
                            const Block& block, uint16_t* compact,
                            const float* slice_max,
                            const ce::TargetStats* stats,
                            const float* grad_loss, bool grad_loss_per_row,
                            const float* lse, const float* target_logprob) {
  CompactArgs args;
  args.slice =
      MakeSliceArgs(problem, block, block.row_begin, block.row_end, nullptr,
                    stats, grad_loss, grad_loss_per_row, lse, target_logprob);
  args.probs = compact;
  args.probs_ld = plan.chunk_ld;
  args.slice_max = slice_max;
  args.slice_max_ld = plan.num_slices;
  args.slice_cols = plan.slice_cols;
  return args;
}

SliceFinishArgs MakeSliceFinishArgs(const Problem& problem, const Block& block,
                                    const ce::TargetStats* stats,
                                    const float* row_max,
                                    const double* row_stats, float* lse,
                                    float* row_loss, float* target_logprob) {
  const CrossEntropyOptions& ce = problem.options->cross_entropy;
  const Tensor& targets = problem.inputs->targets;
  const int64_t row = block.row_begin;
  SliceFinishArgs args;
  args.rows = block.row_end - row;
  args.vocab = problem.vocab;
  args.targets_i64 = targets.dtype == DType::kI64;
  args.targets =
      static_cast<const char*>(targets.data) + row * DTypeSize(targets.dtype);
  args.ignore_index = ce.ignore_index;
  args.label_smoothing = ce.label_smoothing;
  args.z_loss = ce.z_loss;
  args.class_weights = ce.class_weights.has_value()
                           ? ce.class_weights->data_as<float>()
                           : nullptr;
  args.reduction = static_cast<int>(ce.reduction);
  args.stats = stats;
  args.row_max = row_max + row;
  args.row_stats = row_stats + row * kStats;
  args.lse = lse != nullptr ? lse + row : nullptr;
  float* losses = ce.reduction == Reduction::kNone
                      ? problem.loss->data_as<float>()
                      : row_loss;
  args.row_loss = losses != nullptr ? losses + row : nullptr;
  args.target_logprob =
      target_logprob != nullptr ? target_logprob + row : nullptr;
  return args;
}

float DlogitsScale(DType operand_type, int reduction, double ce_denominator) {
  if (operand_type != DType::kF16 || reduction != ce::kMean ||
      !(ce_denominator > 1))
    return 1;
  // The largest power of two <= the denominator, so that scaled dlogits stay <=
  // the incoming gradient times the class weight.
  int exponent = 0;
  std::frexp(ce_denominator, &exponent);
  return std::ldexp(1.0f, std::min(exponent - 1, 30));
}

absl::Status CheckOperands(const LinearCrossEntropyInputs& in, int64_t tokens,
                           int64_t hidden, int64_t vocab,
                           const Context& context) {
  if (hidden < 1) {
    return InvalidArgument("hidden: the hidden size must be >= 1, got ",
                           in.hidden.ShapeString());
  }
  RETURN_IF_ERROR(ce::CheckVocab(vocab, "weight"));
  RETURN_IF_ERROR(CheckDType(
      in.hidden, {DType::kF32, DType::kBF16, DType::kF16}, "hidden"));
  RETURN_IF_ERROR(CheckShape(in.weight, {vocab, hidden}, "weight"));
  if (in.weight.dtype != in.hidden.dtype) {
    return InvalidArgument("weight: dtype ", DTypeName(in.weight.dtype),
                           " differs from hidden's ",
                           DTypeName(in.hidden.dtype));
  }
  RETURN_IF_ERROR(CheckShape(in.targets, {tokens}, "targets"));
  RETURN_IF_ERROR(
      CheckDType(in.targets, {DType::kI64, DType::kI32}, "targets"));
  RETURN_IF_ERROR(ce::CheckOnContext(in.hidden, context, "hidden"));
  RETURN_IF_ERROR(ce::CheckOnContext(in.weight, context, "weight"));
  RETURN_IF_ERROR(ce::CheckOnContext(in.targets, context, "targets"));
  if (in.bias.has_value()) {
    RETURN_IF_ERROR(CheckShape(*in.bias, {vocab}, "bias"));
    RETURN_IF_ERROR(
        CheckDType(*in.bias, {DType::kF32, in.weight.dtype}, "bias"));
    RETURN_IF_ERROR(ce::CheckOnContext(*in.bias, context, "bias"));
  }
  return absl::OkStatus();
}

namespace {

// Inputs and options of every call; sets the sizes in `problem`.
absl::Status CheckInputs(const Context& context, Problem& problem) {
  const LinearCrossEntropyInputs& in = *problem.inputs;
  if (in.hidden.rank() != 2)
    return InvalidArgument("hidden: expected [N, H], got ",
                           in.hidden.ShapeString());
  if (in.weight.rank() != 2)
    return InvalidArgument("weight: expected [V, H], got ",
                           in.weight.ShapeString());
  problem.tokens = in.hidden.dim(0);
  problem.hidden = in.hidden.dim(1);
  problem.vocab = in.weight.dim(0);
  RETURN_IF_ERROR(CheckOperands(in, problem.tokens, problem.hidden,
                                problem.vocab, context));
  return ce::CheckCrossEntropyOptions(problem.options->cross_entropy,
                                      problem.vocab, context);
}

absl::Status CheckGradients(const Context& context, const Problem& problem) {
  const LinearCrossEntropyInputs& in = *problem.inputs;
  const LinearCrossEntropyGradients& g = *problem.gradients;
  RETURN_IF_ERROR(
      CheckShape(g.d_hidden, {problem.tokens, problem.hidden}, "d_hidden"));
  RETURN_IF_ERROR(
      CheckDType(g.d_hidden, {DType::kF32, in.hidden.dtype}, "d_hidden"));
  RETURN_IF_ERROR(ce::CheckOnContext(g.d_hidden, context, "d_hidden"));
  RETURN_IF_ERROR(
      CheckShape(g.d_weight, {problem.vocab, problem.hidden}, "d_weight"));
  RETURN_IF_ERROR(
      CheckDType(g.d_weight, {DType::kF32, in.weight.dtype}, "d_weight"));
  RETURN_IF_ERROR(ce::CheckOnContext(g.d_weight, context, "d_weight"));
  if (in.bias.has_value() != g.d_bias.has_value()) {
    return InvalidArgument(in.bias.has_value()
                               ? "d_bias is required with a bias"
                               : "d_bias given without a bias");
  }
  if (g.d_bias.has_value()) {
    RETURN_IF_ERROR(CheckShape(*g.d_bias, {problem.vocab}, "d_bias"));
    RETURN_IF_ERROR(
        CheckDType(*g.d_bias, {DType::kF32, in.bias->dtype}, "d_bias"));
    RETURN_IF_ERROR(ce::CheckOnContext(*g.d_bias, context, "d_bias"));
  }
  if (g.accumulate &&
      (g.d_weight.dtype != DType::kF32 ||
       (g.d_bias.has_value() && g.d_bias->dtype != DType::kF32))) {
    return InvalidArgument(
        "accumulate adds into f32 d_weight and d_bias only (a 16-bit one "
        "would take an fp32 accumulator of its own); got d_weight ",
        DTypeName(g.d_weight.dtype),
        g.d_bias.has_value()
            ? absl::StrCat(", d_bias ", DTypeName(g.d_bias->dtype))
            : std::string());
  }
  return absl::OkStatus();
}

// The outputs and the incoming tensors that the pass takes (the entry points
// set exactly those in `problem`): loss, lse, grad_loss and gradients.
absl::Status CheckOutputs(const Context& context, const Problem& problem) {
  const Reduction reduction = problem.options->cross_entropy.reduction;
  if (problem.loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*problem.loss, reduction,
                                        problem.tokens, context, "loss"));
  }
  if (problem.lse != nullptr) {
    RETURN_IF_ERROR(ce::CheckLseTensor(*problem.lse, problem.tokens, context));
  }
  if (problem.grad_loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*problem.grad_loss, reduction,
                                        problem.tokens, context, "grad_loss"));
  }
  if (problem.gradients != nullptr)
    RETURN_IF_ERROR(CheckGradients(context, problem));
  const CrossEntropyOptions& ce = problem.options->cross_entropy;
  if (ce.entropy_weight != 0.0f) {
    // A vocabulary slice's gradient would need the rows' entropy.
    if (problem.pass == Pass::kBackward) {
      return InvalidArgument(
          "entropy_weight != 0: LinearCrossEntropyBackward cannot take the "
          "entropy's gradient; use LinearCrossEntropyForwardBackward");
    }
    if (problem.pass == Pass::kForwardBackward &&
        problem.options->schedule == LinearCrossEntropySchedule::kTwoPass) {
      return InvalidArgument(
          "entropy_weight != 0 needs the token-chunk schedule, not kTwoPass");
    }
  }
  if (problem.options->operand_dtype_logits) {
    const LinearCrossEntropySchedule schedule = problem.options->schedule;
    if (problem.operand_type() == DType::kF32) {
      return InvalidArgument(
          "operand_dtype_logits rounds the logits to 16-bit operands' dtype: "
          "hidden and weight are f32");
    }
    if (schedule != LinearCrossEntropySchedule::kAuto &&
        schedule != LinearCrossEntropySchedule::kTokenChunks) {
      return InvalidArgument(
          "operand_dtype_logits rounds the logits of token chunks only; use "
          "kAuto or kTokenChunks");
    }
    if (problem.has_bias()) {
      return InvalidArgument(
          "operand_dtype_logits takes no bias (the logits GEMM's bias epilogue "
          "is fp32)");
    }
  }
  if (problem.options->schedule == LinearCrossEntropySchedule::kCompactChunks &&
      problem.tokens > 0) {
    const CrossEntropyExtras* extras = problem.extras;
    const bool whole_rows =
        ce.entropy_weight != 0.0f ||
        (extras != nullptr &&
         (extras->predicted.has_value() || extras->accuracy.has_value() ||
          extras->entropy.has_value()));
    if (problem.pass == Pass::kBackward) {
      return InvalidArgument(
          "kCompactChunks computes the loss and its gradients in one call "
          "(LinearCrossEntropyForwardBackward), not the split backward");
    }
    if (problem.operand_type() == DType::kF32 && problem.backward()) {
      return InvalidArgument(
          "kCompactChunks holds 16-bit probabilities: bf16 or f16 hidden and "
          "weight only");
    }
    if (ce.softcap > 0.0f && problem.backward()) {
      return InvalidArgument(
          "kCompactChunks keeps no logits, which the soft cap's gradient "
          "needs; use kAuto or another schedule");
    }
    if (whole_rows) {
      return InvalidArgument(
          "kCompactChunks merges each token's statistics slice by slice: it "
          "computes no entropy_weight term and no predicted, accuracy or "
          "entropy extras; use kTokenChunks or kAuto");
    }
  }
  if (problem.options->schedule == LinearCrossEntropySchedule::kVocabSlices &&
      problem.pass != Pass::kBackward) {
    const CrossEntropyExtras* extras = problem.extras;
    if (ce.entropy_weight != 0.0f ||
        (extras != nullptr &&
         (extras->predicted.has_value() || extras->accuracy.has_value() ||
          extras->entropy.has_value()))) {
      return InvalidArgument(
          "kVocabSlices merges each token's statistics slice by slice: it "
          "computes no entropy_weight term and no predicted, accuracy or "
          "entropy extras; use kTokenChunks or kAuto");
    }
  }
  return absl::OkStatus();
}

// Outputs may overlap neither an input nor each other.
absl::Status CheckNoOverlap(const Context& context, const Problem& problem) {
  using Named = std::pair<const Tensor*, const char*>;
  const LinearCrossEntropyInputs& in = *problem.inputs;
  const CrossEntropyOptions& ce = problem.options->cross_entropy;
  std::vector<Named> inputs = {
      {&in.hidden, "hidden"}, {&in.weight, "weight"}, {&in.targets, "targets"}};
  std::vector<Named> outputs;
  if (in.bias.has_value()) inputs.push_back({&*in.bias, "bias"});
  if (ce.class_weights.has_value())
    inputs.push_back({&*ce.class_weights, "class_weights"});
  if (problem.grad_loss != nullptr)
    inputs.push_back({problem.grad_loss, "grad_loss"});
  if (problem.loss != nullptr) outputs.push_back({problem.loss, "loss"});
  if (problem.lse != nullptr) {
    (problem.pass == Pass::kBackward ? inputs : outputs)
        .push_back({problem.lse, "lse"});
  }
  if (problem.gradients != nullptr) {
    outputs.push_back({&problem.gradients->d_hidden, "d_hidden"});
    outputs.push_back({&problem.gradients->d_weight, "d_weight"});
    if (problem.gradients->d_bias.has_value()) {
      outputs.push_back({&*problem.gradients->d_bias, "d_bias"});
    }
  }
  if (problem.extras != nullptr) {
    std::vector<ce::NamedTensor> others;
    for (const Named& named : inputs)
      others.push_back({named.first, named.second});
    for (const Named& named : outputs)
      others.push_back({named.first, named.second});
    RETURN_IF_ERROR(
        ce::CheckExtras(*problem.extras, problem.tokens, context, others));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const Named& input : inputs) {
      if (Overlaps(*outputs[i].first, *input.first)) {
        return InvalidArgument(outputs[i].second, " overlaps the input ",
                               input.second);
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (Overlaps(*outputs[i].first, *outputs[j].first)) {
        return InvalidArgument(outputs[i].second, " overlaps ",
                               outputs[j].second);
      }
    }
  }
  return absl::OkStatus();
}

// Every entry point: the checks, then the plan and its blocks on the backend.
absl::Status Run(Context& context, Problem& problem) {
  RETURN_IF_ERROR(CheckInputs(context, problem));
  RETURN_IF_ERROR(CheckOutputs(context, problem));
  RETURN_IF_ERROR(CheckNoOverlap(context, problem));
#ifdef LOSSRT_WITH_CUDA
  if (context.device().is_cuda()) {
    ASSIGN_OR_RETURN(problem.capturing, StreamIsCapturing(context));
  }
#endif
  if (problem.capturing && problem.backward() &&
      problem.operand_type() == DType::kF16 &&
      problem.options->cross_entropy.reduction == Reduction::kMean) {
    // The f16 dlogits' underflow guard (DlogitsScale) is a host scalar made
    // from the mean's denominator, which a capture cannot read back.
    return absl::FailedPreconditionError(
        "linear cross-entropy: the backward of f16 operands with the mean "
        "reduction cannot run inside a CUDA graph capture (its gradient "
        "scale needs the number of counted tokens on the host); use bf16 or "
        "f32 operands, or run it outside the capture");
  }
  const PlanInput input = PlanInputOf(problem, context.device().kind);
  ASSIGN_OR_RETURN(const Plan plan, MakePlan(input));
  std::unique_ptr<Backend> backend;
  if (context.device().is_cpu()) {
    ASSIGN_OR_RETURN(backend, MakeCpuBackend(problem, plan, context));
  } else {
#ifdef LOSSRT_WITH_CUDA
    ASSIGN_OR_RETURN(backend, MakeCudaBackend(problem, plan, context));
#else
    return absl::UnavailableError(
        "linear cross-entropy on a GPU: built without CUDA");
#endif
  }
  RETURN_IF_ERROR(backend->Begin());
  for (const Block& block : MakeBlocks(input, plan))
    RETURN_IF_ERROR(backend->RunBlock(block));
  return backend->End();
}

}  // namespace
}  // namespace lce

absl::Status LinearCrossEntropyForward(Context& context,
                                       const LinearCrossEntropyInputs& inputs,
                                       const LinearCrossEntropyOptions& options,
                                       const Tensor& loss, const Tensor* lse,
                                       const CrossEntropyExtras* extras) {
  lce::Problem problem;
  problem.extras = extras;
  problem.pass = lce::Pass::kForward;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  return lce::Run(context, problem);
}

absl::Status LinearCrossEntropyForwardBackward(
    Context& context, const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse, const LinearCrossEntropyGradients& gradients,
    const Tensor* grad_loss, const CrossEntropyExtras* extras) {
  lce::Problem problem;
  problem.extras = extras;
  problem.pass = lce::Pass::kForwardBackward;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  problem.grad_loss = grad_loss;
  problem.gradients = &gradients;
  return lce::Run(context, problem);
}

absl::Status LinearCrossEntropyBackward(
    Context& context, const LinearCrossEntropyInputs& inputs, const Tensor& lse,
    const Tensor& grad_loss, const LinearCrossEntropyOptions& options,
    const LinearCrossEntropyGradients& gradients) {
  lce::Problem problem;
  problem.pass = lce::Pass::kBackward;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.lse = &lse;
  problem.grad_loss = &grad_loss;
  problem.gradients = &gradients;
  return lce::Run(context, problem);
}

}  // namespace lossrt
