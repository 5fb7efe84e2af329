// Tests of the cross-entropy op (loss/cross_entropy.h) through its public API
// on every backend (the CPU always, cuda:0 when one is usable), against the
// double-precision reference (loss/cross_entropy_reference.h).
//
// Like ggml's test-backend-ops, one parameterized case per backend x logits
// dtype x target dtype x options x reduction x shape runs every call: Forward
// with and without lse, ForwardBackward (plain and with grad_loss), Backward
// from the saved lse, both in place (grad_logits = logits), and a repeat that
// must give the same bytes. Then special values (all ignored, huge, -inf, NaN
// logits, out-of-range targets), bad inputs, near-certain targets and a
// finite-difference check of the gradient.
//
// Outputs are poisoned with NaN bit patterns before every call, so an element
// left unwritten is caught; row padding of the gradient must stay poisoned and
// a call that fails must leave every output poisoned.
//
// Tolerances for f32 logits (bf16/f16 logits: losses 1e-5 relative, and each
// gradient element may be off by one more unit in the last place of its dtype):
//
// Loss: 1e-6 relative, plus a floor per token of two f32 ulps of
// (|max z| + log S + 1) times d loss / d lse, scaled as the loss is. That is
// what an f32 lse = max + log S is sure to; it matters only where a loss is
// small next to its lse. A near-certain token's loss is lse - z_t, which an
// implementation that keeps lse in f32 pins down no better, and a token with
// S ~ 1.5 has log S off by S's few-ulp relative error whatever its size.
// NearCertainTargetsKeepPrecision checks the fused path's precision there.
//
// lse: 1e-6 relative plus that floor.
//
// Gradient: 1e-5 relative in norm, and every element within 1e-6 of the
// largest one. With softcap, plus two f32 ulps of the cap times the element's
// softmax part: z = cap tanh(x / cap) is itself rounded to f32, and
// exp(z - lse) passes that error on.
#include "loss/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy_reference.h"
#include "loss/cross_entropy_softcap.h"
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

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Two f32 ulps relative: the floor of per-token losses and lse (see the top of
// the file).
constexpr double kTwoUlpsF32 = 0x1p-22;

// ---------------------------------------------------------------------------
// Elements of host images (the raw bytes of a tensor's memory).

using test::Bytes;
using test::IsPoison;
using test::Poison;

float LoadFloat(DType dtype, const Bytes& image, int64_t index) {
  return static_cast<float>(test::Load(dtype, image, index));
}

void StoreFloat(DType dtype, Bytes& image, int64_t index, float value) {
  test::Store(dtype, image, index, value);
}

float RoundTo(DType dtype, float value) {
  if (dtype == DType::kBF16) return Bf16BitsToFloat(FloatToBf16Bits(value));
  if (dtype == DType::kF16) return F16BitsToFloat(FloatToF16Bits(value));
  return value;
}

// The spacing of `dtype`'s values at |x| (subnormal spacing below the normal
// range).
double Ulp(DType dtype, double x) {
  const int mantissa_bits = dtype == DType::kBF16  ? 7
                            : dtype == DType::kF16 ? 10
                                                   : 23;
  const int min_exponent = dtype == DType::kF16 ? -14 : -126;
  const double magnitude = std::fabs(x);
  int exponent = magnitude > 0 && std::isfinite(magnitude)
                     ? std::ilogb(magnitude)
                     : min_exponent;
  exponent = std::max(exponent, min_exponent);
  return std::ldexp(1.0, exponent - mantissa_bits);
}

void StoreTarget(DType dtype, Bytes& image, int64_t index, int64_t value) {
  if (dtype == DType::kI64) {
    std::memcpy(image.data() + 8 * index, &value, 8);
  } else {
    const int32_t narrow = static_cast<int32_t>(value);
    std::memcpy(image.data() + 4 * index, &narrow, 4);
  }
}

// ---------------------------------------------------------------------------
// A problem: the inputs on the host, as the logits' dtype holds them.

struct Problem {
  DType dtype = DType::kF32;
  DType target_dtype = DType::kI64;
  int64_t tokens = 0;
  int64_t vocab = 0;
  int64_t stride = 0;  // elements between rows (>= vocab)
  // Elements before the first one (1: a misaligned base pointer).
  int64_t offset = 0;
  // [tokens, vocab], values exactly representable in dtype.
  std::vector<double> logits;
  std::vector<int64_t> targets;  // [tokens]
  std::vector<float> weights;    // [vocab], or empty for no class weights
  CrossEntropyOptions options;   // class_weights is set on upload

  // Elements the logits (and the gradient) span, and where (i, j) lives.
  int64_t Span() const { return offset + (tokens - 1) * stride + vocab; }
  int64_t Index(int64_t i, int64_t j) const { return offset + i * stride + j; }
  bool Counted(int64_t i) const {
    return targets[i] != options.ignore_index && targets[i] >= 0 &&
           targets[i] < vocab;
  }
};

Problem EmptyProblem(DType dtype, DType target_dtype, int64_t tokens,
                     int64_t vocab, int64_t pad = 0, int64_t offset = 0) {
  Problem p;
  p.dtype = dtype;
  p.target_dtype = target_dtype;
  p.tokens = tokens;
  p.vocab = vocab;
  p.stride = vocab + pad;
  p.offset = offset;
  p.logits.assign(tokens * vocab, 0.0);
  p.targets.assign(tokens, 0);
  return p;
}

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
  options.class_weights.assign(p.weights.begin(), p.weights.end());
  return options;
}

ReferenceResult Reference(const Problem& p,
                          const std::vector<double>& grad_loss = {},
                          const std::vector<double>& saved_lse = {}) {
  return CrossEntropyReference(p.logits, p.targets, p.vocab, RefOptions(p),
                               grad_loss,
                               /*with_grad=*/true, saved_lse);
}

// ---------------------------------------------------------------------------
// The problem on a backend: every tensor's memory there, with a host image of
// it.

struct Array {
  DType dtype = DType::kF32;
  Bytes host;
  Buffer buffer;
  void* At(int64_t element) const {
    return static_cast<char*>(buffer.data()) + element * DTypeSize(dtype);
  }
};

// Copies raw bytes through CopyTensor (as 2-byte elements: every image here has
// even size).
absl::Status CopyBytes(Context& context, const void* src, Device src_device,
                       void* dst, Device dst_device, int64_t bytes) {
  const Tensor from =
      Tensor::Of(const_cast<void*>(src), DType::kF16, {bytes / 2}, src_device);
  const Tensor to = Tensor::Of(dst, DType::kF16, {bytes / 2}, dst_device);
  return CopyTensor(from, to, context);
}

class Harness {
 public:
  static absl::StatusOr<std::unique_ptr<Harness>> Create(
      const Device& device, const Problem& problem) {
    auto harness = std::unique_ptr<Harness>(new Harness(problem));
    ASSIGN_OR_RETURN(harness->context_, Context::Create(device));
    RETURN_IF_ERROR(harness->Init());
    return harness;
  }

  Context& context() { return *context_; }
  const Problem& problem() const { return p_; }
  Device device() const { return context_->device(); }

  // Views on the backend.
  Tensor logits, targets, loss, lse, grad, grad_loss;
  // The problem's options, with class_weights on the backend.
  CrossEntropyOptions options;

  // Poisons loss, lse and grad (host images and backend memory).
  absl::Status PoisonOutputs() {
    for (Array* array : {&loss_, &lse_, &grad_}) {
      Poison(array->dtype, array->host);
      RETURN_IF_ERROR(Upload(*array));
    }
    return absl::OkStatus();
  }
  // Reads loss, lse and grad back into the host images.
  absl::Status DownloadOutputs() {
    for (Array* array : {&loss_, &lse_, &grad_})
      RETURN_IF_ERROR(Download(*array));
    return absl::OkStatus();
  }
  // The fused call with lse and gradient, then its outputs read back.
  absl::Status ForwardBackwardAndDownload() {
    RETURN_IF_ERROR(CrossEntropyForwardBackward(context(), logits, targets,
                                                options, loss, &lse, grad));
    return DownloadOutputs();
  }
  // Sets the saved lse (an input of Backward) from `values` [tokens].
  absl::Status SetLse(const std::vector<float>& values) {
    for (int64_t i = 0; i < p_.tokens; ++i)
      StoreFloat(DType::kF32, lse_.host, p_.offset + i, values[i]);
    return Upload(lse_);
  }
  absl::Status SetGradLoss(const std::vector<double>& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      StoreFloat(DType::kF32, grad_loss_.host, i,
                 static_cast<float>(values[i]));
    }
    return Upload(grad_loss_);
  }
  // A fresh copy of the logits memory (padding included) for an in-place call;
  // its view has the logits' layout.
  absl::StatusOr<std::pair<std::unique_ptr<Array>, Tensor>> LogitsCopy() {
    auto copy = std::make_unique<Array>();
    copy->dtype = logits_.dtype;
    copy->host = logits_.host;
    ASSIGN_OR_RETURN(copy->buffer,
                     context_->allocator().Allocate(copy->host.size()));
    RETURN_IF_ERROR(Upload(*copy));
    Tensor view = logits;
    view.data = copy->At(p_.offset);
    return std::make_pair(std::move(copy), view);
  }
  absl::Status Upload(Array& array) {
    return CopyBytes(*context_, array.host.data(), Device::Cpu(),
                     array.buffer.data(), device(), array.host.size());
  }
  absl::Status Download(Array& array) {
    return CopyBytes(*context_, array.buffer.data(), device(),
                     array.host.data(), Device::Cpu(), array.host.size());
  }

  std::vector<float> LossValues() const {
    std::vector<float> values(loss.numel());
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = LoadFloat(DType::kF32, loss_.host, i);
    return values;
  }
  std::vector<float> LseValues() const {
    std::vector<float> values(p_.tokens);
    for (int64_t i = 0; i < p_.tokens; ++i)
      values[i] = LoadFloat(DType::kF32, lse_.host, p_.offset + i);
    return values;
  }
  const Bytes& logits_image() const { return logits_.host; }
  const Bytes& loss_image() const { return loss_.host; }
  const Bytes& lse_image() const { return lse_.host; }
  const Bytes& grad_image() const { return grad_.host; }
  // Host image of the targets (to corrupt for bad-input tests) and its upload.
  Bytes& targets_image() { return targets_.host; }
  absl::Status UploadTargets() { return Upload(targets_); }
  Bytes& weights_image() { return weights_.host; }
  absl::Status UploadWeights() { return Upload(weights_); }
  // The logits memory as it is now on the backend.
  absl::StatusOr<Bytes> ReadLogits() {
    Array copy;
    copy.dtype = logits_.dtype;
    copy.host.resize(logits_.host.size());
    RETURN_IF_ERROR(CopyBytes(*context_, logits_.buffer.data(), device(),
                              copy.host.data(), Device::Cpu(),
                              copy.host.size()));
    return copy.host;
  }

 private:
  explicit Harness(Problem problem) : p_(std::move(problem)) {}

  absl::Status Alloc(Array& array, DType dtype, int64_t elements) {
    array.dtype = dtype;
    array.host.assign(std::max<int64_t>(elements, 1) * DTypeSize(dtype), 0);
    ASSIGN_OR_RETURN(array.buffer,
                     context_->allocator().Allocate(array.host.size()));
    return absl::OkStatus();
  }

  absl::Status Init() {
    const Device dev = device();
    const int64_t tokens = p_.tokens, vocab = p_.vocab;
    // Logits: poisoned padding (a read of it would turn the loss NaN), values
    // in the rows.
    RETURN_IF_ERROR(Alloc(logits_, p_.dtype, p_.Span()));
    Poison(p_.dtype, logits_.host);
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t j = 0; j < vocab; ++j) {
        StoreFloat(p_.dtype, logits_.host, p_.Index(i, j),
                   static_cast<float>(p_.logits[i * vocab + j]));
      }
    }
    RETURN_IF_ERROR(Upload(logits_));
    logits = Tensor::Of(logits_.At(p_.offset), p_.dtype, {tokens, vocab}, dev,
                        p_.stride);

    RETURN_IF_ERROR(Alloc(targets_, p_.target_dtype, p_.offset + tokens));
    for (int64_t i = 0; i < tokens; ++i)
      StoreTarget(p_.target_dtype, targets_.host, p_.offset + i, p_.targets[i]);
    RETURN_IF_ERROR(Upload(targets_));
    targets =
        Tensor::Of(targets_.At(p_.offset), p_.target_dtype, {tokens}, dev);

    // Loss and grad_loss memory holds [tokens] whatever the reduction
    // (bad-input tests give them the wrong shape).
    const bool per_token = p_.options.reduction == Reduction::kNone;
    RETURN_IF_ERROR(Alloc(loss_, DType::kF32, tokens));
    loss = Tensor::Of(loss_.At(0), DType::kF32,
                      per_token ? Shape{tokens} : Shape{}, dev);
    RETURN_IF_ERROR(Alloc(grad_loss_, DType::kF32, tokens));
    grad_loss = Tensor::Of(grad_loss_.At(0), DType::kF32,
                           per_token ? Shape{tokens} : Shape{}, dev);
    RETURN_IF_ERROR(Alloc(lse_, DType::kF32, p_.offset + tokens));
    lse = Tensor::Of(lse_.At(p_.offset), DType::kF32, {tokens}, dev);
    RETURN_IF_ERROR(Alloc(grad_, p_.dtype, p_.Span()));
    grad = Tensor::Of(grad_.At(p_.offset), p_.dtype, {tokens, vocab}, dev,
                      p_.stride);

    options = p_.options;
    if (!p_.weights.empty()) {
      RETURN_IF_ERROR(Alloc(weights_, DType::kF32, vocab));
      for (int64_t j = 0; j < vocab; ++j)
        StoreFloat(DType::kF32, weights_.host, j, p_.weights[j]);
      RETURN_IF_ERROR(Upload(weights_));
      options.class_weights =
          Tensor::Of(weights_.At(0), DType::kF32, {vocab}, dev);
    }
    return PoisonOutputs();
  }

  Problem p_;
  std::unique_ptr<Context> context_;
  Array logits_, targets_, loss_, grad_loss_, lse_, grad_, weights_;
};

// ---------------------------------------------------------------------------
// Checks.

double LossRelTolerance(DType dtype) {
  return dtype == DType::kF32 ? 1e-6 : 1e-5;
}

// |actual - expected| <= tolerance, with NaN expected only by NaN and inf only
// by itself.
bool Close(double actual, double expected, double tolerance) {
  if (std::isnan(expected)) return std::isnan(actual);
  if (std::isinf(expected)) return actual == expected;
  return std::fabs(actual - expected) <= tolerance;
}

// What an f32 lse = max + log S is sure to within (relative to kTwoUlpsF32):
// the rounding of max and of log S, and log S's absolute error, which is S's
// relative error (S >= 1 carries a few ulps from the exps and the sum).
double LseMagnitude(const ReferenceResult& ref, int64_t i) {
  return std::fabs(ref.max_logit[i]) +
         std::fabs(ref.lse[i] - ref.max_logit[i]) + 1.0;
}

// The floor of token i's loss error: d loss_i / d lse times the lse's
// uncertainty, with the mean's scales when `scaled`.
double TokenLossFloor(const Problem& p, const ReferenceResult& ref, int64_t i,
                      bool scaled) {
  if (!p.Counted(i)) return 0.0;
  const double s = p.options.label_smoothing;
  const double w_t = p.weights.empty() ? 1.0 : p.weights[p.targets[i]];
  double ce = (1.0 - s) * w_t + s * ref.weight_total / p.vocab;
  double z = 2.0 * p.options.z_loss * std::fabs(ref.lse[i]);
  if (scaled && p.options.reduction == Reduction::kMean) {
    ce = ref.ce_denominator > 0 ? ce / ref.ce_denominator : 0.0;
    z = ref.z_denominator > 0 ? z / ref.z_denominator : 0.0;
  }
  return kTwoUlpsF32 * (ce + z) * LseMagnitude(ref, i);
}

testing::AssertionResult LossMatches(const Problem& p,
                                     const ReferenceResult& ref,
                                     const Bytes& image) {
  const double rel = LossRelTolerance(p.dtype);
  if (p.options.reduction != Reduction::kNone) {
    if (IsPoison(DType::kF32, image, 0))
      return testing::AssertionFailure() << "loss not written";
    const double actual = LoadFloat(DType::kF32, image, 0);
    double floor = 0.0;
    for (int64_t i = 0; i < p.tokens; ++i)
      floor += TokenLossFloor(p, ref, i, /*scaled=*/true);
    if (!Close(actual, ref.loss, rel * std::fabs(ref.loss) + floor)) {
      return testing::AssertionFailure()
             << "loss " << actual << ", reference " << ref.loss
             << " (relative error "
             << std::fabs(actual - ref.loss) / std::fabs(ref.loss) << ")";
    }
    return testing::AssertionSuccess();
  }
  for (int64_t i = 0; i < p.tokens; ++i) {
    if (IsPoison(DType::kF32, image, i))
      return testing::AssertionFailure() << "loss[" << i << "] not written";
    const double actual = LoadFloat(DType::kF32, image, i);
    const double expected = ref.token_loss[i];
    const double tolerance =
        rel * std::fabs(expected) + TokenLossFloor(p, ref, i, /*scaled=*/false);
    if (!Close(actual, expected, tolerance)) {
      return testing::AssertionFailure()
             << "loss[" << i << "] " << actual << ", reference " << expected
             << " (target " << p.targets[i] << ", tolerance " << tolerance
             << ")";
    }
  }
  return testing::AssertionSuccess();
}

// lse is written for every token, ignored ones included.
testing::AssertionResult LseMatches(const Problem& p,
                                    const ReferenceResult& ref,
                                    const Bytes& image) {
  const double rel = LossRelTolerance(p.dtype);
  for (int64_t i = 0; i < p.tokens; ++i) {
    if (IsPoison(DType::kF32, image, p.offset + i)) {
      return testing::AssertionFailure() << "lse[" << i << "] not written";
    }
    const double actual = LoadFloat(DType::kF32, image, p.offset + i);
    const double tolerance =
        rel * std::fabs(ref.lse[i]) + kTwoUlpsF32 * LseMagnitude(ref, i);
    if (!Close(actual, ref.lse[i], tolerance)) {
      return testing::AssertionFailure()
             << "lse[" << i << "] " << actual << ", reference " << ref.lse[i];
    }
  }
  return testing::AssertionSuccess();
}

// The gradient in `image` (the problem's layout) against the reference's, on
// the rows where `rows` is true (all when empty).
testing::AssertionResult GradMatches(const Problem& p, const Bytes& image,
                                     const ReferenceResult& reference,
                                     const std::vector<bool>& rows = {}) {
  const std::vector<double>& ref = reference.grad;  // [tokens, vocab]
  auto checked = [&](int64_t i) { return rows.empty() || rows[i]; };
  // With softcap, z = cap tanh(x / cap) is an f32 result, off by up to ~2 f32
  // ulps of |z| <= cap (tanh's error and the rounding); exp turns that into the
  // same relative error of p_j, so of the part of the gradient proportional to
  // p_j.
  const double z_error =
      p.options.softcap > 0 ? 2.0 * Ulp(DType::kF32, p.options.softcap) : 0.0;
  double max_ref = 0.0;
  for (int64_t i = 0; i < p.tokens; ++i) {
    if (!checked(i)) continue;
    for (int64_t j = 0; j < p.vocab; ++j) {
      const double r = ref[i * p.vocab + j];
      if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
    }
  }
  double diff_squares = 0.0, ref_squares = 0.0, softmax_squares = 0.0;
  int failures = 0;
  testing::AssertionResult result = testing::AssertionFailure();
  for (int64_t i = 0; i < p.tokens; ++i) {
    if (!checked(i)) continue;
    for (int64_t j = 0; j < p.vocab; ++j) {
      const int64_t index = p.Index(i, j);
      const double r = ref[i * p.vocab + j];
      if (IsPoison(p.dtype, image, index)) {
        if (failures++ < 5)
          result << "grad[" << i << ", " << j << "] not written; ";
        continue;
      }
      const double actual = LoadFloat(p.dtype, image, index);
      // Rounding to a 16-bit dtype moves an element by up to half a unit in the
      // last place; with the f32 computation's error it may round the other
      // way: one ulp.
      const double tolerance =
          1e-6 * max_ref +
          z_error * std::fabs(reference.grad_softmax_part[i * p.vocab + j]) +
          (p.dtype == DType::kF32 ? 0.0 : Ulp(p.dtype, r));
      if (!Close(actual, r, tolerance)) {
        if (failures++ < 5) {
          result << "grad[" << i << ", " << j << "] " << actual
                 << ", reference " << r << " (target " << p.targets[i]
                 << ", tolerance " << tolerance << "); ";
        }
        continue;
      }
      if (std::isfinite(r)) {
        const double softmax_part =
            reference.grad_softmax_part[i * p.vocab + j];
        diff_squares += (actual - r) * (actual - r);
        ref_squares += r * r;
        softmax_squares += softmax_part * softmax_part;
      }
    }
  }
  if (failures > 0) return result << failures << " elements wrong";
  const double norm_tolerance =
      1e-5 * std::sqrt(ref_squares) + z_error * std::sqrt(softmax_squares);
  if (p.dtype == DType::kF32 && std::sqrt(diff_squares) > norm_tolerance) {
    return testing::AssertionFailure()
           << "gradient error norm " << std::sqrt(diff_squares) << " above "
           << norm_tolerance << " (reference's norm " << std::sqrt(ref_squares)
           << ")";
  }
  return testing::AssertionSuccess();
}

// Every element of `image` outside the rows (padding, the misaligned lead
// element) equals the same element of `expected`.
testing::AssertionResult PaddingUnchanged(const Problem& p, const Bytes& image,
                                          const Bytes& expected) {
  const int64_t size = DTypeSize(p.dtype);
  std::vector<bool> in_row(p.Span(), false);
  for (int64_t i = 0; i < p.tokens; ++i) {
    std::fill(in_row.begin() + p.Index(i, 0),
              in_row.begin() + p.Index(i, p.vocab), true);
  }
  for (int64_t e = 0; e < p.Span(); ++e) {
    if (!in_row[e] && std::memcmp(image.data() + e * size,
                                  expected.data() + e * size, size) != 0) {
      return testing::AssertionFailure()
             << "element " << e << " outside the rows was written";
    }
  }
  return testing::AssertionSuccess();
}

testing::AssertionResult AllPoison(DType dtype, const Bytes& image,
                                   const char* name) {
  for (size_t e = 0; e * DTypeSize(dtype) < image.size(); ++e) {
    if (!IsPoison(dtype, image, e))
      return testing::AssertionFailure()
             << name << " element " << e << " was written";
  }
  return testing::AssertionSuccess();
}

std::vector<double> ToDouble(const std::vector<float>& values) {
  return {values.begin(), values.end()};
}

// ---------------------------------------------------------------------------
// Parameterized cases.

enum class OptionSet {
  kPlain,
  kIgnore,
  kSmoothing,
  kZLoss,
  kSoftcap,
  kWeights,
  kWeightsSmoothingIgnore,
  kEverything,  // weights, smoothing, ignore_index, z-loss and softcap together
};

const char* OptionSetName(OptionSet set) {
  switch (set) {
    case OptionSet::kPlain:
      return "plain";
    case OptionSet::kIgnore:
      return "ignore";
    case OptionSet::kSmoothing:
      return "smooth";
    case OptionSet::kZLoss:
      return "zloss";
    case OptionSet::kSoftcap:
      return "softcap";
    case OptionSet::kWeights:
      return "weights";
    case OptionSet::kWeightsSmoothingIgnore:
      return "weights_smooth_ignore";
    case OptionSet::kEverything:
      return "all";
  }
  return "?";
}

const char* ReductionName(Reduction reduction) {
  return reduction == Reduction::kMean  ? "mean"
         : reduction == Reduction::kSum ? "sum"
                                        : "none";
}

struct Scenario {
  bool cuda = false;
  DType dtype = DType::kF32;
  DType target_dtype = DType::kI64;
  OptionSet options = OptionSet::kPlain;
  Reduction reduction = Reduction::kMean;
  int64_t tokens = 1;
  int64_t vocab = 1;
  int64_t pad = 0;  // row stride = vocab + pad
  // Every tensor starts one element past an aligned address.
  bool misaligned = false;
};

std::string ScenarioName(const testing::TestParamInfo<Scenario>& info) {
  const Scenario& s = info.param;
  return absl::StrCat(s.cuda ? "cuda" : "cpu", "_", DTypeName(s.dtype), "_",
                      DTypeName(s.target_dtype), "_", OptionSetName(s.options),
                      "_", ReductionName(s.reduction), "_T", s.tokens, "_V",
                      s.vocab, s.pad > 0 ? absl::StrCat("_pad", s.pad) : "",
                      s.misaligned ? "_misaligned" : "");
}

void PrintTo(const Scenario& s, std::ostream* os) {
  *os << ScenarioName(testing::TestParamInfo<Scenario>(s, 0));
}

bool Has(OptionSet set, OptionSet feature) {
  switch (feature) {
    case OptionSet::kIgnore:
    case OptionSet::kSmoothing:
    case OptionSet::kWeights:
      return set == feature || set == OptionSet::kWeightsSmoothingIgnore ||
             set == OptionSet::kEverything;
    case OptionSet::kZLoss:
    case OptionSet::kSoftcap:
      return set == feature || set == OptionSet::kEverything;
    default:
      return set == feature;
  }
}

// Logits like a language model's: normal with a stddev of 2 to 4; for 7 tokens
// or more, row 1 has its target far ahead of the rest (p_t near 1) and row 3 a
// non-target.
Problem MakeProblem(const Scenario& s, std::mt19937_64& rng) {
  Problem p = EmptyProblem(s.dtype, s.target_dtype, s.tokens, s.vocab, s.pad,
                           s.misaligned ? 1 : 0);
  p.options.reduction = s.reduction;
  const bool ignore = Has(s.options, OptionSet::kIgnore);
  if (Has(s.options, OptionSet::kSmoothing)) {
    p.options.label_smoothing =
        s.options == OptionSet::kWeightsSmoothingIgnore ? 0.3f : 0.1f;
  }
  if (Has(s.options, OptionSet::kZLoss)) p.options.z_loss = 1e-2f;
  if (Has(s.options, OptionSet::kSoftcap)) p.options.softcap = 20.0f;
  if (Has(s.options, OptionSet::kWeights)) {
    std::uniform_real_distribution<float> weight(0.25f, 2.0f);
    p.weights.resize(s.vocab);
    for (float& w : p.weights) w = weight(rng);
    if (s.vocab >= 3) p.weights[0] = 0.0f;  // zero weights are allowed
  }

  std::uniform_real_distribution<double> stddev_draw(2.0, 4.0);
  std::normal_distribution<double> normal(0.0, stddev_draw(rng));
  std::uniform_int_distribution<int64_t> target(0, s.vocab - 1);
  std::bernoulli_distribution ignored(0.25);
  for (int64_t i = 0; i < s.tokens; ++i) {
    p.targets[i] = target(rng);
    for (int64_t j = 0; j < s.vocab; ++j) {
      p.logits[i * s.vocab + j] =
          RoundTo(s.dtype, static_cast<float>(normal(rng)));
    }
  }
  const bool dominant_rows = s.tokens >= 7 && s.vocab >= 2;
  if (dominant_rows) {
    for (int64_t i : {1, 3}) {
      double* row = p.logits.data() + i * s.vocab;
      const double max = *std::max_element(row, row + s.vocab);
      const int64_t at = i == 1 ? p.targets[i] : (p.targets[i] + 1) % s.vocab;
      row[at] = RoundTo(
          s.dtype, static_cast<float>(
                       max + std::log(static_cast<double>(s.vocab)) + 10.0));
    }
  }
  if (ignore && s.tokens >= 2) {
    bool any_ignored = false, any_counted = false;
    for (int64_t i = 0; i < s.tokens; ++i) {
      if (dominant_rows && (i == 1 || i == 3))
        continue;  // those two stay counted
      if (ignored(rng)) {
        p.targets[i] = p.options.ignore_index;
        any_ignored = true;
      } else {
        any_counted = true;
      }
    }
    if (!any_ignored) p.targets[s.tokens - 1] = p.options.ignore_index;
    if (!any_counted && !dominant_rows) p.targets[0] = 0;
  }
  return p;
}

class CrossEntropyCaseTest : public testing::TestWithParam<Scenario> {};

TEST_P(CrossEntropyCaseTest, MatchesReference) {
  const Scenario& s = GetParam();
  if (s.cuda) SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(test::TestSeed());
  const Problem p = MakeProblem(s, rng);
  absl::StatusOr<std::unique_ptr<Harness>> created =
      Harness::Create(s.cuda ? Device::Cuda(0) : Device::Cpu(), p);
  ASSERT_OK(created.status());
  Harness& h = **created;
  Context& context = h.context();
  const ReferenceResult ref = Reference(p);

  // An incoming gradient: one value for mean/sum, one per token (some negative)
  // for none.
  std::vector<double> grad_loss;
  if (s.reduction == Reduction::kNone) {
    std::uniform_real_distribution<float> g(-1.0f, 2.0f);
    for (int64_t i = 0; i < p.tokens; ++i) grad_loss.push_back(g(rng));
  } else {
    grad_loss.push_back(std::uniform_real_distribution<float>(0.5f, 2.0f)(rng));
  }
  ASSERT_OK(h.SetGradLoss(grad_loss));

  // Forward with lse: writes loss and lse, nothing else.
  ASSERT_OK(CrossEntropyForward(context, h.logits, h.targets, h.options, h.loss,
                                &h.lse));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(LossMatches(p, ref, h.loss_image())) << "Forward";
  EXPECT_TRUE(LseMatches(p, ref, h.lse_image())) << "Forward";
  EXPECT_TRUE(AllPoison(p.dtype, h.grad_image(), "grad")) << "Forward";
  const std::vector<float> saved_lse = h.LseValues();

  // Forward without lse.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(
      CrossEntropyForward(context, h.logits, h.targets, h.options, h.loss));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(LossMatches(p, ref, h.loss_image())) << "Forward without lse";
  EXPECT_TRUE(AllPoison(DType::kF32, h.lse_image(), "lse"))
      << "Forward without lse";

  // ForwardBackward: the gradient of the loss itself.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(CrossEntropyForwardBackward(context, h.logits, h.targets, h.options,
                                        h.loss, &h.lse, h.grad));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(LossMatches(p, ref, h.loss_image())) << "ForwardBackward";
  EXPECT_TRUE(LseMatches(p, ref, h.lse_image())) << "ForwardBackward";
  EXPECT_TRUE(GradMatches(p, h.grad_image(), ref)) << "ForwardBackward";
  Bytes poisoned_grad(h.grad_image().size());
  Poison(p.dtype, poisoned_grad);
  EXPECT_TRUE(PaddingUnchanged(p, h.grad_image(), poisoned_grad))
      << "ForwardBackward";
  const Bytes loss_bytes = h.loss_image(), lse_bytes = h.lse_image(),
              grad_bytes = h.grad_image();

  // The same call again: the same bytes.
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(CrossEntropyForwardBackward(context, h.logits, h.targets, h.options,
                                        h.loss, &h.lse, h.grad));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(h.loss_image() == loss_bytes)
      << "loss differs between two identical calls";
  EXPECT_TRUE(h.lse_image() == lse_bytes)
      << "lse differs between two identical calls";
  EXPECT_TRUE(h.grad_image() == grad_bytes)
      << "grad differs between two identical calls";

  // ForwardBackward scaled by grad_loss.
  const ReferenceResult ref_scaled = Reference(p, grad_loss);
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(CrossEntropyForwardBackward(context, h.logits, h.targets, h.options,
                                        h.loss, &h.lse, h.grad, &h.grad_loss));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(LossMatches(p, ref, h.loss_image()))
      << "ForwardBackward with grad_loss";
  EXPECT_TRUE(GradMatches(p, h.grad_image(), ref_scaled))
      << "ForwardBackward with grad_loss";

  // Backward from the saved lse: the reference builds the gradient from the
  // same f32 lse.
  const ReferenceResult ref_backward =
      Reference(p, grad_loss, ToDouble(saved_lse));
  ASSERT_OK(h.PoisonOutputs());
  ASSERT_OK(h.SetLse(saved_lse));
  ASSERT_OK(CrossEntropyBackward(context, h.logits, h.targets, h.lse,
                                 h.grad_loss, h.options, h.grad));
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(GradMatches(p, h.grad_image(), ref_backward)) << "Backward";
  EXPECT_TRUE(PaddingUnchanged(p, h.grad_image(), poisoned_grad)) << "Backward";
  EXPECT_TRUE(AllPoison(DType::kF32, h.loss_image(), "loss")) << "Backward";

  // In place: grad_logits = logits, for ForwardBackward and Backward.
  {
    absl::StatusOr<std::pair<std::unique_ptr<Array>, Tensor>> copy =
        h.LogitsCopy();
    ASSERT_OK(copy.status());
    auto& [memory, view] = *copy;
    ASSERT_OK(h.PoisonOutputs());
    ASSERT_OK(CrossEntropyForwardBackward(context, view, h.targets, h.options,
                                          h.loss, &h.lse, view));
    ASSERT_OK(h.Download(*memory));
    EXPECT_TRUE(GradMatches(p, memory->host, ref))
        << "in-place ForwardBackward";
    EXPECT_TRUE(PaddingUnchanged(p, memory->host, h.logits_image()))
        << "in-place ForwardBackward";
    ASSERT_OK(h.DownloadOutputs());
    EXPECT_TRUE(LossMatches(p, ref, h.loss_image()))
        << "in-place ForwardBackward";
  }
  {
    absl::StatusOr<std::pair<std::unique_ptr<Array>, Tensor>> copy =
        h.LogitsCopy();
    ASSERT_OK(copy.status());
    auto& [memory, view] = *copy;
    ASSERT_OK(h.SetLse(saved_lse));
    ASSERT_OK(CrossEntropyBackward(context, view, h.targets, h.lse, h.grad_loss,
                                   h.options, view));
    ASSERT_OK(h.Download(*memory));
    EXPECT_TRUE(GradMatches(p, memory->host, ref_backward))
        << "in-place Backward";
    EXPECT_TRUE(PaddingUnchanged(p, memory->host, h.logits_image()))
        << "in-place Backward";
  }
}

std::vector<Scenario> AllScenarios() {
  std::vector<Scenario> scenarios;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  const Reduction reductions[] = {Reduction::kMean, Reduction::kSum,
                                  Reduction::kNone};
  const OptionSet all_options[] = {OptionSet::kPlain,
                                   OptionSet::kIgnore,
                                   OptionSet::kSmoothing,
                                   OptionSet::kZLoss,
                                   OptionSet::kSoftcap,
                                   OptionSet::kWeights,
                                   OptionSet::kWeightsSmoothingIgnore,
                                   OptionSet::kEverything};
  for (bool cuda : {false, true}) {
    // Every dtype x target dtype x options x reduction, on a tiny and a
    // mid-sized shape.
    for (DType dtype : dtypes) {
      for (DType target_dtype : {DType::kI64, DType::kI32}) {
        for (OptionSet options : all_options) {
          for (Reduction reduction : reductions) {
            scenarios.push_back(
                {cuda, dtype, target_dtype, options, reduction, 7, 3});
            scenarios.push_back(
                {cuda, dtype, target_dtype, options, reduction, 16, 4096});
          }
        }
      }
    }
    // Awkward shapes and layouts, plain and with every option.
    struct ShapeCase {
      int64_t tokens, vocab, pad;
      bool misaligned;
    };
    const ShapeCase shapes[] = {
        {1, 1, 0, false},
        {7, 1, 0, false},
        {1, 3, 0, false},
        {64, 3, 5, true},
        {1, 4096, 0, false},
        {7, 4096, 8, false},
        {64, 4096, 0, true},
        {7, 1029, 3, true},
        {1, 50257, 0, false},
        {7, 50257, 0, false},
        {7, 50257, 3, true},
        // Rows too long for one tile of the GPU's largest (8-CTA) cluster,
        // which it holds in two tiles.
        {5, 200003, 0, false},
        {3, 270001, 0, false},
    };
    for (const ShapeCase& shape : shapes) {
      for (DType dtype : dtypes) {
        for (OptionSet options : {OptionSet::kPlain, OptionSet::kEverything}) {
          for (Reduction reduction : {Reduction::kMean, Reduction::kNone}) {
            const DType target_dtype =
                shape.misaligned ? DType::kI32 : DType::kI64;
            scenarios.push_back({cuda, dtype, target_dtype, options, reduction,
                                 shape.tokens, shape.vocab, shape.pad,
                                 shape.misaligned});
          }
        }
      }
    }
    // Contiguous rows of odd vocabularies start inside a 16-byte piece and
    // take the plain vectorized kernels, each row viewed from its piece's
    // start: with ignored targets, class weights and the z-loss too, which
    // keep those kernels (the options that touch every logit take the scalar
    // ones, above).
    for (int64_t vocab : {int64_t{3}, int64_t{1029}, int64_t{50257}}) {
      for (DType dtype : dtypes) {
        for (OptionSet options :
             {OptionSet::kIgnore, OptionSet::kWeights, OptionSet::kZLoss}) {
          scenarios.push_back(
              {cuda, dtype, DType::kI64, options, Reduction::kMean, 9, vocab});
        }
      }
    }
    // A full-size batch of GPT-2's vocabulary.
    for (DType dtype : dtypes) {
      scenarios.push_back({cuda, dtype, DType::kI64, OptionSet::kPlain,
                           Reduction::kMean, 64, 50257});
    }
  }
  return scenarios;
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyCaseTest,
                         testing::ValuesIn(AllScenarios()), ScenarioName);

// ---------------------------------------------------------------------------
// Special values, bad inputs and gradient checks, on each backend.

class CrossEntropyTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) SKIP_WITHOUT_GPU();
  }
  Device device() const { return GetParam() ? Device::Cuda(0) : Device::Cpu(); }
};

std::string BackendName(const testing::TestParamInfo<bool>& info) {
  return info.param ? "cuda" : "cpu";
}

// Fills `p` with normal logits (stddev 3) and uniform targets.
void FillRandom(Problem& p, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_int_distribution<int64_t> target(0, p.vocab - 1);
  for (double& x : p.logits)
    x = RoundTo(p.dtype, static_cast<float>(normal(rng)));
  for (int64_t& t : p.targets) t = target(rng);
}

// A harness for `p` on `device` after ForwardBackward and the download of its
// outputs.
absl::StatusOr<std::unique_ptr<Harness>> ForwardBackwardHarness(
    const Device& device, const Problem& p) {
  ASSIGN_OR_RETURN(std::unique_ptr<Harness> h, Harness::Create(device, p));
  RETURN_IF_ERROR(h->ForwardBackwardAndDownload());
  return h;
}

// Runs ForwardBackward on `p` and checks loss, lse and gradient against the
// reference on the rows where `rows` is true (all when empty; the reduced loss
// only then).
void ExpectForwardBackwardMatches(const Device& device, const Problem& p,
                                  const std::vector<bool>& rows = {}) {
  absl::StatusOr<std::unique_ptr<Harness>> created = Harness::Create(device, p);
  ASSERT_OK(created.status());
  Harness& h = **created;
  const ReferenceResult ref = Reference(p);
  ASSERT_OK(h.ForwardBackwardAndDownload());
  if (rows.empty()) {
    EXPECT_TRUE(LossMatches(p, ref, h.loss_image()));
    EXPECT_TRUE(LseMatches(p, ref, h.lse_image()));
  } else {
    ASSERT_EQ(p.options.reduction, Reduction::kNone);
    for (int64_t i = 0; i < p.tokens; ++i) {
      if (!rows[i]) continue;
      const double actual = LoadFloat(DType::kF32, h.loss_image(), i);
      EXPECT_TRUE(Close(actual, ref.token_loss[i],
                        1e-6 * std::fabs(ref.token_loss[i]) +
                            TokenLossFloor(p, ref, i, /*scaled=*/false)))
          << "loss[" << i << "] " << actual << ", reference "
          << ref.token_loss[i];
    }
  }
  EXPECT_TRUE(GradMatches(p, h.grad_image(), ref, rows));
}

TEST_P(CrossEntropyTest, AllIgnoredGivesZeroLossAndGradient) {
  std::mt19937_64 rng(test::TestSeed());
  for (Reduction reduction :
       {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (bool everything : {false, true}) {
      SCOPED_TRACE(absl::StrCat(ReductionName(reduction),
                                everything ? " with every option" : ""));
      Problem p = EmptyProblem(DType::kF32, DType::kI64, 6, 13);
      FillRandom(p, rng);
      for (int64_t& t : p.targets) t = p.options.ignore_index;
      p.options.reduction = reduction;
      if (everything) {
        p.options.label_smoothing = 0.2f;
        p.options.z_loss = 1e-2f;
        p.options.softcap = 10.0f;
        p.weights.assign(p.vocab, 1.5f);
      }
      absl::StatusOr<std::unique_ptr<Harness>> created =
          Harness::Create(device(), p);
      ASSERT_OK(created.status());
      Harness& h = **created;
      ASSERT_OK(h.SetGradLoss(std::vector<double>(p.tokens, 1.0)));
      ASSERT_OK(h.ForwardBackwardAndDownload());
      for (float loss : h.LossValues()) EXPECT_EQ(loss, 0.0f);
      EXPECT_TRUE(LseMatches(p, Reference(p), h.lse_image()));
      for (int64_t i = 0; i < p.tokens; ++i) {
        for (int64_t j = 0; j < p.vocab; ++j)
          ASSERT_EQ(LoadFloat(p.dtype, h.grad_image(), p.Index(i, j)), 0.0f);
      }
      ASSERT_OK(h.PoisonOutputs());
      ASSERT_OK(h.SetLse(std::vector<float>(p.tokens, 3.0f)));
      ASSERT_OK(CrossEntropyBackward(h.context(), h.logits, h.targets, h.lse,
                                     h.grad_loss, h.options, h.grad));
      ASSERT_OK(h.DownloadOutputs());
      for (int64_t i = 0; i < p.tokens; ++i) {
        for (int64_t j = 0; j < p.vocab; ++j)
          ASSERT_EQ(LoadFloat(p.dtype, h.grad_image(), p.Index(i, j)), 0.0f);
      }
    }
  }
}

// Class weights that are 0 on every counted target: the cross-entropy part's
// denominator is 0 and contributes 0; the z-loss part still counts.
TEST_P(CrossEntropyTest, ZeroWeightDenominator) {
  std::mt19937_64 rng(test::TestSeed());
  Problem p = EmptyProblem(DType::kF32, DType::kI64, 5, 9);
  FillRandom(p, rng);
  p.weights.assign(p.vocab, 1.0f);
  for (int64_t& t : p.targets) t = 2;
  p.targets[4] = p.options.ignore_index;
  p.weights[2] = 0.0f;
  p.options.z_loss = 1e-2f;
  p.options.label_smoothing = 0.1f;
  ExpectForwardBackwardMatches(device(), p);
}

// An ignore_index inside the vocabulary: its tokens are ignored, its class
// still counts in the smoothing term of the others.
TEST_P(CrossEntropyTest, IgnoreIndexInsideVocabulary) {
  std::mt19937_64 rng(test::TestSeed());
  for (Reduction reduction : {Reduction::kMean, Reduction::kNone}) {
    Problem p = EmptyProblem(DType::kF32, DType::kI32, 9, 7);
    FillRandom(p, rng);
    p.options.ignore_index = 2;
    p.options.reduction = reduction;
    p.options.label_smoothing = 0.2f;
    p.targets[0] = p.targets[5] = 2;
    p.targets[1] = 3;
    ExpectForwardBackwardMatches(device(), p);
  }
}

// Logits of 1e30 (finite in f32 and bf16): max subtraction keeps everything
// finite.
TEST_P(CrossEntropyTest, HugeFiniteLogits) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (Reduction reduction : {Reduction::kMean, Reduction::kNone}) {
      for (bool smoothing : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ",
                                  ReductionName(reduction),
                                  smoothing ? " smoothing" : ""));
        Problem p = EmptyProblem(dtype, DType::kI64, 6, 37);
        FillRandom(p, rng);
        const double huge = RoundTo(dtype, 1e30f);
        auto at = [&](int64_t i, int64_t j) -> double& {
          return p.logits[i * p.vocab + (j % p.vocab)];
        };
        at(0, p.targets[0]) = huge;      // certain target
        at(1, p.targets[1] + 1) = huge;  // certain non-target
        // A tie with the target.
        at(2, p.targets[2]) = at(2, p.targets[2] + 2) = huge;
        at(3, p.targets[3]) = huge;  // both signs
        at(3, p.targets[3] + 1) = -huge;
        at(4, p.targets[4]) = -huge;  // hopeless target
        p.options.reduction = reduction;
        if (smoothing) p.options.label_smoothing = 0.1f;
        ExpectForwardBackwardMatches(device(), p);
      }
    }
  }
}

// -inf logits drop out of the softmax; a target at -inf has an infinite loss
// (and a finite gradient); a row of only -inf has lse -inf and a NaN loss.
TEST_P(CrossEntropyTest, NegativeInfinityLogits) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Problem p = EmptyProblem(dtype, DType::kI64, 5, 19);
    FillRandom(p, rng);
    p.options.reduction = Reduction::kNone;
    for (int64_t j = 0; j < p.vocab; j += 3) {
      if (j != p.targets[0]) p.logits[j] = -kInf;
    }
    p.logits[1 * p.vocab + p.targets[1]] = -kInf;
    for (int64_t j = 0; j < p.vocab; ++j) p.logits[2 * p.vocab + j] = -kInf;
    std::vector<bool> rows = {true, true, false, true, true};
    ExpectForwardBackwardMatches(device(), p, rows);

    absl::StatusOr<std::unique_ptr<Harness>> created =
        Harness::Create(device(), p);
    ASSERT_OK(created.status());
    Harness& h = **created;
    ASSERT_OK(CrossEntropyForward(h.context(), h.logits, h.targets, h.options,
                                  h.loss, &h.lse));
    ASSERT_OK(h.DownloadOutputs());
    EXPECT_EQ(h.LossValues()[1], std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(h.LossValues()[2]));
    EXPECT_EQ(h.LseValues()[2], -std::numeric_limits<float>::infinity());
    // Reduced, the infinite token makes the loss infinite.
    Problem reduced = p;
    reduced.options.reduction = Reduction::kSum;
    reduced.logits.resize(2 * p.vocab);
    reduced.targets.resize(2);
    reduced.tokens = 2;
    absl::StatusOr<std::unique_ptr<Harness>> summed =
        Harness::Create(device(), reduced);
    ASSERT_OK(summed.status());
    ASSERT_OK(CrossEntropyForward((*summed)->context(), (*summed)->logits,
                                  (*summed)->targets, (*summed)->options,
                                  (*summed)->loss));
    ASSERT_OK((*summed)->DownloadOutputs());
    EXPECT_EQ((*summed)->LossValues()[0],
              std::numeric_limits<float>::infinity());
  }
}

// A +inf logit takes all the probability, as in PyTorch: lse +inf, an infinite
// loss (NaN where the target itself is +inf), and a gradient of 0 at the
// finite logits, -1 (p_t - 1) at a finite target and NaN at the +inf one.
// Vocab 64 takes the fused fp32 kernel's kept exponentials, 32768 the fast
// forward sum, 37 the scalar kernels.
TEST_P(CrossEntropyTest, PositiveInfinityLogits) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t vocab : {37, 64, 32768}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " vocab ", vocab));
      Problem p = EmptyProblem(dtype, DType::kI64, 3, vocab);
      FillRandom(p, rng);
      p.options.reduction = Reduction::kNone;
      const int64_t inf_at = (p.targets[0] + 5) % p.vocab;
      p.logits[inf_at] = kInf;                      // row 0: not the target
      p.logits[1 * p.vocab + p.targets[1]] = kInf;  // row 1: the target
      absl::StatusOr<std::unique_ptr<Harness>> created =
          Harness::Create(device(), p);
      ASSERT_OK(created.status());
      Harness& h = **created;
      ASSERT_OK(h.ForwardBackwardAndDownload());
      constexpr float kPlusInf = std::numeric_limits<float>::infinity();
      EXPECT_EQ(h.LossValues()[0], kPlusInf);
      EXPECT_EQ(h.LseValues()[0], kPlusInf);
      EXPECT_TRUE(std::isnan(h.LossValues()[1]));
      EXPECT_EQ(h.LseValues()[1], kPlusInf);
      EXPECT_TRUE(std::isfinite(h.LossValues()[2]));
      for (int64_t j = 0; j < p.vocab; ++j) {
        const double g = LoadFloat(dtype, h.grad_image(), p.Index(0, j));
        if (j == inf_at) {
          EXPECT_TRUE(std::isnan(g)) << "logit " << j;
        } else {
          // (Eigen's exp gives ~3e-39, not 0, below its range.)
          EXPECT_NEAR(g, j == p.targets[0] ? -1.0 : 0.0, 1e-30)
              << "logit " << j;
        }
      }
      ASSERT_OK(CrossEntropyForward(h.context(), h.logits, h.targets, h.options,
                                    h.loss, &h.lse));
      ASSERT_OK(h.DownloadOutputs());
      EXPECT_EQ(h.LossValues()[0], kPlusInf) << "forward";
      EXPECT_EQ(h.LseValues()[0], kPlusInf) << "forward";
      EXPECT_TRUE(std::isnan(h.LossValues()[1])) << "forward";
    }
}

// A NaN logit makes its token's loss and gradient row NaN (as in PyTorch), and
// the reduced loss NaN; other tokens are unaffected.
TEST_P(CrossEntropyTest, NaNLogitsPropagate) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Reduction reduction : {Reduction::kNone, Reduction::kMean}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), " ", ReductionName(reduction)));
      Problem p = EmptyProblem(dtype, DType::kI64, 4, 23);
      FillRandom(p, rng);
      p.options.reduction = reduction;
      // Row 2: NaN away from the target; row 3: at the target.
      p.logits[2 * p.vocab + (p.targets[2] + 5) % p.vocab] = kNaN;
      p.logits[3 * p.vocab + p.targets[3]] = kNaN;
      absl::StatusOr<std::unique_ptr<Harness>> created =
          Harness::Create(device(), p);
      ASSERT_OK(created.status());
      Harness& h = **created;
      ASSERT_OK(h.ForwardBackwardAndDownload());
      const std::vector<float> loss = h.LossValues();
      if (reduction == Reduction::kNone) {
        EXPECT_TRUE(std::isfinite(loss[0]) && std::isfinite(loss[1]));
        EXPECT_TRUE(std::isnan(loss[2]));
        EXPECT_TRUE(std::isnan(loss[3]));
      } else {
        EXPECT_TRUE(std::isnan(loss[0]));
      }
      for (int64_t i : {2, 3}) {
        for (int64_t j = 0; j < p.vocab; ++j) {
          EXPECT_TRUE(
              std::isnan(LoadFloat(dtype, h.grad_image(), p.Index(i, j))))
              << i << ", " << j;
        }
      }
      const ReferenceResult ref = Reference(p);
      EXPECT_TRUE(
          GradMatches(p, h.grad_image(), ref, {true, true, false, false}));
    }
  }
}

// Targets outside [0, vocab) with validation off: a NaN loss for their tokens,
// no access out of bounds, the other tokens unaffected.
TEST_P(CrossEntropyTest, UnvalidatedOutOfRangeTargetsGiveNaN) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType target_dtype : {DType::kI64, DType::kI32}) {
    SCOPED_TRACE(DTypeName(target_dtype));
    Problem p = EmptyProblem(DType::kF32, target_dtype, 6, 17);
    FillRandom(p, rng);
    p.options.validate_targets = false;
    p.options.reduction = Reduction::kNone;
    p.weights.assign(p.vocab, 0.5f);
    p.options.label_smoothing = 0.1f;
    p.targets[1] = p.vocab;
    p.targets[3] = -1;
    p.targets[4] = target_dtype == DType::kI64
                       ? (int64_t{1} << 40)
                       : std::numeric_limits<int32_t>::max();
    p.targets[5] = target_dtype == DType::kI64
                       ? std::numeric_limits<int64_t>::min()
                       : std::numeric_limits<int32_t>::min();
    absl::StatusOr<std::unique_ptr<Harness>> created =
        Harness::Create(device(), p);
    ASSERT_OK(created.status());
    Harness& h = **created;
    ASSERT_OK(h.ForwardBackwardAndDownload());
    const std::vector<float> loss = h.LossValues();
    const ReferenceResult ref = Reference(p);
    for (int64_t i : {1, 3, 4, 5})
      EXPECT_TRUE(std::isnan(loss[i])) << "loss[" << i << "] " << loss[i];
    for (int64_t i : {0, 2})
      EXPECT_NEAR(loss[i], ref.token_loss[i], 1e-6 * ref.token_loss[i]);
    EXPECT_TRUE(GradMatches(p, h.grad_image(), ref,
                            {true, false, true, false, false, false}));

    Problem summed = p;
    summed.options.reduction = Reduction::kSum;
    absl::StatusOr<std::unique_ptr<Harness>> created_sum =
        Harness::Create(device(), summed);
    ASSERT_OK(created_sum.status());
    Harness& hs = **created_sum;
    ASSERT_OK(CrossEntropyForward(hs.context(), hs.logits, hs.targets,
                                  hs.options, hs.loss));
    ASSERT_OK(hs.DownloadOutputs());
    EXPECT_TRUE(std::isnan(hs.LossValues()[0]));
  }
}

// Tokens the model is nearly sure of (p_t = 1 - delta, delta down to 1e-7) with
// logits of a realistic size (lse ~ 20-30): the fused call's loss (~delta) and
// target gradient
// (~ -delta) keep their relative precision; computed as lse - z_t in f32 they
// would not.
// Both vocabularies and both calls: the fused call's one-CTA and cluster
// kernels and the forward's streaming kernel each redo such rows exactly.
TEST_P(CrossEntropyTest, NearCertainTargetsKeepPrecision) {
  std::mt19937_64 rng(test::TestSeed());
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (int64_t vocab : {8192, 40000}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " vocab ", vocab));
      Problem p = EmptyProblem(dtype, DType::kI64, 4, vocab);
      FillRandom(p, rng);
      p.options.reduction = Reduction::kNone;
      for (int64_t i = 0; i < p.tokens; ++i) {
        double* row = p.logits.data() + i * p.vocab;
        row[p.targets[i]] = -kInf;
        double rest = 0.0;  // log sum of the other exps
        const double max = *std::max_element(row, row + p.vocab);
        for (int64_t j = 0; j < p.vocab; ++j) rest += std::exp(row[j] - max);
        rest = max + std::log(rest);
        const double delta = std::pow(10.0, -1.0 - 2.0 * i);  // 1e-1 ... 1e-7
        row[p.targets[i]] =
            RoundTo(dtype, static_cast<float>(rest - std::log(delta)));
      }
      absl::StatusOr<std::unique_ptr<Harness>> created =
          ForwardBackwardHarness(device(), p);
      ASSERT_OK(created.status());
      Harness& h = **created;
      const ReferenceResult ref = Reference(p);
      for (int64_t i = 0; i < p.tokens; ++i) {
        const double loss = h.LossValues()[i];
        const double grad_t =
            LoadFloat(dtype, h.grad_image(), p.Index(i, p.targets[i]));
        const double ref_grad_t = ref.grad[i * p.vocab + p.targets[i]];
        EXPECT_NEAR(loss, ref.token_loss[i], 1e-5 * ref.token_loss[i])
            << "token " << i << " (1 - p_t = " << -ref_grad_t << ", lse "
            << ref.lse[i] << ")";
        EXPECT_NEAR(grad_t, ref_grad_t,
                    1e-5 * std::fabs(ref_grad_t) + Ulp(dtype, ref_grad_t))
            << "token " << i << " (lse " << ref.lse[i] << ")";
      }
      // The forward alone (another kernel) keeps the same precision.
      ASSERT_OK(CrossEntropyForward(h.context(), h.logits, h.targets, h.options,
                                    h.loss, &h.lse));
      ASSERT_OK(h.DownloadOutputs());
      for (int64_t i = 0; i < p.tokens; ++i) {
        EXPECT_NEAR(h.LossValues()[i], ref.token_loss[i],
                    1e-5 * ref.token_loss[i])
            << "forward, token " << i;
      }
    }
}

// A target of class weight 0 under label smoothing: its gradient is all
// softmax, coef * p_t, with nothing of the target's own term to hide it. With
// p_t small it must keep its digits (coef * expm1(d) + coef, exact near p_t =
// 1, loses all of them in f32). Flat logits keep every other element small, so
// the check is relative to the element itself. Both vocabularies (one CTA and a
// cluster in the fused call), ForwardBackward and Backward from the saved lse.
TEST_P(CrossEntropyTest, ZeroWeightTargetKeepsItsSoftmaxGradient) {
  std::mt19937_64 rng(test::TestSeed());
  std::normal_distribution<double> normal(0.0, 0.5);
  std::uniform_real_distribution<float> weight(0.25f, 2.0f);
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (int64_t vocab : {8192, 40000}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " vocab ", vocab));
      Problem p = EmptyProblem(dtype, DType::kI64, 4, vocab);
      FillRandom(p, rng);
      for (double& x : p.logits)
        x = RoundTo(dtype, static_cast<float>(normal(rng)));
      p.options.reduction = Reduction::kNone;
      p.options.label_smoothing = 0.1f;
      p.weights.resize(vocab);
      for (float& w : p.weights) w = weight(rng);
      for (int64_t i = 0; i < p.tokens; ++i) {
        p.weights[p.targets[i]] = 0.0f;
        // p_t from about e^-13 down to e^-19 of the row's largest p.
        p.logits[i * vocab + p.targets[i]] =
            RoundTo(dtype, static_cast<float>(-11.0 - 2.0 * i));
      }
      absl::StatusOr<std::unique_ptr<Harness>> created =
          ForwardBackwardHarness(device(), p);
      ASSERT_OK(created.status());
      Harness& h = **created;
      const ReferenceResult ref = Reference(p);
      auto expect_targets = [&](const ReferenceResult& r, const char* call) {
        for (int64_t i = 0; i < p.tokens; ++i) {
          const double grad_t =
              LoadFloat(dtype, h.grad_image(), p.Index(i, p.targets[i]));
          const double ref_grad_t = r.grad[i * p.vocab + p.targets[i]];
          ASSERT_GT(ref_grad_t, 0.0);
          EXPECT_NEAR(grad_t, ref_grad_t,
                      1e-4 * ref_grad_t + Ulp(dtype, ref_grad_t))
              << call << ", token " << i;
        }
      };
      expect_targets(ref, "ForwardBackward");
      const std::vector<float> saved_lse = h.LseValues();
      const std::vector<double> ones(p.tokens, 1.0);
      const ReferenceResult ref_backward =
          Reference(p, ones, ToDouble(saved_lse));
      ASSERT_OK(h.PoisonOutputs());
      ASSERT_OK(h.SetLse(saved_lse));
      ASSERT_OK(h.SetGradLoss(ones));
      ASSERT_OK(CrossEntropyBackward(h.context(), h.logits, h.targets, h.lse,
                                     h.grad_loss, h.options, h.grad));
      ASSERT_OK(h.DownloadOutputs());
      expect_targets(ref_backward, "Backward");
    }
}

// Calls that must fail with InvalidArgument and write nothing.
TEST_P(CrossEntropyTest, BadInputsAreRejectedAndWriteNothing) {
  std::mt19937_64 rng(test::TestSeed());
  const Device other = GetParam() ? Device::Cpu() : Device::Cuda(0);
  for (Reduction reduction : {Reduction::kMean, Reduction::kNone}) {
    SCOPED_TRACE(ReductionName(reduction));
    Problem p = EmptyProblem(DType::kF32, DType::kI64, 7, 11, /*pad=*/2);
    FillRandom(p, rng);
    p.options.reduction = reduction;
    p.weights.assign(p.vocab, 1.0f);
    absl::StatusOr<std::unique_ptr<Harness>> created =
        Harness::Create(device(), p);
    ASSERT_OK(created.status());
    Harness& h = **created;
    Context& context = h.context();
    ASSERT_OK(h.SetGradLoss(std::vector<double>(p.tokens, 1.0)));
    const std::vector<float> lse_values(p.tokens, 5.0f);
    ASSERT_OK(h.SetLse(lse_values));
    const Bytes lse_input = h.lse_image();

    // Each call runs against fresh views; `Expect` checks the status and that
    // the outputs (loss, grad) are still poisoned, the lse still what it was,
    // the logits intact.
    auto expect = [&](const std::string& what,
                      const std::function<absl::Status()>& call,
                      bool lse_is_output) {
      SCOPED_TRACE(what);
      Bytes poisoned_lse = h.lse_image();
      Poison(DType::kF32, poisoned_lse);
      ASSERT_OK(h.PoisonOutputs());
      if (!lse_is_output) ASSERT_OK(h.SetLse(lse_values));
      const absl::Status status = call();
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      ASSERT_OK(h.DownloadOutputs());
      EXPECT_TRUE(AllPoison(DType::kF32, h.loss_image(), "loss"));
      EXPECT_TRUE(AllPoison(p.dtype, h.grad_image(), "grad"));
      EXPECT_TRUE(h.lse_image() == (lse_is_output ? poisoned_lse : lse_input))
          << "lse was written";
    };
    // Runs `mutate` on copies of the views and the options, then each call in
    // `calls` that takes the mutated tensor.
    struct Views {
      Tensor logits, targets, loss, lse, grad, grad_loss;
      CrossEntropyOptions options;
    };
    enum Calls { kForward = 1, kForwardBackward = 2, kBackward = 4, kAll = 7 };
    auto expect_all = [&](const std::string& what,
                          const std::function<void(Views&)>& mutate,
                          int calls = kAll) {
      Views v{h.logits, h.targets,   h.loss,   h.lse,
              h.grad,   h.grad_loss, h.options};
      mutate(v);
      if (calls & kForward) {
        expect(
            what + " (Forward)",
            [&] {
              return CrossEntropyForward(context, v.logits, v.targets,
                                         v.options, v.loss, &v.lse);
            },
            true);
      }
      if (calls & kForwardBackward) {
        expect(
            what + " (ForwardBackward)",
            [&] {
              return CrossEntropyForwardBackward(context, v.logits, v.targets,
                                                 v.options, v.loss, &v.lse,
                                                 v.grad, &v.grad_loss);
            },
            true);
      }
      if (calls & kBackward) {
        expect(
            what + " (Backward)",
            [&] {
              return CrossEntropyBackward(context, v.logits, v.targets, v.lse,
                                          v.grad_loss, v.options, v.grad);
            },
            false);
      }
    };
    // The calls that take each output.
    const int with_loss = kForward | kForwardBackward;
    const int with_grad = kForwardBackward | kBackward;
    const int64_t tokens = p.tokens, vocab = p.vocab;

    // Shapes.
    expect_all("targets [T-1]",
               [&](Views& v) { v.targets.shape = {tokens - 1}; });
    expect_all("targets [T, 1]", [&](Views& v) {
      v.targets.shape = {tokens, 1};
    });
    expect_all("logits rank 1", [&](Views& v) {
      v.logits.shape = {vocab};
      v.logits.row_stride = 0;
    });
    expect_all("logits rank 3", [&](Views& v) {
      v.logits.shape = {tokens, vocab, 1};
    });
    expect_all("logits vocab 0", [&](Views& v) {
      v.logits.shape = {tokens, 0};
    });
    expect_all("logits tokens -1", [&](Views& v) {
      v.logits.shape = {-1, vocab};
    });
    expect_all("logits vocab -2", [&](Views& v) {
      v.logits.shape = {tokens, -2};
    });
    expect_all("logits row_stride < vocab",
               [&](Views& v) { v.logits.row_stride = vocab - 1; });
    expect_all("lse [T-1]", [&](Views& v) { v.lse.shape = {tokens - 1}; });
    expect_all(
        "grad [T, V-1]",
        [&](Views& v) {
          v.grad.shape = {tokens, vocab - 1};
        },
        with_grad);
    expect_all(
        "grad row_stride < vocab",
        [&](Views& v) { v.grad.row_stride = vocab - 1; }, with_grad);
    expect_all("class_weights [V-1]",
               [&](Views& v) { v.options.class_weights->shape = {vocab - 1}; });
    if (reduction == Reduction::kNone) {
      expect_all(
          "loss [] for none", [&](Views& v) { v.loss.shape = {}; }, with_loss);
      expect_all(
          "grad_loss [] for none", [&](Views& v) { v.grad_loss.shape = {}; },
          with_grad);
    } else {
      expect_all(
          "loss [T] for mean", [&](Views& v) { v.loss.shape = {tokens}; },
          with_loss);
      expect_all(
          "grad_loss [T] for mean",
          [&](Views& v) { v.grad_loss.shape = {tokens}; }, with_grad);
    }
    // Dtypes.
    expect_all("logits i32", [&](Views& v) {
      v.logits.dtype = DType::kI32;
      v.grad.dtype = DType::kI32;
    });
    expect_all("logits f64", [&](Views& v) {
      v.logits.dtype = DType::kF64;
      v.grad.dtype = DType::kF64;
    });
    expect_all(
        "grad bf16 for f32 logits",
        [&](Views& v) { v.grad.dtype = DType::kBF16; }, with_grad);
    expect_all("targets f32", [&](Views& v) { v.targets.dtype = DType::kF32; });
    expect_all(
        "loss bf16", [&](Views& v) { v.loss.dtype = DType::kBF16; }, with_loss);
    expect_all("lse f16", [&](Views& v) { v.lse.dtype = DType::kF16; });
    expect_all(
        "grad_loss bf16", [&](Views& v) { v.grad_loss.dtype = DType::kBF16; },
        with_grad);
    expect_all("class_weights bf16", [&](Views& v) {
      v.options.class_weights->dtype = DType::kBF16;
    });
    // Null data.
    expect_all("null logits", [&](Views& v) { v.logits.data = nullptr; });
    expect_all("null targets", [&](Views& v) { v.targets.data = nullptr; });
    expect_all(
        "null loss", [&](Views& v) { v.loss.data = nullptr; }, with_loss);
    expect_all("null lse", [&](Views& v) { v.lse.data = nullptr; });
    expect_all(
        "null grad", [&](Views& v) { v.grad.data = nullptr; }, with_grad);
    expect_all(
        "null grad_loss", [&](Views& v) { v.grad_loss.data = nullptr; },
        with_grad);
    expect_all("null class_weights",
               [&](Views& v) { v.options.class_weights->data = nullptr; });
    // Options.
    for (float s :
         {1.0f, 1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
      expect_all(absl::StrCat("label_smoothing ", s),
                 [&](Views& v) { v.options.label_smoothing = s; });
    }
    for (float value : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity()}) {
      expect_all(absl::StrCat("z_loss ", value),
                 [&](Views& v) { v.options.z_loss = value; });
      expect_all(absl::StrCat("softcap ", value),
                 [&](Views& v) { v.options.softcap = value; });
    }
    // Devices: every tensor must be on the context's device.
    expect_all("logits on the other device",
               [&](Views& v) { v.logits.device = other; });
    expect_all("targets on the other device",
               [&](Views& v) { v.targets.device = other; });
    expect_all(
        "loss on the other device", [&](Views& v) { v.loss.device = other; },
        with_loss);
    expect_all("lse on the other device",
               [&](Views& v) { v.lse.device = other; });
    expect_all(
        "grad on the other device", [&](Views& v) { v.grad.device = other; },
        with_grad);
    expect_all(
        "grad_loss on the other device",
        [&](Views& v) { v.grad_loss.device = other; }, with_grad);
    expect_all("class_weights on the other device",
               [&](Views& v) { v.options.class_weights->device = other; });
    // A gradient that overlaps the logits without being them.
    expect_all(
        "grad overlapping the logits",
        [&](Views& v) {
          v.grad.data = static_cast<char*>(v.logits.data) + DTypeSize(p.dtype);
        },
        with_grad);

    // Bad values in the inputs: weights below 0 or NaN; targets out of range
    // (validated).
    for (float bad : {-0.5f, std::numeric_limits<float>::quiet_NaN()}) {
      Bytes& weights = h.weights_image();
      const Bytes saved = weights;
      StoreFloat(DType::kF32, weights, 4, bad);
      ASSERT_OK(h.UploadWeights());
      expect_all(absl::StrCat("class weight ", bad), [](Views&) {});
      weights = saved;
      ASSERT_OK(h.UploadWeights());
    }
    for (int64_t bad : {vocab, int64_t{-1}, int64_t{1} << 40}) {
      Bytes& targets = h.targets_image();
      const Bytes saved = targets;
      StoreTarget(p.target_dtype, targets, p.offset + 3, bad);
      ASSERT_OK(h.UploadTargets());
      expect_all(absl::StrCat("target ", bad), [](Views&) {});
      targets = saved;
      ASSERT_OK(h.UploadTargets());
    }
    // The logits themselves are untouched by all of this.
    absl::StatusOr<Bytes> logits_now = h.ReadLogits();
    ASSERT_OK(logits_now.status());
    EXPECT_TRUE(*logits_now == h.logits_image()) << "the logits were modified";
  }
}

// The i32 targets of validation: a value out of range in i32 too.
TEST_P(CrossEntropyTest, OutOfRangeI32TargetsAreRejected) {
  std::mt19937_64 rng(test::TestSeed());
  Problem p = EmptyProblem(DType::kBF16, DType::kI32, 5, 10);
  FillRandom(p, rng);
  p.targets[2] = 10;
  absl::StatusOr<std::unique_ptr<Harness>> created =
      Harness::Create(device(), p);
  ASSERT_OK(created.status());
  Harness& h = **created;
  const absl::Status status = CrossEntropyForwardBackward(
      h.context(), h.logits, h.targets, h.options, h.loss, &h.lse, h.grad);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ASSERT_OK(h.DownloadOutputs());
  EXPECT_TRUE(AllPoison(DType::kF32, h.loss_image(), "loss"));
  EXPECT_TRUE(AllPoison(DType::kF32, h.lse_image(), "lse"));
  EXPECT_TRUE(AllPoison(p.dtype, h.grad_image(), "grad"));
}

// Rows are indexed in 32 bits inside the kernels: a longer vocabulary is
// refused before anything is read (no memory stands behind these logits) or
// written.
TEST(CrossEntropyLimits, VocabularyPastTheKernelLimitIsRejected) {
  absl::StatusOr<std::unique_ptr<Context>> context =
      Context::Create(Device::Cpu());
  ASSERT_TRUE(context.ok()) << context.status();
  const int64_t vocab = int64_t{1} << 30;
  alignas(16) static char unread[16];
  int64_t target = 0;
  float loss = std::numeric_limits<float>::quiet_NaN();
  const Tensor logits =
      Tensor::Of(unread, DType::kBF16, {1, vocab}, Device::Cpu());
  const Tensor targets = Tensor::Of(&target, DType::kI64, {1}, Device::Cpu());
  const Tensor loss_view = Tensor::Of(&loss, DType::kF32, {}, Device::Cpu());
  const absl::Status status = CrossEntropyForward(
      **context, logits, targets, CrossEntropyOptions(), loss_view);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("vocab"), std::string::npos)
      << status;
  EXPECT_TRUE(std::isnan(loss));
}

// The reference's gradient against a central finite difference of its own
// objective, and the backend's f32 gradient against both, with every option on.
TEST_P(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(test::TestSeed());
  for (Reduction reduction :
       {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    SCOPED_TRACE(ReductionName(reduction));
    Problem p = EmptyProblem(DType::kF32, DType::kI64, 5, 6);
    FillRandom(p, rng);
    p.options.reduction = reduction;
    p.options.label_smoothing = 0.15f;
    p.options.z_loss = 0.05f;
    p.options.softcap = 4.0f;
    p.weights = {0.5f, 1.0f, 2.0f, 0.0f, 1.25f, 0.75f};
    p.targets[2] = p.options.ignore_index;
    p.targets[4] = 3;  // a zero-weight class
    std::vector<double> grad_loss;
    std::uniform_real_distribution<double> g(-1.0, 2.0);
    for (int64_t i = 0; i < (reduction == Reduction::kNone ? p.tokens : 1);
         ++i) {
      grad_loss.push_back(static_cast<float>(g(rng)));
    }
    const ReferenceResult ref = Reference(p, grad_loss);
    double max_grad = 0.0;
    for (double x : ref.grad) max_grad = std::max(max_grad, std::fabs(x));
    for (int64_t e = 0; e < p.tokens * p.vocab; ++e) {
      Problem plus = p, minus = p;
      const double h = 1e-5;
      plus.logits[e] += h;
      minus.logits[e] -= h;
      const double numeric = (Reference(plus, grad_loss).objective -
                              Reference(minus, grad_loss).objective) /
                             (2 * h);
      EXPECT_NEAR(ref.grad[e], numeric, 1e-7 * max_grad + 1e-9)
          << "element " << e;
    }

    absl::StatusOr<std::unique_ptr<Harness>> created =
        Harness::Create(device(), p);
    ASSERT_OK(created.status());
    Harness& hs = **created;
    ASSERT_OK(hs.SetGradLoss(grad_loss));
    ASSERT_OK(CrossEntropyForwardBackward(hs.context(), hs.logits, hs.targets,
                                          hs.options, hs.loss, &hs.lse, hs.grad,
                                          &hs.grad_loss));
    ASSERT_OK(hs.DownloadOutputs());
    EXPECT_TRUE(GradMatches(p, hs.grad_image(), ref));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CrossEntropyTest, testing::Bool(),
                         BackendName);

// The GPU kernels' soft cap (ce::SoftCapWith with the special-function unit's
// exp2 and reciprocal) against double tanh over a dense sweep of f32 logits,
// on the host: exp2 and the reciprocal are correctly rounded and then moved
// by up to the device instructions' errors (ex2.approx 2 ulps, rcp.approx 1
// ulp, as CUDA documents exp2f and __fdividef), every sign combination. The
// bounds are what GradMatches' softcap term (two f32 ulps of the cap) and the
// loss floors rest on; the sweep is monotone, so a row's capped max is the cap
// of its largest logit.
TEST(SoftCapTest, ErrorBoundAndMonotone) {
  for (const float cap : {4.0f, 20.0f}) {
    SCOPED_TRACE(absl::StrCat("softcap ", cap));
    double worst_tanh_error = 0.0;        // |t - tanh(x / c)|, t = z / c
    double worst_exact_tanh_error = 0.0;  // with unperturbed exp2, reciprocal
    for (int exp2_error = -1; exp2_error <= 1; ++exp2_error) {
      for (int rcp_error = -1; rcp_error <= 1; ++rcp_error) {
        auto exp2 = [&](float a) {
          return static_cast<float>(std::exp2(static_cast<double>(a)) *
                                    (1.0 + exp2_error * 0x1p-22));
        };
        auto reciprocal = [&](float d) {
          return static_cast<float>((1.0 / d) * (1.0 + rcp_error * 0x1p-23));
        };
        float previous = -cap;
        int64_t checked = 0;
        // Every 127th f32 from 1e-9 (below which the cap is x to the last bit)
        // up to 12 caps (tanh is 1 in f32 from about 9 caps), and 0.
        for (uint32_t bits = 0x3089705fu;; bits += 127) {
          float x;
          std::memcpy(&x, &bits, sizeof(x));
          if (x > 12.0f * cap) break;
          const float z = ce::SoftCapWith(x, cap, 1.0f / cap, exp2, reciprocal);
          const float z_negative =
              ce::SoftCapWith(-x, cap, 1.0f / cap, exp2, reciprocal);
          ASSERT_EQ(z_negative, -z) << "x " << x;
          ASSERT_GE(z, previous) << "x " << x;  // monotone
          previous = z;
          const double error =
              std::fabs(z / static_cast<double>(cap) -
                        std::tanh(static_cast<double>(x) / cap));
          worst_tanh_error = std::max(worst_tanh_error, error);
          if (exp2_error == 0 && rcp_error == 0)
            worst_exact_tanh_error = std::max(worst_exact_tanh_error, error);
          ++checked;
        }
        EXPECT_GT(checked, 1000000);
      }
    }
    // About 4.1 and 2.2 * 2^-24 measured: 2.3 and 1.4 f32 ulps of a cap of
    // 20 (whose ulp is 2^-19) once multiplied by it.
    EXPECT_LE(worst_tanh_error, 4.5 * 0x1p-24);
    EXPECT_LE(worst_exact_tanh_error, 2.5 * 0x1p-24);
    auto exp2 = [](float a) { return std::exp2(a); };
    auto reciprocal = [](float d) { return 1.0f / d; };
    EXPECT_EQ(ce::SoftCapWith(0.0f, cap, 1.0f / cap, exp2, reciprocal), 0.0f);
    EXPECT_EQ(ce::SoftCapWith(std::numeric_limits<float>::infinity(), cap,
                              1.0f / cap, exp2, reciprocal),
              cap);
    EXPECT_EQ(ce::SoftCapWith(-std::numeric_limits<float>::infinity(), cap,
                              1.0f / cap, exp2, reciprocal),
              -cap);
    EXPECT_TRUE(
        std::isnan(ce::SoftCapWith(std::numeric_limits<float>::quiet_NaN(), cap,
                                   1.0f / cap, exp2, reciprocal)));
  }
}

}  // namespace
}  // namespace lossrt
