// Tests of LayerNorm and RMSNorm (graph/ops/norm.h): the CPU forward against a
// double computation written here, the CPU backward (f64) against finite
// differences of the forward, the CPU f32 path against f64, CUDA f32 and bf16
// against the CPU f64 results on every kernel path (warp path at several
// widths, block path for odd or wide rows and misaligned tensors) with
// poisoned outputs and a bitwise repeat, and invalid arguments (nothing
// written).
#include "graph/ops/norm.h"

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
using test::Rounded;
using test::ToHost;

constexpr double kEps = 1e-5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The norm in plain double loops.
struct Reference {
  std::vector<double> y, mean, rstd;
};

Reference NormReference(const std::vector<double>& x,
                        const std::vector<double>& gamma,
                        const std::vector<double>* beta, int64_t rows,
                        int64_t cols, bool rms) {
  Reference ref;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0;
    if (!rms) {
      for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
      mean /= cols;
    }
    double var = 0;
    for (int64_t c = 0; c < cols; ++c) {
      var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    }
    // eps as the op gets it: a float.
    const double rstd = 1 / std::sqrt(var / cols + static_cast<float>(kEps));
    ref.mean.push_back(mean);
    ref.rstd.push_back(rstd);
    for (int64_t c = 0; c < cols; ++c) {
      ref.y.push_back((x[r * cols + c] - mean) * rstd * gamma[c] +
                      (beta != nullptr ? (*beta)[c] : 0.0));
    }
  }
  return ref;
}

// ---------------------------------------------------------------------------
// CPU forward against the double loops.

struct ForwardCase {
  DType dtype;
  bool rms;
  bool beta;
};

class NormForwardTest : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(NormForwardTest, MatchesDouble) {
  const ForwardCase param = GetParam();
  const uint64_t seed = test::TestSeed();
  auto context = MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  const int64_t rows = 6, cols = 37;
  // A large common offset: a one-pass variance would lose digits here.
  std::vector<double> x = RandomValues(rows * cols, seed, 10, 14);
  std::vector<double> gamma = RandomValues(cols, seed + 1, 0.5, 1.5);
  std::vector<double> beta = RandomValues(cols, seed + 2, -1, 1);
  x = Rounded(param.dtype, x);
  gamma = Rounded(param.dtype, gamma);
  beta = Rounded(param.dtype, beta);
  const DType dtype = param.dtype;
  ASSERT_OK_AND_ASSIGN(OwnedTensor x_t,
                       FromHost(*context, dtype, {rows, cols}, x));
  ASSERT_OK_AND_ASSIGN(OwnedTensor gamma_t,
                       FromHost(*context, dtype, {cols}, gamma));
  ASSERT_OK_AND_ASSIGN(OwnedTensor beta_t,
                       FromHost(*context, dtype, {cols}, beta));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y_t,
                       PoisonedTensor(*context, dtype, {rows, cols}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor mean_t,
                       PoisonedTensor(*context, dtype, {rows}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor rstd_t,
                       PoisonedTensor(*context, dtype, {rows}));
  if (param.rms) {
    ASSERT_OK(RmsNormForward(*context, x_t.view, gamma_t.view, kEps, y_t.view,
                             rstd_t.view));
  } else {
    ASSERT_OK(LayerNormForward(*context, x_t.view, gamma_t.view,
                               param.beta ? &beta_t.view : nullptr, kEps,
                               y_t.view, mean_t.view, rstd_t.view));
  }
  const Reference ref = NormReference(x, gamma, param.beta ? &beta : nullptr,
                                      rows, cols, param.rms);
  const double tol = dtype == DType::kF64 ? 1e-13 : 1e-6;
  ASSERT_OK_AND_ASSIGN(std::vector<double> y, ToHost(*context, y_t.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> rstd, ToHost(*context, rstd_t.view));
  EXPECT_TRUE(AllClose(y, ref.y, tol, tol));
  EXPECT_TRUE(AllClose(rstd, ref.rstd, tol, tol));
  if (!param.rms) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> mean,
                         ToHost(*context, mean_t.view));
    EXPECT_TRUE(AllClose(mean, ref.mean, tol, tol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, NormForwardTest,
    ::testing::Values(ForwardCase{DType::kF64, false, true},
                      ForwardCase{DType::kF64, false, false},
                      ForwardCase{DType::kF64, true, false},
                      ForwardCase{DType::kF32, false, true},
                      ForwardCase{DType::kF32, true, false}),
    [](const ::testing::TestParamInfo<ForwardCase>& info) {
      return absl::StrCat(DTypeName(info.param.dtype),
                          info.param.rms ? "RmsNorm" : "LayerNorm",
                          info.param.beta ? "WithBeta" : "");
    });

// ---------------------------------------------------------------------------
// CPU f64 backward against finite differences of the forward.

struct BackwardCase {
  bool rms;
  bool beta;
  bool accumulate;
};

std::string BackwardName(const ::testing::TestParamInfo<BackwardCase>& info) {
  return absl::StrCat(info.param.rms ? "RmsNorm" : "LayerNorm",
                      info.param.beta ? "WithBeta" : "",
                      info.param.accumulate ? "Accumulate" : "Overwrite");
}

class NormGradientTest : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(NormGradientTest, MatchesFiniteDifferences) {
  const BackwardCase param = GetParam();
  const uint64_t seed = test::TestSeed();
  auto context = MakeContext(Device::Cpu());
  ASSERT_NE(context, nullptr);
  const int64_t rows = 4, cols = 13;
  std::vector<double> x = RandomValues(rows * cols, seed, -2, 3);
  std::vector<double> gamma = RandomValues(cols, seed + 1, 0.5, 1.5);
  std::vector<double> beta = RandomValues(cols, seed + 2, -1, 1);
  const std::vector<double> w = RandomValues(rows * cols, seed + 3, -1, 1);
  std::vector<double> y(rows * cols), mean(rows), rstd(rows);
  const Tensor x_v = F64View(x, {rows, cols});
  const Tensor gamma_v = F64View(gamma, {cols});
  const Tensor beta_v = F64View(beta, {cols});
  const Tensor y_v = F64View(y, {rows, cols});
  const Tensor mean_v = F64View(mean, {rows});
  const Tensor rstd_v = F64View(rstd, {rows});
  auto forward = [&]() {
    return param.rms ? RmsNormForward(*context, x_v, gamma_v, kEps, y_v, rstd_v)
                     : LayerNormForward(*context, x_v, gamma_v,
                                        param.beta ? &beta_v : nullptr, kEps,
                                        y_v, mean_v, rstd_v);
  };
  // L = sum(w * y), so dL/dy = w.
  auto objective = [&]() {
    const absl::Status status = forward();
    EXPECT_TRUE(status.ok()) << status;
    return Dot(w, y);
  };
  const std::vector<double> fd_x = test::RichardsonGradient(objective, x, 1e-3);
  const std::vector<double> fd_gamma =
      test::RichardsonGradient(objective, gamma, 1e-3);
  const std::vector<double> fd_beta =
      test::RichardsonGradient(objective, beta, 1e-3);

  ASSERT_OK(forward());
  std::vector<double> dy = w;
  const std::vector<double> dx0 = RandomValues(rows * cols, seed + 4, -1, 1);
  const std::vector<double> d_gamma0 = RandomValues(cols, seed + 5, -1, 1);
  const std::vector<double> d_beta0 = RandomValues(cols, seed + 6, -1, 1);
  std::vector<double> dx =
      param.accumulate ? dx0 : std::vector<double>(rows * cols, kNaN);
  std::vector<double> d_gamma = d_gamma0;
  std::vector<double> d_beta = d_beta0;
  const Tensor d_beta_v = F64View(d_beta, {cols});
  if (param.rms) {
    ASSERT_OK(RmsNormBackward(
        *context, x_v, gamma_v, rstd_v, F64View(dy, {rows, cols}),
        F64View(dx, {rows, cols}), param.accumulate, F64View(d_gamma, {cols})));
  } else {
    ASSERT_OK(LayerNormBackward(
        *context, x_v, gamma_v, mean_v, rstd_v, F64View(dy, {rows, cols}),
        F64View(dx, {rows, cols}), param.accumulate, F64View(d_gamma, {cols}),
        param.beta ? &d_beta_v : nullptr));
  }
  constexpr double kTol = 1e-10;
  EXPECT_TRUE(
      AllClose(dx, param.accumulate ? Plus(dx0, fd_x) : fd_x, kTol, kTol));
  EXPECT_TRUE(AllClose(d_gamma, Plus(d_gamma0, fd_gamma), kTol, kTol));
  if (param.beta) {
    EXPECT_TRUE(AllClose(d_beta, Plus(d_beta0, fd_beta), kTol, kTol));
  } else {
    EXPECT_EQ(d_beta, d_beta0);  // not passed: untouched
  }
}

INSTANTIATE_TEST_SUITE_P(CpuF64, NormGradientTest,
                         ::testing::Values(BackwardCase{false, true, false},
                                           BackwardCase{false, true, true},
                                           BackwardCase{false, false, false},
                                           BackwardCase{true, false, false},
                                           BackwardCase{true, false, true}),
                         BackwardName);

// ---------------------------------------------------------------------------
// Runs forward and backward on `context` in `dtype` (the CPU f64 run is the
// reference of the others).

struct RunInputs {
  int64_t rows = 0;
  int64_t cols = 0;
  bool rms = false;
  bool beta = false;
  bool accumulate = false;
  // Offset x, dy and dx by one element from an aligned allocation, to force
  // the GPU's block path.
  bool misaligned = false;
  std::vector<double> x, gamma, beta_values, dy, dx0, d_gamma0, d_beta0;
};

struct RunOutputs {
  // The inputs as the dtype holds them.
  std::vector<double> x, gamma, beta, dy, dx0;
  std::vector<double> y, mean, rstd, dx, d_gamma, d_beta;
};

absl::StatusOr<RunOutputs> RunNorm(Context& context, DType dtype,
                                   const RunInputs& in) {
  const int64_t rows = in.rows, cols = in.cols;
  const DType acc = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  const bool mis = in.misaligned;
  ASSIGN_OR_RETURN(Placed x,
                   Place(context, dtype, {rows, cols}, in.x, mis, false));
  ASSIGN_OR_RETURN(Placed gamma,
                   Place(context, dtype, {cols}, in.gamma, false, false));
  ASSIGN_OR_RETURN(Placed beta,
                   Place(context, dtype, {cols}, in.beta_values, false, false));
  ASSIGN_OR_RETURN(Placed dy,
                   Place(context, dtype, {rows, cols}, in.dy, mis, false));
  ASSIGN_OR_RETURN(Placed dx, Place(context, dtype, {rows, cols}, in.dx0, mis,
                                    !in.accumulate));
  ASSIGN_OR_RETURN(Placed y,
                   Place(context, dtype, {rows, cols}, in.x, mis, true));
  ASSIGN_OR_RETURN(Placed mean, Place(context, acc, {rows},
                                      std::vector<double>(rows), false, true));
  ASSIGN_OR_RETURN(Placed rstd, Place(context, acc, {rows},
                                      std::vector<double>(rows), false, true));
  ASSIGN_OR_RETURN(Placed d_gamma,
                   Place(context, acc, {cols}, in.d_gamma0, false, false));
  ASSIGN_OR_RETURN(Placed d_beta,
                   Place(context, acc, {cols}, in.d_beta0, false, false));
  RunOutputs out;
  ASSIGN_OR_RETURN(out.x, ToHost(context, x.view));
  ASSIGN_OR_RETURN(out.gamma, ToHost(context, gamma.view));
  ASSIGN_OR_RETURN(out.beta, ToHost(context, beta.view));
  ASSIGN_OR_RETURN(out.dy, ToHost(context, dy.view));
  if (in.accumulate) {
    ASSIGN_OR_RETURN(out.dx0, ToHost(context, dx.view));
  }
  if (in.rms) {
    RETURN_IF_ERROR(
        RmsNormForward(context, x.view, gamma.view, kEps, y.view, rstd.view));
    RETURN_IF_ERROR(RmsNormBackward(context, x.view, gamma.view, rstd.view,
                                    dy.view, dx.view, in.accumulate,
                                    d_gamma.view));
  } else {
    RETURN_IF_ERROR(LayerNormForward(context, x.view, gamma.view,
                                     in.beta ? &beta.view : nullptr, kEps,
                                     y.view, mean.view, rstd.view));
    RETURN_IF_ERROR(LayerNormBackward(
        context, x.view, gamma.view, mean.view, rstd.view, dy.view, dx.view,
        in.accumulate, d_gamma.view, in.beta ? &d_beta.view : nullptr));
  }
  ASSIGN_OR_RETURN(out.y, ToHost(context, y.view));
  if (!in.rms) {
    ASSIGN_OR_RETURN(out.mean, ToHost(context, mean.view));
  }
  ASSIGN_OR_RETURN(out.rstd, ToHost(context, rstd.view));
  ASSIGN_OR_RETURN(out.dx, ToHost(context, dx.view));
  ASSIGN_OR_RETURN(out.d_gamma, ToHost(context, d_gamma.view));
  ASSIGN_OR_RETURN(out.d_beta, ToHost(context, d_beta.view));
  return out;
}

RunInputs RandomInputs(uint64_t seed, int64_t rows, int64_t cols, bool rms,
                       bool beta, bool accumulate, bool misaligned) {
  RunInputs in;
  in.rows = rows;
  in.cols = cols;
  in.rms = rms;
  in.beta = beta;
  in.accumulate = accumulate;
  in.misaligned = misaligned;
  in.x = RandomValues(rows * cols, seed, -2, 3);
  in.gamma = RandomValues(cols, seed + 1, 0.5, 1.5);
  in.beta_values = RandomValues(cols, seed + 2, -1, 1);
  in.dy = RandomValues(rows * cols, seed + 3, -1, 1);
  in.dx0 = RandomValues(rows * cols, seed + 4, -1, 1);
  in.d_gamma0 = RandomValues(cols, seed + 5, -1, 1);
  in.d_beta0 = RandomValues(cols, seed + 6, -1, 1);
  return in;
}

// The CPU f64 run on `other`'s inputs as its dtype rounded them.
absl::StatusOr<RunOutputs> ReferenceOn(Context& cpu, RunInputs in,
                                       const RunOutputs& other) {
  in.x = other.x;
  in.gamma = other.gamma;
  in.beta_values = other.beta;
  in.dy = other.dy;
  if (in.accumulate) in.dx0 = other.dx0;
  in.misaligned = false;
  return RunNorm(cpu, DType::kF64, in);
}

// |actual - expected| <= rtol |expected| + atol_fraction * max |expected|.
::testing::AssertionResult Near(const std::vector<double>& actual,
                                const std::vector<double>& expected,
                                double rtol, double atol_fraction) {
  return AllClose(actual, expected, atol_fraction * MaxAbs(expected), rtol);
}

TEST(NormCpuTest, F32MatchesF64) {
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "RmsNorm" : "LayerNorm");
    const RunInputs in = RandomInputs(seed, 7, 45, rms, !rms, true, false);
    ASSERT_OK_AND_ASSIGN(RunOutputs f32, RunNorm(*cpu, DType::kF32, in));
    ASSERT_OK_AND_ASSIGN(RunOutputs ref, ReferenceOn(*cpu, in, f32));
    EXPECT_TRUE(Near(f32.y, ref.y, 1e-5, 1e-6));
    EXPECT_TRUE(Near(f32.rstd, ref.rstd, 1e-6, 0));
    EXPECT_TRUE(Near(f32.dx, ref.dx, 1e-5, 1e-6));
    EXPECT_TRUE(Near(f32.d_gamma, ref.d_gamma, 1e-5, 1e-6));
    if (!rms) {
      EXPECT_TRUE(Near(f32.mean, ref.mean, 1e-6, 1e-7));
      EXPECT_TRUE(Near(f32.d_beta, ref.d_beta, 1e-5, 1e-6));
    }
  }
}

TEST(NormCpuTest, EmptyRowsAreANoOp) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  std::vector<double> gamma = {1, 2, 3};
  std::vector<double> d_gamma = {4, 5, 6};
  std::vector<double> none;
  const Tensor empty = F64View(none, {0, 3});
  const Tensor stats = F64View(none, {0});
  ASSERT_OK(LayerNormForward(*cpu, empty, F64View(gamma, {3}), nullptr, kEps,
                             empty, stats, stats));
  ASSERT_OK(LayerNormBackward(*cpu, empty, F64View(gamma, {3}), stats, stats,
                              empty, empty, false, F64View(d_gamma, {3}),
                              nullptr));
  EXPECT_EQ(d_gamma, (std::vector<double>{4, 5, 6}));
}

TEST(NormCpuTest, WorkspaceBytesCoverTheBackward) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const int64_t rows = 5, cols = 24;
  const int64_t bytes = NormBackwardWorkspaceBytes(Device::Cpu(), rows, cols);
  EXPECT_EQ(bytes, 2 * cols * 8);
  EXPECT_EQ(NormBackwardWorkspaceBytes(Device::Cpu(), 0, cols), 0);
  // GPU: two f32 partial rows per block, a block per 16 rows at most, at most
  // 16 blocks per SM (256 SMs assumed where none can be queried).
  EXPECT_EQ(NormBackwardWorkspaceBytes(Device::Cuda(0), 32, cols),
            2 * 2 * cols * 4);
  EXPECT_LE(NormBackwardWorkspaceBytes(Device::Cuda(0), 1 << 20, cols),
            2 * 16 * 256 * cols * 4);
  ASSERT_OK(cpu->ReserveWorkspace(bytes));
  const int64_t reserved = cpu->workspace_bytes();
  ASSERT_OK_AND_ASSIGN(RunOutputs out,
                       RunNorm(*cpu, DType::kF64,
                               RandomInputs(test::TestSeed(), rows, cols, false,
                                            true, false, false)));
  EXPECT_EQ(cpu->workspace_bytes(), reserved);  // no growth on the hot path
}

// ---------------------------------------------------------------------------
// GPU f32 and bf16 against the CPU f64 results.

struct GpuCase {
  int64_t rows;
  int64_t cols;
  bool misaligned;
  const char* name;
};

class NormGpuTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(NormGpuTest, MatchesCpuF64) {
  SKIP_WITHOUT_GPU();
  const GpuCase shape = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool rms : {false, true}) {
      for (bool beta : {false, true}) {
        if (rms && beta) continue;
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), rms ? " rms" : " layer",
                                    beta ? " beta" : "",
                                    accumulate ? " accumulate" : ""));
          const RunInputs in = RandomInputs(seed, shape.rows, shape.cols, rms,
                                            beta, accumulate, shape.misaligned);
          ASSERT_OK_AND_ASSIGN(RunOutputs got, RunNorm(*gpu, dtype, in));
          ASSERT_OK_AND_ASSIGN(RunOutputs ref, ReferenceOn(*cpu, in, got));
          // bf16 outputs: one rounding (2^-9 relative) after fp32 math.
          const bool bf16 = dtype == DType::kBF16;
          const double rtol = bf16 ? 1.0 / 128 : 2e-5;
          const double atol = bf16 ? 2e-3 : 2e-5;
          EXPECT_TRUE(Near(got.y, ref.y, rtol, atol));
          EXPECT_TRUE(Near(got.rstd, ref.rstd, 1e-5, 0));
          if (!rms) {
            EXPECT_TRUE(Near(got.mean, ref.mean, 1e-5, 1e-6));
          }
          EXPECT_TRUE(Near(got.dx, ref.dx, rtol, atol));
          // fp32 sums over the rows, from exact products of the inputs.
          EXPECT_TRUE(Near(got.d_gamma, ref.d_gamma, 1e-4, 1e-5));
          EXPECT_TRUE(
              Near(got.d_beta, beta ? ref.d_beta : in.d_beta0, 1e-4, 1e-5));
          // Deterministic: a second run gives the same bits.
          ASSERT_OK_AND_ASSIGN(RunOutputs again, RunNorm(*gpu, dtype, in));
          EXPECT_EQ(again.y, got.y);
          EXPECT_EQ(again.dx, got.dx);
          EXPECT_EQ(again.d_gamma, got.d_gamma);
          EXPECT_EQ(again.d_beta, got.d_beta);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NormGpuTest,
    ::testing::Values(
        // Warp path: GPT-2's width (3 chunks a lane), one chunk, the widest.
        GpuCase{67, 768, false, "Gpt2Width"}, GpuCase{33, 64, false, "Narrow"},
        GpuCase{9, 2048, false, "WidestWarp"},
        // Many rows per backward warp (the persistent loop, whose warps load
        // the next row while they finish one), narrow and at GPT-2's width.
        GpuCase{3000, 96, false, "ManyRows"},
        GpuCase{2501, 768, false, "ManyRowsGpt2Width"},
        // Block path: width not a multiple of 8, too wide, misaligned.
        GpuCase{20, 37, false, "OddWidth"}, GpuCase{5, 2056, false, "Wide"},
        GpuCase{40, 768, true, "Misaligned"}),
    [](const ::testing::TestParamInfo<GpuCase>& info) {
      return std::string(info.param.name);
    });

TEST(NormGpuTest, WorkspaceBytesCoverTheBackward) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  const int64_t rows = 4000, cols = 768;
  ASSERT_OK(gpu->ReserveWorkspace(
      NormBackwardWorkspaceBytes(gpu->device(), rows, cols)));
  const int64_t reserved = gpu->workspace_bytes();
  ASSERT_OK_AND_ASSIGN(RunOutputs out,
                       RunNorm(*gpu, DType::kBF16,
                               RandomInputs(test::TestSeed(), rows, cols, false,
                                            true, false, false)));
  EXPECT_EQ(gpu->workspace_bytes(), reserved);
}

TEST(NormGpuTest, RejectsF64) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK_AND_ASSIGN(OwnedTensor x,
                       PoisonedTensor(*gpu, DType::kF64, {2, 8}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor gamma,
                       PoisonedTensor(*gpu, DType::kF64, {8}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y,
                       PoisonedTensor(*gpu, DType::kF64, {2, 8}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor rstd,
                       PoisonedTensor(*gpu, DType::kF64, {2}));
  EXPECT_EQ(
      RmsNormForward(*gpu, x.view, gamma.view, kEps, y.view, rstd.view).code(),
      absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Invalid arguments: InvalidArgument, and nothing written.

class NormInvalidTest : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = MakeContext(Device::Cpu());
    ASSERT_NE(context_, nullptr);
    x_ = RandomValues(kRows * kCols, test::TestSeed(), -1, 1);
    gamma_.assign(kCols, 1.0);
    beta_.assign(kCols, 0.5);
    dy_ = RandomValues(kRows * kCols, test::TestSeed() + 1, -1, 1);
    y_.assign(kRows * kCols, kNaN);
    mean_.assign(kRows, kNaN);
    rstd_.assign(kRows, kNaN);
    dx_.assign(kRows * kCols, kNaN);
    d_gamma_.assign(kCols, 7.0);
    d_beta_.assign(kCols, 7.0);
  }

  // Nothing was written to the outputs.
  void ExpectUntouched() {
    for (double v : y_) EXPECT_TRUE(std::isnan(v));
    for (double v : mean_) EXPECT_TRUE(std::isnan(v));
    for (double v : rstd_) EXPECT_TRUE(std::isnan(v));
    for (double v : dx_) EXPECT_TRUE(std::isnan(v));
    for (double v : d_gamma_) EXPECT_EQ(v, 7.0);
    for (double v : d_beta_) EXPECT_EQ(v, 7.0);
  }

  absl::Status Forward(const Tensor& x, const Tensor& gamma, const Tensor* beta,
                       const Tensor& y, const Tensor& mean, float eps = kEps) {
    return LayerNormForward(*context_, x, gamma, beta, eps, y, mean,
                            F64View(rstd_, {kRows}));
  }

  absl::Status Backward(const Tensor& dy, const Tensor& dx,
                        const Tensor& d_gamma, const Tensor* d_beta) {
    // Valid statistics, so that only the argument under test is wrong.
    std::vector<double> mean(kRows, 0.0), rstd(kRows, 1.0);
    return LayerNormBackward(*context_, F64View(x_, {kRows, kCols}),
                             F64View(gamma_, {kCols}), F64View(mean, {kRows}),
                             F64View(rstd, {kRows}), dy, dx, false, d_gamma,
                             d_beta);
  }

  static constexpr int64_t kRows = 3;
  static constexpr int64_t kCols = 8;
  std::unique_ptr<Context> context_;
  std::vector<double> x_, gamma_, beta_, dy_, y_, mean_, rstd_, dx_, d_gamma_,
      d_beta_;
};

TEST_F(NormInvalidTest, Forward) {
  const Tensor x = F64View(x_, {kRows, kCols});
  const Tensor gamma = F64View(gamma_, {kCols});
  const Tensor beta = F64View(beta_, {kCols});
  const Tensor y = F64View(y_, {kRows, kCols});
  const Tensor mean = F64View(mean_, {kRows});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ExpectUntouched();
  };
  // Shapes.
  expect_invalid(Forward(x, F64View(gamma_, {kCols - 1}), &beta, y, mean));
  expect_invalid(
      Forward(x, gamma, &beta, F64View(y_, {kRows, kCols - 1}), mean));
  expect_invalid(Forward(x, gamma, &beta, y, F64View(mean_, {kRows - 1})));
  expect_invalid(Forward(F64View(x_, {kRows * kCols}), gamma, &beta, y, mean));
  std::vector<double> none;
  expect_invalid(Forward(F64View(none, {kRows, 0}), F64View(none, {0}), nullptr,
                         F64View(none, {kRows, 0}), mean));
  // Dtypes: an integer x, bf16 (not a CPU activation dtype), f32 statistics
  // for f64 activations.
  Tensor x_i32 = x;
  x_i32.dtype = DType::kI32;
  expect_invalid(Forward(x_i32, gamma, &beta, y, mean));
  Tensor x_bf16 = x;
  x_bf16.dtype = DType::kBF16;
  expect_invalid(Forward(x_bf16, gamma, &beta, y, mean));
  Tensor mean_f32 = mean;
  mean_f32.dtype = DType::kF32;
  expect_invalid(Forward(x, gamma, &beta, y, mean_f32));
  // Null data, another device, eps.
  Tensor x_null = x;
  x_null.data = nullptr;
  expect_invalid(Forward(x_null, gamma, &beta, y, mean));
  Tensor beta_null = beta;
  beta_null.data = nullptr;
  expect_invalid(Forward(x, gamma, &beta_null, y, mean));
  Tensor x_gpu = x;
  x_gpu.device = Device::Cuda(0);
  expect_invalid(Forward(x_gpu, gamma, &beta, y, mean));
  expect_invalid(Forward(x, gamma, &beta, y, mean, -1.0f));
  expect_invalid(Forward(x, gamma, &beta, y, mean, NAN));
  // Overlap: y on x, mean inside y.
  expect_invalid(Forward(x, gamma, &beta, x, mean));
  expect_invalid(Forward(x, gamma, &beta, y, F64View(y_, {kRows})));
}

TEST_F(NormInvalidTest, Backward) {
  const Tensor dy = F64View(dy_, {kRows, kCols});
  const Tensor dx = F64View(dx_, {kRows, kCols});
  const Tensor d_gamma = F64View(d_gamma_, {kCols});
  const Tensor d_beta = F64View(d_beta_, {kCols});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ExpectUntouched();
  };
  expect_invalid(
      Backward(F64View(dy_, {kRows - 1, kCols}), dx, d_gamma, &d_beta));
  expect_invalid(
      Backward(dy, F64View(dx_, {kRows, kCols - 1}), d_gamma, &d_beta));
  expect_invalid(Backward(dy, dx, F64View(d_gamma_, {kCols + 1}), &d_beta));
  Tensor d_gamma_f32 = d_gamma;
  d_gamma_f32.dtype = DType::kF32;
  expect_invalid(Backward(dy, dx, d_gamma_f32, &d_beta));
  Tensor d_beta_null = d_beta;
  d_beta_null.data = nullptr;
  expect_invalid(Backward(dy, dx, d_gamma, &d_beta_null));
  // dx on dy, d_beta on d_gamma.
  expect_invalid(Backward(dy, F64View(dy_, {kRows, kCols}), d_gamma, &d_beta));
  expect_invalid(Backward(dy, dx, d_gamma, &d_gamma));
  // RMSNorm's own entry point checks too.
  std::vector<double> rstd(kRows, 1.0);
  EXPECT_EQ(RmsNormBackward(*context_, F64View(x_, {kRows, kCols}),
                            F64View(gamma_, {kCols}),
                            F64View(rstd, {kRows - 1}), dy, dx, false, d_gamma)
                .code(),
            absl::StatusCode::kInvalidArgument);
  ExpectUntouched();
}

}  // namespace
}  // namespace ops
}  // namespace lossrt
