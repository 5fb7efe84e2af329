// Host round trips, poison, random values and gradient checks for op tests.
#include "tests/graph/op_test_util.h"

#include <algorithm>
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
                   EmptyTensor(context.allocator(), dtype, shape));
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

absl::StatusOr<Placed> Place(Context& context, DType dtype, Shape shape,
                             absl::Span<const double> values, bool misaligned,
                             bool poison) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (!poison && static_cast<int64_t>(values.size()) != count) {
    return absl::InvalidArgumentError("Place: values do not fill the shape");
  }
  const int64_t pad = misaligned ? 1 : 0;
  std::vector<double> padded(pad + count, 0.0);
  if (!poison) std::copy(values.begin(), values.end(), padded.begin() + pad);
  const Shape flat = {static_cast<int64_t>(padded.size())};
  Placed placed;
  ASSIGN_OR_RETURN(placed.owned, poison
                                     ? PoisonedTensor(context, dtype, flat)
                                     : FromHost(context, dtype, flat, padded));
  placed.view = Tensor::Of(
      static_cast<char*>(placed.owned.view.data) + pad * DTypeSize(dtype),
      dtype, std::move(shape), context.device());
  return placed;
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

std::unique_ptr<Context> MakeContext(Device device) {
  auto context = Context::Create(device);
  EXPECT_TRUE(context.ok()) << context.status();
  return context.ok() ? std::move(context).value() : nullptr;
}

Tensor F64View(std::vector<double>& values, Shape shape) {
  return Tensor::Of(values.data(), DType::kF64, std::move(shape),
                    Device::Cpu());
}

double RoundTo(DType dtype, double value) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(value);
    case DType::kBF16:
      return Bf16BitsToFloat(FloatToBf16Bits(static_cast<float>(value)));
    default:
      return value;
  }
}

std::vector<double> Rounded(DType dtype, std::vector<double> values) {
  for (double& value : values) value = RoundTo(dtype, value);
  return values;
}

double MaxAbs(absl::Span<const double> values) {
  double max = 0;
  for (double value : values) max = std::max(max, std::abs(value));
  return max;
}

std::vector<double> Plus(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

double Dot(absl::Span<const double> a, absl::Span<const double> b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
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

std::vector<double> RichardsonGradient(const std::function<double()>& objective,
                                       std::vector<double>& x, double step) {
  std::vector<double> fine = NumericalGradient(objective, x, step);
  const std::vector<double> coarse = NumericalGradient(objective, x, 2 * step);
  for (size_t i = 0; i < fine.size(); ++i) {
    fine[i] = (4 * fine[i] - coarse[i]) / 3;
  }
  return fine;
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
