// Tests of the loss extras (CrossEntropyExtras: predicted token, accuracy,
// entropy, target log-probability) and of entropy_weight, in the cross-entropy
// op (loss/cross_entropy.h) and the linear cross-entropy
// (loss/linear_cross_entropy.h), on every backend (the CPU always, cuda:0 when
// one is usable) and logits dtype, against the double-precision reference
// (loss/cross_entropy_reference.h).
//
// Every output is poisoned before a call and every element checked after it;
// a repeat of a call must give the same bytes. Tolerances: the entropy and the
// target log-probability within 1e-5 (f32) or 1e-4 (16-bit logits, whose
// kernels sum in a different order) times (1 + |lse|); the accuracy within
// 1e-6; the predicted token exactly, except where the soft cap or an fp32
// GEMM leaves the top two logits within rounding of each other (then any
// index whose reference logit is that close to the max is accepted).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy.h"
#include "loss/cross_entropy_reference.h"
#include "loss/linear_cross_entropy.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"
#include "tests/tensor_image.h"

namespace lossrt {
namespace {

using reference::CrossEntropyReference;
using reference::ReferenceOptions;
using reference::ReferenceReduction;
using reference::ReferenceResult;
using test::Bytes;

float RoundTo(DType dtype, float value) {
  if (dtype == DType::kBF16) return Bf16BitsToFloat(FloatToBf16Bits(value));
  if (dtype == DType::kF16) return F16BitsToFloat(FloatToF16Bits(value));
  return value;
}

// A tensor on a backend with a host image of its bytes.
struct Array {
  DType dtype = DType::kF32;
  Shape shape;
  Bytes host;
  Buffer buffer;
  Tensor view;
};

absl::Status CopyBytes(Context& context, const void* src, Device src_device,
                       void* dst, Device dst_device, int64_t bytes) {
  const Tensor from =
      Tensor::Of(const_cast<void*>(src), DType::kF16, {bytes / 2}, src_device);
  const Tensor to = Tensor::Of(dst, DType::kF16, {bytes / 2}, dst_device);
  return CopyTensor(from, to, context);
}

absl::Status MakeArray(Context& context, DType dtype, const Shape& shape,
                       Array& array) {
  array.dtype = dtype;
  array.shape = shape;
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  // At least 4 bytes, an even count: CopyBytes moves 2-byte elements.
  array.host.assign(std::max<int64_t>(elements * DTypeSize(dtype), 4), 0);
  ASSIGN_OR_RETURN(array.buffer,
                   context.allocator().Allocate(array.host.size()));
  array.view = Tensor::Of(array.buffer.data(), dtype, shape, context.device());
  return absl::OkStatus();
}

absl::Status Upload(Context& context, Array& array) {
  return CopyBytes(context, array.host.data(), Device::Cpu(),
                   array.buffer.data(), context.device(), array.host.size());
}

absl::Status Download(Context& context, Array& array) {
  return CopyBytes(context, array.buffer.data(), context.device(),
                   array.host.data(), Device::Cpu(), array.host.size());
}

absl::Status PoisonArray(Context& context, Array& array) {
  if (array.dtype == DType::kI64 || array.dtype == DType::kI32) {
    std::fill(array.host.begin(), array.host.end(), 0xa5);
  } else {
    test::Poison(array.dtype, array.host);
  }
  return Upload(context, array);
}

// Element i of a host image of `dtype` elements.
double LoadImage(DType dtype, const Bytes& host, int64_t i) {
  if (dtype == DType::kI64) {
    int64_t v;
    std::memcpy(&v, host.data() + 8 * i, 8);
    return static_cast<double>(v);
  }
  if (dtype == DType::kI32) {
    int32_t v;
    std::memcpy(&v, host.data() + 4 * i, 4);
    return v;
  }
  return test::Load(dtype, host, i);
}

double LoadValue(const Array& array, int64_t i) {
  return LoadImage(array.dtype, array.host, i);
}

void StoreValue(Array& array, int64_t i, double value) {
  if (array.dtype == DType::kI64) {
    const int64_t v = static_cast<int64_t>(value);
    std::memcpy(array.host.data() + 8 * i, &v, 8);
  } else if (array.dtype == DType::kI32) {
    const int32_t v = static_cast<int32_t>(value);
    std::memcpy(array.host.data() + 4 * i, &v, 4);
  } else {
    test::Store(array.dtype, array.host, i, static_cast<float>(value));
  }
}

// A cross-entropy problem and its reference.
struct Problem {
  DType dtype = DType::kF32;
  DType predicted_dtype = DType::kI64;
  int64_t tokens = 0;
  int64_t vocab = 0;
  std::vector<double> logits;  // [tokens, vocab], exact in dtype
  std::vector<int64_t> targets;
  std::vector<float> weights;  // [vocab] or empty
  CrossEntropyOptions options;
};

ReferenceOptions RefOptions(const Problem& p) {
  ReferenceOptions options;
  options.ignore_index = p.options.ignore_index;
  options.reduction =
      p.options.reduction == Reduction::kMean  ? ReferenceReduction::kMean
      : p.options.reduction == Reduction::kSum ? ReferenceReduction::kSum
                                               : ReferenceReduction::kNone;
  options.label_smoothing = p.options.label_smoothing;
  options.z_loss = p.options.z_loss;
  options.softcap = p.options.softcap;
  options.entropy_weight = p.options.entropy_weight;
  options.class_weights.assign(p.weights.begin(), p.weights.end());
  return options;
}

// Random logits (stddev 3), a quarter of the rows ignored, and ties: every
// fifth row gets its max at two or three places (the lowest index wins).
Problem RandomProblem(DType dtype, int64_t tokens, int64_t vocab,
                      std::mt19937_64& rng) {
  Problem p;
  p.dtype = dtype;
  p.tokens = tokens;
  p.vocab = vocab;
  p.logits.resize(tokens * vocab);
  p.targets.resize(tokens);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_int_distribution<int64_t> column(0, vocab - 1);
  for (double& x : p.logits)
    x = RoundTo(dtype, static_cast<float>(normal(rng)));
  for (int64_t i = 0; i < tokens; ++i) {
    p.targets[i] = column(rng);
    if (i % 4 == 3) p.targets[i] = p.options.ignore_index;
    double* row = p.logits.data() + i * vocab;
    if (i % 5 == 0 && vocab > 2) {
      const double top = RoundTo(dtype, 12.0f);
      for (int k = 0; k < 3; ++k) row[column(rng)] = top;
    }
    // Some counted rows are predicted right, for a nontrivial accuracy.
    if (i % 3 == 1 && p.targets[i] >= 0)
      row[p.targets[i]] = RoundTo(dtype, 14.0f);
  }
  return p;
}

// The call's tensors on a backend.
struct CallSetup {
  std::unique_ptr<Context> context;
  Array logits, targets, weights, loss, lse, grad, grad_loss;
  Array predicted, accuracy, entropy, logprob;
  CrossEntropyOptions options;
  CrossEntropyExtras extras;

  absl::Status PoisonOutputs() {
    for (Array* a :
         {&loss, &lse, &grad, &predicted, &accuracy, &entropy, &logprob}) {
      RETURN_IF_ERROR(PoisonArray(*context, *a));
    }
    return absl::OkStatus();
  }
  absl::Status DownloadOutputs() {
    for (Array* a :
         {&loss, &lse, &grad, &predicted, &accuracy, &entropy, &logprob}) {
      RETURN_IF_ERROR(Download(*context, *a));
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<CallSetup>> MakeSetup(const Device& device,
                                                     const Problem& p) {
  auto s = std::make_unique<CallSetup>();
  ASSIGN_OR_RETURN(s->context, Context::Create(device));
  Context& c = *s->context;
  const int64_t n = p.tokens, v = p.vocab;
  RETURN_IF_ERROR(MakeArray(c, p.dtype, {n, v}, s->logits));
  for (int64_t i = 0; i < n * v; ++i) StoreValue(s->logits, i, p.logits[i]);
  RETURN_IF_ERROR(Upload(c, s->logits));
  RETURN_IF_ERROR(MakeArray(c, DType::kI64, {n}, s->targets));
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(s->targets.host.data() + 8 * i, &p.targets[i], 8);
  RETURN_IF_ERROR(Upload(c, s->targets));
  s->options = p.options;
  if (!p.weights.empty()) {
    RETURN_IF_ERROR(MakeArray(c, DType::kF32, {v}, s->weights));
    for (int64_t j = 0; j < v; ++j) StoreValue(s->weights, j, p.weights[j]);
    RETURN_IF_ERROR(Upload(c, s->weights));
    s->options.class_weights = s->weights.view;
  }
  const bool none = p.options.reduction == Reduction::kNone;
  RETURN_IF_ERROR(
      MakeArray(c, DType::kF32, none ? Shape{n} : Shape{}, s->loss));
  RETURN_IF_ERROR(MakeArray(c, DType::kF32, {n}, s->lse));
  RETURN_IF_ERROR(MakeArray(c, p.dtype, {n, v}, s->grad));
  RETURN_IF_ERROR(
      MakeArray(c, DType::kF32, none ? Shape{n} : Shape{}, s->grad_loss));
  RETURN_IF_ERROR(MakeArray(c, p.predicted_dtype, {n}, s->predicted));
  RETURN_IF_ERROR(MakeArray(c, DType::kF32, {}, s->accuracy));
  RETURN_IF_ERROR(MakeArray(c, DType::kF32, {n}, s->entropy));
  RETURN_IF_ERROR(MakeArray(c, DType::kF32, {n}, s->logprob));
  s->extras.predicted = s->predicted.view;
  s->extras.accuracy = s->accuracy.view;
  s->extras.entropy = s->entropy.view;
  s->extras.target_logprob = s->logprob.view;
  RETURN_IF_ERROR(s->PoisonOutputs());
  return s;
}

// The soft-capped (or plain) logit z_ij of the reference, in double.
double RefLogit(const Problem& p, int64_t i, int64_t j) {
  const double x = p.logits[i * p.vocab + j];
  const double cap = p.options.softcap;
  return cap > 0 ? cap * std::tanh(x / cap) : x;
}

// `rounding`: how close (relative to |max|) another logit may come to the max
// and still count as a tie (the soft cap's and the GEMM's rounding).
testing::AssertionResult ExtrasMatch(const Problem& p,
                                     const ReferenceResult& ref,
                                     const CallSetup& s, double rounding) {
  const double tol_scale = p.dtype == DType::kF32 ? 1e-5 : 1e-4;
  for (int64_t i = 0; i < p.tokens; ++i) {
    const double pred = LoadValue(s.predicted, i);
    if (pred != ref.predicted[i]) {
      const double max = RefLogit(p, i, ref.predicted[i]);
      const double slack = rounding * (1.0 + std::fabs(max));
      bool accepted = rounding > 0 && pred >= 0 && pred < p.vocab &&
                      RefLogit(p, i, static_cast<int64_t>(pred)) >= max - slack;
      // Below it, no index may be that close (the lowest one wins).
      for (int64_t j = 0; accepted && j < pred; ++j)
        accepted = RefLogit(p, i, j) < max - slack;
      if (!accepted) {
        return testing::AssertionFailure()
               << "predicted[" << i << "] = " << pred << ", reference "
               << ref.predicted[i];
      }
    }
    const double tol = tol_scale * (1.0 + std::fabs(ref.lse[i]));
    const double h = LoadValue(s.entropy, i);
    if (!(std::fabs(h - ref.entropy[i]) <= tol)) {
      return testing::AssertionFailure() << "entropy[" << i << "] = " << h
                                         << ", reference " << ref.entropy[i];
    }
    const double lp = LoadValue(s.logprob, i);
    if (!(std::fabs(lp - ref.target_logprob[i]) <= tol)) {
      return testing::AssertionFailure()
             << "target_logprob[" << i << "] = " << lp << ", reference "
             << ref.target_logprob[i];
    }
  }
  const double acc = LoadValue(s.accuracy, 0);
  if (!(std::fabs(acc - ref.accuracy) <= 1e-6)) {
    return testing::AssertionFailure()
           << "accuracy " << acc << ", reference " << ref.accuracy;
  }
  return testing::AssertionSuccess();
}

struct BackendRun {
  Device device;
  DType dtype;
};

std::vector<BackendRun> Runs() {
  std::vector<BackendRun> runs = {{Device::Cpu(), DType::kF32},
                                  {Device::Cpu(), DType::kBF16}};
  if (test::GpuUnavailableReason().empty()) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
      runs.push_back({Device::Cuda(0), dtype});
  } else {
    std::printf("GPU cases skipped: %s\n",
                test::GpuUnavailableReason().c_str());
  }
  return runs;
}

std::string RunName(const BackendRun& run) {
  return std::string(run.device.is_cpu() ? "cpu " : "cuda ") +
         DTypeName(run.dtype);
}

// kMasked: -inf logits (a masked vocabulary), whose e_j is 0 and whose
// entropy term is 0 rather than 0 * -inf: every seventh logit of the even
// rows, and all but the target of every sixth row (on both backends: the CPU
// one tests d_j, as its Eigen exp takes -inf to a tiny positive e_j).
enum class Variant { kPlain, kSoftcap, kWeights, kSmoothing, kMasked };

void ApplyVariant(Variant variant, Problem& p, std::mt19937_64& rng) {
  switch (variant) {
    case Variant::kPlain:
      break;
    case Variant::kSoftcap:
      p.options.softcap = 20.0f;
      break;
    case Variant::kWeights: {
      std::uniform_real_distribution<float> weight(0.0f, 2.0f);
      p.weights.resize(p.vocab);
      for (float& w : p.weights) w = weight(rng);
      break;
    }
    case Variant::kSmoothing:
      p.options.label_smoothing = 0.1f;
      p.options.z_loss = 1e-3f;
      break;
    case Variant::kMasked: {
      const double neg_inf = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < p.tokens; ++i) {
        const int64_t t = p.targets[i];
        double* row = p.logits.data() + i * p.vocab;
        for (int64_t j = 0; j < p.vocab; ++j) {
          if (j == t) continue;
          if ((i % 6 == 2 && t >= 0) || (i % 2 == 0 && j % 7 == 3))
            row[j] = neg_inf;
        }
      }
      break;
    }
  }
}

// Forward and ForwardBackward with every extra, each reduction and several
// shapes (vocab 1, odd vocabularies whose rows are not 16-byte aligned, rows
// longer than a warp's tile), against the reference; and a repeat that must
// give the same bytes.
TEST(CrossEntropyExtrasTest, MatchReference) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    // 32768: rows shared by warps (forward) and split over a cluster (fused);
    // 139264: rows longer than a cluster holds (tiled) on the GPU.
    for (int64_t vocab : {int64_t{1}, int64_t{37}, int64_t{1024}, int64_t{5003},
                          int64_t{32768}, int64_t{139264}}) {
      for (Variant variant :
           {Variant::kPlain, Variant::kSoftcap, Variant::kWeights,
            Variant::kSmoothing, Variant::kMasked}) {
        for (Reduction reduction :
             {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
          SCOPED_TRACE(RunName(run) + " vocab " + std::to_string(vocab) +
                       " variant " + std::to_string(static_cast<int>(variant)) +
                       " reduction " +
                       std::to_string(static_cast<int>(reduction)));
          if (vocab > 8192 && reduction != Reduction::kMean) continue;
          Problem p = RandomProblem(run.dtype, 23, vocab, rng);
          p.options.reduction = reduction;
          p.predicted_dtype = vocab % 2 == 0 ? DType::kI32 : DType::kI64;
          ApplyVariant(variant, p, rng);
          const ReferenceResult ref = CrossEntropyReference(
              p.logits, p.targets, p.vocab, RefOptions(p));
          ASSERT_OK_AND_ASSIGN(std::unique_ptr<CallSetup> s,
                               MakeSetup(run.device, p));
          const double rounding = p.options.softcap > 0 ? 1e-6 : 0.0;
          ASSERT_OK(CrossEntropyForward(
              *s->context, s->logits.view, s->targets.view, s->options,
              s->loss.view, &s->lse.view, &s->extras));
          ASSERT_OK(s->DownloadOutputs());
          EXPECT_TRUE(ExtrasMatch(p, ref, *s, rounding));
          const Bytes forward_predicted = s->predicted.host,
                      forward_entropy = s->entropy.host;

          ASSERT_OK(s->PoisonOutputs());
          ASSERT_OK(CrossEntropyForwardBackward(
              *s->context, s->logits.view, s->targets.view, s->options,
              s->loss.view, &s->lse.view, s->grad.view, nullptr, &s->extras));
          ASSERT_OK(s->DownloadOutputs());
          EXPECT_TRUE(ExtrasMatch(p, ref, *s, rounding));
          const Bytes first[] = {s->predicted.host, s->accuracy.host,
                                 s->entropy.host,   s->logprob.host,
                                 s->loss.host,      s->grad.host};

          // The same call again: the same bytes.
          ASSERT_OK(s->PoisonOutputs());
          ASSERT_OK(CrossEntropyForwardBackward(
              *s->context, s->logits.view, s->targets.view, s->options,
              s->loss.view, &s->lse.view, s->grad.view, nullptr, &s->extras));
          ASSERT_OK(s->DownloadOutputs());
          const Bytes again[] = {s->predicted.host, s->accuracy.host,
                                 s->entropy.host,   s->logprob.host,
                                 s->loss.host,      s->grad.host};
          for (int k = 0; k < 6; ++k)
            EXPECT_EQ(first[k], again[k]) << "output " << k << " changed";
          (void)forward_predicted;
          (void)forward_entropy;
        }
      }
    }
  }
}

// Asking for the extras leaves the loss, lse and gradient as they are without
// them: to the bit on the CPU (the same row passes), within a few roundings on
// the GPU (whose extras' kernels may cut a row into other tiles).
TEST(CrossEntropyExtrasTest, ExtrasLeaveTheLossAndGradientAlone) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    for (int64_t vocab : {int64_t{777}, int64_t{32768}}) {
      SCOPED_TRACE(RunName(run) + " vocab " + std::to_string(vocab));
      Problem p = RandomProblem(run.dtype, 31, vocab, rng);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<CallSetup> s,
                           MakeSetup(run.device, p));
      ASSERT_OK(CrossEntropyForwardBackward(
          *s->context, s->logits.view, s->targets.view, s->options,
          s->loss.view, &s->lse.view, s->grad.view));
      ASSERT_OK(s->DownloadOutputs());
      const Bytes loss = s->loss.host, lse = s->lse.host, grad = s->grad.host;
      ASSERT_OK(s->PoisonOutputs());
      ASSERT_OK(CrossEntropyForwardBackward(
          *s->context, s->logits.view, s->targets.view, s->options,
          s->loss.view, &s->lse.view, s->grad.view, nullptr, &s->extras));
      ASSERT_OK(s->DownloadOutputs());
      if (run.device.is_cpu()) {
        EXPECT_EQ(loss, s->loss.host);
        EXPECT_EQ(lse, s->lse.host);
        EXPECT_EQ(grad, s->grad.host);
        continue;
      }
      const double grad_rel = p.dtype == DType::kF32    ? 1e-5
                              : p.dtype == DType::kBF16 ? 1e-2
                                                        : 2e-3;
      for (int64_t k = 0; k < p.tokens * p.vocab; ++k) {
        const double a = LoadImage(p.dtype, grad, k), b = LoadValue(s->grad, k);
        // (f16's subnormals are 6e-8 apart)
        ASSERT_LE(std::fabs(a - b), 1.2e-7 + grad_rel * std::fabs(a))
            << "grad[" << k / vocab << ", " << k % vocab << "]";
      }
      for (int64_t i = 0; i < p.tokens; ++i) {
        const double a = LoadImage(DType::kF32, lse, i),
                     b = LoadValue(s->lse, i);
        EXPECT_LE(std::fabs(a - b), 1e-6 * (1.0 + std::fabs(a))) << i;
      }
      const double a = LoadImage(DType::kF32, loss, 0),
                   b = LoadValue(s->loss, 0);
      EXPECT_LE(std::fabs(a - b), 1e-5 * (1.0 + std::fabs(a)));
    }
  }
}

// Every token ignored: accuracy 0, entropy and log-probabilities 0, the
// predicted tokens still the argmax.
TEST(CrossEntropyExtrasTest, AllIgnored) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    SCOPED_TRACE(RunName(run));
    Problem p = RandomProblem(run.dtype, 9, 300, rng);
    for (int64_t& t : p.targets) t = p.options.ignore_index;
    const ReferenceResult ref =
        CrossEntropyReference(p.logits, p.targets, p.vocab, RefOptions(p));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CallSetup> s,
                         MakeSetup(run.device, p));
    ASSERT_OK(CrossEntropyForward(*s->context, s->logits.view, s->targets.view,
                                  s->options, s->loss.view, nullptr,
                                  &s->extras));
    ASSERT_OK(s->DownloadOutputs());
    EXPECT_EQ(LoadValue(s->accuracy, 0), 0.0);
    for (int64_t i = 0; i < p.tokens; ++i) {
      EXPECT_EQ(LoadValue(s->entropy, i), 0.0) << i;
      EXPECT_EQ(LoadValue(s->logprob, i), 0.0) << i;
      EXPECT_EQ(LoadValue(s->predicted, i), ref.predicted[i]) << i;
    }
  }
}

// entropy_weight: the loss and the gradient of ForwardBackward, of the forward
// alone, and of Backward from the saved lse (its entropy recomputed, or saved
// by the forward) against the reference; a wrong saved entropy is rejected
// and writes nothing.
TEST(CrossEntropyExtrasTest, EntropyWeightLossAndGradient) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    for (bool softcap : {false, true}) {
      for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
        for (int64_t vocab :
             {int64_t{37}, int64_t{2048}, int64_t{32768}, int64_t{139264}}) {
          SCOPED_TRACE(RunName(run) + (softcap ? " softcap" : "") + " vocab " +
                       std::to_string(vocab));
          Problem p = RandomProblem(run.dtype, 13, vocab, rng);
          p.options.reduction = reduction;
          p.options.entropy_weight = 0.3f;
          if (softcap) p.options.softcap = 15.0f;
          const ReferenceResult ref = CrossEntropyReference(
              p.logits, p.targets, p.vocab, RefOptions(p));
          ASSERT_OK_AND_ASSIGN(std::unique_ptr<CallSetup> s,
                               MakeSetup(run.device, p));
          const double grad_ulp = p.dtype == DType::kF32    ? 1e-6
                                  : p.dtype == DType::kBF16 ? 8e-3
                                                            : 1e-3;
          auto check = [&](bool with_loss) {
            if (with_loss) {
              const double loss = LoadValue(s->loss, 0);
              EXPECT_NEAR(loss, ref.loss, 1e-5 * (1.0 + std::fabs(ref.loss)));
            }
            double largest = 0.0;
            for (double g : ref.grad) largest = std::max(largest, std::fabs(g));
            for (int64_t k = 0; k < p.tokens * p.vocab; ++k) {
              const double g = LoadValue(s->grad, k);
              ASSERT_LE(std::fabs(g - ref.grad[k]),
                        1e-5 * largest + grad_ulp * std::fabs(ref.grad[k]))
                  << "grad[" << k / vocab << ", " << k % vocab << "] " << g
                  << ", reference " << ref.grad[k];
            }
          };
          ASSERT_OK(CrossEntropyForwardBackward(
              *s->context, s->logits.view, s->targets.view, s->options,
              s->loss.view, &s->lse.view, s->grad.view));
          ASSERT_OK(s->DownloadOutputs());
          check(true);
          // The backward from the saved lse (its entropy recomputed).
          StoreValue(s->grad_loss, 0, 1.0);
          ASSERT_OK(Upload(*s->context, s->grad_loss));
          ASSERT_OK(PoisonArray(*s->context, s->grad));
          ASSERT_OK(CrossEntropyBackward(
              *s->context, s->logits.view, s->targets.view, s->lse.view,
              s->grad_loss.view, s->options, s->grad.view));
          ASSERT_OK(Download(*s->context, s->grad));
          check(false);
          // The forward alone, saving lse and entropy (its loss and the
          // entropy against the reference), then the backward from both.
          ASSERT_OK(s->PoisonOutputs());
          CrossEntropyExtras saved;
          saved.entropy = s->entropy.view;
          ASSERT_OK(CrossEntropyForward(*s->context, s->logits.view,
                                        s->targets.view, s->options,
                                        s->loss.view, &s->lse.view, &saved));
          ASSERT_OK(Download(*s->context, s->loss));
          ASSERT_OK(Download(*s->context, s->entropy));
          EXPECT_NEAR(LoadValue(s->loss, 0), ref.loss,
                      1e-5 * (1.0 + std::fabs(ref.loss)));
          const double entropy_tol = p.dtype == DType::kF32 ? 1e-5 : 1e-4;
          for (int64_t i = 0; i < p.tokens; ++i) {
            EXPECT_NEAR(LoadValue(s->entropy, i), ref.entropy[i],
                        entropy_tol * (1.0 + std::fabs(ref.lse[i])))
                << i;
          }
          ASSERT_OK(CrossEntropyBackward(
              *s->context, s->logits.view, s->targets.view, s->lse.view,
              s->grad_loss.view, s->options, s->grad.view, &s->entropy.view));
          ASSERT_OK(Download(*s->context, s->grad));
          check(false);
          // A saved entropy of the wrong length or dtype.
          ASSERT_OK(PoisonArray(*s->context, s->grad));
          const std::vector<uint8_t> poisoned = s->grad.host;
          const Tensor short_entropy = Tensor::Of(
              s->entropy.view.data, DType::kF32, {p.tokens - 1}, run.device);
          const Tensor int_entropy = Tensor::Of(
              s->entropy.view.data, DType::kI32, {p.tokens}, run.device);
          for (const Tensor* bad : {&short_entropy, &int_entropy}) {
            EXPECT_EQ(CrossEntropyBackward(*s->context, s->logits.view,
                                           s->targets.view, s->lse.view,
                                           s->grad_loss.view, s->options,
                                           s->grad.view, bad)
                          .code(),
                      absl::StatusCode::kInvalidArgument);
          }
          ASSERT_OK(Download(*s->context, s->grad));
          EXPECT_EQ(s->grad.host, poisoned) << "a rejected call wrote";
        }
      }
    }
  }
}

// The reference's entropy gradient against central finite differences of its
// own objective.
TEST(CrossEntropyExtrasTest, ReferenceEntropyGradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(test::TestSeed());
  Problem p = RandomProblem(DType::kF32, 4, 7, rng);
  p.options.entropy_weight = 0.7f;
  p.options.softcap = 5.0f;
  const ReferenceOptions options = RefOptions(p);
  const ReferenceResult ref =
      CrossEntropyReference(p.logits, p.targets, p.vocab, options);
  for (int64_t k = 0; k < p.tokens * p.vocab; ++k) {
    std::vector<double> x = p.logits;
    const double h = 1e-5;
    x[k] += h;
    const double up =
        CrossEntropyReference(x, p.targets, p.vocab, options, {}, false)
            .objective;
    x[k] -= 2 * h;
    const double down =
        CrossEntropyReference(x, p.targets, p.vocab, options, {}, false)
            .objective;
    EXPECT_NEAR((up - down) / (2 * h), ref.grad[k], 1e-6) << k;
  }
}

// Bad extras: InvalidArgument, and nothing written.
TEST(CrossEntropyExtrasTest, BadExtrasAreRejectedAndWriteNothing) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    if (run.dtype != DType::kF32) continue;
    SCOPED_TRACE(RunName(run));
    Problem p = RandomProblem(run.dtype, 8, 50, rng);
    p.options.reduction = Reduction::kNone;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CallSetup> s,
                         MakeSetup(run.device, p));
    const Tensor& entropy = s->entropy.view;
    std::vector<std::pair<std::string, CrossEntropyExtras>> cases;
    CrossEntropyExtras e;
    e.predicted =
        Tensor::Of(s->predicted.buffer.data(), DType::kF32, {8}, run.device);
    cases.push_back({"predicted f32", e});
    e = CrossEntropyExtras{};
    e.entropy = Tensor::Of(entropy.data, DType::kF32, {7}, run.device);
    cases.push_back({"entropy [7]", e});
    e = CrossEntropyExtras{};
    e.accuracy = Tensor::Of(entropy.data, DType::kF32, {2}, run.device);
    cases.push_back({"accuracy [2]", e});
    e = CrossEntropyExtras{};
    e.target_logprob = s->loss.view;  // overlaps the loss
    cases.push_back({"logprob over loss", e});
    e = CrossEntropyExtras{};
    e.entropy = entropy;
    e.target_logprob = entropy;
    cases.push_back({"entropy over logprob", e});
    e = CrossEntropyExtras{};
    e.entropy =
        Tensor::Of(s->logits.buffer.data(), DType::kF32, {8}, run.device);
    cases.push_back({"entropy over logits", e});
    e = CrossEntropyExtras{};
    e.entropy =
        Tensor::Of(entropy.data, DType::kF32, {8},
                   run.device.is_cpu() ? Device::Cuda(0) : Device::Cpu());
    cases.push_back({"entropy elsewhere", e});
    for (const auto& [name, extras] : cases) {
      SCOPED_TRACE(name);
      ASSERT_OK(s->PoisonOutputs());
      const absl::Status status =
          CrossEntropyForward(*s->context, s->logits.view, s->targets.view,
                              s->options, s->loss.view, &s->lse.view, &extras);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      ASSERT_OK(s->DownloadOutputs());
      for (int64_t i = 0; i < p.tokens; ++i) {
        EXPECT_TRUE(std::isnan(LoadValue(s->loss, i)));
        EXPECT_TRUE(std::isnan(LoadValue(s->entropy, i)));
        EXPECT_TRUE(std::isnan(LoadValue(s->logprob, i)));
      }
    }
    CrossEntropyOptions bad = s->options;
    bad.entropy_weight = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(CrossEntropyForward(*s->context, s->logits.view, s->targets.view,
                                  bad, s->loss.view)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// ---------------------------------------------------------------------------
// The linear cross-entropy: its extras against the reference on the logits
// hidden @ weight^T (in double), on each schedule, with several chunks.

TEST(LinearCrossEntropyExtrasTest, MatchReference) {
  std::mt19937_64 rng(test::TestSeed());
  for (const BackendRun& run : Runs()) {
    if (run.dtype == DType::kF16) continue;
    for (LinearCrossEntropySchedule schedule :
         {LinearCrossEntropySchedule::kTokenChunks,
          LinearCrossEntropySchedule::kTwoPass}) {
      for (bool entropy_weight : {false, true}) {
        if (entropy_weight && schedule == LinearCrossEntropySchedule::kTwoPass)
          continue;
        SCOPED_TRACE(RunName(run) +
                     (schedule == LinearCrossEntropySchedule::kTwoPass
                          ? " two-pass"
                          : " token chunks") +
                     (entropy_weight ? " entropy_weight" : ""));
        const int64_t n = 70, h = 16, v = 301;
        ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                             Context::Create(run.device));
        Context& c = *context;
        Array hidden, weight, targets, loss, d_hidden, d_weight;
        Array predicted, accuracy, entropy, logprob;
        ASSERT_OK(MakeArray(c, run.dtype, {n, h}, hidden));
        ASSERT_OK(MakeArray(c, run.dtype, {v, h}, weight));
        ASSERT_OK(MakeArray(c, DType::kI64, {n}, targets));
        std::normal_distribution<double> normal(0.0, 1.0);
        std::uniform_int_distribution<int64_t> column(0, v - 1);
        std::vector<double> hv(n * h), wv(v * h);
        for (int64_t k = 0; k < n * h; ++k) {
          hv[k] = RoundTo(run.dtype, static_cast<float>(normal(rng)));
          StoreValue(hidden, k, hv[k]);
        }
        for (int64_t k = 0; k < v * h; ++k) {
          wv[k] = RoundTo(run.dtype, static_cast<float>(normal(rng)));
          StoreValue(weight, k, wv[k]);
        }
        Problem p;
        p.dtype = DType::kF32;
        p.tokens = n;
        p.vocab = v;
        p.targets.resize(n);
        p.logits.assign(n * v, 0.0);
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < v; ++j) {
            for (int64_t k = 0; k < h; ++k)
              p.logits[i * v + j] += hv[i * h + k] * wv[j * h + k];
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          // Right about a third of the time: the argmax as the target.
          p.targets[i] =
              i % 3 == 0 ? std::max_element(p.logits.begin() + i * v,
                                            p.logits.begin() + (i + 1) * v) -
                               (p.logits.begin() + i * v)
                         : column(rng);
          if (i % 4 == 3) p.targets[i] = p.options.ignore_index;
          std::memcpy(targets.host.data() + 8 * i, &p.targets[i], 8);
        }
        if (entropy_weight) p.options.entropy_weight = 0.2f;
        ASSERT_OK(Upload(c, hidden));
        ASSERT_OK(Upload(c, weight));
        ASSERT_OK(Upload(c, targets));
        ASSERT_OK(MakeArray(c, DType::kF32, {}, loss));
        ASSERT_OK(MakeArray(c, run.dtype, {n, h}, d_hidden));
        ASSERT_OK(MakeArray(c, DType::kF32, {v, h}, d_weight));
        ASSERT_OK(MakeArray(c, DType::kI32, {n}, predicted));
        ASSERT_OK(MakeArray(c, DType::kF32, {}, accuracy));
        ASSERT_OK(MakeArray(c, DType::kF32, {n}, entropy));
        ASSERT_OK(MakeArray(c, DType::kF32, {n}, logprob));
        CrossEntropyExtras extras;
        extras.predicted = predicted.view;
        extras.accuracy = accuracy.view;
        extras.entropy = entropy.view;
        extras.target_logprob = logprob.view;
        LinearCrossEntropyOptions options;
        options.cross_entropy = p.options;
        options.schedule = schedule;
        // Small enough for several chunks (slices) of the 70 tokens.
        options.max_workspace_bytes = 64 << 10;
        const ReferenceResult ref =
            CrossEntropyReference(p.logits, p.targets, v, RefOptions(p));
        const double tol_scale = run.dtype == DType::kF32 ? 1e-5 : 1e-4;
        for (bool backward : {false, true}) {
          for (Array* a : {&predicted, &accuracy, &entropy, &logprob, &loss})
            ASSERT_OK(PoisonArray(c, *a));
          const LinearCrossEntropyInputs inputs{hidden.view, weight.view,
                                                std::nullopt, targets.view};
          if (backward) {
            ASSERT_OK(LinearCrossEntropyForwardBackward(
                c, inputs, options, loss.view, nullptr,
                {d_hidden.view, d_weight.view, std::nullopt}, nullptr,
                &extras));
          } else {
            ASSERT_OK(LinearCrossEntropyForward(c, inputs, options, loss.view,
                                                nullptr, &extras));
          }
          for (Array* a : {&predicted, &accuracy, &entropy, &logprob, &loss})
            ASSERT_OK(Download(c, *a));
          EXPECT_NEAR(LoadValue(loss, 0), ref.loss,
                      tol_scale * (1.0 + std::fabs(ref.loss)));
          int64_t mismatches = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double tol = tol_scale * (1.0 + std::fabs(ref.lse[i]));
            EXPECT_NEAR(LoadValue(entropy, i), ref.entropy[i], tol) << i;
            EXPECT_NEAR(LoadValue(logprob, i), ref.target_logprob[i], tol) << i;
            const int64_t pred = static_cast<int64_t>(LoadValue(predicted, i));
            ASSERT_GE(pred, 0);
            ASSERT_LT(pred, v);
            if (pred != ref.predicted[i]) {
              // Only within the GEMM's rounding of the max.
              EXPECT_GE(p.logits[i * v + pred],
                        p.logits[i * v + ref.predicted[i]] - 1e-3)
                  << i;
              ++mismatches;
            }
          }
          if (mismatches == 0) {
            EXPECT_NEAR(LoadValue(accuracy, 0), ref.accuracy, 1e-6);
          }
        }
      }
    }
  }
}

TEST(LinearCrossEntropyExtrasTest, EntropyWeightNeedsTheFusedTokenChunks) {
  for (const BackendRun& run : Runs()) {
    if (run.dtype != DType::kF32) continue;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(run.device));
    Context& c = *context;
    const int64_t n = 4, h = 8, v = 16;
    Array hidden, weight, targets, loss, lse, grad_loss, d_hidden, d_weight;
    ASSERT_OK(MakeArray(c, DType::kF32, {n, h}, hidden));
    ASSERT_OK(MakeArray(c, DType::kF32, {v, h}, weight));
    ASSERT_OK(MakeArray(c, DType::kI64, {n}, targets));
    ASSERT_OK(Upload(c, targets));
    ASSERT_OK(MakeArray(c, DType::kF32, {}, loss));
    ASSERT_OK(MakeArray(c, DType::kF32, {n}, lse));
    ASSERT_OK(MakeArray(c, DType::kF32, {}, grad_loss));
    ASSERT_OK(MakeArray(c, DType::kF32, {n, h}, d_hidden));
    ASSERT_OK(MakeArray(c, DType::kF32, {v, h}, d_weight));
    LinearCrossEntropyOptions options;
    options.cross_entropy.entropy_weight = 0.5f;
    const LinearCrossEntropyInputs inputs{hidden.view, weight.view,
                                          std::nullopt, targets.view};
    const LinearCrossEntropyGradients gradients{d_hidden.view, d_weight.view,
                                                std::nullopt};
    EXPECT_EQ(LinearCrossEntropyBackward(c, inputs, lse.view, grad_loss.view,
                                         options, gradients)
                  .code(),
              absl::StatusCode::kInvalidArgument);
    options.schedule = LinearCrossEntropySchedule::kTwoPass;
    EXPECT_EQ(LinearCrossEntropyForwardBackward(c, inputs, options, loss.view,
                                                nullptr, gradients)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace lossrt
