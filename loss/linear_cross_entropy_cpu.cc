// The CPU backend of the linear cross-entropy (Eigen, fp32), with the same plan
// and blocks as the GPU: fp32 logits of a block, the cross-entropy CPU twins on
// it (dlogits in place in the operand dtype, so they are rounded exactly as on
// the GPU), then the gradient GEMMs in fp32. Also the CPU twins of the linear
// cross-entropy's own kernels.
//
// Outside the workspace budget, the CPU keeps fp32 copies of 16-bit hidden and
// weight (Eigen does not multiply bf16 at speed) and fp32 staging for 16-bit
// gradient outputs.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "loss/cpu_matmul.h"
#include "loss/cross_entropy_cpu.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/kernel_args.h"
#include "loss/linear_cross_entropy_internal.h"
#include "loss/linear_cross_entropy_kernels.h"
#include "loss/loss_checks.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace lossrt {
namespace lce {
namespace {

float LoadHost(const void* base, DType type, int64_t i) {
  switch (type) {
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

void StoreHost(void* base, DType type, int64_t i, float value) {
  switch (type) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(value);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16Bits(value);
      break;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

}  // namespace

void SliceBackwardCpu(const SliceArgs& args) {
  for (int64_t i = 0; i < args.rows; ++i) {
    const SliceRow row = MakeSliceRow(args, i);
    float* logits = args.logits + i * args.ld;
    // In place and in increasing order: a 16-bit value j lands on bytes of
    // logit j / 2, which has been read already.
    for (int64_t j = 0; j < args.cols; ++j) {
      StoreHost(logits, args.grad_type, j,
                SliceGradient(args, row, logits[j], args.col_begin + j));
    }
  }
}

namespace {

// Row i of SliceStatsArgs merged into its statistics; returns the slice's max.
float SliceStatsRowCpu(const SliceStatsArgs& args, int64_t i) {
  const float* x = args.logits + i * args.ld;  // [cols]
  const int64_t skip =
      SliceTargetColumn(args.targets, args.targets_i64, i, args.ignore_index,
                        args.col_begin, args.cols);
  float max = -INFINITY;
  for (int64_t j = 0; j < args.cols; ++j)
    max = std::max(max, SoftcapLogit(x[j], args.softcap));
  double rest = 0.0, smooth = 0.0;
  for (int64_t j = 0; j < args.cols; ++j) {
    const float z = SoftcapLogit(x[j], args.softcap);
    if (j != skip && max != -INFINITY) rest += std::exp(z - max);
    if (args.smoothing) {
      const float w = args.class_weights != nullptr
                          ? args.class_weights[args.col_begin + j]
                          : 1.0f;
      smooth += static_cast<double>(w) * z;
    }
  }
  const double target_z = skip >= 0 ? SoftcapLogit(x[skip], args.softcap) : 0.0;
  MergeSliceStats(args.merge, max, rest, skip >= 0, target_z, smooth,
                  args.row_max + i, args.row_stats + i * kStats);
  return max;
}

}  // namespace

void SliceStatsCpu(const SliceStatsArgs& args) {
  for (int64_t i = 0; i < args.rows; ++i) SliceStatsRowCpu(args, i);
}

void CompactStatsCpu(const CompactStatsArgs& args) {
  const SliceStatsArgs& stats = args.stats;
  for (int64_t i = 0; i < stats.rows; ++i) {
    const float max = SliceStatsRowCpu(stats, i);  // softcap 0: raw logits
    args.slice_max[i * args.slice_max_ld] = max;
    const float* x = stats.logits + i * stats.ld;  // [cols]
    uint16_t* probs = args.probs + i * args.probs_ld;
    for (int64_t j = 0; j < stats.cols; ++j) {
      probs[j] = FloatToF16Bits(max == -INFINITY ? 0.0f : std::exp(x[j] - max));
    }
  }
}

void CompactBackwardCpu(const CompactArgs& args) {
  const SliceArgs& slice = args.slice;
  for (int64_t i = 0; i < slice.rows; ++i) {
    const SliceRow row = MakeSliceRow(slice, i);
    uint16_t* probs = args.probs + i * args.probs_ld;  // [vocab]
    const float* maxima = args.slice_max + i * args.slice_max_ld;
    // In place: value j becomes gradient j.
    for (int64_t j = 0; j < slice.vocab; ++j) {
      const float e = F16BitsToFloat(probs[j]);
      const float m = maxima[j / args.slice_cols];
      StoreHost(probs, slice.grad_type, j,
                CompactGradient(slice, row, e, m, j));
    }
  }
}

void SliceFinishCpu(const SliceFinishArgs& args) {
  for (int64_t i = 0; i < args.rows; ++i) FinishSliceRow(args, i);
}

void ConvertCpu(const ConvertArgs& args) {
  for (int64_t i = 0; i < args.rows; ++i) {
    for (int64_t j = 0; j < args.cols; ++j) {
      const float value = args.src == nullptr
                              ? args.scale
                              : args.scale * LoadHost(args.src, args.src_type,
                                                      i * args.src_ld + j);
      StoreHost(args.dst, args.dst_type, i * args.dst_ld + j, value);
    }
  }
}

namespace {

using RowMajor =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;
using ConstMatrixMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

// An fp32 matrix with strided rows: the caller's f32 tensor, or a converted
// copy.
struct FloatMatrix {
  const float* data = nullptr;
  int64_t ld = 0;
  ConstMatrixMap Rows(int64_t begin, int64_t count, int64_t cols) const {
    return ConstMatrixMap(data + begin * ld, count, cols,
                          Eigen::OuterStride<>(ld));
  }
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Problem& problem, const Plan& plan, Context& context)
      : problem_(problem),
        plan_(plan),
        context_(context),
        ce_(problem.options->cross_entropy),
        operand_(problem.operand_type()) {}

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
  absl::StatusOr<FloatMatrix> AsFloat(const Tensor& tensor, Buffer& copy);
  const void* Targets(int64_t row) const {
    return static_cast<const char*>(problem_.inputs->targets.data) +
           row * DTypeSize(problem_.inputs->targets.dtype);
  }
  const float* GradLoss(int64_t row) const {
    return grad_loss_ == nullptr ? nullptr
                                 : grad_loss_ + (grad_loss_per_row_ ? row : 0);
  }
  void CrossEntropy(const Block& block);
  absl::Status Gradients(
      const Block& block,
      const Eigen::Ref<const RowMajor, 0, Eigen::OuterStride<>>& logits);
  // Writes `value` (rows x cols, fp32) to a tensor of any float dtype, or adds
  // it.
  void WriteRows(const Eigen::Ref<const RowMajor>& value, void* out, DType type,
                 int64_t ld, bool accumulate);

  const Problem& problem_;
  const Plan& plan_;
  Context& context_;
  const CrossEntropyOptions& ce_;
  const DType operand_;

  Buffer block_;
  Buffer hidden_copy_;
  Buffer weight_copy_;
  FloatMatrix hidden_;  // [N, H]
  FloatMatrix weight_;  // [V, H]
  float* logits_ = nullptr;
  // operand_dtype_logits: the chunk's logits as fp32 values rounded to the
  // operand dtype (the GPU keeps them in 16 bits, in the plan's half-size
  // buffer; here, outside the budget like the operands' fp32 copies).
  std::vector<float> rounded_logits_;
  ce::TargetStats* stats_ = nullptr;
  float* row_loss_ = nullptr;
  float* row_hit_ = nullptr;  // [N] the accuracy's terms, or null
  float* lse_ = nullptr;
  // [N] the targets' log-probabilities of the two-pass schedule's first pass,
  // read by its slices; null otherwise.
  float* target_logprob_ = nullptr;
  const float* bias_ = nullptr;
  float* d_weight_acc_ = nullptr;
  float* d_bias_acc_ = nullptr;
  float* d_hidden_acc_ = nullptr;  // [chunk_rows, H] (vocabulary slices)
  float* row_max_ = nullptr;       // [N] (vocabulary slices)
  double* row_stats_ = nullptr;    // [N, kStats] (vocabulary slices)
  uint16_t* compact_ = nullptr;    // [chunk_rows, chunk_ld] (compact chunks)
  float* slice_max_ = nullptr;     // [chunk_rows, num_slices] (compact chunks)
  // The compact chunks' dlogits widened to fp32, outside the budget like the
  // fp32 copies of 16-bit operands.
  RowMajor compact_dlogits_;
  const float* grad_loss_ = nullptr;
  bool grad_loss_per_row_ = false;
  float scale_ = 1.0f;
  RowMajor staging_;  // fp32 results bound for 16-bit outputs
};

absl::StatusOr<FloatMatrix> CpuBackend::AsFloat(const Tensor& tensor,
                                                Buffer& copy) {
  FloatMatrix matrix;
  if (tensor.dtype == DType::kF32) {
    matrix.data = tensor.data_as<float>();
    matrix.ld = tensor.effective_row_stride();
    return matrix;
  }
  const int64_t rows = tensor.dim(0);
  const int64_t cols = tensor.dim(1);
  ASSIGN_OR_RETURN(copy, context_.allocator().Allocate(rows * cols * 4));
  ConvertArgs convert;
  convert.src = tensor.data;
  convert.src_type = tensor.dtype;
  convert.src_ld = tensor.effective_row_stride();
  convert.dst = copy.data();
  convert.dst_ld = cols;
  convert.rows = rows;
  convert.cols = cols;
  ConvertCpu(convert);
  matrix.data = copy.data_as<float>();
  matrix.ld = cols;
  return matrix;
}

absl::Status CpuBackend::Begin() {
  const LinearCrossEntropyInputs& in = *problem_.inputs;
  ASSIGN_OR_RETURN(block_, context_.allocator().Allocate(plan_.block_bytes));
  logits_ = At<float>(plan_.logits_offset);
  if (plan_.logit_bytes != 4) {
    rounded_logits_.assign(plan_.chunk_rows * plan_.chunk_ld, 0.0f);
    logits_ = rounded_logits_.data();
  }
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
  const float* class_weights = ce_.class_weights.has_value()
                                   ? ce_.class_weights->data_as<float>()
                                   : nullptr;
  *stats_ =
      ce::ScanTargetsCpu(in.targets.data, in.targets.dtype == DType::kI64, n,
                         problem_.vocab, ce_.ignore_index, class_weights);
  RETURN_IF_ERROR(ce::CheckTargetStats(*stats_, ce_, n, problem_.vocab));
  if (problem_.backward()) {
    scale_ = DlogitsScale(operand_, static_cast<int>(ce_.reduction),
                          stats_->ce_denominator);
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
    ConvertCpu(scaled);
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
      ConvertCpu(bias);
      bias_ = At<float>(plan_.bias_offset);
    } else {
      bias_ = in.bias->data_as<float>();
    }
  }
  if (n > 0) {
    ASSIGN_OR_RETURN(hidden_, AsFloat(in.hidden, hidden_copy_));
    ASSIGN_OR_RETURN(weight_, AsFloat(in.weight, weight_copy_));
  }
  return absl::OkStatus();
}

void CpuBackend::CrossEntropy(const Block& block) {
  const Tensor& targets = problem_.inputs->targets;
  const int64_t row = block.row_begin;
  if (block.mode == CeMode::kSliceBackward) {
    const SliceArgs args =
        MakeSliceArgs(problem_, block, row, block.row_end, logits_, stats_,
                      grad_loss_, grad_loss_per_row_, lse_, target_logprob_);
    SliceBackwardCpu(args);
    return;
  }
  ce::RowArgs args = ce::MakeRowArgs(
      logits_, DType::kF32, block.ld, block.row_end - row, problem_.vocab,
      Targets(row), targets.dtype == DType::kI64, ce_);
  args.stats = stats_;
  args.lse = lse_ != nullptr ? lse_ + row : nullptr;
  if (block.mode != CeMode::kBackward) {
    SetChunkExtras(problem_, row, row_hit_, args);
    if (target_logprob_ != nullptr) args.target_logprob = target_logprob_ + row;
    args.row_loss = ce_.reduction == Reduction::kNone
                        ? problem_.loss->data_as<float>() + row
                        : row_loss_ + row;
  }
  if (block.mode != CeMode::kForward) {
    args.grad_loss = GradLoss(row);
    args.grad_loss_per_row = grad_loss_per_row_;
    args.grad = logits_;  // in place
    args.grad_type = operand_;
    args.grad_stride = block.ld * 4 / DTypeSize(operand_);
  }
  if (block.mode == CeMode::kBackward) {
    ce::BackwardCpu(args);
  } else {
    ce::RowsCpu(args);
  }
}

void CpuBackend::WriteRows(const Eigen::Ref<const RowMajor>& value, void* out,
                           DType type, int64_t ld, bool accumulate) {
  if (type == DType::kF32) {
    MatrixMap target(static_cast<float*>(out), value.rows(), value.cols(),
                     Eigen::OuterStride<>(ld));
    if (accumulate) {
      target += value;
    } else {
      target = value;
    }
    return;
  }
  // 16-bit outputs accumulate in their own dtype only with
  // fp32_gradient_accumulation off (else through fp32 accumulators): the fp32
  // sum of the old value and the chunk's, rounded once, as the GPU's GEMMs
  // with beta = 1 compute it.
  for (int64_t i = 0; i < value.rows(); ++i) {
    for (int64_t j = 0; j < value.cols(); ++j) {
      const int64_t k = i * ld + j;
      StoreHost(
          out, type, k,
          accumulate ? LoadHost(out, type, k) + value(i, j) : value(i, j));
    }
  }
}

absl::Status CpuBackend::RunBlock(const Block& block) {
  const int64_t rows = block.row_end - block.row_begin;
  const int64_t cols = block.col_end - block.col_begin;
  const int64_t h = problem_.hidden;
  const ConstMatrixMap hidden =
      hidden_.Rows(block.row_begin, rows, h);  // [rows, H]
  if (block.mode == CeMode::kSliceFinish) {
    SliceFinishCpu(MakeSliceFinishArgs(problem_, block, stats_, row_max_,
                                       row_stats_, lse_, row_loss_,
                                       target_logprob_));
    return absl::OkStatus();
  }
  const ConstMatrixMap weight =
      weight_.Rows(block.col_begin, cols, h);  // [cols, H]
  if (block.mode == CeMode::kCompactBackward) {
    CompactBackwardCpu(
        MakeCompactArgs(problem_, plan_, block, compact_, slice_max_, stats_,
                        grad_loss_, grad_loss_per_row_, lse_, target_logprob_));
    compact_dlogits_.resize(rows, cols);
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* bits = compact_ + i * block.ld;
      for (int64_t j = 0; j < cols; ++j) {
        compact_dlogits_(i, j) = operand_ == DType::kBF16
                                     ? Bf16BitsToFloat(bits[j])
                                     : F16BitsToFloat(bits[j]);
      }
    }
    return Gradients(block, compact_dlogits_);
  }
  MatrixMap logits(logits_, rows, cols,
                   Eigen::OuterStride<>(block.ld));  // [rows, cols]
  if (!block.logits_ready) {
    cpu_matmul::MultiplyABt(1.0f, cpu_matmul::ConstViewOf(hidden),
                            cpu_matmul::ConstViewOf(weight),
                            cpu_matmul::ViewOf(logits));
    if (bias_ != nullptr) {
      logits.rowwise() +=
          Eigen::Map<const Eigen::RowVectorXf>(bias_ + block.col_begin, cols);
    }
    if (plan_.logit_bytes != 4) {
      // As the GPU's GEMM rounds its fp32 sums into a 16-bit output.
      logits = logits.unaryExpr(
          [this](float z) { return RoundToDType(operand_, z); });
    }
  }
  if (block.mode == CeMode::kSliceStats) {
    SliceStatsCpu(
        MakeSliceStatsArgs(problem_, block, logits_, row_max_, row_stats_));
    return absl::OkStatus();
  }
  if (block.mode == CeMode::kCompactStats) {
    CompactStatsCpu(MakeCompactStatsArgs(problem_, plan_, block, logits_,
                                         row_max_, row_stats_, compact_,
                                         slice_max_));
    return absl::OkStatus();
  }
  CrossEntropy(block);
  if (block.mode == CeMode::kForward) return absl::OkStatus();

  if (operand_ != DType::kF32) {
    // Widen the 16-bit dlogits to fp32 in place, from the end of each row
    // backwards (value j sits at bytes [2j, 2j + 2), below its destination [4j,
    // 4j + 4)).
    for (int64_t i = 0; i < rows; ++i) {
      float* row = logits_ + i * block.ld;
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(row);
      for (int64_t j = cols - 1; j >= 0; --j) {
        row[j] = operand_ == DType::kBF16 ? Bf16BitsToFloat(bits[j])
                                          : F16BitsToFloat(bits[j]);
      }
    }
  }
  return Gradients(block, logits);
}

// G2 and G3 (and d_bias) of a block from its fp32 dlogits [rows, cols].
absl::Status CpuBackend::Gradients(
    const Block& block,
    const Eigen::Ref<const RowMajor, 0, Eigen::OuterStride<>>& logits) {
  const int64_t rows = block.row_end - block.row_begin;
  const int64_t cols = block.col_end - block.col_begin;
  const int64_t h = problem_.hidden;
  const ConstMatrixMap hidden =
      hidden_.Rows(block.row_begin, rows, h);  // [rows, H]
  const ConstMatrixMap weight =
      weight_.Rows(block.col_begin, cols, h);  // [cols, H]
  const float unscale = 1.0f / scale_;
  const LinearCrossEntropyGradients& g = *problem_.gradients;
  if (block.d_hidden) {
    const Tensor& d_hidden = g.d_hidden;
    staging_.resize(rows, h);  // [rows, H]
    cpu_matmul::MultiplyAB(unscale, cpu_matmul::ConstViewOf(logits),
                           cpu_matmul::ConstViewOf(weight),
                           cpu_matmul::ViewOf(staging_));
    char* d_hidden_rows = static_cast<char*>(d_hidden.data) +
                          block.row_begin * d_hidden.effective_row_stride() *
                              DTypeSize(d_hidden.dtype);
    if (d_hidden_acc_ != nullptr) {
      // Vocabulary slices of a 16-bit d_hidden: fp32 sums, rounded once.
      WriteRows(staging_, d_hidden_acc_, DType::kF32, h,
                block.d_hidden_accumulate);
      if (block.d_hidden_done) {
        ConvertArgs round;
        round.src = d_hidden_acc_;
        round.src_ld = h;
        round.dst = d_hidden_rows;
        round.dst_type = d_hidden.dtype;
        round.dst_ld = d_hidden.effective_row_stride();
        round.rows = rows;
        round.cols = h;
        ConvertCpu(round);
      }
    } else {
      WriteRows(staging_, d_hidden_rows, d_hidden.dtype,
                d_hidden.effective_row_stride(), block.d_hidden_accumulate);
    }
  }
  if (block.d_weight) {
    staging_.resize(cols, h);  // [cols, H]
    cpu_matmul::MultiplyAtB(unscale, cpu_matmul::ConstViewOf(logits),
                            cpu_matmul::ConstViewOf(hidden),
                            cpu_matmul::ViewOf(staging_));
    if (d_weight_acc_ != nullptr) {
      WriteRows(staging_, d_weight_acc_ + block.col_begin * h, DType::kF32, h,
                block.accumulate);
    } else {
      const Tensor& d_weight = g.d_weight;
      WriteRows(staging_,
                static_cast<char*>(d_weight.data) +
                    block.col_begin * d_weight.effective_row_stride() *
                        DTypeSize(d_weight.dtype),
                d_weight.dtype, d_weight.effective_row_stride(),
                block.accumulate);
    }
    if (bias_ != nullptr) {
      const Tensor& d_bias = *g.d_bias;
      const RowMajor sums = unscale * logits.colwise().sum();  // [1, cols]
      if (d_bias_acc_ != nullptr) {
        WriteRows(sums, d_bias_acc_ + block.col_begin, DType::kF32, cols,
                  block.accumulate);
      } else {
        WriteRows(sums,
                  static_cast<char*>(d_bias.data) +
                      block.col_begin * DTypeSize(d_bias.dtype),
                  d_bias.dtype, cols, block.accumulate);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::End() {
  const int64_t n = problem_.tokens;
  const int64_t v = problem_.vocab;
  const int64_t h = problem_.hidden;
  const LinearCrossEntropyGradients* g = problem_.gradients;
  if (problem_.pass != Pass::kBackward && ce_.reduction != Reduction::kNone) {
    *problem_.loss->data_as<float>() =
        static_cast<float>(ce::SumRowsCpu(row_loss_, n));
  }
  if (row_hit_ != nullptr) {
    problem_.extras->accuracy->data_as<float>()[0] =
        static_cast<float>(ce::SumRowsCpu(row_hit_, n));
  }
  if (n == 0 && g != nullptr) {
    // No tokens: a zero gradient, which accumulate adds by leaving the
    // outputs as they are.
    if (g->accumulate) return absl::OkStatus();
    const int64_t element = DTypeSize(g->d_weight.dtype);
    for (int64_t r = 0; r < v; ++r) {
      std::memset(static_cast<char*>(g->d_weight.data) +
                      r * g->d_weight.effective_row_stride() * element,
                  0, h * element);
    }
    if (g->d_bias.has_value())
      std::memset(g->d_bias->data, 0, v * DTypeSize(g->d_bias->dtype));
    return absl::OkStatus();
  }
  if (d_weight_acc_ != nullptr) {
    ConvertArgs round;
    round.src = d_weight_acc_;
    round.src_ld = h;
    round.dst = g->d_weight.data;
    round.dst_type = g->d_weight.dtype;
    round.dst_ld = g->d_weight.effective_row_stride();
    round.rows = v;
    round.cols = h;
    ConvertCpu(round);
  }
  if (d_bias_acc_ != nullptr) {
    ConvertArgs round;
    round.src = d_bias_acc_;
    round.dst = g->d_bias->data;
    round.dst_type = g->d_bias->dtype;
    round.rows = 1;
    round.cols = round.src_ld = round.dst_ld = v;
    ConvertCpu(round);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const Problem& problem,
                                                        const Plan& plan,
                                                        Context& context) {
  return std::unique_ptr<Backend>(new CpuBackend(problem, plan, context));
}

}  // namespace lce
}  // namespace lossrt
