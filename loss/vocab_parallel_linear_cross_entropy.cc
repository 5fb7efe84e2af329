// The vocabulary-parallel linear cross-entropy
// (loss/vocab_parallel_linear_cross_entropy.h): the rank-local checks, the
// exchange of a validity flag and of the ranks' slices (one all-gather, before
// anything is written), the per-token target weights from their owners, and
// the token-chunk loop. Each chunk: local logits (Eigen, fp32), the row max
// all-reduced (kMax), then the row sums all-reduced (kSum, f64), the loss and
// lse from those, the local dlogits from the global lse, d_hidden's partial
// product all-reduced (kSum, f32), d_weight and d_bias accumulated locally.
// The CUDA path (CudaRunner, kernels in
// vocab_parallel_kernels.cu) runs the same steps on the
// context's stream.
//
// The per-row math follows the cross-entropy's CPU twin
// (loss/cross_entropy_cpu.cc) term for term, so that the results differ from
// the single-device op only by the order of the sums over the vocabulary.
#include "loss/vocab_parallel_linear_cross_entropy.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "loss/cpu_matmul.h"
#include "loss/cross_entropy_cpu.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/linear_cross_entropy_internal.h"
#include "loss/loss_checks.h"
#include "loss/vocab_parallel_internal.h"
#include "loss/vocab_parallel_kernels.h"
#include "runtime/dtype.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <optional>

#include "absl/container/inlined_vector.h"
#include "loss/cross_entropy_cuda.h"
#include "loss/linear_cross_entropy_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace vocab_parallel {
namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;
using ConstMatrixMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;

// A chunk's regions (logits, row max, row sums, d_hidden partial) are each
// 256-aligned: the most bytes their alignment may add.
constexpr int64_t kChunkSlack = 4 * kAlignment;
constexpr char kOpName[] = "vocabulary-parallel linear cross-entropy";

// The CUDA path (defined only when built with CUDA).
class CudaRunner;

// One call on one rank.
struct Problem {
  lce::Pass pass = lce::Pass::kForward;
  const VocabShard* shard = nullptr;
  const LinearCrossEntropyInputs* inputs = nullptr;
  const LinearCrossEntropyOptions* options = nullptr;
  const Tensor* loss = nullptr;
  const Tensor* lse = nullptr;
  const Tensor* grad_loss = nullptr;
  const LinearCrossEntropyGradients* gradients = nullptr;
  int64_t tokens = 0;       // N
  int64_t hidden = 0;       // H
  int64_t local_vocab = 0;  // V_r
  bool backward() const { return pass != lce::Pass::kForward; }
  bool forward() const { return pass != lce::Pass::kBackward; }
  Slice slice() const {
    return {shard->vocab_offset, local_vocab, shard->vocab};
  }
};

absl::Status CheckInputs(const Context& context, Problem& p) {
  const LinearCrossEntropyInputs& in = *p.inputs;
  if (in.hidden.rank() != 2)
    return InvalidArgument("hidden: expected [N, H], got ",
                           in.hidden.ShapeString());
  if (in.weight.rank() != 2)
    return InvalidArgument("weight: expected [V_r, H], got ",
                           in.weight.ShapeString());
  p.tokens = in.hidden.dim(0);
  p.hidden = in.hidden.dim(1);
  p.local_vocab = in.weight.dim(0);
  const int64_t v = p.local_vocab;
  RETURN_IF_ERROR(lce::CheckOperands(in, p.tokens, p.hidden, v, context));
  RETURN_IF_ERROR(CheckSliceInVocab(p.slice(), "rows", "the weight"));
  const LinearCrossEntropyOptions& options = *p.options;
  if (options.max_workspace_bytes <= 0) {
    return InvalidArgument("max_workspace_bytes must be positive, got ",
                           options.max_workspace_bytes);
  }
  if (options.chunk_rows < 0) {
    return InvalidArgument(
        "chunk_rows must be >= 0 (0: the planner's choice), got ",
        options.chunk_rows);
  }
  if (options.schedule == LinearCrossEntropySchedule::kTwoPass ||
      options.schedule == LinearCrossEntropySchedule::kVocabSlices ||
      options.schedule == LinearCrossEntropySchedule::kCompactChunks) {
    return InvalidArgument(
        "vocabulary-parallel linear cross-entropy: only the token-chunk "
        "schedule is offered, not ",
        options.schedule == LinearCrossEntropySchedule::kTwoPass ? "kTwoPass"
        : options.schedule == LinearCrossEntropySchedule::kVocabSlices
            ? "kVocabSlices"
            : "kCompactChunks");
  }
  if (options.operand_dtype_logits) {
    return InvalidArgument(
        "vocabulary-parallel linear cross-entropy: operand_dtype_logits is not "
        "offered (the logits are fp32)");
  }
  if (!options.fp32_gradient_accumulation) {
    return InvalidArgument(
        "vocabulary-parallel linear cross-entropy: fp32_gradient_accumulation "
        "= false is not offered (16-bit gradients accumulate in fp32)");
  }
  return ce::CheckCrossEntropyOptions(options.cross_entropy, v, context);
}

absl::Status CheckOutputs(const Context& context, const Problem& p) {
  const CrossEntropyOptions& ce = p.options->cross_entropy;
  RETURN_IF_ERROR(CheckStatTensors(context, ce.reduction, p.tokens, p.loss,
                                   p.lse, p.grad_loss));
  if (p.gradients != nullptr) {
    const LinearCrossEntropyInputs& in = *p.inputs;
    const LinearCrossEntropyGradients& g = *p.gradients;
    if (g.accumulate) {
      return InvalidArgument(
          "vocabulary-parallel linear cross-entropy: accumulate is not "
          "offered (its gradients are written over)");
    }
    RETURN_IF_ERROR(CheckShape(g.d_hidden, {p.tokens, p.hidden}, "d_hidden"));
    RETURN_IF_ERROR(
        CheckDType(g.d_hidden, {DType::kF32, in.hidden.dtype}, "d_hidden"));
    RETURN_IF_ERROR(ce::CheckOnContext(g.d_hidden, context, "d_hidden"));
    RETURN_IF_ERROR(
        CheckShape(g.d_weight, {p.local_vocab, p.hidden}, "d_weight"));
    RETURN_IF_ERROR(
        CheckDType(g.d_weight, {DType::kF32, in.weight.dtype}, "d_weight"));
    RETURN_IF_ERROR(ce::CheckOnContext(g.d_weight, context, "d_weight"));
    if (in.bias.has_value() != g.d_bias.has_value()) {
      return InvalidArgument(in.bias.has_value()
                                 ? "d_bias is required with a bias"
                                 : "d_bias given without a bias");
    }
    if (g.d_bias.has_value()) {
      RETURN_IF_ERROR(CheckShape(*g.d_bias, {p.local_vocab}, "d_bias"));
      RETURN_IF_ERROR(
          CheckDType(*g.d_bias, {DType::kF32, in.bias->dtype}, "d_bias"));
      RETURN_IF_ERROR(ce::CheckOnContext(*g.d_bias, context, "d_bias"));
    }
  }
  if (ce.entropy_weight != 0.0f && p.pass == lce::Pass::kBackward) {
    return InvalidArgument(
        "entropy_weight != 0: VocabParallelLinearCrossEntropyBackward cannot "
        "take the entropy's gradient; use "
        "VocabParallelLinearCrossEntropyForwardBackward");
  }
  // Outputs may overlap neither an input nor each other.
  const LinearCrossEntropyInputs& in = *p.inputs;
  std::vector<NamedTensor> inputs = {
      {&in.hidden, "hidden"}, {&in.weight, "weight"}, {&in.targets, "targets"}};
  std::vector<NamedTensor> outputs;
  if (in.bias.has_value()) inputs.push_back({&*in.bias, "bias"});
  AddCallTensors(ce, p.grad_loss, p.loss, p.lse, p.forward(), inputs, outputs);
  if (p.gradients != nullptr) {
    outputs.push_back({&p.gradients->d_hidden, "d_hidden"});
    outputs.push_back({&p.gradients->d_weight, "d_weight"});
    if (p.gradients->d_bias.has_value())
      outputs.push_back({&*p.gradients->d_bias, "d_bias"});
  }
  return CheckDisjoint(outputs, inputs, nullptr, nullptr);
}

// The call's temporaries: per-call arrays first, then a token chunk's.
struct Layout {
  int64_t row_loss = -1;       // f32 [N] (mean, sum)
  int64_t lse = -1;            // f32 [N] when the caller's lse is not given
  int64_t target_weight = -1;  // f64 [N + 1]: w[t] per token, then W
  int64_t bias = -1;           // f32 [V_r] copy of a 16-bit bias
  int64_t d_weight_acc = -1;   // f32 [V_r, H] for a 16-bit d_weight
  int64_t d_bias_acc = -1;     // f32 [V_r] for a 16-bit d_bias
  int64_t record = 0;          // i64 [P * kFields + kFields]
  int64_t fixed_bytes = 0;
  int64_t ld = 0;         // the logits' row stride (floats)
  int64_t row_bytes = 0;  // bytes a chunk row takes
  int64_t max_rows = 0;   // the most rows a chunk may take within the budget
};

absl::Status PlanLayout(const Problem& p, int world_size, Layout& layout) {
  const int64_t n = p.tokens;
  const int64_t v = p.local_vocab;
  const LinearCrossEntropyInputs& in = *p.inputs;
  BlockPlan plan;
  const bool reduced = p.options->cross_entropy.reduction != Reduction::kNone;
  layout.record = plan.Add(true, 8 * kFields * (world_size + 1));
  layout.row_loss = plan.Add(p.forward() && reduced, 4 * n);
  layout.lse = plan.Add(p.lse == nullptr, 4 * n);
  layout.target_weight = plan.Add(true, 8 * (n + 1));
  layout.bias =
      plan.Add(in.bias.has_value() && in.bias->dtype != DType::kF32, 4 * v);
  layout.d_weight_acc =
      plan.Add(p.backward() && p.gradients->d_weight.dtype != DType::kF32,
               4 * v * p.hidden);
  layout.d_bias_acc =
      plan.Add(p.backward() && p.gradients->d_bias.has_value() &&
                   p.gradients->d_bias->dtype != DType::kF32,
               4 * v);
  layout.fixed_bytes = plan.size();
  layout.ld = RoundUp(v, int64_t{8});
  // logits, the row max, the row sums and d_hidden's partial row.
  layout.row_bytes =
      4 * layout.ld + 4 + 8 * kRowSums + (p.backward() ? 4 * p.hidden : 0);
  const int64_t room =
      p.options->max_workspace_bytes - layout.fixed_bytes - kChunkSlack;
  layout.max_rows = room / layout.row_bytes;
  if (n > 0 && layout.max_rows < 1) {
    return InvalidArgument(
        "max_workspace_bytes = ", p.options->max_workspace_bytes,
        " is too small for one chunk of this problem (N = ", n,
        ", H = ", p.hidden, ", V_r = ", v, "): it needs at least ",
        layout.fixed_bytes + kChunkSlack + layout.row_bytes, " bytes");
  }
  layout.max_rows =
      std::min(std::max<int64_t>(layout.max_rows, 1), std::max<int64_t>(n, 1));
  const int64_t chunk_rows = std::min(p.options->chunk_rows, n);
  if (chunk_rows > 0) {
    if (chunk_rows > layout.max_rows) {
      return InvalidArgument(
          "max_workspace_bytes = ", p.options->max_workspace_bytes,
          " is too small for chunks of chunk_rows = ", chunk_rows,
          " tokens (H = ", p.hidden, ", V_r = ", v, "): they need at least ",
          layout.fixed_bytes + kChunkSlack + chunk_rows * layout.row_bytes,
          " bytes");
    }
    layout.max_rows = chunk_rows;
  }
  return absl::OkStatus();
}

// What both runners hold beyond RunnerBase: the plan and the call's arrays.
class LinearRunner : protected RunnerBase {
 protected:
  LinearRunner(Context& context, const Problem& p)
      : RunnerBase(context, *p.shard->communicator, p.options->cross_entropy),
        p_(p),
        operand_(p.inputs->hidden.dtype) {}

  // The fp32 bias (null without one): the caller's, or a 16-bit bias
  // converted into the block by convert(bias, dst).
  template <typename Convert>
  absl::Status SetBias(Convert&& convert) {
    const LinearCrossEntropyInputs& in = *p_.inputs;
    if (!in.bias.has_value()) return absl::OkStatus();
    if (layout_.bias < 0) {
      bias_ = in.bias->data_as<const float>();
      return absl::OkStatus();
    }
    float* bias = At<float>(layout_.bias);
    RETURN_IF_ERROR(convert(*in.bias, bias));
    bias_ = bias;
    return absl::OkStatus();
  }
  // lse, row_loss and the fp32 accumulators: the caller's or the block's.
  void SetCallArrays() {
    lse_ =
        p_.lse != nullptr ? p_.lse->data_as<float>() : At<float>(layout_.lse);
    row_loss_ = ce_.reduction == Reduction::kNone
                    ? (p_.forward() ? p_.loss->data_as<float>() : nullptr)
                    : At<float>(layout_.row_loss);
    d_weight_acc_ = At<float>(layout_.d_weight_acc);
    d_bias_acc_ = At<float>(layout_.d_bias_acc);
  }
  // The plan, the class weights, (`stats` given: the CPU path) the target
  // scan, the block and (tokens > 0) the chunk buffer.
  absl::Status PlanAndAllocate(ce::TargetStats* stats) {
    RETURN_IF_ERROR(PlanLayout(p_, comm_.world_size(), layout_));
    if (ce_.class_weights.has_value())
      class_weights_ = ce_.class_weights->data_as<const float>();
    if (stats != nullptr) {
      RETURN_IF_ERROR(ScanTargetsHost(p_.inputs->targets, p_.slice(),
                                      class_weights_, ce_, *stats));
    }
    ASSIGN_OR_RETURN(block_, context_.allocator().Allocate(
                                 std::max<int64_t>(layout_.fixed_bytes, 1)));
    if (p_.tokens > 0) {
      ASSIGN_OR_RETURN(chunk_,
                       context_.allocator().Allocate(
                           layout_.max_rows * layout_.row_bytes + kChunkSlack));
    }
    return absl::OkStatus();
  }
  // The chunk arguments of the call from W and the mean's denominators.
  void SetCallArgs(double weight_total, double ce_denominator,
                   double z_denominator) {
    call_ = CallArgs(ce_, p_.slice(), layout_.ld, p_.inputs->targets,
                     class_weights_, p_.forward(), p_.backward(), operand_);
    call_.weight_total = weight_total;
    MeanScales(ce_, ce_denominator, z_denominator, call_);
    if (p_.backward()) {
      call_.dlogits_scale = lce::DlogitsScale(
          operand_, static_cast<int>(ce_.reduction), ce_denominator);
    }
  }
  // What a valid rank's record says of its call.
  CallFacts Facts() const {
    return {p_.slice(), p_.tokens, p_.hidden, layout_.max_rows,
            static_cast<int64_t>(p_.pass)};
  }
  // The record's place in the block, or null for none (yet).
  int64_t* RecordInBlock() const {
    return block_.data() != nullptr ? At<int64_t>(layout_.record) : nullptr;
  }

  const Problem& p_;
  const DType operand_;

  Layout layout_;
  const float* bias_ = nullptr;      // [V_r] fp32 or null
  float* lse_ = nullptr;             // [N]
  float* row_loss_ = nullptr;        // [N] or null
  double* target_weight_ = nullptr;  // [N + 1] (CPU), [N] or null (CUDA)
  float* d_weight_acc_ = nullptr;
  float* d_bias_acc_ = nullptr;
  ChunkArgs call_;  // the chunk arguments that do not depend on the chunk
};

class Runner : LinearRunner {
 public:
  Runner(Context& context, const Problem& p) : LinearRunner(context, p) {}

  // `checks`: the verdict of the rank-local argument checks. The rank takes
  // part in the exchange whatever it is.
  absl::Status Run(const absl::Status& checks);

 private:
  // Local checks, plan and scan: OK or the rank's own verdict.
  absl::Status Prepare();
  absl::Status Chunk(int64_t row_begin, int64_t row_end);
  absl::Status Finish();
  float* FloatCopy(const Tensor& tensor, Buffer& copy, int64_t& ld,
                   absl::Status& status);

  Buffer hidden_copy_;
  Buffer weight_copy_;
  const float* hidden_ = nullptr;  // [N, H], row stride hidden_ld_
  int64_t hidden_ld_ = 0;
  const float* weight_ = nullptr;  // [V_r, H], row stride weight_ld_
  int64_t weight_ld_ = 0;
  ce::TargetStats stats_{};
  RowMajor staging_;
};

float* Runner::FloatCopy(const Tensor& tensor, Buffer& copy, int64_t& ld,
                         absl::Status& status) {
  if (tensor.dtype == DType::kF32) {
    ld = tensor.effective_row_stride();
    return tensor.data_as<float>();
  }
  const int64_t rows = tensor.dim(0);
  const int64_t cols = tensor.dim(1);
  absl::StatusOr<Buffer> buffer =
      context_.allocator().Allocate(std::max<int64_t>(rows * cols, 1) * 4);
  if (!buffer.ok()) {
    status = buffer.status();
    return nullptr;
  }
  copy = std::move(*buffer);
  float* out = copy.data_as<float>();
  const int64_t src_ld = tensor.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = LoadHost(tensor.data, tensor.dtype, i * src_ld + j);
  }
  ld = cols;
  return out;
}

absl::Status Runner::Prepare() {
  RETURN_IF_ERROR(PlanAndAllocate(&stats_));
  const LinearCrossEntropyInputs& in = *p_.inputs;
  if (p_.tokens > 0) {
    absl::Status status;
    hidden_ = FloatCopy(in.hidden, hidden_copy_, hidden_ld_, status);
    RETURN_IF_ERROR(status);
    weight_ = FloatCopy(in.weight, weight_copy_, weight_ld_, status);
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status Runner::Run(const absl::Status& checks) {
  const absl::Status local = checks.ok() ? Prepare() : checks;
  // The record lives in the block when it exists, else in a small buffer.
  RETURN_IF_ERROR(ExchangeRecordsCpu(context_, comm_, RecordInBlock(), local,
                                     Facts(), ce_, p_.inputs->targets, kOpName,
                                     agreed_));
  const LinearCrossEntropyInputs& in = *p_.inputs;
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;

  // The targets' weights from their owners and the weight total W, and the
  // mean's denominators as the target scan sums them (in token order).
  target_weight_ = At<double>(layout_.target_weight);
  double ce_denominator = 0.0;
  RETURN_IF_ERROR(TargetWeightsCpu(context_, comm_, in.targets, p_.slice(),
                                   class_weights_, ce_.ignore_index,
                                   target_weight_, ce_denominator));
  stats_.weight_total = target_weight_[n];
  stats_.ce_denominator = ce_denominator;
  SetCallArgs(stats_.weight_total, ce_denominator, stats_.z_denominator);

  SetCallArrays();
  RETURN_IF_ERROR(SetBias([v](const Tensor& bias, float* dst) {
    for (int64_t j = 0; j < v; ++j) dst[j] = LoadHost(bias.data, bias.dtype, j);
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(ForEachChunk(agreed_, n, [this](int64_t begin, int64_t end) {
    return Chunk(begin, end);
  }));
  return Finish();
}

absl::Status Runner::Chunk(int64_t row_begin, int64_t row_end) {
  const LinearCrossEntropyInputs& in = *p_.inputs;
  const int64_t rows = row_end - row_begin;
  const int64_t v = p_.local_vocab;
  const int64_t h = p_.hidden;
  const int64_t ld = layout_.ld;

  const ChunkRegions regions = RegionsOf(chunk_.data(), layout_.max_rows, ld);
  float* logits = regions.logits;    // [rows, ld]
  float* partial = regions.partial;  // [rows, H]

  const ConstMatrixMap hidden(hidden_ + row_begin * hidden_ld_, rows, h,
                              Eigen::OuterStride<>(hidden_ld_));  // [rows, H]
  const ConstMatrixMap weight(weight_, v, h,
                              Eigen::OuterStride<>(weight_ld_));  // [V_r, H]
  MatrixMap z(logits, rows, v, Eigen::OuterStride<>(ld));         // [rows, V_r]
  cpu_matmul::MultiplyABt(1.0f, cpu_matmul::ConstViewOf(hidden),
                          cpu_matmul::ConstViewOf(weight),
                          cpu_matmul::ViewOf(z));
  if (bias_ != nullptr)
    z.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias_, v);
  SoftcapCpu(logits, rows, v, ld, ce_.softcap);

  const ChunkArgs args =
      RowArgs(call_, regions, in.targets, p_.grad_loss, row_begin, row_end,
              lse_, row_loss_, target_weight_);

  // The global lse: the row max (kMax), then the row sums (kSum).
  if (args.fused) RETURN_IF_ERROR(GlobalRowStatsCpu(context_, comm_, args));
  // Loss and lse of each row, then (backward) its dlogits in place, rounded
  // to the operand dtype as the single-device op's.
  RowFinishCpu(args);
  if (!p_.backward()) return absl::OkStatus();

  // d_hidden[rows] = sum over the ranks of dlogits @ weight_r.
  const float unscale = 1.0f / call_.dlogits_scale;
  MatrixMap part(partial, rows, h, Eigen::OuterStride<>(h));  // [rows, H]
  cpu_matmul::MultiplyAB(unscale, cpu_matmul::ConstViewOf(z),
                         cpu_matmul::ConstViewOf(weight),
                         cpu_matmul::ViewOf(part));
  const Tensor part_view = View(partial, DType::kF32, rows * h);
  RETURN_IF_ERROR(
      comm_.AllReduce(part_view, part_view, ReduceOp::kSum, context_));
  const Tensor& d_hidden = p_.gradients->d_hidden;
  const int64_t dh_ld = d_hidden.effective_row_stride();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < h; ++k) {
      StoreHost(d_hidden.data, d_hidden.dtype, (row_begin + i) * dh_ld + k,
                partial[i * h + k]);
    }
  }
  // d_weight (+)= dlogits^T @ hidden[rows], d_bias (+)= column sums, locally.
  const bool accumulate = row_begin > 0;
  staging_.resize(v, h);  // [V_r, H]
  cpu_matmul::MultiplyAtB(unscale, cpu_matmul::ConstViewOf(z),
                          cpu_matmul::ConstViewOf(hidden),
                          cpu_matmul::ViewOf(staging_));
  const Tensor& d_weight = p_.gradients->d_weight;
  float* dw =
      d_weight_acc_ != nullptr ? d_weight_acc_ : d_weight.data_as<float>();
  const int64_t dw_ld =
      d_weight_acc_ != nullptr ? h : d_weight.effective_row_stride();
  MatrixMap dw_map(dw, v, h, Eigen::OuterStride<>(dw_ld));
  if (accumulate) {
    dw_map += staging_;
  } else {
    dw_map = staging_;
  }
  if (bias_ != nullptr) {
    const Eigen::RowVectorXf column_sums = unscale * z.colwise().sum();
    float* db = d_bias_acc_ != nullptr ? d_bias_acc_
                                       : p_.gradients->d_bias->data_as<float>();
    Eigen::Map<Eigen::RowVectorXf> db_map(db, v);
    if (accumulate) {
      db_map += column_sums;
    } else {
      db_map = column_sums;
    }
  }
  return absl::OkStatus();
}

absl::Status Runner::Finish() {
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;
  const int64_t h = p_.hidden;
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    *p_.loss->data_as<float>() =
        static_cast<float>(ce::SumRowsCpu(row_loss_, n));
  }
  if (!p_.backward()) return absl::OkStatus();
  const LinearCrossEntropyGradients& g = *p_.gradients;
  const int64_t dw_ld = g.d_weight.effective_row_stride();
  if (n == 0) {
    const int64_t element = DTypeSize(g.d_weight.dtype);
    for (int64_t r = 0; r < v; ++r) {
      std::memset(static_cast<char*>(g.d_weight.data) + r * dw_ld * element, 0,
                  h * element);
    }
    if (g.d_bias.has_value())
      std::memset(g.d_bias->data, 0, v * DTypeSize(g.d_bias->dtype));
    return absl::OkStatus();
  }
  if (d_weight_acc_ != nullptr) {
    for (int64_t r = 0; r < v; ++r) {
      for (int64_t k = 0; k < h; ++k) {
        StoreHost(g.d_weight.data, g.d_weight.dtype, r * dw_ld + k,
                  d_weight_acc_[r * h + k]);
      }
    }
  }
  if (d_bias_acc_ != nullptr) {
    for (int64_t j = 0; j < v; ++j)
      StoreHost(g.d_bias->data, g.d_bias->dtype, j, d_bias_acc_[j]);
  }
  return absl::OkStatus();
}

#ifdef LOSSRT_WITH_CUDA
// The CUDA path: the same exchange and chunk loop with the chunk's logits from
// the context's GEMM runner and the row statistics and dlogits from the
// kernels of vocab_parallel_kernels.h, every collective
// queued on the context's stream. The targets are checked on the device and
// their verdict travels in the record, so that the exchange needs the call's
// one wait for the stream (the records' readback).
class CudaRunner : LinearRunner {
 public:
  CudaRunner(Context& context, const Problem& p)
      : LinearRunner(context, p), e_(DTypeSize(p.inputs->hidden.dtype)) {}

  absl::Status Run(const absl::Status& checks);

 private:
  const char* RowOf(const Tensor& tensor, int64_t row) const {
    return static_cast<const char*>(tensor.data) +
           row * tensor.effective_row_stride() * DTypeSize(tensor.dtype);
  }
  absl::Status Prepare();
  absl::Status Chunk(int64_t row_begin, int64_t row_end);
  absl::Status Finish();
  absl::Status Gemm(const GemmCall& call) { return gemm_->Run(call, stream_); }

  const int64_t e_;  // operand bytes

  std::optional<ScopedDevice> device_;
  cudaStream_t stream_ = nullptr;
  GemmRunner* gemm_ = nullptr;
  std::optional<GemmRunner> tf32_gemm_;
  ChunkRegions regions_;
};

absl::Status CudaRunner::Prepare() {
  RETURN_IF_ERROR(PlanAndAllocate(nullptr));
  if (p_.tokens > 0)
    regions_ = RegionsOf(chunk_.data(), layout_.max_rows, layout_.ld);
  return absl::OkStatus();
}

absl::Status CudaRunner::Run(const absl::Status& checks) {
  ASSIGN_OR_RETURN(stream_, EnterDevice(context_, device_));
  absl::Status local = checks;
  if (local.ok()) local = Prepare();
  Denominators denominators;
  RETURN_IF_ERROR(ExchangeRecordsCuda(
      context_, comm_, stream_, RecordInBlock(), local, Facts(), ce_,
      p_.inputs->targets, class_weights_, kOpName, agreed_, denominators));
  SetCallArgs(denominators.weight_total, denominators.ce, denominators.z);

  const LinearCrossEntropyInputs& in = *p_.inputs;
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;
  if (p_.options->use_tf32 && operand_ == DType::kF32) {
    ASSIGN_OR_RETURN(cublasLtHandle_t lt, CublasLtHandleOf(context_));
    ASSIGN_OR_RETURN(void* lt_workspace, context_.cublaslt_workspace());
    ASSIGN_OR_RETURN(GemmTuning * tuning, ContextGemmTuning(context_));
    tf32_gemm_.emplace(lt, lt_workspace, Context::kCublasLtWorkspaceBytes,
                       CUBLAS_COMPUTE_32F_FAST_TF32, tuning);
    gemm_ = &*tf32_gemm_;
  } else {
    ASSIGN_OR_RETURN(gemm_, ContextGemmRunner(context_));
  }

  // The targets' weights from their owners (kSum over the ranks).
  if (class_weights_ != nullptr && n > 0) {
    target_weight_ = At<double>(layout_.target_weight);
    RETURN_IF_ERROR(TargetWeightsCuda(context_, comm_, stream_, in.targets,
                                      p_.slice(), class_weights_,
                                      target_weight_));
  }
  SetCallArrays();
  RETURN_IF_ERROR(SetBias([this, v](const Tensor& bias, float* dst) {
    lce::ConvertArgs convert;
    convert.src = bias.data;
    convert.src_type = bias.dtype;
    convert.dst = dst;
    convert.rows = 1;
    convert.cols = convert.src_ld = convert.dst_ld = v;
    CUDA_RETURN_IF_ERROR(lce::LaunchConvert(convert, stream_));
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(ForEachChunk(agreed_, n, [this](int64_t begin, int64_t end) {
    return Chunk(begin, end);
  }));
  return Finish();
}

absl::Status CudaRunner::Chunk(int64_t row_begin, int64_t row_end) {
  const LinearCrossEntropyInputs& in = *p_.inputs;
  const int64_t rows = row_end - row_begin;
  const int64_t v = p_.local_vocab;
  const int64_t h = p_.hidden;
  const int64_t ld = layout_.ld;
  const cudaDataType type = CudaType(operand_);
  float* logits = regions_.logits;  // [rows, ld]
  // dlogits rows start where their logits rows do; their stride in operand
  // elements.
  const int64_t dlogits_ld = ld * 4 / e_;

  // logits[rows, V_r] = hidden[rows] @ weight_r^T + bias_r, as the
  // column-major D[V_r, rows] = W^T(op T of [H, V_r]) @ hidden(op N of [H,
  // rows]).
  GemmCall g1;
  g1.a = {in.weight.data, type, h, v, in.weight.effective_row_stride(),
          CUBLAS_OP_T};
  g1.b = {RowOf(in.hidden, row_begin),      type,       h, rows,
          in.hidden.effective_row_stride(), CUBLAS_OP_N};
  g1.d = logits;
  g1.d_type = CUDA_R_32F;
  g1.m = v;
  g1.n = rows;
  g1.ld_d = ld;
  g1.bias = bias_;
  RETURN_IF_ERROR(Gemm(g1));

  const ChunkArgs args =
      RowArgs(call_, regions_, in.targets, p_.grad_loss, row_begin, row_end,
              lse_, row_loss_, target_weight_);

  // The global lse: the row max (kMax), then the row sums (kSum).
  if (args.fused) {
    RETURN_IF_ERROR(GlobalRowStatsCuda(context_, comm_, stream_, args));
  }
  CUDA_RETURN_IF_ERROR(LaunchRowFinish(args, stream_));
  if (!p_.backward()) return absl::OkStatus();

  // d_hidden[rows] = sum over the ranks of dlogits @ weight_r: the column-major
  // D[H, rows] = weight_r(op N of [H, V_r]) @ dlogits(op N of [V_r, rows]),
  // in fp32, all-reduced, then rounded into d_hidden.
  const float unscale = 1.0f / call_.dlogits_scale;
  GemmCall g2;
  g2.a = {in.weight.data, type, h, v, in.weight.effective_row_stride(),
          CUBLAS_OP_N};
  g2.b = {logits, type, v, rows, dlogits_ld, CUBLAS_OP_N};
  g2.d = regions_.partial;
  g2.d_type = CUDA_R_32F;
  g2.m = h;
  g2.n = rows;
  g2.ld_d = h;
  g2.alpha = unscale;
  RETURN_IF_ERROR(Gemm(g2));
  const Tensor partial = View(regions_.partial, DType::kF32, rows * h);
  RETURN_IF_ERROR(comm_.AllReduce(partial, partial, ReduceOp::kSum, context_));
  const Tensor& d_hidden = p_.gradients->d_hidden;
  lce::ConvertArgs store;
  store.src = regions_.partial;
  store.src_ld = h;
  store.dst = const_cast<char*>(RowOf(d_hidden, row_begin));
  store.dst_type = d_hidden.dtype;
  store.dst_ld = d_hidden.effective_row_stride();
  store.rows = rows;
  store.cols = h;
  CUDA_RETURN_IF_ERROR(lce::LaunchConvert(store, stream_));

  // d_weight (+)= dlogits^T @ hidden[rows], locally: the column-major
  // D[H, V_r] = hidden(op N of [H, rows]) @ dlogits(op T of [V_r, rows]).
  const bool accumulate = row_begin > 0;
  const Tensor& d_weight = p_.gradients->d_weight;
  GemmCall g3;
  g3.a = {RowOf(in.hidden, row_begin),      type,       h, rows,
          in.hidden.effective_row_stride(), CUBLAS_OP_N};
  g3.b = {logits, type, v, rows, dlogits_ld, CUBLAS_OP_T};
  if (d_weight_acc_ != nullptr) {
    g3.d = d_weight_acc_;
    g3.d_type = CUDA_R_32F;
    g3.ld_d = h;
  } else {
    g3.d = d_weight.data;
    g3.d_type = CudaType(d_weight.dtype);
    g3.ld_d = d_weight.effective_row_stride();
  }
  g3.m = h;
  g3.n = v;
  g3.alpha = unscale;
  g3.beta = accumulate ? 1.0f : 0.0f;
  RETURN_IF_ERROR(Gemm(g3));
  if (bias_ != nullptr) {
    // d_bias (+)= the dlogits' column sums, by our own kernel rather than a
    // GEMV against ones: cuBLASLt may pick a split-K reduction for an n = 1
    // product whose bytes vary run to run; the kernel sums each column's
    // rows in order. The destination is fp32: the accumulator for a 16-bit
    // d_bias, else d_bias itself (checked to be f32 or the bias' dtype).
    ColumnSumArgs g4;
    g4.dlogits = logits;
    g4.type = operand_;
    g4.ld = dlogits_ld;
    g4.rows = rows;
    g4.cols = v;
    g4.alpha = unscale;
    g4.accumulate = accumulate;
    g4.d_bias = d_bias_acc_ != nullptr ? d_bias_acc_
                                       : p_.gradients->d_bias->data_as<float>();
    CUDA_RETURN_IF_ERROR(LaunchColumnSum(g4, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Finish() {
  const int64_t n = p_.tokens;
  const int64_t v = p_.local_vocab;
  const int64_t h = p_.hidden;
  if (p_.forward() && ce_.reduction != Reduction::kNone) {
    if (n == 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(p_.loss->data, 0, sizeof(float), stream_));
    } else {
      CUDA_RETURN_IF_ERROR(
          ce::LaunchSumRows(row_loss_, n, p_.loss->data_as<float>(), stream_));
    }
  }
  if (!p_.backward()) return absl::OkStatus();
  const LinearCrossEntropyGradients& g = *p_.gradients;
  if (n == 0) {
    const int64_t element = DTypeSize(g.d_weight.dtype);
    CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(
        g.d_weight.data, g.d_weight.effective_row_stride() * element, 0,
        h * element, v, stream_));
    if (g.d_bias.has_value()) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          g.d_bias->data, 0, v * DTypeSize(g.d_bias->dtype), stream_));
    }
    return absl::OkStatus();
  }
  if (d_weight_acc_ != nullptr) {
    // The one rounding of the fp32 d_weight to the caller's dtype.
    lce::ConvertArgs round;
    round.src = d_weight_acc_;
    round.src_ld = h;
    round.dst = g.d_weight.data;
    round.dst_type = g.d_weight.dtype;
    round.dst_ld = g.d_weight.effective_row_stride();
    round.rows = v;
    round.cols = h;
    CUDA_RETURN_IF_ERROR(lce::LaunchConvert(round, stream_));
  }
  if (d_bias_acc_ != nullptr) {
    lce::ConvertArgs round;
    round.src = d_bias_acc_;
    round.dst = g.d_bias->data;
    round.dst_type = g.d_bias->dtype;
    round.rows = 1;
    round.cols = round.src_ld = round.dst_ld = v;
    CUDA_RETURN_IF_ERROR(lce::LaunchConvert(round, stream_));
  }
  return absl::OkStatus();
}
#endif  // LOSSRT_WITH_CUDA

absl::Status Run(Context& context, Problem& p) {
  return RunRank<Runner, CudaRunner>(context, p, kOpName);
}

}  // namespace
}  // namespace vocab_parallel

absl::Status VocabParallelLinearCrossEntropyForward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse) {
  vocab_parallel::Problem problem;
  problem.pass = lce::Pass::kForward;
  problem.shard = &shard;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelLinearCrossEntropyForwardBackward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs,
    const LinearCrossEntropyOptions& options, const Tensor& loss,
    const Tensor* lse, const LinearCrossEntropyGradients& gradients,
    const Tensor* grad_loss) {
  vocab_parallel::Problem problem;
  problem.pass = lce::Pass::kForwardBackward;
  problem.shard = &shard;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.loss = &loss;
  problem.lse = lse;
  problem.grad_loss = grad_loss;
  problem.gradients = &gradients;
  return vocab_parallel::Run(context, problem);
}

absl::Status VocabParallelLinearCrossEntropyBackward(
    Context& context, const VocabShard& shard,
    const LinearCrossEntropyInputs& inputs, const Tensor& lse,
    const Tensor& grad_loss, const LinearCrossEntropyOptions& options,
    const LinearCrossEntropyGradients& gradients) {
  vocab_parallel::Problem problem;
  problem.pass = lce::Pass::kBackward;
  problem.shard = &shard;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.lse = &lse;
  problem.grad_loss = &grad_loss;
  problem.gradients = &gradients;
  return vocab_parallel::Run(context, problem);
}

}  // namespace lossrt
