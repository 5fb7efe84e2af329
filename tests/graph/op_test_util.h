// Helpers for the graph's op tests: tensors made from and read back into
// host vectors of doubles (any float dtype, any device), NaN poison to tell
// which elements a call wrote, random values, central-difference gradients and
// an element-wise closeness assertion that names the worst element.
//
//   ASSERT_OK_AND_ASSIGN(OwnedTensor x, FromHost(*context, DType::kF32,
//                                                {rows, cols}, values));
//   ASSERT_OK_AND_ASSIGN(std::vector<double> y, ToHost(*context, out.view));
//   EXPECT_TRUE(AllClose(y, expected, /*atol=*/1e-6, /*rtol=*/1e-5));
#ifndef LOSSRT_TESTS_GRAPH_OP_TEST_UTIL_H_
#define LOSSRT_TESTS_GRAPH_OP_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/status_assertions.h"

namespace lossrt {
namespace test {

// A contiguous tensor on the context's device holding `values` rounded to
// `dtype` (integer dtypes truncate).
absl::StatusOr<OwnedTensor> FromHost(Context& context, DType dtype, Shape shape,
                                     absl::Span<const double> values);

// A contiguous tensor on the context's device whose every element is the
// poison NaN of its dtype (tests/tensor_image.h).
absl::StatusOr<OwnedTensor> PoisonedTensor(Context& context, DType dtype,
                                           Shape shape);

// The tensor's elements as doubles, after the context's queued work is done.
// Poisoned elements read as NaN.
absl::StatusOr<std::vector<double>> ToHost(Context& context,
                                           const Tensor& tensor);

// A tensor on the context's device viewed as `shape`: holding `values`, or
// poisoned (`poison`; its size then comes from `shape`). `misaligned` puts
// the view one element into a larger tensor, off 16-byte alignment.
struct Placed {
  OwnedTensor owned;
  Tensor view;
};
absl::StatusOr<Placed> Place(Context& context, DType dtype, Shape shape,
                             absl::Span<const double> values,
                             bool misaligned = false, bool poison = false);

// How many elements of the tensor still hold the poison.
absl::StatusOr<int64_t> CountPoison(Context& context, const Tensor& tensor);

// A context on `device` (a test failure and null when it cannot be made).
std::unique_ptr<Context> MakeContext(Device device);

// An f64 CPU tensor viewing `values`.
Tensor F64View(std::vector<double>& values, Shape shape);

// `value` (each of `values`) rounded to `dtype` and back: f32 and bf16 round,
// other dtypes keep the value.
double RoundTo(DType dtype, double value);
std::vector<double> Rounded(DType dtype, std::vector<double> values);

// max |values[i]| (0 for none), a + b element-wise, and the dot product.
double MaxAbs(absl::Span<const double> values);
std::vector<double> Plus(std::vector<double> a, const std::vector<double>& b);
double Dot(absl::Span<const double> a, absl::Span<const double> b);

// `count` values uniform in [low, high) from `seed`.
std::vector<double> RandomValues(int64_t count, uint64_t seed, double low,
                                 double high);

// Central differences (objective(x + eps e_i) - objective(x - eps e_i)) /
// (2 eps) for every i; `objective` must read `x` (which is restored).
std::vector<double> NumericalGradient(const std::function<double()>& objective,
                                      std::vector<double>& x, double eps);

// NumericalGradient with Richardson extrapolation over steps `step` and
// 2 `step` (error O(step^4)).
std::vector<double> RichardsonGradient(const std::function<double()>& objective,
                                       std::vector<double>& x, double step);

// |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for every i (NaN
// fails), else a failure naming the count of bad elements and the worst one.
::testing::AssertionResult AllClose(absl::Span<const double> actual,
                                    absl::Span<const double> expected,
                                    double atol, double rtol);

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_GRAPH_OP_TEST_UTIL_H_
