// Tests of the element-wise ops (graph/ops/elementwise.h): Add, AccumulateInto
// over every pair of f32/bf16/f64 and Zero over every dtype, on the CPU and
// (when usable) the GPU, each against the exact result computed here (the ops
// round once, so CPU and GPU must match it bit for bit); in-place calls,
// tails, misaligned tensors, poisoned outputs, and invalid arguments (nothing
// written).
#include "graph/ops/elementwise.h"

#include <cmath>
#include <cstdint>
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

using test::FromHost;
using test::MakeContext;
using test::Place;
using test::Placed;
using test::PoisonedTensor;
using test::RandomValues;
using test::RoundTo;
using test::ToHost;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<Device> Devices() { return test::TestDevices(); }

std::vector<DType> ActivationDTypes(const Device& device) {
  if (device.is_cpu()) return {DType::kF32, DType::kF64};
  return {DType::kF32, DType::kBF16};
}

std::string Trace(const Device& device, DType dtype, int64_t n,
                  bool misaligned) {
  return absl::StrCat(device.ToString(), " ", DTypeName(dtype), " n=", n,
                      misaligned ? " misaligned" : "");
}

// ---------------------------------------------------------------------------
// Add.

TEST(AddTest, MatchesExactSum) {
  const uint64_t seed = test::TestSeed();
  for (const Device& device : Devices()) {
    auto context = MakeContext(device);
    ASSERT_NE(context, nullptr);
    for (DType dtype : ActivationDTypes(device)) {
      // One element, a tail after whole chunks, many chunks; misaligned.
      for (int64_t n : {int64_t{1}, int64_t{1003}, int64_t{1} << 17}) {
        for (bool misaligned : {false, true}) {
          SCOPED_TRACE(Trace(device, dtype, n, misaligned));
          ASSERT_OK_AND_ASSIGN(Placed a,
                               Place(*context, dtype, {n},
                                     RandomValues(n, seed, -4, 4), misaligned));
          ASSERT_OK_AND_ASSIGN(
              Placed b, Place(*context, dtype, {n},
                              RandomValues(n, seed + 1, -4, 4), misaligned));
          ASSERT_OK_AND_ASSIGN(
              Placed y, Place(*context, dtype, {n}, std::vector<double>(n),
                              misaligned, /*poison=*/true));
          ASSERT_OK_AND_ASSIGN(std::vector<double> av,
                               ToHost(*context, a.view));
          ASSERT_OK_AND_ASSIGN(std::vector<double> bv,
                               ToHost(*context, b.view));
          ASSERT_OK(Add(*context, a.view, b.view, y.view));
          ASSERT_OK_AND_ASSIGN(std::vector<double> yv,
                               ToHost(*context, y.view));
          std::vector<double> expected(n);
          for (int64_t i = 0; i < n; ++i) {
            // f32 math for f32 and bf16, one rounding to the dtype.
            expected[i] = dtype == DType::kF64
                              ? av[i] + bv[i]
                              : RoundTo(dtype, static_cast<float>(av[i]) +
                                                   static_cast<float>(bv[i]));
          }
          EXPECT_EQ(yv, expected);
          // In place, into a and into b.
          ASSERT_OK(Add(*context, a.view, b.view, a.view));
          ASSERT_OK_AND_ASSIGN(std::vector<double> in_a,
                               ToHost(*context, a.view));
          EXPECT_EQ(in_a, expected);
          ASSERT_OK(Add(*context, y.view, b.view, b.view));
          ASSERT_OK_AND_ASSIGN(std::vector<double> in_b,
                               ToHost(*context, b.view));
          for (int64_t i = 0; i < n; ++i) {
            expected[i] = dtype == DType::kF64
                              ? yv[i] + bv[i]
                              : RoundTo(dtype, static_cast<float>(yv[i]) +
                                                   static_cast<float>(bv[i]));
          }
          EXPECT_EQ(in_b, expected);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// AccumulateInto over every (src, dst) pair of f32, bf16, f64.

TEST(AccumulateIntoTest, MatchesExactResult) {
  const uint64_t seed = test::TestSeed();
  const std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF64};
  for (const Device& device : Devices()) {
    auto context = MakeContext(device);
    ASSERT_NE(context, nullptr);
    for (DType src_dtype : dtypes) {
      for (DType dst_dtype : dtypes) {
        for (bool accumulate : {false, true}) {
          for (bool misaligned : {false, true}) {
            const int64_t n = 1003;
            SCOPED_TRACE(absl::StrCat(Trace(device, src_dtype, n, misaligned),
                                      " -> ", DTypeName(dst_dtype),
                                      accumulate ? " accumulate" : ""));
            // Values with more digits than f32 holds, so that every rounding
            // shows.
            ASSERT_OK_AND_ASSIGN(
                Placed src, Place(*context, src_dtype, {n},
                                  RandomValues(n, seed, -3, 3), misaligned));
            ASSERT_OK_AND_ASSIGN(
                Placed dst, Place(*context, dst_dtype, {n},
                                  RandomValues(n, seed + 1, -3, 3), !misaligned,
                                  /*poison=*/!accumulate));
            ASSERT_OK_AND_ASSIGN(std::vector<double> sv,
                                 ToHost(*context, src.view));
            ASSERT_OK_AND_ASSIGN(std::vector<double> dv,
                                 ToHost(*context, dst.view));
            ASSERT_OK(AccumulateInto(*context, src.view, dst.view, accumulate));
            ASSERT_OK_AND_ASSIGN(std::vector<double> got,
                                 ToHost(*context, dst.view));
            const bool wide =
                src_dtype == DType::kF64 || dst_dtype == DType::kF64;
            std::vector<double> expected(n);
            for (int64_t i = 0; i < n; ++i) {
              double sum;
              if (wide) {
                sum = accumulate ? dv[i] + sv[i] : sv[i];
              } else {
                sum = accumulate ? static_cast<float>(dv[i]) +
                                       static_cast<float>(sv[i])
                                 : static_cast<float>(sv[i]);
              }
              expected[i] = RoundTo(dst_dtype, sum);
            }
            EXPECT_EQ(got, expected);
          }
        }
      }
    }
  }
}

TEST(AccumulateIntoTest, IntoItself) {
  for (const Device& device : Devices()) {
    auto context = MakeContext(device);
    ASSERT_NE(context, nullptr);
    SCOPED_TRACE(device.ToString());
    const std::vector<double> values = {1.5, -2.25, 3, 0.125, 7, 9, 11, 13, 2};
    ASSERT_OK_AND_ASSIGN(OwnedTensor t,
                         FromHost(*context, DType::kF32, {3, 3}, values));
    ASSERT_OK(AccumulateInto(*context, t.view, t.view, true));
    ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*context, t.view));
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], 2 * values[i]);
    // Shapes may differ when the element counts agree.
    ASSERT_OK_AND_ASSIGN(OwnedTensor flat,
                         PoisonedTensor(*context, DType::kBF16, {9}));
    ASSERT_OK(AccumulateInto(*context, t.view, flat.view, false));
    ASSERT_OK_AND_ASSIGN(std::vector<double> copied,
                         ToHost(*context, flat.view));
    EXPECT_EQ(copied, got);  // all exact in bf16
  }
}

// ---------------------------------------------------------------------------
// Zero.

TEST(ZeroTest, EveryDtype) {
  for (const Device& device : Devices()) {
    auto context = MakeContext(device);
    ASSERT_NE(context, nullptr);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                        DType::kI64, DType::kF64}) {
      for (int64_t n : {int64_t{1}, int64_t{1001}}) {
        SCOPED_TRACE(Trace(device, dtype, n, false));
        ASSERT_OK_AND_ASSIGN(
            OwnedTensor t,
            FromHost(*context, dtype, {n},
                     std::vector<double>(n, -5.0)));  // not 0 in any dtype
        ASSERT_OK(Zero(*context, t.view));
        ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*context, t.view));
        for (double v : got) {
          EXPECT_EQ(v, 0.0);
          EXPECT_FALSE(std::signbit(v));
        }
      }
    }
    // Empty tensors, with or without data, are fine.
    ASSERT_OK(Zero(
        *context, Tensor::Of(nullptr, DType::kF32, {0, 4}, context->device())));
  }
}

// ---------------------------------------------------------------------------
// Invalid arguments: InvalidArgument, and nothing written.

TEST(ElementwiseInvalidTest, NothingWritten) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  std::vector<double> a = {1, 2, 3, 4, 5, 6};
  std::vector<double> b = {1, 1, 1, 1, 1, 1};
  std::vector<double> out(8, kNaN);
  auto view = [](std::vector<double>& v, Shape shape, int64_t offset = 0) {
    return Tensor::Of(v.data() + offset, DType::kF64, std::move(shape),
                      Device::Cpu());
  };
  const Tensor av = view(a, {2, 3});
  const Tensor bv = view(b, {2, 3});
  const Tensor yv = view(out, {2, 3});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (double v : out) EXPECT_TRUE(std::isnan(v));
  };
  // Add: shapes, dtypes, null data, device, partial overlap.
  expect_invalid(Add(*cpu, av, view(b, {3, 2}), yv));
  expect_invalid(Add(*cpu, av, bv, view(out, {6})));
  Tensor b_f32 = bv;
  b_f32.dtype = DType::kF32;
  expect_invalid(Add(*cpu, av, b_f32, yv));
  Tensor a_i32 = av, b_i32 = bv, y_i32 = yv;
  a_i32.dtype = b_i32.dtype = y_i32.dtype = DType::kI32;
  expect_invalid(Add(*cpu, a_i32, b_i32, y_i32));
  Tensor a_bf16 = av, b_bf16 = bv, y_bf16 = yv;
  a_bf16.dtype = b_bf16.dtype = y_bf16.dtype = DType::kBF16;
  expect_invalid(Add(*cpu, a_bf16, b_bf16, y_bf16));
  Tensor b_null = bv;
  b_null.data = nullptr;
  expect_invalid(Add(*cpu, av, b_null, yv));
  Tensor y_gpu = yv;
  y_gpu.device = Device::Cuda(0);
  expect_invalid(Add(*cpu, av, bv, y_gpu));
  expect_invalid(Add(*cpu, yv, bv, view(out, {2, 3}, 1)));
  Tensor y_strided = yv;
  y_strided.row_stride = 4;
  expect_invalid(Add(*cpu, av, bv, y_strided));
  // AccumulateInto: counts, dtypes, overlaps.
  expect_invalid(AccumulateInto(*cpu, av, view(out, {7}), false));
  expect_invalid(AccumulateInto(*cpu, a_i32, yv, false));
  Tensor y_f16 = yv;
  y_f16.dtype = DType::kF16;
  expect_invalid(AccumulateInto(*cpu, av, y_f16, false));
  expect_invalid(AccumulateInto(*cpu, yv, view(out, {2, 3}, 1), true));
  // The same bytes read as another dtype.
  const Tensor out_as_f32 =
      Tensor::Of(out.data(), DType::kF32, {6}, Device::Cpu());
  expect_invalid(AccumulateInto(*cpu, view(out, {6}), out_as_f32, true));
  expect_invalid(AccumulateInto(*cpu, b_null, yv, false));
  // Zero: null data, device, strides.
  Tensor y_null = yv;
  y_null.data = nullptr;
  EXPECT_EQ(Zero(*cpu, y_null).code(), absl::StatusCode::kInvalidArgument);
  expect_invalid(Zero(*cpu, y_gpu));
  expect_invalid(Zero(*cpu, y_strided));
}

TEST(ElementwiseGpuTest, RejectsF64Add) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK_AND_ASSIGN(OwnedTensor a, PoisonedTensor(*gpu, DType::kF64, {4}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor y, PoisonedTensor(*gpu, DType::kF64, {4}));
  EXPECT_EQ(Add(*gpu, a.view, a.view, y.view).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ops
}  // namespace lossrt
