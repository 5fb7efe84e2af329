// Tests of GELU and SwiGLU (graph/ops/activation.h): the CPU forward against
// the formulas evaluated in double here, the CPU f64 backward against finite
// differences of the forward (overwriting and accumulating), in-place calls,
// CUDA f32 and bf16 against the CPU f64 results (vector and scalar paths,
// tails, misaligned tensors) with poisoned outputs, and invalid arguments
// (nothing written).
#include "graph/ops/activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace ops {
namespace {

using test::AllClose;
using test::Dot;
using test::F64View;
using test::FromHost;
using test::MakeContext;
using test::MaxAbs;
using test::Place;
using test::Placed;
using test::Plus;
using test::PoisonedTensor;
using test::RandomValues;
using test::ToHost;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

::testing::AssertionResult Near(const std::vector<double>& actual,
                                const std::vector<double>& expected,
                                double rtol, double atol_fraction) {
  return AllClose(actual, expected, atol_fraction * MaxAbs(expected), rtol);
}

double GeluReference(double x) {
  return 0.5 * x *
         (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

double SiluReference(double g) { return g / (1 + std::exp(-g)); }

// ---------------------------------------------------------------------------
// CPU forward against the formulas.

class ActivationCpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(ActivationCpuTest, GeluForwardMatchesDouble) {
  const DType dtype = GetParam();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t n = 1001;
  const std::vector<double> values = RandomValues(n, test::TestSeed(), -7, 7);
  ASSERT_OK_AND_ASSIGN(OwnedTensor x, FromHost(*cpu, dtype, {n}, values));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y, PoisonedTensor(*cpu, dtype, {n}));
  ASSERT_OK(GeluForward(*cpu, x.view, y.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> xs, ToHost(*cpu, x.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> ys, ToHost(*cpu, y.view));
  std::vector<double> expected;
  for (double v : xs) expected.push_back(GeluReference(v));
  const double tol = dtype == DType::kF64 ? 1e-14 : 1e-6;
  EXPECT_TRUE(Near(ys, expected, tol, tol));
}

TEST_P(ActivationCpuTest, SwiGluForwardMatchesDouble) {
  const DType dtype = GetParam();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t rows = 5, width = 11;
  const std::vector<double> values =
      RandomValues(rows * 2 * width, test::TestSeed(), -6, 6);
  ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                       FromHost(*cpu, dtype, {rows, 2 * width}, values));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y,
                       PoisonedTensor(*cpu, dtype, {rows, width}));
  ASSERT_OK(SwiGluForward(*cpu, x.view, y.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> xs, ToHost(*cpu, x.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> ys, ToHost(*cpu, y.view));
  std::vector<double> expected;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t f = 0; f < width; ++f) {
      expected.push_back(SiluReference(xs[r * 2 * width + f]) *
                         xs[r * 2 * width + width + f]);
    }
  }
  const double tol = dtype == DType::kF64 ? 1e-14 : 1e-6;
  EXPECT_TRUE(Near(ys, expected, tol, tol));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActivationCpuTest,
                         ::testing::Values(DType::kF64, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// CPU f64 backward against finite differences.

class ActivationGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(ActivationGradientTest, GeluMatchesFiniteDifferences) {
  const bool accumulate = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t rows = 4, cols = 15;
  std::vector<double> x = RandomValues(rows * cols, seed, -5, 5);
  const std::vector<double> w = RandomValues(rows * cols, seed + 1, -1, 1);
  std::vector<double> y(rows * cols);
  auto objective = [&]() {
    const absl::Status status =
        GeluForward(*cpu, F64View(x, {rows, cols}), F64View(y, {rows, cols}));
    EXPECT_TRUE(status.ok()) << status;
    return Dot(w, y);
  };
  const std::vector<double> fd = test::RichardsonGradient(objective, x, 1e-3);
  std::vector<double> dy = w;
  const std::vector<double> dx0 = RandomValues(rows * cols, seed + 2, -1, 1);
  std::vector<double> dx =
      accumulate ? dx0 : std::vector<double>(rows * cols, kNaN);
  ASSERT_OK(GeluBackward(*cpu, F64View(x, {rows, cols}),
                         F64View(dy, {rows, cols}), F64View(dx, {rows, cols}),
                         accumulate));
  EXPECT_TRUE(AllClose(dx, accumulate ? Plus(dx0, fd) : fd, 1e-10, 1e-10));
}

TEST_P(ActivationGradientTest, SwiGluMatchesFiniteDifferences) {
  const bool accumulate = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t rows = 3, width = 7;
  std::vector<double> x = RandomValues(rows * 2 * width, seed, -5, 5);
  const std::vector<double> w = RandomValues(rows * width, seed + 1, -1, 1);
  std::vector<double> y(rows * width);
  auto objective = [&]() {
    const absl::Status status = SwiGluForward(
        *cpu, F64View(x, {rows, 2 * width}), F64View(y, {rows, width}));
    EXPECT_TRUE(status.ok()) << status;
    return Dot(w, y);
  };
  const std::vector<double> fd = test::RichardsonGradient(objective, x, 1e-3);
  std::vector<double> dy = w;
  const std::vector<double> dx0 =
      RandomValues(rows * 2 * width, seed + 2, -1, 1);
  std::vector<double> dx =
      accumulate ? dx0 : std::vector<double>(rows * 2 * width, kNaN);
  ASSERT_OK(SwiGluBackward(*cpu, F64View(x, {rows, 2 * width}),
                           F64View(dy, {rows, width}),
                           F64View(dx, {rows, 2 * width}), accumulate));
  EXPECT_TRUE(AllClose(dx, accumulate ? Plus(dx0, fd) : fd, 1e-10, 1e-10));
}

INSTANTIATE_TEST_SUITE_P(CpuF64, ActivationGradientTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Accumulate" : "Overwrite";
                         });

// ---------------------------------------------------------------------------
// In place: outputs that are inputs give the out-of-place results.

void ExpectInPlaceMatches(Context& context, DType dtype, bool misaligned) {
  const uint64_t seed = test::TestSeed();
  const int64_t rows = 6, width = 24;
  const std::vector<double> xv = RandomValues(rows * width, seed, -4, 4);
  const std::vector<double> dyv = RandomValues(rows * width, seed + 1, -1, 1);
  const std::vector<double> sv =
      RandomValues(rows * 2 * width, seed + 2, -4, 4);
  const std::vector<double> sdyv = RandomValues(rows * width, seed + 3, -1, 1);
  ASSERT_OK_AND_ASSIGN(Placed x,
                       Place(context, dtype, {rows, width}, xv, misaligned));
  ASSERT_OK_AND_ASSIGN(Placed dy,
                       Place(context, dtype, {rows, width}, dyv, misaligned));
  ASSERT_OK_AND_ASSIGN(
      Placed y, Place(context, dtype, {rows, width}, xv, misaligned, true));
  ASSERT_OK_AND_ASSIGN(
      Placed dx, Place(context, dtype, {rows, width}, xv, misaligned, true));
  ASSERT_OK(GeluForward(context, x.view, y.view));
  ASSERT_OK(GeluBackward(context, x.view, dy.view, dx.view, false));
  ASSERT_OK_AND_ASSIGN(std::vector<double> y_out, ToHost(context, y.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> dx_out, ToHost(context, dx.view));
  // dx into dy, then y into x (x is read by the backward first).
  ASSERT_OK(GeluBackward(context, x.view, dy.view, dy.view, false));
  ASSERT_OK(GeluForward(context, x.view, x.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> dy_in, ToHost(context, dy.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> x_in, ToHost(context, x.view));
  EXPECT_EQ(dy_in, dx_out);
  EXPECT_EQ(x_in, y_out);

  // SwiGLU backward into x itself, accumulating (dx = x + gradient).
  ASSERT_OK_AND_ASSIGN(
      Placed s, Place(context, dtype, {rows, 2 * width}, sv, misaligned));
  ASSERT_OK_AND_ASSIGN(Placed sdy,
                       Place(context, dtype, {rows, width}, sdyv, misaligned));
  ASSERT_OK_AND_ASSIGN(
      Placed sdx, Place(context, dtype, {rows, 2 * width}, sv, misaligned));
  ASSERT_OK(SwiGluBackward(context, s.view, sdy.view, sdx.view, true));
  ASSERT_OK(SwiGluBackward(context, s.view, sdy.view, s.view, true));
  ASSERT_OK_AND_ASSIGN(std::vector<double> apart, ToHost(context, sdx.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> in_place, ToHost(context, s.view));
  EXPECT_EQ(in_place, apart);
}

TEST(ActivationInPlaceTest, CpuMatchesOutOfPlace) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  ExpectInPlaceMatches(*cpu, DType::kF64, false);
  ExpectInPlaceMatches(*cpu, DType::kF32, false);
}

TEST(ActivationInPlaceTest, GpuMatchesOutOfPlace) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool misaligned : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), misaligned ? " misaligned" : ""));
      ExpectInPlaceMatches(*gpu, dtype, misaligned);
    }
  }
}

// ---------------------------------------------------------------------------
// GPU f32 and bf16 against the CPU f64 results on the same (rounded) inputs.

struct GpuCase {
  int64_t rows;
  int64_t cols;  // GELU's width; SwiGLU's output width F (input 2F)
  bool misaligned;
  const char* name;
};

class ActivationGpuTest : public ::testing::TestWithParam<GpuCase> {};

// Tolerances: bf16 outputs carry one rounding (2^-9 relative) after fp32
// math; f32 ones a few ulps of tanhf/expf, relative to the largest value where
// 1 + tanh cancels.
double Rtol(DType dtype) { return dtype == DType::kBF16 ? 1.0 / 128 : 1e-5; }
double AtolFraction(DType dtype) { return dtype == DType::kBF16 ? 1e-3 : 1e-6; }

TEST_P(ActivationGpuTest, GeluMatchesCpuF64) {
  SKIP_WITHOUT_GPU();
  const GpuCase shape = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t rows = shape.rows, cols = shape.cols, n = rows * cols;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), accumulate ? " accumulate" : ""));
      const bool mis = shape.misaligned;
      ASSERT_OK_AND_ASSIGN(Placed x, Place(*gpu, dtype, {rows, cols},
                                           RandomValues(n, seed, -6, 6), mis));
      ASSERT_OK_AND_ASSIGN(Placed dy,
                           Place(*gpu, dtype, {rows, cols},
                                 RandomValues(n, seed + 1, -1, 1), mis));
      ASSERT_OK_AND_ASSIGN(
          Placed dx, Place(*gpu, dtype, {rows, cols},
                           RandomValues(n, seed + 2, -1, 1), mis, !accumulate));
      ASSERT_OK_AND_ASSIGN(Placed y,
                           Place(*gpu, dtype, {rows, cols}, {}, mis, true));
      ASSERT_OK_AND_ASSIGN(std::vector<double> xs, ToHost(*gpu, x.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> dys, ToHost(*gpu, dy.view));
      std::vector<double> dx_ref(n, kNaN);
      if (accumulate) {
        ASSERT_OK_AND_ASSIGN(dx_ref, ToHost(*gpu, dx.view));
      }
      ASSERT_OK(GeluForward(*gpu, x.view, y.view));
      ASSERT_OK(GeluBackward(*gpu, x.view, dy.view, dx.view, accumulate));
      std::vector<double> y_ref(n);
      ASSERT_OK(GeluForward(*cpu, F64View(xs, {rows, cols}),
                            F64View(y_ref, {rows, cols})));
      ASSERT_OK(GeluBackward(*cpu, F64View(xs, {rows, cols}),
                             F64View(dys, {rows, cols}),
                             F64View(dx_ref, {rows, cols}), accumulate));
      ASSERT_OK_AND_ASSIGN(std::vector<double> y_got, ToHost(*gpu, y.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> dx_got, ToHost(*gpu, dx.view));
      EXPECT_TRUE(Near(y_got, y_ref, Rtol(dtype), AtolFraction(dtype)));
      EXPECT_TRUE(Near(dx_got, dx_ref, Rtol(dtype), AtolFraction(dtype)));
    }
  }
}

TEST_P(ActivationGpuTest, SwiGluMatchesCpuF64) {
  SKIP_WITHOUT_GPU();
  const GpuCase shape = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t rows = shape.rows, width = shape.cols;
  const int64_t n_in = rows * 2 * width, n_out = rows * width;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), accumulate ? " accumulate" : ""));
      const bool mis = shape.misaligned;
      ASSERT_OK_AND_ASSIGN(Placed x,
                           Place(*gpu, dtype, {rows, 2 * width},
                                 RandomValues(n_in, seed, -6, 6), mis));
      ASSERT_OK_AND_ASSIGN(Placed dy,
                           Place(*gpu, dtype, {rows, width},
                                 RandomValues(n_out, seed + 1, -1, 1), mis));
      ASSERT_OK_AND_ASSIGN(Placed dx, Place(*gpu, dtype, {rows, 2 * width},
                                            RandomValues(n_in, seed + 2, -1, 1),
                                            mis, !accumulate));
      ASSERT_OK_AND_ASSIGN(Placed y,
                           Place(*gpu, dtype, {rows, width}, {}, mis, true));
      ASSERT_OK_AND_ASSIGN(std::vector<double> xs, ToHost(*gpu, x.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> dys, ToHost(*gpu, dy.view));
      std::vector<double> dx_ref(n_in, kNaN);
      if (accumulate) {
        ASSERT_OK_AND_ASSIGN(dx_ref, ToHost(*gpu, dx.view));
      }
      ASSERT_OK(SwiGluForward(*gpu, x.view, y.view));
      ASSERT_OK(SwiGluBackward(*gpu, x.view, dy.view, dx.view, accumulate));
      std::vector<double> y_ref(n_out);
      ASSERT_OK(SwiGluForward(*cpu, F64View(xs, {rows, 2 * width}),
                              F64View(y_ref, {rows, width})));
      ASSERT_OK(SwiGluBackward(*cpu, F64View(xs, {rows, 2 * width}),
                               F64View(dys, {rows, width}),
                               F64View(dx_ref, {rows, 2 * width}), accumulate));
      ASSERT_OK_AND_ASSIGN(std::vector<double> y_got, ToHost(*gpu, y.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> dx_got, ToHost(*gpu, dx.view));
      EXPECT_TRUE(Near(y_got, y_ref, Rtol(dtype), AtolFraction(dtype)));
      EXPECT_TRUE(Near(dx_got, dx_ref, Rtol(dtype), AtolFraction(dtype)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationGpuTest,
                         ::testing::Values(GpuCase{67, 768, false, "Gpt2Width"},
                                           GpuCase{7, 13, false,
                                                   "OddWidthWithTail"},
                                           GpuCase{1, 1, false, "OneElement"},
                                           GpuCase{9, 64, true, "Misaligned"}),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(ActivationGpuTest, RejectsF64) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                       PoisonedTensor(*gpu, DType::kF64, {2, 8}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y,
                       PoisonedTensor(*gpu, DType::kF64, {2, 8}));
  EXPECT_EQ(GeluForward(*gpu, x.view, y.view).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Invalid arguments: InvalidArgument, and nothing written.

TEST(ActivationInvalidTest, NothingWritten) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t rows = 3, cols = 8;
  std::vector<double> x = RandomValues(rows * cols, test::TestSeed(), -1, 1);
  std::vector<double> dy =
      RandomValues(rows * cols, test::TestSeed() + 1, -1, 1);
  std::vector<double> out(2 * rows * cols, kNaN);
  const Tensor xv = F64View(x, {rows, cols});
  const Tensor dyv = F64View(dy, {rows, cols});
  const Tensor outv = F64View(out, {rows, cols});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (double v : out) EXPECT_TRUE(std::isnan(v));
  };
  // GELU: shape, dtype, null data, device, partial overlap.
  expect_invalid(GeluForward(*cpu, xv, F64View(out, {rows, cols - 1})));
  expect_invalid(GeluForward(*cpu, xv, F64View(out, {rows * cols})));
  Tensor out_f32 = outv;
  out_f32.dtype = DType::kF32;
  expect_invalid(GeluForward(*cpu, xv, out_f32));
  Tensor x_i32 = xv;
  x_i32.dtype = DType::kI32;
  expect_invalid(GeluForward(*cpu, x_i32, outv));
  Tensor x_bf16 = xv;
  x_bf16.dtype = DType::kBF16;
  expect_invalid(GeluForward(*cpu, x_bf16, outv));
  Tensor x_null = xv;
  x_null.data = nullptr;
  expect_invalid(GeluForward(*cpu, x_null, outv));
  Tensor out_gpu = outv;
  out_gpu.device = Device::Cuda(0);
  expect_invalid(GeluForward(*cpu, xv, out_gpu));
  const Tensor shifted =
      Tensor::Of(out.data() + 1, DType::kF64, {rows, cols}, Device::Cpu());
  expect_invalid(GeluForward(*cpu, outv, shifted));
  expect_invalid(
      GeluBackward(*cpu, xv, F64View(dy, {rows, cols - 1}), outv, false));
  expect_invalid(GeluBackward(*cpu, xv, outv, shifted, true));
  // SwiGLU: odd width, wrong output shapes, overlaps.
  expect_invalid(
      SwiGluForward(*cpu, F64View(x, {rows, 7}), F64View(out, {rows, 3})));
  expect_invalid(SwiGluForward(*cpu, xv, F64View(out, {rows, cols})));
  expect_invalid(SwiGluForward(*cpu, F64View(x, {rows * cols}), outv));
  expect_invalid(SwiGluForward(*cpu, outv, F64View(out, {rows, cols / 2})));
  expect_invalid(
      SwiGluBackward(*cpu, xv, F64View(dy, {rows, cols}), outv, false));
  expect_invalid(SwiGluBackward(*cpu, xv, F64View(dy, {rows, cols / 2}),
                                F64View(out, {rows, cols / 2}), false));
  expect_invalid(
      SwiGluBackward(*cpu, xv, F64View(out, {rows, cols / 2}), shifted, false));
}

}  // namespace
}  // namespace ops
}  // namespace lossrt
