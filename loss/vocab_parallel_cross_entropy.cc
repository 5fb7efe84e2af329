// The vocabulary-parallel cross-entropy (loss/vocab_parallel_cross_entropy.h):
// the rank-local checks, the exchange of the validity record (one all-gather,
// before anything is written), the per-token target weights from their owners,
// and the token-chunk loop. Each chunk: the local logits widened to fp32 (and
// soft-capped), the row max all-reduced (kMax), the row sums all-reduced
// (kSum, f64), the loss and lse from those, the local dlogits from the global
// lse, stored into grad_logits. The row math is that of the vocabulary-
// parallel linear cross-entropy (the CPU twins of vocab_parallel_internal.h,
// the kernels of vocab_parallel_kernels.h on CUDA).
#include "loss/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "loss/cross_entropy_cpu.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/loss_checks.h"
#include "loss/vocab_parallel_internal.h"
#include "loss/vocab_parallel_kernels.h"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include <optional>

#include "absl/container/inlined_vector.h"
#include "loss/cross_entropy_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace vocab_parallel {
namespace {

constexpr char kOpName[] = "vocabulary-parallel cross-entropy";
// A chunk's regions (logits, row max, row sums) are each 256-aligned: the most
// bytes their alignment may add.
constexpr int64_t kChunkSlack = 3 * kAlignment;

enum class Pass : int64_t { kForward, kForwardBackward, kBackward };

// The CUDA path (defined only when built with CUDA).
class CudaRunner;

// One call on one rank.
struct Problem {
  Pass pass = Pass::kForward;
  const VocabShard* shard = nullptr;
  const Tensor* logits = nullptr;
  const Tensor* targets = nullptr;
  const CrossEntropyOptions* options = nullptr;
  const Tensor* loss = nullptr;
  const Tensor* lse = nullptr;
  const Tensor* grad_loss = nullptr;
  const Tensor* grad_logits = nullptr;
  int64_t tokens = 0;       // N
  int64_t local_vocab = 0;  // V_r
  bool backward() const { return pass != Pass::kForward; }
  bool forward() const { return pass != Pass::kBackward; }
  // Whether the row statistics come from the logits: every forward, and a
  // backward with entropy_weight != 0 (the entropy is not saved).
  bool statistics() const {
    return forward() || options->entropy_weight != 0.0f;
  }
  Slice slice() const {
    return {shard->vocab_offset, local_vocab, shard->vocab};
  }
};

absl::Status CheckInputs(const Context& context, Problem& p) {
  const Tensor& logits = *p.logits;
  RETURN_IF_ERROR(
      CheckDType(logits, {DType::kF32, DType::kBF16, DType::kF16}, "logits"));
  if (logits.rank() != 2) {
    return InvalidArgument("logits: expected [tokens, V_r], got ",
                           logits.ShapeString());
  }
  p.tokens = logits.dim(0);
  p.local_vocab = logits.dim(1);
  if (p.tokens < 1) {
    return InvalidArgument("logits: tokens must be >= 1, got ",
                           logits.ShapeString());
  }
  RETURN_IF_ERROR(ce::CheckVocab(p.local_vocab, "logits"));
  RETURN_IF_ERROR(ce::CheckOnContext(logits, context, "logits"));
  RETURN_IF_ERROR(CheckSliceInVocab(p.slice(), "columns", "the logits"));
  const Tensor& targets = *p.targets;
  RETURN_IF_ERROR(CheckDType(targets, {DType::kI64, DType::kI32}, "targets"));
  RETURN_IF_ERROR(CheckShape(targets, {p.tokens}, "targets"));
  RETURN_IF_ERROR(ce::CheckOnContext(targets, context, "targets"));
  return ce::CheckCrossEntropyOptions(*p.options, p.local_vocab, context);
}

absl::Status CheckOutputs(const Context& context, const Problem& p) {
  const CrossEntropyOptions& ce = *p.options;
  RETURN_IF_ERROR(CheckStatTensors(context, ce.reduction, p.tokens, p.loss,
                                   p.lse, p.grad_loss));
  const Tensor& logits = *p.logits;
  if (p.grad_logits != nullptr) {
    const Tensor& grad = *p.grad_logits;
    if (grad.dtype != logits.dtype) {
      return InvalidArgument("grad_logits: dtype must match the logits (",
                             DTypeName(logits.dtype), "), got ",
                             DTypeName(grad.dtype));
    }
    RETURN_IF_ERROR(CheckShape(grad, {p.tokens, p.local_vocab}, "grad_logits"));
    RETURN_IF_ERROR(ce::CheckOnContext(grad, context, "grad_logits"));
    if (Overlaps(grad, logits) &&
        (grad.data != logits.data ||
         grad.effective_row_stride() != logits.effective_row_stride())) {
      return InvalidArgument(
          "grad_logits overlaps the logits without being the same tensor; "
          "pass the logits themselves for the in-place mode");
    }
  }
  // Outputs may overlap neither an input (but grad_logits the logits, in
  // place) nor each other.
  std::vector<NamedTensor> inputs = {{&logits, "logits"},
                                     {p.targets, "targets"}};
  std::vector<NamedTensor> outputs;
  AddCallTensors(ce, p.grad_loss, p.loss, p.lse, p.forward(), inputs, outputs);
  if (p.grad_logits != nullptr)
    outputs.push_back({p.grad_logits, "grad_logits"});
  return CheckDisjoint(outputs, inputs, p.grad_logits, &logits);
}

// The call's temporaries: per-call arrays (the block), then a token chunk's.
struct Layout {
  int64_t record = 0;          // i64 [P * kFields + kFields]
  int64_t row_loss = -1;       // f32 [N] (forward, mean or sum)
  int64_t lse = -1;            // f32 [N]: the lse when the caller's is not
                               // written (not given, or a backward's input)
  int64_t target_weight = -1;  // f64 [N + 1]: w[t] per token, then W
  int64_t block_bytes = 0;
  int64_t ld = 0;        // the chunk logits' row stride (floats)
  int64_t max_rows = 0;  // the most rows a chunk may take on this rank
  int64_t chunk_bytes = 0;
};

Layout PlanLayout(const Problem& p, int world_size) {
  Layout layout;
  const int64_t n = p.tokens;
  BlockPlan plan;
  const bool reduced = p.options->reduction != Reduction::kNone;
  layout.record = plan.Add(true, 8 * kFields * (world_size + 1));
  layout.row_loss = plan.Add(p.forward() && reduced, 4 * n);
  layout.lse = plan.Add(p.lse == nullptr || !p.forward(), 4 * n);
  layout.target_weight = plan.Add(true, 8 * (n + 1));
  layout.block_bytes = plan.size();
  layout.ld = RoundUp(p.local_vocab, int64_t{8});
  const int64_t row_bytes = 4 * layout.ld + 4 + 8 * kRowSums;
  layout.max_rows =
      std::min(std::max<int64_t>(kVocabParallelChunkBytes / row_bytes, 1), n);
  layout.chunk_bytes = layout.max_rows * row_bytes + kChunkSlack;
  return layout;
}

// What both runners hold beyond RunnerBase: the problem and its plan.
class CeRunner : protected RunnerBase {
 protected:
  CeRunner(Context& context, const Problem& p)
      : RunnerBase(context, *p.shard->communicator, *p.options), p_(p) {}

  // The plan, the class weights, (`stats` given: the CPU path) the target
  // scan, the block and the chunk buffer.
  absl::Status PlanAndAllocate(ce::TargetStats* stats) {
    layout_ = PlanLayout(p_, comm_.world_size());
    if (ce_.class_weights.has_value())
      class_weights_ = ce_.class_weights->data_as<const float>();
    if (stats != nullptr) {
      RETURN_IF_ERROR(ScanTargetsHost(*p_.targets, p_.slice(), class_weights_,
                                      ce_, *stats));
    }
    ASSIGN_OR_RETURN(block_,
                     context_.allocator().Allocate(layout_.block_bytes));
    ASSIGN_OR_RETURN(chunk_,
                     context_.allocator().Allocate(layout_.chunk_bytes));
    return absl::OkStatus();
  }
  // What a valid rank's record says of its call.
  CallFacts Facts() const {
    return {p_.slice(), p_.tokens, 0, layout_.max_rows,
            static_cast<int64_t>(p_.pass)};
  }
  // The record's place in the block, or null for none (yet).
  int64_t* RecordInBlock() const {
    return block_.data() != nullptr ? At<int64_t>(layout_.record) : nullptr;
  }
  // The chunk arguments that do not depend on the chunk, from W and the
  // mean's denominators.
  ChunkArgs CallArgsOf(double weight_total, double ce_denominator,
                       double z_denominator) const {
    ChunkArgs call =
        CallArgs(ce_, p_.slice(), layout_.ld, *p_.targets, class_weights_,
                 p_.statistics(), p_.backward(), p_.logits->dtype);
    call.weight_total = weight_total;
    MeanScales(ce_, ce_denominator, z_denominator, call);
    return call;
  }
  // chunk(args, row_begin, row_end) over the agreed chunks, each with its
  // rows' arguments from `call`, the call's lse (the caller's when a forward
  // writes it, else the block's; a backward without the statistics reads the
  // saved one) and per-row losses (`row_loss`, null in a backward).
  template <typename ChunkFn>
  absl::Status ChunkLoop(const ChunkArgs& call, const double* target_weight,
                         float*& row_loss, ChunkFn&& chunk) const {
    float* lse = p_.forward() && p_.lse != nullptr ? p_.lse->data_as<float>()
                                                   : At<float>(layout_.lse);
    if (!call.fused) lse = p_.lse->data_as<float>();  // the saved lse, read
    row_loss = !p_.forward() ? nullptr
               : ce_.reduction == Reduction::kNone
                   ? p_.loss->data_as<float>()
                   : At<float>(layout_.row_loss);
    const ChunkRegions regions =
        RegionsOf(chunk_.data(), layout_.max_rows, layout_.ld);
    return ForEachChunk(agreed_, p_.tokens, [&](int64_t begin, int64_t end) {
      return chunk(RowArgs(call, regions, *p_.targets, p_.grad_loss, begin, end,
                           lse, row_loss, target_weight),
                   begin, end);
    });
  }

  const Problem& p_;
  Layout layout_;
};

// The CPU path.
class Runner : CeRunner {
 public:
  Runner(Context& context, const Problem& p) : CeRunner(context, p) {}

  // `checks`: the verdict of the rank-local argument checks. The rank takes
  // part in the exchange whatever it is.
  absl::Status Run(const absl::Status& checks);

 private:
  absl::Status Chunk(const ChunkArgs& call, int64_t row_begin, int64_t row_end);

  ce::TargetStats stats_{};
};

absl::Status Runner::Run(const absl::Status& checks) {
  const absl::Status local = checks.ok() ? PlanAndAllocate(&stats_) : checks;
  // The record lives in the block when it exists, else in a small buffer.
  RETURN_IF_ERROR(ExchangeRecordsCpu(context_, comm_, RecordInBlock(), local,
                                     Facts(), ce_, *p_.targets, kOpName,
                                     agreed_));
  const int64_t n = p_.tokens;

  // The targets' weights from their owners and the weight total W, and the
  // mean's denominators as the target scan sums them (in token order).
  double* target_weight = At<double>(layout_.target_weight);
  double ce_denominator = 0.0;
  RETURN_IF_ERROR(TargetWeightsCpu(context_, comm_, *p_.targets, p_.slice(),
                                   class_weights_, ce_.ignore_index,
                                   target_weight, ce_denominator));
  const ChunkArgs call =
      CallArgsOf(target_weight[n], ce_denominator, stats_.z_denominator);
  float* row_loss = nullptr;
  RETURN_IF_ERROR(
      ChunkLoop(call, target_weight, row_loss,
                [this](const ChunkArgs& args, int64_t begin, int64_t end) {
                  return Chunk(args, begin, end);
                }));
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    *p_.loss->data_as<float>() =
        static_cast<float>(ce::SumRowsCpu(row_loss, n));
  }
  return absl::OkStatus();
}

absl::Status Runner::Chunk(const ChunkArgs& args, int64_t row_begin,
                           int64_t row_end) {
  const Tensor& logits = *p_.logits;
  const int64_t rows = row_end - row_begin;
  const int64_t v = p_.local_vocab;
  const int64_t ld = layout_.ld;
  // The chunk's logits in fp32 [rows, ld], soft-capped.
  const int64_t src_ld = logits.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = args.logits + i * ld;
    const int64_t base = (row_begin + i) * src_ld;
    if (logits.dtype == DType::kF32) {
      std::memcpy(dst, logits.data_as<const float>() + base, 4 * v);
    } else {
      for (int64_t j = 0; j < v; ++j)
        dst[j] = LoadHost(logits.data, logits.dtype, base + j);
    }
  }
  SoftcapCpu(args.logits, rows, v, ld, ce_.softcap);

  // The global lse: the row max (kMax), then the row sums (kSum).
  if (args.fused) RETURN_IF_ERROR(GlobalRowStatsCpu(context_, comm_, args));
  RowFinishCpu(args);
  if (!p_.backward()) return absl::OkStatus();
  // The dlogits (already rounded to the logits' dtype) into grad_logits.
  const Tensor& grad = *p_.grad_logits;
  const int64_t grad_ld = grad.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = args.logits + i * ld;
    const int64_t base = (row_begin + i) * grad_ld;
    if (grad.dtype == DType::kF32) {
      std::memcpy(grad.data_as<float>() + base, src, 4 * v);
    } else {
      for (int64_t j = 0; j < v; ++j)
        StoreHost(grad.data, grad.dtype, base + j, src[j]);
    }
  }
  return absl::OkStatus();
}

#ifdef LOSSRT_WITH_CUDA
// The CUDA path: the same exchange and chunk loop, every step on the
// context's stream. The targets are checked on the device and their verdict
// travels in the record, so that the exchange needs the call's one wait for
// the stream (the records' readback).
class CudaRunner : CeRunner {
 public:
  CudaRunner(Context& context, const Problem& p) : CeRunner(context, p) {}

  absl::Status Run(const absl::Status& checks);

 private:
  absl::Status Chunk(const ChunkArgs& args, int64_t row_begin, int64_t row_end);

  std::optional<ScopedDevice> device_;
  cudaStream_t stream_ = nullptr;
  Denominators denominators_;
};

absl::Status CudaRunner::Run(const absl::Status& checks) {
  ASSIGN_OR_RETURN(stream_, EnterDevice(context_, device_));
  absl::Status local = checks;
  if (local.ok()) local = PlanAndAllocate(nullptr);
  RETURN_IF_ERROR(ExchangeRecordsCuda(
      context_, comm_, stream_, RecordInBlock(), local, Facts(), ce_,
      *p_.targets, class_weights_, kOpName, agreed_, denominators_));
  const int64_t n = p_.tokens;

  // The targets' weights from their owners (kSum over the ranks).
  double* target_weight = nullptr;
  if (class_weights_ != nullptr) {
    target_weight = At<double>(layout_.target_weight);
    RETURN_IF_ERROR(TargetWeightsCuda(context_, comm_, stream_, *p_.targets,
                                      p_.slice(), class_weights_,
                                      target_weight));
  }
  const ChunkArgs call =
      CallArgsOf(denominators_.weight_total, denominators_.ce, denominators_.z);
  float* row_loss = nullptr;
  RETURN_IF_ERROR(
      ChunkLoop(call, target_weight, row_loss,
                [this](const ChunkArgs& args, int64_t begin, int64_t end) {
                  return Chunk(args, begin, end);
                }));
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    CUDA_RETURN_IF_ERROR(
        ce::LaunchSumRows(row_loss, n, p_.loss->data_as<float>(), stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Chunk(const ChunkArgs& args, int64_t row_begin,
                               int64_t row_end) {
  const Tensor& logits = *p_.logits;
  const int64_t rows = row_end - row_begin;
  const int64_t e = DTypeSize(logits.dtype);
  // The chunk's logits in fp32 [rows, ld].
  WidenArgs widen;
  widen.src = static_cast<const char*>(logits.data) +
              row_begin * logits.effective_row_stride() * e;
  widen.type = logits.dtype;
  widen.src_ld = logits.effective_row_stride();
  widen.dst = args.logits;
  widen.dst_ld = args.ld;
  widen.rows = rows;
  widen.cols = args.cols;
  CUDA_RETURN_IF_ERROR(LaunchWiden(widen, stream_));

  // The global lse: the row max (kMax, soft-capping in place), then the row
  // sums (kSum).
  if (args.fused) {
    RETURN_IF_ERROR(GlobalRowStatsCuda(context_, comm_, stream_, args));
  }
  CUDA_RETURN_IF_ERROR(LaunchRowFinish(args, stream_));
  if (!p_.backward()) return absl::OkStatus();
  // The dlogits, stored in the logits' dtype from each fp32 row's start
  // (a row stride of ld * 4 bytes), into grad_logits.
  const Tensor& grad = *p_.grad_logits;
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      static_cast<char*>(grad.data) +
          row_begin * grad.effective_row_stride() * e,
      grad.effective_row_stride() * e, args.logits, args.ld * 4, args.cols * e,
      rows, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}
#endif  // LOSSRT_WITH_CUDA

absl::Status Run(Context& context, Problem& p) {
  return RunRank<Runner, CudaRunner>(context, p, kOpName);
}

}  // namespace
}  // namespace vocab_parallel

absl::Status VocabParallelCrossEntropyForward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kForward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelCrossEntropyBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const Tensor& lse, const Tensor& grad_loss,
    const CrossEntropyOptions& options, const Tensor& grad_logits) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kBackward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.lse = &lse;
  problem.grad_loss = &grad_loss;
  problem.grad_logits = &grad_logits;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelCrossEntropyForwardBackward(
    Context& context, const VocabShard& shard, const Tensor& logits,
    const Tensor& targets, const CrossEntropyOptions& options,
    const Tensor& loss, const Tensor* lse, const Tensor& grad_logits,
    const Tensor* grad_loss) {
  vocab_parallel::Problem problem;
  problem.pass = vocab_parallel::Pass::kForwardBackward;
  problem.shard = &shard;
  problem.logits = &logits;
  problem.targets = &targets;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  problem.grad_loss = grad_loss;
  problem.grad_logits = &grad_logits;
  return vocab_parallel::Run(context, problem);
}

}  // namespace lossrt
