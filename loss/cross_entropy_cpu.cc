// The CPU backend of the cross-entropy kernels: Eigen-vectorized fp32 row
// passes (max, sum of exp, gradient) with the per-row scalars in double. See
// loss/cross_entropy.h for the math and loss/cross_entropy_cpu.h for the
// contracts.
//
// A row is processed in three passes over an fp32 view of it: the max, then the
// sum of exp(z - max) (and, for label smoothing, sum_j w_j (max - z_j)), then
// the gradient (the extras add the argmax and, for the entropy, a pass for
// sum_j e_j (z_j - max) over the cached row). The view is the logits row itself
// (f32 without softcap) or a per-thread scratch vector that holds the converted
// and soft-capped row, so the logits are read from memory once per row and the
// later passes hit the cache. Rows are independent and every sum has a fixed
// order, so results do not depend on the number of threads.
#include "loss/cross_entropy_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "runtime/dtype.h"

namespace lossrt {
namespace ce {
namespace {

using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;

// Elements per partial sum. Within a block Eigen sums in fp32 (a few packets'
// lanes); blocks are added in double, so the rounding error of a 50K-entry
// row's sums stays near that of a 1K-entry one (as with the GPU's tree
// reductions) instead of growing with vocab.
constexpr int64_t kBlock = 1024;

// Elements (rows * vocab) each thread gets at least; smaller calls use fewer.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 18;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int64_t LoadTarget(const void* targets, bool targets_i64, int64_t row) {
  return targets_i64 ? static_cast<const int64_t*>(targets)[row]
                     : static_cast<const int32_t*>(targets)[row];
}

// sum_j w_j in double, in order (vocab without weights).
double WeightTotal(const float* class_weights, int64_t vocab) {
  if (class_weights == nullptr) return static_cast<double>(vocab);
  double total = 0.0;
  for (int64_t j = 0; j < vocab; ++j) total += class_weights[j];
  return total;
}

// The fp32 view of logits row `row`: z = softcap * tanh(x / softcap) or x,
// [vocab]. Points into the logits (f32 without softcap) or at `scratch`
// [vocab].
const float* LoadRow(const RowArgs& args, int64_t row, float* scratch) {
  const int64_t vocab = args.vocab;
  const int64_t offset = row * args.logits_stride;
  const float* z = scratch;
  switch (args.logits_type) {
    case DType::kF32: {
      const float* x = static_cast<const float*>(args.logits) + offset;
      if (args.softcap <= 0.0f) return x;
      std::copy(x, x + vocab, scratch);
      break;
    }
    case DType::kBF16: {
      const uint16_t* x = static_cast<const uint16_t*>(args.logits) + offset;
      for (int64_t j = 0; j < vocab; ++j) scratch[j] = Bf16BitsToFloat(x[j]);
      break;
    }
    case DType::kF16: {
      const uint16_t* x = static_cast<const uint16_t*>(args.logits) + offset;
      for (int64_t j = 0; j < vocab; ++j) scratch[j] = F16BitsToFloat(x[j]);
      break;
    }
    default:  // the op admits only the three float types
      break;
  }
  if (args.softcap > 0.0f) {
    ArrayMap view(scratch, vocab);
    const float inv_cap = 1.0f / args.softcap;
    view = args.softcap * (view * inv_cap).tanh();
  }
  return z;
}

// Stores `values` [count] as grad_type at `out` (round to nearest even for
// bf16/f16).
void StoreGrad(const float* values, int64_t count, DType grad_type, void* out) {
  switch (grad_type) {
    case DType::kF32:
      std::copy(values, values + count, static_cast<float*>(out));
      break;
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(out);
      for (int64_t j = 0; j < count; ++j) dst[j] = FloatToBf16Bits(values[j]);
      break;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(out);
      for (int64_t j = 0; j < count; ++j) dst[j] = FloatToF16Bits(values[j]);
      break;
    }
    default:  // the op admits only the three float types
      break;
  }
}

void* GradRow(const RowArgs& args, int64_t row) {
  const int64_t element = args.grad_type == DType::kF32 ? 4 : 2;
  return static_cast<char*>(args.grad) + row * args.grad_stride * element;
}

// sum of exp(z_j - max) over z[0, count), in fp32.
double SumExp(const float* z, int64_t count, float max) {
  if (count <= 0) return 0.0;
  return (ConstArrayMap(z, count) - max).exp().sum();
}

// The entropy's sum_j e_j (z_j - max), e_j = exp(z_j - max), over the row
// z[0, vocab): fp32 within blocks, blocks added in double. Terms of -inf
// logits add 0, not e_j * -inf: the test is on d_j, since Eigen's vectorized
// exp clamps its argument and returns a tiny positive e_j for -inf.
double CenteredSum(const float* z, int64_t vocab, float max) {
  double sum = 0.0;
  for (int64_t b = 0; b < vocab; b += kBlock) {
    const int64_t count = std::min(kBlock, vocab - b);
    const Eigen::ArrayXf d = ConstArrayMap(z + b, count) - max;  // [count]
    const Eigen::ArrayXf e = d.exp();
    sum +=
        (d > -std::numeric_limits<float>::infinity()).select(e * d, 0.0f).sum();
  }
  return sum;
}

// H = log S - sum_j e_j (z_j - max) / S of a row, from its max and S =
// sum_j exp(z_j - max) (both terms >= 0: no cancellation).
double RowEntropy(const float* z, int64_t vocab, float max, double sum_exp) {
  if (max == std::numeric_limits<float>::infinity()) return kNaN;
  return std::log(sum_exp) - CenteredSum(z, vocab, max) / sum_exp;
}

// The index of the row's first max (0 when none equals it: a NaN max).
int64_t ArgMax(const float* z, int64_t vocab, float max) {
  const int64_t index = std::find(z, z + vocab, max) - z;
  return index < vocab ? index : 0;
}

void StorePredicted(const RowArgs& args, int64_t row, int64_t index) {
  if (args.predicted_i64) {
    static_cast<int64_t*>(args.predicted)[row] = index;
  } else {
    static_cast<int32_t*>(args.predicted)[row] = static_cast<int32_t>(index);
  }
}

// The per-token extras of a row that counts nothing: 0 when ignored, NaN for
// a target out of range (as its loss).
void WriteUncountedExtras(const RowArgs& args, int64_t row, bool ignored) {
  const float fill = ignored ? 0.0f : kNaN;
  if (args.entropy != nullptr) args.entropy[row] = fill;
  if (args.target_logprob != nullptr) args.target_logprob[row] = fill;
  if (args.row_hit != nullptr) args.row_hit[row] = 0.0f;
}

// Fills gradient row `row` with `value` (0 for ignored tokens, NaN for bad
// targets).
void FillGradRow(const RowArgs& args, int64_t row, float value) {
  float block[kBlock];
  std::fill(block, block + kBlock, value);
  char* out = static_cast<char*>(GradRow(args, row));
  const int64_t element = args.grad_type == DType::kF32 ? 4 : 2;
  for (int64_t begin = 0; begin < args.vocab; begin += kBlock) {
    const int64_t count = std::min(kBlock, args.vocab - begin);
    StoreGrad(block, count, args.grad_type, out + begin * element);
  }
}

// Call-wide constants: what every row shares.
struct CallConstants {
  // W = sum_j w_j.
  double weight_total = 0.0;
  // 1 / ce_denominator for kMean (0 when that is 0), else 1.
  double ce_scale = 1.0;
  // The same for the z-loss part and z_denominator.
  double z_scale = 1.0;
  // 1 / ce_denominator whatever the reduction (0 when that is 0): the
  // accuracy's scale.
  double hit_scale = 0.0;
};

CallConstants MakeCallConstants(const RowArgs& args) {
  CallConstants constants;
  constants.weight_total = WeightTotal(args.class_weights, args.vocab);
  if (args.reduction == kMean || args.row_hit != nullptr) {
    TargetStats local;
    const TargetStats* stats = args.stats;
    if (stats == nullptr) {
      local = ScanTargetsCpu(args.targets, args.targets_i64, args.rows,
                             args.vocab, args.ignore_index, args.class_weights);
      stats = &local;
    }
    // A zero denominator (no counted token, or only zero-weight ones)
    // contributes 0.
    constants.hit_scale =
        stats->ce_denominator > 0 ? 1.0 / stats->ce_denominator : 0.0;
    if (args.reduction == kMean) {
      constants.ce_scale = constants.hit_scale;
      constants.z_scale =
          stats->z_denominator > 0 ? 1.0 / stats->z_denominator : 0.0;
    }
  }
  return constants;
}

// The gradient of a row, written in blocks so that in place works: block k of
// z is read before block k of the gradient is written, and a 16-bit gradient
// written over f32 logits (as the linear cross-entropy does) only covers the
// first half of what has been read.
//   p_j  = exp((z_j - shift) - log_sum)
//   dz_j = coef * p_j - smooth_w * w_j                        for j != t
//   dz_t = coef * expm1((z_t - shift) - log_sum) + target_offset
//   dz_j += ent_coef * p_j * (((z_j - shift) - log_sum) + H)  with entropy
//   dx_j = dz_j * (1 - (z_j / softcap)^2)                     with softcap
// where target_offset = coef - (target_coef + smooth_w * w_t) is passed in
// already simplified, so that p_t - 1 never cancels when p_t is near 1, and
// ((z_j - shift) - log_sum) + H = z_j - (lse - H) is the entropy term's
// z_j - E[z].
struct GradCoefficients {
  double shift;     // max (fused) or the saved lse (backward)
  double log_sum;   // log of the sum of exp(z - max) (fused) or 0 (backward)
  double coef;      // C
  double smooth_w;  // g * s / V / denominator
  double target_offset;
  double ent_coef = 0.0;  // g * entropy_weight / z denominator (0: off)
  double entropy = 0.0;   // H of the row
};

void WriteGradRow(const RowArgs& args, int64_t row, const float* z,
                  int64_t target, const GradCoefficients& c) {
  const int64_t vocab = args.vocab;
  const float* weights = args.class_weights;
  const bool smoothing = c.smooth_w != 0.0;
  const float inv_cap = args.softcap > 0.0f ? 1.0f / args.softcap : 0.0f;
  const float shift = static_cast<float>(c.shift),
              log_sum = static_cast<float>(c.log_sum);
  const float coef = static_cast<float>(c.coef),
              smooth_w = static_cast<float>(c.smooth_w);
  // The target's gradient, from z_t read before any of the row is overwritten.
  // Computed in double through expm1: p_t - 1 keeps its digits when p_t is
  // near 1.
  const double z_t = z[target];
  const double d_t = (z_t - c.shift) - c.log_sum;
  double dz_t = c.coef * std::expm1(d_t) + c.target_offset;
  // (0, not 0 * -inf, where p is 0)
  if (c.ent_coef != 0.0 && std::exp(d_t) > 0)
    dz_t += c.ent_coef * std::exp(d_t) * (d_t + c.entropy);
  if (args.softcap > 0.0f) {
    const double t = z_t * inv_cap;
    dz_t *= 1.0 - t * t;
  }
  const float target_grad = static_cast<float>(dz_t);

  char* out = static_cast<char*>(GradRow(args, row));
  const int64_t element = args.grad_type == DType::kF32 ? 4 : 2;
  alignas(64) float block[kBlock];
  for (int64_t begin = 0; begin < vocab; begin += kBlock) {
    const int64_t count = std::min(kBlock, vocab - begin);
    ConstArrayMap zb(z + begin, count);  // [count]
    ArrayMap gb(block, count);           // [count]
    if (c.ent_coef != 0.0) {
      const Eigen::ArrayXf d = (zb - shift) - log_sum;  // [count] z_j - lse
      const Eigen::ArrayXf e = d.exp();
      // 0, not 0 * -inf, where p is 0.
      gb = (e > 0.0f).select(
          e * (coef + static_cast<float>(c.ent_coef) *
                          (d + static_cast<float>(c.entropy))),
          0.0f);
    } else {
      gb = coef * ((zb - shift) - log_sum).exp();
    }
    if (smoothing) {
      if (weights != nullptr) {
        gb -= smooth_w * ConstArrayMap(weights + begin, count);
      } else {
        gb -= smooth_w;
      }
    }
    if (args.softcap > 0.0f) gb *= 1.0f - (zb * inv_cap).square();
    if (target >= begin && target < begin + count)
      block[target - begin] = target_grad;
    StoreGrad(block, count, args.grad_type, out + begin * element);
  }
}

// Runs fn(begin, end, scratch) over row ranges, on several threads for large
// calls. scratch is a per-thread fp32 buffer of vocab elements.
template <typename Fn>
void ForEachRowRange(const RowArgs& args, Fn fn) {
  const int64_t rows = args.rows;
  const int64_t elements = rows * args.vocab;
  int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  threads =
      std::min(threads, std::max<int64_t>(1, elements / kMinElementsPerThread));
  threads = std::min(threads, rows);
  if (threads <= 1) {
    std::vector<float> scratch(args.vocab);
    fn(0, rows, scratch.data());
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int64_t i = 0; i < threads; ++i) {
    const int64_t begin = rows * i / threads, end = rows * (i + 1) / threads;
    pool.emplace_back([&args, &fn, begin, end] {
      std::vector<float> scratch(args.vocab);
      fn(begin, end, scratch.data());
    });
  }
  for (std::thread& thread : pool) thread.join();
}

void ProcessRows(const RowArgs& args, const CallConstants& k, int64_t begin,
                 int64_t end, float* scratch) {
  const int64_t vocab = args.vocab;
  const double s = args.label_smoothing;
  const bool smoothing = args.label_smoothing > 0.0f;
  const float* weights = args.class_weights;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t target = LoadTarget(args.targets, args.targets_i64, row);
    const bool ignored = target == args.ignore_index;
    const bool valid = !ignored && target >= 0 && target < vocab;
    if (!valid && args.lse == nullptr && args.predicted == nullptr) {
      // Ignored tokens add nothing; a target out of range (not validated) is a
      // NaN loss.
      args.row_loss[row] = ignored ? 0.0f : kNaN;
      if (args.grad != nullptr) FillGradRow(args, row, ignored ? 0.0f : kNaN);
      WriteUncountedExtras(args, row, ignored);
      continue;
    }
    const float* z = LoadRow(args, row, scratch);  // [vocab]

    // Pass 1: the max. NaN logits need no care here: they reach the sum below.
    const float max = ConstArrayMap(z, vocab).maxCoeff();
    // Pass 2: S = sum_j exp(z_j - max) and, for smoothing, the sum of
    // w_j (max - z_j) >= 0 (the smoothing term as W log S + that sum: no
    // cancellation between lse and the z_j). The target's term e_t is left out
    // of the fp32 block sums and added in double: when p_t is near 1, e_t ~ 1
    // would swallow the low bits of the other terms, and their sum (S times the
    // complement of p_t) is what the token's loss and target gradient are made
    // of. A row of only -inf keeps S = 0: lse = -inf.
    const int64_t skip = valid ? target : -1;
    double sum_exp = 0.0, smooth_sum = 0.0;
    if (max == std::numeric_limits<float>::infinity()) {
      // +inf logits: each one's term is exp(0) = 1 and the others' 0 (as in
      // PyTorch's logsumexp: lse = +inf, not inf - inf); NaNs stay NaN.
      const ConstArrayMap zr(z, vocab);  // [vocab]
      sum_exp = static_cast<double>((zr == max).count()) +
                (zr.isNaN().any() ? kNaN : 0.0);
      if (smoothing && valid) {
        smooth_sum = weights != nullptr
                         ? (ConstArrayMap(weights, vocab) * (max - zr)).sum()
                         : (max - zr).sum();
      }
    } else if (max != -std::numeric_limits<float>::infinity()) {
      for (int64_t b = 0; b < vocab; b += kBlock) {
        const int64_t count = std::min(kBlock, vocab - b);
        if (skip >= b && skip < b + count) {
          sum_exp += SumExp(z + b, skip - b, max) +
                     SumExp(z + skip + 1, b + count - skip - 1, max);
        } else {
          sum_exp += SumExp(z + b, count, max);
        }
        if (smoothing && valid) {
          ConstArrayMap zb(z + b, count);  // [count]
          smooth_sum +=
              weights != nullptr
                  ? (ConstArrayMap(weights + b, count) * (max - zb)).sum()
                  : (max - zb).sum();
        }
      }
      if (valid) sum_exp += std::exp(static_cast<double>(z[target]) - max);
    }
    const double log_sum = std::log(sum_exp);
    const double lse = max + log_sum;
    if (args.lse != nullptr) args.lse[row] = static_cast<float>(lse);
    int64_t predicted = -1;
    if (args.predicted != nullptr || args.row_hit != nullptr) {
      predicted = ArgMax(z, vocab, max);
      if (args.predicted != nullptr) StorePredicted(args, row, predicted);
    }

    if (!valid) {
      args.row_loss[row] = ignored ? 0.0f : kNaN;
      if (args.grad != nullptr) FillGradRow(args, row, ignored ? 0.0f : kNaN);
      WriteUncountedExtras(args, row, ignored);
      continue;
    }
    const bool with_entropy =
        args.entropy != nullptr || args.entropy_weight != 0.0f;
    const double entropy =
        with_entropy ? RowEntropy(z, vocab, max, sum_exp) : 0.0;
    if (args.entropy != nullptr)
      args.entropy[row] = static_cast<float>(entropy);
    const double w_t = weights != nullptr ? weights[target] : 1.0;
    // lse - z_t as (max - z_t) + log S: exact max - z_t, so a near-certain
    // token's small loss is not the difference of two rounded large numbers.
    const double nll = (static_cast<double>(max) - z[target]) + log_sum;
    if (args.target_logprob != nullptr)
      args.target_logprob[row] = static_cast<float>(-nll);
    if (args.row_hit != nullptr)
      args.row_hit[row] =
          predicted == target ? static_cast<float>(w_t * k.hit_scale) : 0.0f;
    double ce = (1.0 - s) * w_t * nll;
    if (smoothing) ce += s / vocab * (k.weight_total * log_sum + smooth_sum);
    // The entropy term is scaled as the z-loss part (by the count).
    double zl = args.z_loss > 0.0f ? args.z_loss * lse * lse : 0.0;
    if (args.entropy_weight != 0.0f) zl -= args.entropy_weight * entropy;
    args.row_loss[row] = static_cast<float>(
        args.reduction == kMean ? ce * k.ce_scale + zl * k.z_scale : ce + zl);

    if (args.grad != nullptr) {
      double g = 1.0;
      if (args.grad_loss != nullptr)
        g = args.grad_loss[args.grad_loss_per_row ? row : 0];
      const double ce_scale = g * k.ce_scale, z_scale = g * k.z_scale;
      const double target_coef = ce_scale * (1.0 - s) * w_t;
      const double smooth_w = ce_scale * s / vocab;
      const double z_term =
          args.z_loss > 0.0f ? 2.0 * z_scale * args.z_loss * lse : 0.0;
      GradCoefficients c;
      c.shift = max;
      c.log_sum = log_sum;
      c.coef = target_coef + smooth_w * k.weight_total + z_term;
      c.smooth_w = smooth_w;
      c.target_offset = smooth_w * (k.weight_total - w_t) + z_term;
      c.ent_coef = z_scale * args.entropy_weight;
      c.entropy = entropy;
      WriteGradRow(args, row, z, target, c);
    }
  }
}

void BackwardRows(const RowArgs& args, const CallConstants& k, int64_t begin,
                  int64_t end, float* scratch) {
  const int64_t vocab = args.vocab;
  const double s = args.label_smoothing;
  const float* weights = args.class_weights;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t target = LoadTarget(args.targets, args.targets_i64, row);
    const bool ignored = target == args.ignore_index;
    const bool valid = !ignored && target >= 0 && target < vocab;
    if (!valid) {
      FillGradRow(args, row, ignored ? 0.0f : kNaN);
      continue;
    }
    const float* z = LoadRow(args, row, scratch);  // [vocab]
    const double lse = args.lse[row];
    const double w_t = weights != nullptr ? weights[target] : 1.0;
    double g = 1.0;
    if (args.grad_loss != nullptr)
      g = args.grad_loss[args.grad_loss_per_row ? row : 0];
    const double ce_scale = g * k.ce_scale, z_scale = g * k.z_scale;
    const double target_coef = ce_scale * (1.0 - s) * w_t;
    const double smooth_w = ce_scale * s / vocab;
    const double z_term =
        args.z_loss > 0.0f ? 2.0 * z_scale * args.z_loss * lse : 0.0;
    GradCoefficients c;
    c.shift = lse;
    c.log_sum = 0.0;
    c.coef = target_coef + smooth_w * k.weight_total + z_term;
    c.smooth_w = smooth_w;
    c.target_offset = smooth_w * (k.weight_total - w_t) + z_term;
    if (args.entropy_weight != 0.0f) {
      c.ent_coef = z_scale * args.entropy_weight;
      if (args.entropy != nullptr) {
        c.entropy = args.entropy[row];
      } else {
        // The row's own statistics (the saved lse only gives p).
        const float max = ConstArrayMap(z, vocab).maxCoeff();
        double sum_exp = 0.0;
        for (int64_t b = 0; b < vocab; b += kBlock)
          sum_exp += SumExp(z + b, std::min(kBlock, vocab - b), max);
        c.entropy = RowEntropy(z, vocab, max, sum_exp);
      }
    }
    WriteGradRow(args, row, z, target, c);
  }
}

}  // namespace

TargetStats ScanTargetsCpu(const void* targets, bool targets_i64, int64_t rows,
                           int64_t vocab, int64_t ignore_index,
                           const float* class_weights) {
  TargetStats stats{};
  int64_t counted = 0;
  double weight_sum = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = LoadTarget(targets, targets_i64, i);
    if (t == ignore_index) continue;
    if (t < 0 || t >= vocab) {
      ++stats.invalid;
      continue;
    }
    ++counted;
    weight_sum +=
        class_weights != nullptr ? static_cast<double>(class_weights[t]) : 1.0;
  }
  if (class_weights != nullptr) {
    for (int64_t j = 0; j < vocab; ++j) {
      // NaN counts as negative too.
      if (!(class_weights[j] >= 0.0f)) ++stats.negative_weights;
    }
  }
  stats.ce_denominator =
      class_weights != nullptr ? weight_sum : static_cast<double>(counted);
  stats.z_denominator = static_cast<double>(counted);
  stats.weight_total = WeightTotal(class_weights, vocab);
  return stats;
}

void RowsCpu(const RowArgs& args) {
  if (args.rows <= 0 || args.vocab <= 0) return;
  const CallConstants constants = MakeCallConstants(args);
  ForEachRowRange(args, [&](int64_t begin, int64_t end, float* scratch) {
    ProcessRows(args, constants, begin, end, scratch);
  });
}

void BackwardCpu(const RowArgs& args) {
  if (args.rows <= 0 || args.vocab <= 0) return;
  const CallConstants constants = MakeCallConstants(args);
  ForEachRowRange(args, [&](int64_t begin, int64_t end, float* scratch) {
    BackwardRows(args, constants, begin, end, scratch);
  });
}

double SumRowsCpu(const float* row_loss, int64_t rows) {
  double sum = 0.0;
  for (int64_t i = 0; i < rows; ++i) sum += row_loss[i];
  return sum;
}

}  // namespace ce
}  // namespace lossrt
