// Host round trips, poison, random values and gradient checks for op tests.
#include "tests/graph/op_test_util.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "tests/tensor_image.h"

namespace lossrt {
namespace test {
namespace {

Tensor HostView(Bytes& image, const Tensor& like) {
  return Tensor::Of(image.data(), like.dtype, like.shape, Device::Cpu());
}

absl::StatusOr<OwnedTensor> FromImage(Context& context, DType dtype,
                                      Shape shape, Bytes& image) {
  ASSIGN_OR_RETURN(OwnedTensor tensor,
                   EmptyTensor(context.allocator(), dtype, std::move(shape)));
  RETURN_IF_ERROR(
      CopyTensor(HostView(image, tensor.view), tensor.view, context));
  RETURN_IF_ERROR(context.Synchronize());
  return tensor;
}

absl::StatusOr<Bytes> ToImage(Context& context, const Tensor& tensor) {
  Bytes image(tensor.numel() * DTypeSize(tensor.dtype));
  Tensor contiguous = tensor;
  RETURN_IF_ERROR(CopyTensor(tensor, HostView(image, contiguous), context));
  RETURN_IF_ERROR(context.Synchronize());
  return image;
}

}  // namespace

absl::StatusOr<OwnedTensor> FromHost(Context& context, DType dtype, Shape shape,
                                     absl::Span<const double> values) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count != static_cast<int64_t>(values.size())) {
    return InvalidArgument("FromHost: ", values.size(),
                           " values for a tensor of ", count);
  }
  Bytes image(count * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) Store(dtype, image, i, values[i]);
  return FromImage(context, dtype, std::move(shape), image);
}

absl::StatusOr<OwnedTensor> PoisonedTensor(Context& context, DType dtype,
                                           Shape shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  Bytes image(count * DTypeSize(dtype));
  Poison(dtype, image);
  return FromImage(context, dtype, std::move(shape), image);
}

absl::StatusOr<std::vector<double>> ToHost(Context& context,
                                           const Tensor& tensor) {
  ASSIGN_OR_RETURN(Bytes image, ToImage(context, tensor));
  std::vector<double> values(tensor.numel());
  const bool floating = IsFloating(tensor.dtype);
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    values[i] = floating && IsPoison(tensor.dtype, image, i)
                    ? std::nan("")
                    : Load(tensor.dtype, image, i);
  }
  return values;
}

absl::StatusOr<int64_t> CountPoison(Context& context, const Tensor& tensor) {
  ASSIGN_OR_RETURN(Bytes image, ToImage(context, tensor));
  int64_t poisoned = 0;
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    poisoned += IsPoison(tensor.dtype, image, i) ? 1 : 0;
  }
  return poisoned;
}

std::vector<double> RandomValues(int64_t count, uint64_t seed, double low,
                                 double high) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> uniform(low, high);
  std::vector<double> values(count);
  for (double& value : values) value = uniform(engine);
  return values;
}

std::vector<double> NumericalGradient(const std::function<double()>& objective,
                                      std::vector<double>& x, double eps) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = objective();
    x[i] = saved - eps;
    const double minus = objective();
    x[i] = saved;
    gradient[i] = (plus - minus) / (2 * eps);
  }
  return gradient;
}

::testing::AssertionResult AllClose(absl::Span<const double> actual,
                                    absl::Span<const double> expected,
                                    double atol, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " values against " << expected.size();
  }
  int64_t bad = 0;
  int64_t worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - expected[i]);
    const double bound = atol + rtol * std::abs(expected[i]);
    if (!(error <= bound)) {
      ++bad;
      const double excess = std::isnan(error) ? INFINITY : error / bound;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements off (atol " << atol
         << ", rtol " << rtol << "); worst at " << worst << ": "
         << actual[worst] << " vs " << expected[worst];
}

}  // namespace test
}  // namespace lossrt
