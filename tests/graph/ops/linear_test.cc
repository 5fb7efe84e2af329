// Tests of the linear layer: the forward against plain double loops, the
// backward against central differences (f64 on the CPU), GPU f32 and bf16
// against the CPU in f64, and argument checks.
#include "graph/ops/linear.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace {

using test::AllClose;
using test::FromHost;
using test::NumericalGradient;
using test::PoisonedTensor;
using test::RandomValues;
using test::ToHost;

struct LinearCase {
  int64_t rows, in, out;
  bool bias;
};

// y = x w^T + b in double.
std::vector<double> ReferenceForward(const LinearCase& c,
                                     const std::vector<double>& x,
                                     const std::vector<double>& w,
                                     const std::vector<double>& b) {
  std::vector<double> y(c.rows * c.out);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t o = 0; o < c.out; ++o) {
      double sum = c.bias ? b[o] : 0.0;
      for (int64_t i = 0; i < c.in; ++i)
        sum += x[r * c.in + i] * w[o * c.in + i];
      y[r * c.out + o] = sum;
    }
  }
  return y;
}

struct Operands {
  std::vector<double> x, w, b, dy;
};

Operands RandomOperands(const LinearCase& c, uint64_t seed) {
  return {RandomValues(c.rows * c.in, seed, -1, 1),
          RandomValues(c.out * c.in, seed + 1, -1, 1),
          RandomValues(c.out, seed + 2, -1, 1),
          RandomValues(c.rows * c.out, seed + 3, -1, 1)};
}

struct Gradients {
  std::vector<double> dx, dw, db;
};

// Runs forward and backward on `context` in `dtype`, starting from the given
// gradient contents (accumulate mode when `start` has values).
absl::StatusOr<std::pair<std::vector<double>, Gradients>> RunLinear(
    Context& context, DType dtype, const LinearCase& c, const Operands& v,
    bool accumulate, const Gradients& start) {
  const DType acc = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  ASSIGN_OR_RETURN(OwnedTensor x,
                   FromHost(context, dtype, {c.rows, c.in}, v.x));
  ASSIGN_OR_RETURN(OwnedTensor w, FromHost(context, dtype, {c.out, c.in}, v.w));
  ASSIGN_OR_RETURN(OwnedTensor b, FromHost(context, dtype, {c.out}, v.b));
  ASSIGN_OR_RETURN(OwnedTensor dy,
                   FromHost(context, dtype, {c.rows, c.out}, v.dy));
  ASSIGN_OR_RETURN(OwnedTensor y,
                   PoisonedTensor(context, dtype, {c.rows, c.out}));
  OwnedTensor dx, dw, db;
  if (accumulate) {
    ASSIGN_OR_RETURN(dx, FromHost(context, dtype, {c.rows, c.in}, start.dx));
  } else {
    ASSIGN_OR_RETURN(dx, PoisonedTensor(context, dtype, {c.rows, c.in}));
  }
  ASSIGN_OR_RETURN(dw, FromHost(context, acc, {c.out, c.in}, start.dw));
  ASSIGN_OR_RETURN(db, FromHost(context, acc, {c.out}, start.db));
  RETURN_IF_ERROR(ops::LinearForward(context, x.view, w.view,
                                     c.bias ? &b.view : nullptr, y.view));
  RETURN_IF_ERROR(ops::LinearBackward(context, x.view, w.view, dy.view,
                                      &dx.view, accumulate, dw.view,
                                      c.bias ? &db.view : nullptr));
  Gradients g;
  ASSIGN_OR_RETURN(std::vector<double> y_host, ToHost(context, y.view));
  ASSIGN_OR_RETURN(g.dx, ToHost(context, dx.view));
  ASSIGN_OR_RETURN(g.dw, ToHost(context, dw.view));
  ASSIGN_OR_RETURN(g.db, ToHost(context, db.view));
  return std::make_pair(y_host, g);
}

Gradients StartGradients(const LinearCase& c, uint64_t seed) {
  return {RandomValues(c.rows * c.in, seed + 10, -1, 1),
          RandomValues(c.out * c.in, seed + 11, -1, 1),
          RandomValues(c.out, seed + 12, -1, 1)};
}

class LinearCpuTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearCpuTest, MatchesReferenceAndFiniteDifferences) {
  const LinearCase c = GetParam();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  Operands v = RandomOperands(c, seed);
  for (bool accumulate : {false, true}) {
    const Gradients start = StartGradients(c, seed);
    ASSERT_OK_AND_ASSIGN(
        auto result, RunLinear(*context, DType::kF64, c, v, accumulate, start));
    EXPECT_TRUE(AllClose(result.first, ReferenceForward(c, v.x, v.w, v.b),
                         1e-12, 1e-12));
    // The objective sum(y * dy) has gradients dx, dw, db.
    auto objective = [&] {
      const std::vector<double> y = ReferenceForward(c, v.x, v.w, v.b);
      double sum = 0;
      for (size_t i = 0; i < y.size(); ++i) sum += y[i] * v.dy[i];
      return sum;
    };
    std::vector<double> dx = NumericalGradient(objective, v.x, 1e-6);
    std::vector<double> dw = NumericalGradient(objective, v.w, 1e-6);
    std::vector<double> db = NumericalGradient(objective, v.b, 1e-6);
    for (size_t i = 0; i < dx.size() && accumulate; ++i) dx[i] += start.dx[i];
    for (size_t i = 0; i < dw.size(); ++i) dw[i] += start.dw[i];
    for (size_t i = 0; i < db.size(); ++i) {
      db[i] = c.bias ? db[i] + start.db[i] : start.db[i];
    }
    EXPECT_TRUE(AllClose(result.second.dx, dx, 1e-7, 1e-7)) << accumulate;
    EXPECT_TRUE(AllClose(result.second.dw, dw, 1e-7, 1e-7)) << accumulate;
    EXPECT_TRUE(AllClose(result.second.db, db, 1e-7, 1e-7)) << accumulate;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCpuTest,
                         ::testing::Values(LinearCase{1, 1, 1, true},
                                           LinearCase{5, 3, 4, true},
                                           LinearCase{7, 8, 2, false},
                                           LinearCase{16, 12, 20, true}));

class LinearGpuTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearGpuTest, MatchesCpuInDouble) {
  SKIP_WITHOUT_GPU();
  const LinearCase c = GetParam();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const Operands v = RandomOperands(c, seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // bf16 operands: round them first, so that only the arithmetic differs.
    Operands rounded = v;
    if (dtype == DType::kBF16) {
      for (auto* values : {&rounded.x, &rounded.w, &rounded.b, &rounded.dy}) {
        for (double& value : *values) {
          value = Bf16BitsToFloat(FloatToBf16Bits(static_cast<float>(value)));
        }
      }
    }
    for (bool accumulate : {false, true}) {
      const Gradients start = StartGradients(c, seed);
      ASSERT_OK_AND_ASSIGN(auto want, RunLinear(*cpu, DType::kF64, c, rounded,
                                                accumulate, start));
      ASSERT_OK_AND_ASSIGN(
          auto got, RunLinear(*gpu, dtype, c, rounded, accumulate, start));
      // f32 GEMMs accumulate in fp32; bf16 outputs round to 8 bits.
      const double tol = dtype == DType::kF32 ? 1e-4 : 2e-2;
      const double scale = std::sqrt(static_cast<double>(c.in + c.rows));
      EXPECT_TRUE(AllClose(got.first, want.first, tol * scale, tol))
          << DTypeName(dtype);
      EXPECT_TRUE(AllClose(got.second.dx, want.second.dx, tol * scale, tol))
          << DTypeName(dtype) << " accumulate " << accumulate;
      // Parameter gradients are fp32 in both cases.
      EXPECT_TRUE(AllClose(got.second.dw, want.second.dw, 1e-4 * scale, 1e-4))
          << DTypeName(dtype);
      EXPECT_TRUE(AllClose(got.second.db, want.second.db, 1e-4 * scale, 1e-4))
          << DTypeName(dtype);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearGpuTest,
                         ::testing::Values(LinearCase{1, 8, 8, true},
                                           LinearCase{37, 24, 40, true},
                                           LinearCase{300, 64, 96, false},
                                           LinearCase{1024, 768, 2304, true}));

// LinearResidualForward: y = x w^T (+ b) + residual against double loops, on
// the CPU in f64 and on a GPU in f32 and bf16 (the residual in the GEMM's
// epilogue), into a separate y and in place (y is the residual).
class LinearResidualTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearResidualTest, MatchesReference) {
  const LinearCase c = GetParam();
  const uint64_t seed = test::TestSeed();
  const auto runs = test::TestRuns(DType::kF64, {DType::kF32, DType::kBF16});
  for (const auto& [device, dtype] : runs) {
    std::unique_ptr<Context> context = test::MakeContext(device);
    ASSERT_NE(context, nullptr);
    Operands v = RandomOperands(c, seed);
    v.x = test::Rounded(dtype, v.x);
    v.w = test::Rounded(dtype, v.w);
    v.b = test::Rounded(dtype, v.b);
    const std::vector<double> r =
        test::Rounded(dtype, RandomValues(c.rows * c.out, seed + 7, -4, 4));
    std::vector<double> want = ReferenceForward(c, v.x, v.w, v.b);
    for (size_t i = 0; i < want.size(); ++i) want[i] += r[i];
    ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                         FromHost(*context, dtype, {c.rows, c.in}, v.x));
    ASSERT_OK_AND_ASSIGN(OwnedTensor w,
                         FromHost(*context, dtype, {c.out, c.in}, v.w));
    ASSERT_OK_AND_ASSIGN(OwnedTensor b,
                         FromHost(*context, dtype, {c.out}, v.b));
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) +
                   (in_place ? " in place" : " separate"));
      ASSERT_OK_AND_ASSIGN(OwnedTensor residual,
                           FromHost(*context, dtype, {c.rows, c.out}, r));
      ASSERT_OK_AND_ASSIGN(OwnedTensor y_own,
                           PoisonedTensor(*context, dtype, {c.rows, c.out}));
      const Tensor& y = in_place ? residual.view : y_own.view;
      ASSERT_OK(ops::LinearResidualForward(*context, x.view, w.view,
                                           c.bias ? &b.view : nullptr,
                                           residual.view, y));
      ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*context, y));
      // f64: rounding only; f32 GEMMs accumulate in fp32; bf16 outputs keep 8
      // bits.
      const double tol = dtype == DType::kF64   ? 1e-12
                         : dtype == DType::kF32 ? 1e-4
                                                : 2e-2;
      const double scale = std::sqrt(static_cast<double>(c.in));
      EXPECT_TRUE(AllClose(got, want, tol * scale, tol));
      if (!in_place) {
        // The residual is an input: it is left as it was.
        ASSERT_OK_AND_ASSIGN(std::vector<double> after,
                             ToHost(*context, residual.view));
        EXPECT_EQ(after, r);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearResidualTest,
                         ::testing::Values(LinearCase{1, 8, 8, true},
                                           LinearCase{5, 3, 4, true},
                                           LinearCase{37, 24, 40, false},
                                           LinearCase{256, 768, 768, true}));

// The GELU MLP's fused ops (LinearGeluForward, LinearGeluBackwardInput)
// against double references: on the CPU in f64, on a GPU in f32 and bf16 from
// the same rounded operands. `hidden` not a multiple of 8 takes the composed
// path on a GPU (cuBLASLt's aux matrix needs it).
struct GeluCase {
  int64_t rows, in, hidden, out;
  bool bias;
};

double Gelu(double x) {
  return 0.5 * x *
         (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

double GeluDerivative(double x) {
  const double k = std::sqrt(2 / M_PI);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// h = x w^T (+ b) and a = gelu(h) in double: x [rows, in], w [hidden, in].
void GeluForwardReference(const GeluCase& c, const std::vector<double>& x,
                          const std::vector<double>& w,
                          const std::vector<double>& b,
                          std::vector<double>* h_ref,
                          std::vector<double>* a_ref) {
  h_ref->assign(c.rows * c.hidden, 0.0);
  a_ref->assign(c.rows * c.hidden, 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t o = 0; o < c.hidden; ++o) {
      double sum = c.bias ? b[o] : 0.0;
      for (int64_t i = 0; i < c.in; ++i)
        sum += x[r * c.in + i] * w[o * c.in + i];
      (*h_ref)[r * c.hidden + o] = sum;
      (*a_ref)[r * c.hidden + o] = Gelu(sum);
    }
  }
}

class LinearGeluTest : public ::testing::TestWithParam<GeluCase> {};

TEST_P(LinearGeluTest, MatchesReference) {
  const GeluCase c = GetParam();
  const uint64_t seed = test::TestSeed();
  const auto runs = test::TestRuns(DType::kF64, {DType::kF32, DType::kBF16});
  for (const auto& [device, dtype] : runs) {
    SCOPED_TRACE(DTypeName(dtype));
    std::unique_ptr<Context> context = test::MakeContext(device);
    ASSERT_NE(context, nullptr);
    // Operands rounded to the dtype, so that only the arithmetic differs.
    const std::vector<double> x =
        test::Rounded(dtype, RandomValues(c.rows * c.in, seed, -2, 2));
    const std::vector<double> w1 =
        test::Rounded(dtype, RandomValues(c.hidden * c.in, seed + 1, -1, 1));
    const std::vector<double> b1 =
        test::Rounded(dtype, RandomValues(c.hidden, seed + 2, -1, 1));
    const std::vector<double> w2 =
        test::Rounded(dtype, RandomValues(c.out * c.hidden, seed + 3, -1, 1));
    const std::vector<double> dy =
        test::Rounded(dtype, RandomValues(c.rows * c.out, seed + 4, -1, 1));
    const std::vector<double> h_in =
        test::Rounded(dtype, RandomValues(c.rows * c.hidden, seed + 5, -3, 3));
    // Forward reference: h = x w1^T + b1, a = gelu(h).
    std::vector<double> h_ref, a_ref;
    GeluForwardReference(c, x, w1, b1, &h_ref, &a_ref);
    // Backward reference from the given h: d_h = (dy w2) * gelu'(h).
    std::vector<double> dh_ref(c.rows * c.hidden);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t k = 0; k < c.hidden; ++k) {
        double sum = 0;
        for (int64_t o = 0; o < c.out; ++o)
          sum += dy[r * c.out + o] * w2[o * c.hidden + k];
        dh_ref[r * c.hidden + k] = sum * GeluDerivative(h_in[r * c.hidden + k]);
      }
    }
    ASSERT_OK_AND_ASSIGN(OwnedTensor tx,
                         FromHost(*context, dtype, {c.rows, c.in}, x));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tw1,
                         FromHost(*context, dtype, {c.hidden, c.in}, w1));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tb1,
                         FromHost(*context, dtype, {c.hidden}, b1));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tw2,
                         FromHost(*context, dtype, {c.out, c.hidden}, w2));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tdy,
                         FromHost(*context, dtype, {c.rows, c.out}, dy));
    ASSERT_OK_AND_ASSIGN(OwnedTensor th_in,
                         FromHost(*context, dtype, {c.rows, c.hidden}, h_in));
    ASSERT_OK_AND_ASSIGN(OwnedTensor ta,
                         PoisonedTensor(*context, dtype, {c.rows, c.hidden}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor th,
                         PoisonedTensor(*context, dtype, {c.rows, c.hidden}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tdh,
                         PoisonedTensor(*context, dtype, {c.rows, c.hidden}));
    ASSERT_OK(ops::LinearGeluForward(*context, tx.view, tw1.view,
                                     c.bias ? &tb1.view : nullptr, ta.view,
                                     th.view));
    ASSERT_OK(ops::LinearGeluBackwardInput(*context, tw2.view, tdy.view,
                                           th_in.view, tdh.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> a, ToHost(*context, ta.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> h, ToHost(*context, th.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> dh, ToHost(*context, tdh.view));
    // f64: rounding only; f32 GEMMs accumulate in fp32; bf16 outputs keep 8
    // bits (an element may round either way from the fp32 result).
    const double tol = dtype == DType::kF64   ? 1e-12
                       : dtype == DType::kF32 ? 1e-4
                                              : 2e-2;
    const double scale = std::sqrt(static_cast<double>(c.in + c.out));
    EXPECT_TRUE(AllClose(h, h_ref, tol * scale, tol));
    EXPECT_TRUE(AllClose(a, a_ref, tol * scale, tol));
    EXPECT_TRUE(AllClose(dh, dh_ref, tol * scale, tol));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearGeluTest,
                         ::testing::Values(GeluCase{5, 3, 4, 2, true},
                                           GeluCase{37, 24, 40, 16, true},
                                           GeluCase{64, 32, 36, 24, true},
                                           GeluCase{300, 64, 96, 48, false},
                                           GeluCase{128, 768, 3072, 768,
                                                    true}));

// On a GPU in bf16, each engine of LinearGeluForward against the double
// reference, run to run, and tuned against untuned: a context whose GEMM
// tuning is off runs cuDNN's first plan, a tuning one the fastest plan that
// writes the same bits, so the two must agree bitwise. kAuto must give what
// kCudnn gives where cuDNN has a plan (which it must for GPT-2 small's MLP).
TEST(LinearGeluGpuTest, EnginesMatchReferenceAndRepeatBitwise) {
  SKIP_WITHOUT_GPU();
  const absl::Status cudnn_built =
      ops::GeluGemmEngineBuilt(ops::GeluGemmEngine::kCudnn);
  if (!cudnn_built.ok()) {
    GTEST_SKIP() << "no cuDNN engine to compare: " << cudnn_built.message();
  }
  const uint64_t seed = test::TestSeed();
  const DType dtype = DType::kBF16;
  for (const GeluCase c :
       {GeluCase{128, 768, 3072, 0, true}, GeluCase{256, 768, 3072, 0, false},
        GeluCase{64, 64, 96, 0, true}, GeluCase{37, 24, 40, 0, true}}) {
    SCOPED_TRACE(testing::Message() << c.rows << "x" << c.in << "x" << c.hidden
                                    << (c.bias ? " bias" : ""));
    const std::vector<double> x =
        test::Rounded(dtype, RandomValues(c.rows * c.in, seed, -2, 2));
    const std::vector<double> w =
        test::Rounded(dtype, RandomValues(c.hidden * c.in, seed + 1, -1, 1));
    const std::vector<double> b =
        test::Rounded(dtype, RandomValues(c.hidden, seed + 2, -1, 1));
    std::vector<double> h_ref, a_ref;
    GeluForwardReference(c, x, w, b, &h_ref, &a_ref);
    struct Outputs {
      absl::Status status;
      std::vector<double> a, h;
    };
    // One call (or `calls` calls on one context) of `engine`; the outputs of
    // the last.
    auto run = [&](ops::GeluGemmEngine engine, bool tuning,
                   int calls) -> Outputs {
      Outputs out;
      std::unique_ptr<Context> context = test::MakeContext(Device::Cuda(0));
      if (context == nullptr) {
        out.status = absl::InternalError("no CUDA context");
        return out;
      }
      out.status = context->set_gemm_tuning(tuning);
      if (!out.status.ok()) return out;
      auto tx = FromHost(*context, dtype, {c.rows, c.in}, x);
      auto tw = FromHost(*context, dtype, {c.hidden, c.in}, w);
      auto tb = FromHost(*context, dtype, {c.hidden}, b);
      auto ta = PoisonedTensor(*context, dtype, {c.rows, c.hidden});
      auto th = PoisonedTensor(*context, dtype, {c.rows, c.hidden});
      for (const absl::Status& status :
           {tx.status(), tw.status(), tb.status(), ta.status(), th.status()}) {
        if (!status.ok()) {
          out.status = status;
          return out;
        }
      }
      for (int call = 0; call < calls && out.status.ok(); ++call) {
        out.status = ops::LinearGeluForward(*context, tx->view, tw->view,
                                            c.bias ? &tb->view : nullptr,
                                            ta->view, th->view, engine);
      }
      if (!out.status.ok()) {
        // Nothing written on refusal.
        auto poisoned = test::CountPoison(*context, ta->view);
        EXPECT_TRUE(poisoned.ok() && *poisoned == ta->view.numel());
        return out;
      }
      auto a = ToHost(*context, ta->view);
      auto h = ToHost(*context, th->view);
      if (!a.ok() || !h.ok()) {
        out.status = a.ok() ? h.status() : a.status();
        return out;
      }
      out.a = *std::move(a);
      out.h = *std::move(h);
      return out;
    };
    const double tol = 2e-2;
    const double scale = std::sqrt(static_cast<double>(c.in));
    const Outputs cublaslt = run(ops::GeluGemmEngine::kCublasLt, true, 1);
    ASSERT_OK(cublaslt.status);
    EXPECT_TRUE(AllClose(cublaslt.h, h_ref, tol * scale, tol));
    EXPECT_TRUE(AllClose(cublaslt.a, a_ref, tol * scale, tol));
    const Outputs untuned = run(ops::GeluGemmEngine::kCudnn, false, 1);
    const Outputs auto_engine = run(ops::GeluGemmEngine::kAuto, true, 1);
    ASSERT_OK(auto_engine.status);
    if (absl::IsUnimplemented(untuned.status)) {
      // No cuDNN plan for the shape: kAuto is cuBLASLt's, bit for bit.
      EXPECT_NE(c.in, 768) << untuned.status;
      EXPECT_EQ(auto_engine.h, cublaslt.h);
      EXPECT_EQ(auto_engine.a, cublaslt.a);
      continue;
    }
    ASSERT_OK(untuned.status);
    EXPECT_TRUE(AllClose(untuned.h, h_ref, tol * scale, tol));
    EXPECT_TRUE(AllClose(untuned.a, a_ref, tol * scale, tol));
    // Tuned on the first call, the chosen plan on the second and third.
    const Outputs tuned = run(ops::GeluGemmEngine::kCudnn, true, 3);
    ASSERT_OK(tuned.status);
    EXPECT_EQ(tuned.h, untuned.h);
    EXPECT_EQ(tuned.a, untuned.a);
    const Outputs first_tuned = run(ops::GeluGemmEngine::kCudnn, true, 1);
    ASSERT_OK(first_tuned.status);
    EXPECT_EQ(first_tuned.h, untuned.h);
    EXPECT_EQ(first_tuned.a, untuned.a);
    EXPECT_EQ(auto_engine.h, untuned.h);
    EXPECT_EQ(auto_engine.a, untuned.a);
  }
}

// The cuDNN engine takes bf16 only: f32 on a GPU is refused, nothing written.
TEST(LinearGeluGpuTest, CudnnEngineRefusesF32) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Context> context = test::MakeContext(Device::Cuda(0));
  ASSERT_NE(context, nullptr);
  ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                       FromHost(*context, DType::kF32, {4, 8},
                                RandomValues(32, test::TestSeed(), -1, 1)));
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor w, FromHost(*context, DType::kF32, {16, 8},
                              RandomValues(128, test::TestSeed() + 1, -1, 1)));
  ASSERT_OK_AND_ASSIGN(OwnedTensor a,
                       PoisonedTensor(*context, DType::kF32, {4, 16}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor h,
                       PoisonedTensor(*context, DType::kF32, {4, 16}));
  EXPECT_TRUE(absl::IsUnimplemented(
      ops::LinearGeluForward(*context, x.view, w.view, nullptr, a.view, h.view,
                             ops::GeluGemmEngine::kCudnn)));
  ASSERT_OK_AND_ASSIGN(int64_t poisoned_a, test::CountPoison(*context, a.view));
  ASSERT_OK_AND_ASSIGN(int64_t poisoned_h, test::CountPoison(*context, h.view));
  EXPECT_EQ(poisoned_a, a.view.numel());
  EXPECT_EQ(poisoned_h, h.view.numel());
}

TEST(LinearTest, RejectsBadArguments) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                       PoisonedTensor(*context, DType::kF32, {4, 3}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor w,
                       PoisonedTensor(*context, DType::kF32, {5, 3}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor w_bad,
                       PoisonedTensor(*context, DType::kF32, {5, 2}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor w_f64,
                       PoisonedTensor(*context, DType::kF64, {5, 3}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y,
                       PoisonedTensor(*context, DType::kF32, {4, 5}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y_bad,
                       PoisonedTensor(*context, DType::kF32, {4, 4}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor bias_bad,
                       PoisonedTensor(*context, DType::kF32, {4}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor x_i32,
                       PoisonedTensor(*context, DType::kI32, {4, 3}));
  auto code = [](const absl::Status& status) { return status.code(); };
  EXPECT_EQ(
      code(ops::LinearForward(*context, x.view, w_bad.view, nullptr, y.view)),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(ops::LinearForward(*context, x.view, w_f64.view, nullptr, y.view)),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(ops::LinearForward(*context, x.view, w.view, nullptr, y_bad.view)),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ops::LinearForward(*context, x.view, w.view, &bias_bad.view,
                                    y.view)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code(ops::LinearForward(*context, x_i32.view, w.view, nullptr, y.view)),
      absl::StatusCode::kInvalidArgument);
  Tensor null_x = x.view;
  null_x.data = nullptr;
  EXPECT_EQ(code(ops::LinearForward(*context, null_x, w.view, nullptr, y.view)),
            absl::StatusCode::kInvalidArgument);
  // A residual of another shape, or one that overlaps y without being it.
  ASSERT_OK_AND_ASSIGN(OwnedTensor wide,
                       PoisonedTensor(*context, DType::kF32, {5, 5}));
  EXPECT_EQ(code(ops::LinearResidualForward(*context, x.view, w.view, nullptr,
                                            y_bad.view, y.view)),
            absl::StatusCode::kInvalidArgument);
  Tensor shifted = wide.view;
  shifted.shape = {4, 5};
  Tensor shifted_y = shifted;
  shifted_y.data = wide.view.data_as<float>() + 5;
  EXPECT_EQ(code(ops::LinearResidualForward(*context, x.view, w.view, nullptr,
                                            shifted, shifted_y)),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(int64_t wide_poisoned,
                       test::CountPoison(*context, wide.view));
  EXPECT_EQ(wide_poisoned, wide.view.numel());
  // Nothing was written by the failed calls.
  ASSERT_OK_AND_ASSIGN(int64_t poisoned, test::CountPoison(*context, y.view));
  EXPECT_EQ(poisoned, y.view.numel());
  // The parameter gradients must be in the accumulator dtype.
  EXPECT_EQ(code(ops::LinearBackward(*context, x.view, w.view, y.view, nullptr,
                                     false, w_f64.view, nullptr)),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lossrt
