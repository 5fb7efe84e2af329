// The CUDA backend of the linear cross-entropy. Each block runs
//   G1 logits (cuBLASLt, fp32 output, bias epilogue) -> CE kernel (dlogits in
//   place, in the operand dtype) -> G2 d_hidden and G3 d_weight (cuBLASLt, fp32
//   accumulation),
// and, where the plan overlaps streams, splits the block's rows in two so that
// the memory-bound cross-entropy of one half runs on a second stream while the
// GEMMs of the other half run on the context's stream:
//   main:  G1(a) G1(b) . G2(a) G2(b) G3
//   side:        CE(a) CE(b)
// (Measured on the H200, 2026-11-30: this pays only where the GEMMs take
// several times longer than the cross-entropy, e.g. bf16 at H = 4096; four
// parts, stream priorities, or fewer SMs for the cross-entropy with the GEMMs'
// CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET did no better.)
// All GEMMs stay on the context's stream, so the one cuBLASLt workspace is
// never shared. Compiled only with the CUDA toolkit (LOSSRT_WITH_CUDA).
#ifdef LOSSRT_WITH_CUDA
#include "loss/linear_cross_entropy_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "loss/cross_entropy_cuda.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/kernel_args.h"
#include "loss/linear_cross_entropy_internal.h"
#include "loss/linear_cross_entropy_kernels.h"
#include "loss/loss_checks.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#include "runtime/status.h"

namespace lossrt {
namespace lce {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Problem& problem, const Plan& plan, Context& context)
      : problem_(problem),
        plan_(plan),
        context_(context),
        ce_(problem.options->cross_entropy),
        operand_(problem.operand_type()),
        e_(DTypeSize(problem.operand_type())) {}

  ~CudaBackend() override {
    // Whatever happened, the context's stream must not run ahead of the side
    // stream's use of the workspace block, which goes back to the allocator's
    // cache after this. (The side stream and the events are the context's.)
    if (side_ != nullptr) {
      if (cudaEventRecord(side_done_, side_) == cudaSuccess) {
        cudaStreamWaitEvent(main_, side_done_, 0);
      }
    }
  }

  absl::Status Begin() override;
  absl::Status RunBlock(const Block& block) override;
  absl::Status End() override;

 private:
  template <typename T = void>
  T* At(int64_t offset) const {
    return offset < 0 ? nullptr
                      : reinterpret_cast<T*>(static_cast<char*>(block_.data()) +
                                             offset);
  }
  const char* RowOf(const Tensor& tensor, int64_t row) const {
    return static_cast<const char*>(tensor.data) +
           row * tensor.effective_row_stride() * DTypeSize(tensor.dtype);
  }
  const void* Targets(int64_t row) const {
    return static_cast<const char*>(problem_.inputs->targets.data) +
           row * DTypeSize(problem_.inputs->targets.dtype);
  }
  const float* GradLoss(int64_t row) const {
    return grad_loss_ == nullptr ? nullptr
                                 : grad_loss_ + (grad_loss_per_row_ ? row : 0);
  }
  float* Logits(const Block& block, int64_t row) const {
    return logits_ + (row - block.row_begin) * block.ld;
  }
  // A token chunk's logits row, fp32 or (operand_dtype_logits) 16-bit, as the
  // plan's logit_bytes say; the slices' rows are fp32 (Logits).
  void* ChunkLogits(const Block& block, int64_t row) const {
    return reinterpret_cast<char*>(logits_) +
           (row - block.row_begin) * block.ld * plan_.logit_bytes;
  }
  DType LogitsType() const {
    return plan_.logit_bytes == 4 ? DType::kF32 : operand_;
  }
  // dlogits rows start where their logits rows do (kCompactBackward: in the
  // compact rows, whose stride block.ld counts 16-bit elements); their stride
  // in operand elements.
  void* Dlogits(const Block& block, int64_t row) const {
    return block.mode == CeMode::kCompactBackward
               ? static_cast<void*>(compact_ +
                                    (row - block.row_begin) * block.ld)
               : ChunkLogits(block, row);
  }
  int64_t DlogitsLd(const Block& block) const {
    return block.mode == CeMode::kCompactBackward
               ? block.ld
               : block.ld * plan_.logit_bytes / e_;
  }

  absl::Status ComputeLogits(const Block& block, int64_t row_begin,
                             int64_t row_end);
  absl::Status CrossEntropy(const Block& block, int64_t row_begin,
                            int64_t row_end, cudaStream_t stream);
  absl::Status DHidden(const Block& block, int64_t row_begin, int64_t row_end);
  absl::Status DWeight(const Block& block);
  absl::Status DBias(const Block& block);
  absl::Status ZeroOutputs();

  const Problem& problem_;
  const Plan& plan_;
  Context& context_;
  const CrossEntropyOptions& ce_;
  const DType operand_;
  const int64_t e_;  // operand bytes

  std::optional<ScopedDevice> device_;
  Buffer block_;
  cudaStream_t main_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t logits_ready_[2] = {};
  cudaEvent_t dlogits_ready_[2] = {};
  cudaEvent_t side_done_ = nullptr;
  GemmRunner* gemm_ = nullptr;  // the context's, for this compute type and
                                // workspace share
  int num_sms_ = 0;

  float* logits_ = nullptr;  // [rows, ld] fp32 (the buffer)
  ce::TargetStats* stats_ = nullptr;
  float* row_loss_ = nullptr;  // [N]
  float* row_hit_ = nullptr;   // [N] the accuracy's terms, or null
  float* lse_ = nullptr;       // [N] or null
  // [N] the targets' log-probabilities of the two-pass schedule's first pass,
  // read by its slices; null otherwise.
  float* target_logprob_ = nullptr;
  const float* bias_ = nullptr;    // [V] fp32 or null
  const void* ones_ = nullptr;     // [N] operand dtype
  float* d_weight_acc_ = nullptr;  // [V, H] or null
  float* d_bias_acc_ = nullptr;    // [V] or null
  float* d_hidden_acc_ = nullptr;  // [chunk_rows, H] (vocabulary slices)
  float* row_max_ = nullptr;       // [N] (vocabulary slices)
  double* row_stats_ = nullptr;    // [N, kStats] (vocabulary slices)
  uint16_t* compact_ = nullptr;    // [chunk_rows, chunk_ld] (compact chunks)
  float* slice_max_ = nullptr;     // [chunk_rows, num_slices] (compact chunks)
  const float* grad_loss_ = nullptr;
  bool grad_loss_per_row_ = false;
  float scale_ =
      1.0f;  // dlogits are `scale_` times the gradient (f16 underflow guard)
};

absl::Status CudaBackend::Begin() {
  const LinearCrossEntropyInputs& in = *problem_.inputs;
  const LinearCrossEntropyOptions& options = *problem_.options;
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context_.device().ordinal));
  device_.emplace(std::move(scoped));
  ASSIGN_OR_RETURN(main_, CudaStreamOf(context_));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &num_sms_, cudaDevAttrMultiProcessorCount, context_.device().ordinal));
  ASSIGN_OR_RETURN(block_, context_.allocator().Allocate(plan_.block_bytes));
  logits_ = At<float>(plan_.logits_offset);
  stats_ = At<ce::TargetStats>(plan_.stats_offset);
  row_loss_ = At<float>(plan_.row_loss_offset);
  row_hit_ = At<float>(plan_.row_hit_offset);
  d_weight_acc_ = At<float>(plan_.d_weight_acc_offset);
  d_bias_acc_ = At<float>(plan_.d_bias_acc_offset);
  d_hidden_acc_ = At<float>(plan_.d_hidden_acc_offset);
  row_max_ = At<float>(plan_.row_max_offset);
  row_stats_ = At<double>(plan_.row_stats_offset);
  compact_ = At<uint16_t>(plan_.compact_offset);
  slice_max_ = At<float>(plan_.slice_max_offset);
  lse_ = problem_.lse != nullptr ? problem_.lse->data_as<float>()
                                 : At<float>(plan_.lse_offset);
  target_logprob_ = SliceTargetLogprob(problem_, plan_,
                                       At<float>(plan_.target_logprob_offset));
  const int64_t n = problem_.tokens;
  if (n == 0) return absl::OkStatus();

  // Targets: the mean's denominators on the device, and one readback to reject
  // bad targets (and to scale f16 dlogits) before anything is written. Inside
  // a CUDA graph capture there is no readback: the verdict goes to the
  // context's deferred error count (the driver refuses the f16 mean's
  // backward there, whose scale needs the denominator on the host).
  const float* class_weights = ce_.class_weights.has_value()
                                   ? ce_.class_weights->data_as<float>()
                                   : nullptr;
  CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
      in.targets.data, in.targets.dtype == DType::kI64, n, problem_.vocab,
      ce_.ignore_index, class_weights, stats_, main_));
  const bool f16_mean = operand_ == DType::kF16 &&
                        ce_.reduction == Reduction::kMean &&
                        problem_.backward();
  if (problem_.capturing) {
    RETURN_IF_ERROR(ce::DeferTargetStatsCheck(context_, stats_, ce_, main_));
  } else if (ce::ChecksTargetStats(ce_) || f16_mean) {
    ce::TargetStats host;
    RETURN_IF_ERROR(
        ce::ReadBackTargetStats(stats_, main_, ce_, n, problem_.vocab, &host));
    if (problem_.backward()) {
      scale_ = DlogitsScale(operand_, static_cast<int>(ce_.reduction),
                            host.ce_denominator);
    }
  }

  if (problem_.grad_loss != nullptr) {
    grad_loss_ = problem_.grad_loss->data_as<float>();
    grad_loss_per_row_ = ce_.reduction == Reduction::kNone;
  }
  if (scale_ != 1.0f) {
    ConvertArgs scaled;
    scaled.src = grad_loss_;
    scaled.cols = grad_loss_per_row_ ? n : 1;
    scaled.src_ld = scaled.dst_ld = scaled.cols;
    scaled.rows = 1;
    scaled.dst = At<float>(plan_.grad_scale_offset);
    scaled.scale = scale_;
    CUDA_RETURN_IF_ERROR(LaunchConvert(scaled, main_));
    grad_loss_ = At<float>(plan_.grad_scale_offset);
  }
  if (in.bias.has_value()) {
    if (plan_.bias_offset >= 0) {
      ConvertArgs bias;
      bias.src = in.bias->data;
      bias.src_type = in.bias->dtype;
      bias.dst = At<float>(plan_.bias_offset);
      bias.rows = 1;
      bias.cols = bias.src_ld = bias.dst_ld = problem_.vocab;
      CUDA_RETURN_IF_ERROR(LaunchConvert(bias, main_));
      bias_ = At<float>(plan_.bias_offset);
    } else {
      bias_ = in.bias->data_as<float>();
    }
  }
  if (plan_.ones_offset >= 0) {
    ConvertArgs ones;  // src null: fill with `scale`
    ones.dst = At(plan_.ones_offset);
    ones.dst_type = operand_;
    ones.rows = 1;
    ones.cols = ones.src_ld = ones.dst_ld = n;
    CUDA_RETURN_IF_ERROR(LaunchConvert(ones, main_));
    ones_ = ones.dst;
  }

  const cublasComputeType_t compute =
      operand_ == DType::kF32 && options.use_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                  : CUBLAS_COMPUTE_32F;
  // The plans, the second stream and its events belong to the context: made
  // on a context's first call, reused by the later ones.
  ASSIGN_OR_RETURN(gemm_, ContextGemmRunnerFor(context_, compute,
                                               plan_.gemm_workspace_bytes));

  if (plan_.overlap_streams) {
    // The cross-entropy runs on the context's second stream, of the device's
    // highest priority, so that its blocks take SMs as soon as GEMM tiles
    // retire instead of queueing behind the next GEMM.
    ASSIGN_OR_RETURN(side_, ContextSideStream(context_));
    ASSIGN_OR_RETURN(const cudaEvent_t* events, ContextEvents(context_, 5));
    logits_ready_[0] = events[0];
    logits_ready_[1] = events[1];
    dlogits_ready_[0] = events[2];
    dlogits_ready_[1] = events[3];
    side_done_ = events[4];
    // The side stream's work of this call follows what the context's stream
    // has queued so far (the inputs' producers, the block's conversions).
    CUDA_RETURN_IF_ERROR(cudaEventRecord(side_done_, main_));
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, side_done_, 0));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::RunBlock(const Block& block) {
  // Vocabulary slices: one stream (the plan overlaps none).
  if (block.mode == CeMode::kSliceFinish) {
    CUDA_RETURN_IF_ERROR(LaunchSliceFinish(
        MakeSliceFinishArgs(problem_, block, stats_, row_max_, row_stats_, lse_,
                            row_loss_, target_logprob_),
        main_));
    return absl::OkStatus();
  }
  if (block.mode == CeMode::kSliceStats) {
    if (!block.logits_ready)
      RETURN_IF_ERROR(ComputeLogits(block, block.row_begin, block.row_end));
    CUDA_RETURN_IF_ERROR(LaunchSliceStats(
        MakeSliceStatsArgs(problem_, block, logits_, row_max_, row_stats_),
        main_));
    return absl::OkStatus();
  }
  if (block.mode == CeMode::kCompactStats) {
    RETURN_IF_ERROR(ComputeLogits(block, block.row_begin, block.row_end));
    CUDA_RETURN_IF_ERROR(LaunchCompactStats(
        MakeCompactStatsArgs(problem_, plan_, block, logits_, row_max_,
                             row_stats_, compact_, slice_max_),
        main_));
    return absl::OkStatus();
  }
  if (block.mode == CeMode::kCompactBackward) {
    CUDA_RETURN_IF_ERROR(LaunchCompactBackward(
        MakeCompactArgs(problem_, plan_, block, compact_, slice_max_, stats_,
                        grad_loss_, grad_loss_per_row_, lse_, target_logprob_),
        main_));
    RETURN_IF_ERROR(DHidden(block, block.row_begin, block.row_end));
    RETURN_IF_ERROR(DWeight(block));
    if (bias_ != nullptr) RETURN_IF_ERROR(DBias(block));
    return absl::OkStatus();
  }
  const int64_t rows = block.row_end - block.row_begin;
  // Two halves when there is a second stream and enough rows for two GEMMs of
  // full tiles.
  const int parts = side_ != nullptr && rows >= 256 ? 2 : 1;
  const int64_t split[3] = {
      block.row_begin,
      parts == 2 ? block.row_begin + (rows / 2 + 63) / 64 * 64 : block.row_end,
      block.row_end};
  cudaStream_t ce_stream = side_ != nullptr ? side_ : main_;
  for (int p = 0; p < parts && !block.logits_ready; ++p) {
    RETURN_IF_ERROR(ComputeLogits(block, split[p], split[p + 1]));
    if (side_ != nullptr)
      CUDA_RETURN_IF_ERROR(cudaEventRecord(logits_ready_[p], main_));
  }
  for (int p = 0; p < parts; ++p) {
    if (side_ != nullptr)
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, logits_ready_[p], 0));
    RETURN_IF_ERROR(CrossEntropy(block, split[p], split[p + 1], ce_stream));
    if (side_ != nullptr)
      CUDA_RETURN_IF_ERROR(cudaEventRecord(dlogits_ready_[p], side_));
  }
  if (block.d_hidden) {
    for (int p = 0; p < parts; ++p) {
      if (side_ != nullptr) {
        CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main_, dlogits_ready_[p], 0));
      }
      RETURN_IF_ERROR(DHidden(block, split[p], split[p + 1]));
    }
  }
  // The whole block's dlogits are needed by G3, and the buffer is overwritten
  // by the next block's G1.
  if (side_ != nullptr) {
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(main_, dlogits_ready_[parts - 1], 0));
  }
  if (block.d_weight) {
    RETURN_IF_ERROR(DWeight(block));
    if (bias_ != nullptr) RETURN_IF_ERROR(DBias(block));
  }
  return absl::OkStatus();
}

// logits[rows, cols] = hidden[rows] @ weight[cols]^T + bias[cols], as the
// column-major D[cols, rows] = W^T(op T of [H, cols]) @ hidden(op N of [H,
// rows]).
absl::Status CudaBackend::ComputeLogits(const Block& block, int64_t row_begin,
                                        int64_t row_end) {
  const Tensor& hidden = problem_.inputs->hidden;
  const Tensor& weight = problem_.inputs->weight;
  const cudaDataType type = CudaType(operand_);
  const int64_t cols = block.col_end - block.col_begin;
  const int64_t rows = row_end - row_begin;
  GemmCall call;
  call.a = {RowOf(weight, block.col_begin), type,       problem_.hidden, cols,
            weight.effective_row_stride(),  CUBLAS_OP_T};
  call.b = {RowOf(hidden, row_begin),      type,       problem_.hidden, rows,
            hidden.effective_row_stride(), CUBLAS_OP_N};
  call.d = ChunkLogits(block, row_begin);
  call.d_type = LogitsType() == DType::kF32 ? CUDA_R_32F : type;
  call.m = cols;
  call.n = rows;
  call.ld_d = block.ld;
  call.bias = bias_ != nullptr ? bias_ + block.col_begin : nullptr;
  return gemm_->Run(call, main_);
}

absl::Status CudaBackend::CrossEntropy(const Block& block, int64_t row_begin,
                                       int64_t row_end, cudaStream_t stream) {
  const Tensor& targets = problem_.inputs->targets;
  if (block.mode == CeMode::kSliceBackward) {
    const SliceArgs args = MakeSliceArgs(
        problem_, block, row_begin, row_end, Logits(block, row_begin), stats_,
        grad_loss_, grad_loss_per_row_, lse_, target_logprob_);
    CUDA_RETURN_IF_ERROR(LaunchSliceBackward(args, stream));
    return absl::OkStatus();
  }
  ce::RowArgs args =
      ce::MakeRowArgs(ChunkLogits(block, row_begin), LogitsType(), block.ld,
                      row_end - row_begin, problem_.vocab, Targets(row_begin),
                      targets.dtype == DType::kI64, ce_);
  args.stats = stats_;
  args.lse = lse_ != nullptr ? lse_ + row_begin : nullptr;
  if (block.mode != CeMode::kBackward) {
    SetChunkExtras(problem_, row_begin, row_hit_, args);
    if (target_logprob_ != nullptr)
      args.target_logprob = target_logprob_ + row_begin;
    args.row_loss = ce_.reduction == Reduction::kNone
                        ? problem_.loss->data_as<float>() + row_begin
                        : row_loss_ + row_begin;
  }
  if (block.mode != CeMode::kForward) {
    args.grad_loss = GradLoss(row_begin);
    args.grad_loss_per_row = grad_loss_per_row_;
    // In place: 16-bit rows start where fp32 rows do (and 16-bit logits are
    // overwritten element by element).
    args.grad = ChunkLogits(block, row_begin);
    args.grad_type = operand_;
    args.grad_stride = DlogitsLd(block);
  }
  CUDA_RETURN_IF_ERROR(block.mode == CeMode::kBackward
                           ? ce::LaunchBackward(args, num_sms_, stream)
                           : ce::LaunchRows(args, num_sms_, stream));
  return absl::OkStatus();
}

// d_hidden[rows] (+)= dlogits[rows, cols] @ weight[cols, H], as the
// column-major D[H, rows] = weight(op N of [H, cols]) @ dlogits(op N of
// [cols, rows]): written once over whole rows; vocabulary slices add up in
// d_hidden itself (f32) or in the fp32 accumulator, rounded into d_hidden
// after the rows' last slice.
absl::Status CudaBackend::DHidden(const Block& block, int64_t row_begin,
                                  int64_t row_end) {
  const Tensor& weight = problem_.inputs->weight;
  const Tensor& d_hidden = problem_.gradients->d_hidden;
  const cudaDataType type = CudaType(operand_);
  const int64_t cols = block.col_end - block.col_begin;
  GemmCall call;
  call.a = {RowOf(weight, block.col_begin), type,       problem_.hidden, cols,
            weight.effective_row_stride(),  CUBLAS_OP_N};
  call.b = {Dlogits(block, row_begin), type,       cols, row_end - row_begin,
            DlogitsLd(block),          CUBLAS_OP_N};
  char* d_hidden_rows = const_cast<char*>(RowOf(d_hidden, row_begin));
  if (d_hidden_acc_ != nullptr) {
    call.d = d_hidden_acc_ + (row_begin - block.row_begin) * problem_.hidden;
    call.d_type = CUDA_R_32F;
    call.ld_d = problem_.hidden;
  } else {
    call.d = d_hidden_rows;
    call.d_type = CudaType(d_hidden.dtype);
    call.ld_d = d_hidden.effective_row_stride();
  }
  call.m = problem_.hidden;
  call.n = row_end - row_begin;
  call.alpha = 1.0f / scale_;
  call.beta = block.d_hidden_accumulate ? 1.0f : 0.0f;
  RETURN_IF_ERROR(gemm_->Run(call, main_));
  if (d_hidden_acc_ != nullptr && block.d_hidden_done) {
    ConvertArgs round;
    round.src = call.d;
    round.src_ld = problem_.hidden;
    round.dst = d_hidden_rows;
    round.dst_type = d_hidden.dtype;
    round.dst_ld = d_hidden.effective_row_stride();
    round.rows = row_end - row_begin;
    round.cols = problem_.hidden;
    CUDA_RETURN_IF_ERROR(LaunchConvert(round, main_));
  }
  return absl::OkStatus();
}

// d_weight[cols] (+)= dlogits[rows, cols]^T @ hidden[rows], as the column-major
// D[H, cols] = hidden(op N of [H, rows]) @ dlogits(op T of [cols, rows]), into
// the fp32 accumulator or straight into d_weight.
absl::Status CudaBackend::DWeight(const Block& block) {
  const Tensor& hidden = problem_.inputs->hidden;
  const Tensor& d_weight = problem_.gradients->d_weight;
  const cudaDataType type = CudaType(operand_);
  const int64_t rows = block.row_end - block.row_begin;
  const int64_t cols = block.col_end - block.col_begin;
  GemmCall call;
  call.a = {RowOf(hidden, block.row_begin), type,       problem_.hidden, rows,
            hidden.effective_row_stride(),  CUBLAS_OP_N};
  call.b = {Dlogits(block, block.row_begin),
            type,
            cols,
            rows,
            DlogitsLd(block),
            CUBLAS_OP_T};
  if (d_weight_acc_ != nullptr) {
    call.d = d_weight_acc_ + block.col_begin * problem_.hidden;
    call.d_type = CUDA_R_32F;
    call.ld_d = problem_.hidden;
  } else {
    call.d = const_cast<char*>(RowOf(d_weight, block.col_begin));
    call.d_type = CudaType(d_weight.dtype);
    call.ld_d = d_weight.effective_row_stride();
  }
  call.m = problem_.hidden;
  call.n = cols;
  call.alpha = 1.0f / scale_;
  call.beta = block.accumulate ? 1.0f : 0.0f;
  return gemm_->Run(call, main_);
}

// d_bias[cols] (+)= dlogits^T @ ones: a GEMV through cuBLASLt, deterministic
// like the GEMMs.
absl::Status CudaBackend::DBias(const Block& block) {
  const Tensor& d_bias = *problem_.gradients->d_bias;
  const cudaDataType type = CudaType(operand_);
  const int64_t rows = block.row_end - block.row_begin;
  const int64_t cols = block.col_end - block.col_begin;
  GemmCall call;
  call.a = {Dlogits(block, block.row_begin),
            type,
            cols,
            rows,
            DlogitsLd(block),
            CUBLAS_OP_N};
  call.b = {ones_, type, rows, 1, rows, CUBLAS_OP_N};
  if (d_bias_acc_ != nullptr) {
    call.d = d_bias_acc_ + block.col_begin;
    call.d_type = CUDA_R_32F;
  } else {
    call.d = static_cast<char*>(d_bias.data) +
             block.col_begin * DTypeSize(d_bias.dtype);
    call.d_type = CudaType(d_bias.dtype);
  }
  call.m = cols;
  call.n = 1;
  call.ld_d = cols;
  call.alpha = 1.0f / scale_;
  call.beta = block.accumulate ? 1.0f : 0.0f;
  return gemm_->Run(call, main_);
}

absl::Status CudaBackend::ZeroOutputs() {
  if (problem_.loss != nullptr && ce_.reduction != Reduction::kNone) {
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(problem_.loss->data, 0, sizeof(float), main_));
  }
  if (problem_.extras != nullptr && problem_.extras->accuracy.has_value()) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(problem_.extras->accuracy->data, 0,
                                         sizeof(float), main_));
  }
  // No tokens: a zero gradient, which accumulate adds by leaving d_weight
  // and d_bias as they are.
  if (problem_.gradients != nullptr && !problem_.gradients->accumulate) {
    const Tensor& d_weight = problem_.gradients->d_weight;
    const int64_t element = DTypeSize(d_weight.dtype);
    CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(
        d_weight.data, d_weight.effective_row_stride() * element, 0,
        problem_.hidden * element, problem_.vocab, main_));
    if (problem_.gradients->d_bias.has_value()) {
      const Tensor& d_bias = *problem_.gradients->d_bias;
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          d_bias.data, 0, problem_.vocab * DTypeSize(d_bias.dtype), main_));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::End() {
  if (problem_.tokens == 0) return ZeroOutputs();
  if (problem_.pass != Pass::kBackward && ce_.reduction != Reduction::kNone) {
    CUDA_RETURN_IF_ERROR(ce::LaunchSumRows(
        row_loss_, problem_.tokens, problem_.loss->data_as<float>(), main_));
  }
  if (row_hit_ != nullptr) {
    CUDA_RETURN_IF_ERROR(
        ce::LaunchSumRows(row_hit_, problem_.tokens,
                          problem_.extras->accuracy->data_as<float>(), main_));
  }
  if (d_weight_acc_ != nullptr) {
    // The one rounding of the fp32 d_weight to the caller's dtype.
    const Tensor& d_weight = problem_.gradients->d_weight;
    ConvertArgs round;
    round.src = d_weight_acc_;
    round.src_ld = problem_.hidden;
    round.dst = d_weight.data;
    round.dst_type = d_weight.dtype;
    round.dst_ld = d_weight.effective_row_stride();
    round.rows = problem_.vocab;
    round.cols = problem_.hidden;
    CUDA_RETURN_IF_ERROR(LaunchConvert(round, main_));
  }
  if (d_bias_acc_ != nullptr) {
    const Tensor& d_bias = *problem_.gradients->d_bias;
    ConvertArgs round;
    round.src = d_bias_acc_;
    round.dst = d_bias.data;
    round.dst_type = d_bias.dtype;
    round.rows = 1;
    round.cols = round.src_ld = round.dst_ld = problem_.vocab;
    CUDA_RETURN_IF_ERROR(LaunchConvert(round, main_));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const Problem& problem,
                                                         const Plan& plan,
                                                         Context& context) {
  return std::unique_ptr<Backend>(new CudaBackend(problem, plan, context));
}

}  // namespace lce
}  // namespace lossrt

#endif  // LOSSRT_WITH_CUDA
