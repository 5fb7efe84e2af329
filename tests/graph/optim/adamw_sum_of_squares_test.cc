// Tests of the sharded optimizer's pieces (graph/optim/adamw.h):
// GradientSumOfSquares against a long-double sum on the CPU and the GPU (f32
// and, on the CPU, f64 gradients; empty, ragged and past the GPU's first-stage
// block cap), bitwise consistent with GradientNorm and reproducible; and
// AdamWStepWithSumOfSquares on shards of a flat state (uneven, one empty, one
// cutting the decay boundary): given the whole gradient's sum of squares the
// shards' steps are AdamWStep's bits, and given the sum of the shards' sums
// (what ZeRO-1's all-reduce gives) they follow the double reference; CPU and
// GPU give the same bits from the same state and sum; bad arguments give
// InvalidArgument and write nothing. The GPU cases skip without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/optim/adamw.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"
#include "tests/graph/optim/adamw_reference.h"

namespace lossrt {
namespace optim {
namespace {

using test::AdamWReference;
using test::AllClose;
using test::CountPoison;
using test::FromHost;
using test::MaxAbs;
using test::PoisonedTensor;
using test::RandomValues;
using test::ReferenceNorm;
using test::ReferenceSumOfSquares;
using test::ReferenceUpdate;
using test::Rounded;
using test::TestSeed;
using test::ToHost;

// Elements [begin, end) of the flat `whole` as a tensor of their own.
Tensor Slice(const Tensor& whole, int64_t begin, int64_t end) {
  char* data = static_cast<char*>(whole.data) + begin * DTypeSize(whole.dtype);
  return Tensor::Of(data, whole.dtype, {end - begin}, whole.device);
}

absl::StatusOr<double> ReadScalar(Context& context, const Tensor& tensor) {
  ASSIGN_OR_RETURN(std::vector<double> values, ToHost(context, tensor));
  return values[0];
}

// ---- GradientSumOfSquares ----

// A double sum of squares (all positive) in any order is within n * 2^-53
// relative of the exact one at worst; about 1e-12 is seen at 9M elements.
constexpr double kSumRtol = 1e-11;

TEST(GradientSumOfSquaresTest, MatchesLongDoubleSum) {
  const uint64_t seed = TestSeed();
  for (const Device& device : test::TestDevices()) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(device));
    std::vector<DType> dtypes = {DType::kF32};
    if (device.is_cpu()) dtypes.push_back(DType::kF64);
    // Below one vector, ragged, several blocks, and past the GPU's cap of
    // first-stage blocks.
    const std::vector<Shape> shapes = {{0},    {1},     {3},
                                       {5, 7}, {40961}, {3, 3000, 1001}};
    for (DType dtype : dtypes) {
      for (const Shape& shape : shapes) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        SCOPED_TRACE(
            absl::StrCat(device.ToString(), " ", DTypeName(dtype), " n ", n));
        // Magnitudes over many octaves, some negative.
        std::vector<double> values = RandomValues(n, seed + n, -1.0, 1.0);
        for (int64_t i = 0; i < n; ++i) values[i] *= std::exp2(i % 24 - 12);
        values = Rounded(dtype, values);
        ASSERT_OK_AND_ASSIGN(OwnedTensor grads,
                             FromHost(*context, dtype, shape, values));
        ASSERT_OK(context->ReserveWorkspace(
            AdamWWorkspaceBytes(context->device(), n)));
        // [] and [1] outputs.
        for (const Shape& out_shape : {Shape{}, Shape{1}}) {
          ASSERT_OK_AND_ASSIGN(
              OwnedTensor sum,
              PoisonedTensor(*context, DType::kF64, out_shape));
          ASSERT_OK(GradientSumOfSquares(*context, grads.view, sum.view));
          ASSERT_OK_AND_ASSIGN(double out, ReadScalar(*context, sum.view));
          const double expected = ReferenceSumOfSquares(values);
          if (n == 0) {
            EXPECT_EQ(out, 0.0);
          } else {
            EXPECT_NEAR(out, expected, kSumRtol * expected);
          }
          // sqrt of it is GradientNorm's norm, bit for bit (the same sum).
          ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                               PoisonedTensor(*context, dtype, {}));
          ASSERT_OK(GradientNorm(*context, grads.view, norm.view));
          ASSERT_OK_AND_ASSIGN(double norm_out,
                               ReadScalar(*context, norm.view));
          EXPECT_EQ(norm_out, test::RoundTo(dtype, std::sqrt(out)));
          // Reproducible to the bit.
          ASSERT_OK_AND_ASSIGN(OwnedTensor again,
                               PoisonedTensor(*context, DType::kF64, {}));
          ASSERT_OK(GradientSumOfSquares(*context, grads.view, again.view));
          ASSERT_OK_AND_ASSIGN(double out_again,
                               ReadScalar(*context, again.view));
          EXPECT_EQ(out_again, out);
        }
      }
    }
  }
}

TEST(GradientSumOfSquaresTest, CpuMatchesGpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  for (int64_t n : {int64_t{1}, int64_t{4099}, int64_t{(9 << 20) + 3}}) {
    SCOPED_TRACE(absl::StrCat("n ", n));
    const std::vector<double> values =
        Rounded(DType::kF32, RandomValues(n, seed + n, -2.0, 2.0));
    double sums[2];
    Context* contexts[2] = {cpu.get(), gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Context& context = *contexts[k];
      ASSERT_OK_AND_ASSIGN(OwnedTensor grads,
                           FromHost(context, DType::kF32, {n}, values));
      ASSERT_OK_AND_ASSIGN(OwnedTensor sum,
                           PoisonedTensor(context, DType::kF64, {}));
      ASSERT_OK(
          context.ReserveWorkspace(AdamWWorkspaceBytes(context.device(), n)));
      ASSERT_OK(GradientSumOfSquares(context, grads.view, sum.view));
      ASSERT_OK_AND_ASSIGN(sums[k], ReadScalar(context, sum.view));
    }
    // Double sums of the same squares in two orders.
    EXPECT_NEAR(sums[1], sums[0], kSumRtol * sums[0]);
    EXPECT_NEAR(sums[0], ReferenceSumOfSquares(values), kSumRtol * sums[0]);
  }
}

// ---- AdamWStepWithSumOfSquares on shards ----

// One flat optimizer state on a device.
struct FlatState {
  OwnedTensor params, grads, m, v;
  std::optional<OwnedTensor> copy;
  int64_t n = 0;

  // Elements [begin, end), decayed below `decay_count` of the whole.
  AdamWState Shard(int64_t begin, int64_t end, int64_t decay_count) const {
    AdamWState state;
    state.params = Slice(params.view, begin, end);
    state.grads = Slice(grads.view, begin, end);
    state.m = Slice(m.view, begin, end);
    state.v = Slice(v.view, begin, end);
    if (copy.has_value()) state.compute_copy = Slice(copy->view, begin, end);
    state.decay_count =
        std::clamp<int64_t>(decay_count - begin, 0, end - begin);
    return state;
  }
};

absl::StatusOr<FlatState> MakeFlatState(Context& context, DType dtype,
                                        std::optional<DType> copy_dtype,
                                        const std::vector<double>& params) {
  FlatState state;
  state.n = static_cast<int64_t>(params.size());
  const std::vector<double> zeros(state.n, 0.0);
  ASSIGN_OR_RETURN(state.params, FromHost(context, dtype, {state.n}, params));
  ASSIGN_OR_RETURN(state.grads, FromHost(context, dtype, {state.n}, zeros));
  ASSIGN_OR_RETURN(state.m, FromHost(context, dtype, {state.n}, zeros));
  ASSIGN_OR_RETURN(state.v, FromHost(context, dtype, {state.n}, zeros));
  if (copy_dtype.has_value()) {
    ASSIGN_OR_RETURN(OwnedTensor copy,
                     PoisonedTensor(context, *copy_dtype, {state.n}));
    state.copy = std::move(copy);
  }
  return state;
}

absl::Status SetGrads(Context& context, FlatState& state,
                      const std::vector<double>& values) {
  ASSIGN_OR_RETURN(OwnedTensor host, FromHost(context, state.grads.view.dtype,
                                              {state.n}, values));
  RETURN_IF_ERROR(CopyTensor(host.view, state.grads.view, context));
  return context.Synchronize();
}

absl::Status SetScalar(Context& context, const Tensor& tensor, double value) {
  ASSIGN_OR_RETURN(OwnedTensor host,
                   FromHost(context, tensor.dtype, tensor.shape, {value}));
  RETURN_IF_ERROR(CopyTensor(host.view, tensor, context));
  return context.Synchronize();
}

struct Flat {
  std::vector<double> params, m, v, copy;
};

absl::StatusOr<Flat> ReadFlat(Context& context, const FlatState& state) {
  Flat out;
  ASSIGN_OR_RETURN(out.params, ToHost(context, state.params.view));
  ASSIGN_OR_RETURN(out.m, ToHost(context, state.m.view));
  ASSIGN_OR_RETURN(out.v, ToHost(context, state.v.view));
  if (state.copy.has_value()) {
    ASSIGN_OR_RETURN(out.copy, ToHost(context, state.copy->view));
  }
  return out;
}

// n not a multiple of 4; shards uneven, misaligned for vector accesses, one
// of them empty and one cut by the decay boundary.
constexpr int64_t kN = 4 * 1500 + 3;
constexpr int64_t kDecayCount = 2 * 1001 + 1;
const std::vector<int64_t>& ShardBounds() {
  static const std::vector<int64_t> bounds = {0, 1, 2001, 2001, 2005, 4500, kN};
  return bounds;
}

struct ShardCase {
  Device device;
  DType dtype;
  std::optional<DType> copy_dtype;
  bool clip;

  std::string Name() const {
    return absl::StrCat(device.is_cpu() ? "Cpu" : "Gpu", DTypeName(dtype),
                        "_copy", copy_dtype ? DTypeName(*copy_dtype) : "none",
                        clip ? "_clipped" : "_noClip");
  }
};

class ShardedStepTest : public ::testing::TestWithParam<ShardCase> {};

// Given the whole gradient's sum of squares, the shards' steps write what one
// AdamWStep of the whole writes, bit for bit: the same norm, the same clip
// scale, the same elementwise update.
TEST_P(ShardedStepTest, WholeSumGivesAdamWStepBits) {
  const ShardCase& c = GetParam();
  if (c.device.is_cuda()) SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(c.device));
  ASSERT_OK(
      context->ReserveWorkspace(AdamWWorkspaceBytes(context->device(), kN)));
  const std::vector<double> params =
      Rounded(c.dtype, RandomValues(kN, seed, -1.0, 1.0));
  ASSERT_OK_AND_ASSIGN(FlatState whole,
                       MakeFlatState(*context, c.dtype, c.copy_dtype, params));
  ASSERT_OK_AND_ASSIGN(FlatState sharded,
                       MakeFlatState(*context, c.dtype, c.copy_dtype, params));
  AdamWOptions options;
  options.weight_decay = 0.5f;
  // Gradients in [-1, 1): the norm is about 45.
  options.max_grad_norm = c.clip ? 1.0f : 0.0f;
  ASSERT_OK_AND_ASSIGN(OwnedTensor whole_norm,
                       PoisonedTensor(*context, c.dtype, {}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor sum,
                       PoisonedTensor(*context, DType::kF64, {}));
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<double> grads =
        Rounded(c.dtype, RandomValues(kN, seed + step, -1.0, 1.0));
    ASSERT_OK(SetGrads(*context, whole, grads));
    ASSERT_OK(SetGrads(*context, sharded, grads));
    const float lr = 1e-2f / static_cast<float>(step);
    ASSERT_OK(AdamWStep(*context, whole.Shard(0, kN, kDecayCount), options, lr,
                        step, whole_norm.view));
    ASSERT_OK_AND_ASSIGN(const double expected_norm,
                         ReadScalar(*context, whole_norm.view));
    ASSERT_OK(GradientSumOfSquares(*context, sharded.grads.view, sum.view));
    const std::vector<int64_t>& bounds = ShardBounds();
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      SCOPED_TRACE(
          absl::StrCat("shard [", bounds[s], ", ", bounds[s + 1], ")"));
      ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                           PoisonedTensor(*context, c.dtype, {}));
      ASSERT_OK(AdamWStepWithSumOfSquares(
          *context, sharded.Shard(bounds[s], bounds[s + 1], kDecayCount),
          options, lr, step, sum.view, norm.view));
      ASSERT_OK_AND_ASSIGN(const double shard_norm,
                           ReadScalar(*context, norm.view));
      EXPECT_EQ(shard_norm, expected_norm);
    }
    ASSERT_OK_AND_ASSIGN(Flat a, ReadFlat(*context, whole));
    ASSERT_OK_AND_ASSIGN(Flat b, ReadFlat(*context, sharded));
    EXPECT_TRUE(AllClose(b.params, a.params, 0.0, 0.0));
    EXPECT_TRUE(AllClose(b.m, a.m, 0.0, 0.0));
    EXPECT_TRUE(AllClose(b.v, a.v, 0.0, 0.0));
    if (c.copy_dtype.has_value()) {
      ASSERT_OK_AND_ASSIGN(int64_t poisoned,
                           CountPoison(*context, sharded.copy->view));
      EXPECT_EQ(poisoned, 0);
      EXPECT_TRUE(AllClose(b.copy, a.copy, 0.0, 0.0));
    }
  }
}

// Given the sum of the shards' own sums of squares, as ZeRO-1's all-reduce
// gives it, the steps follow the double-precision reference of the whole.
TEST_P(ShardedStepTest, SumOfShardSumsFollowsDoubleReference) {
  const ShardCase& c = GetParam();
  if (c.device.is_cuda()) SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(c.device));
  ASSERT_OK(
      context->ReserveWorkspace(AdamWWorkspaceBytes(context->device(), kN)));
  AdamWReference ref;
  ref.params = Rounded(c.dtype, RandomValues(kN, seed, -1.0, 1.0));
  ref.m.assign(kN, 0.0);
  ref.v.assign(kN, 0.0);
  ASSERT_OK_AND_ASSIGN(
      FlatState sharded,
      MakeFlatState(*context, c.dtype, c.copy_dtype, ref.params));
  AdamWOptions options;
  options.weight_decay = 0.5f;
  options.max_grad_norm = c.clip ? 1.0f : 0.0f;
  const bool f64 = c.dtype == DType::kF64;
  const double params_tol = f64 ? 1e-12 : 2e-6;
  const double moments_tol = f64 ? 1e-14 : 1e-6;
  const double norm_rtol = f64 ? 1e-13 : 1e-6;
  const std::vector<int64_t>& bounds = ShardBounds();
  const size_t shards = bounds.size() - 1;
  ASSERT_OK_AND_ASSIGN(OwnedTensor total,
                       PoisonedTensor(*context, DType::kF64, {1}));
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<double> grads =
        Rounded(c.dtype, RandomValues(kN, seed + step, -1.0, 1.0));
    ASSERT_OK(SetGrads(*context, sharded, grads));
    // Each shard's part, summed in rank order.
    double sum = 0.0;
    for (size_t s = 0; s < shards; ++s) {
      ASSERT_OK_AND_ASSIGN(OwnedTensor part,
                           PoisonedTensor(*context, DType::kF64, {}));
      ASSERT_OK(GradientSumOfSquares(
          *context, Slice(sharded.grads.view, bounds[s], bounds[s + 1]),
          part.view));
      ASSERT_OK_AND_ASSIGN(const double value, ReadScalar(*context, part.view));
      const std::vector<double> shard_grads(grads.begin() + bounds[s],
                                            grads.begin() + bounds[s + 1]);
      if (shard_grads.empty()) {
        EXPECT_EQ(value, 0.0);
      } else {
        const double expected = ReferenceSumOfSquares(shard_grads);
        EXPECT_NEAR(value, expected, kSumRtol * expected);
      }
      sum += value;
    }
    ASSERT_OK(SetScalar(*context, total.view, sum));
    const float lr = 1e-2f / static_cast<float>(step);
    for (size_t s = 0; s < shards; ++s) {
      ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                           PoisonedTensor(*context, c.dtype, {}));
      ASSERT_OK(AdamWStepWithSumOfSquares(
          *context, sharded.Shard(bounds[s], bounds[s + 1], kDecayCount),
          options, lr, step, total.view, norm.view));
      ASSERT_OK_AND_ASSIGN(const double out_norm,
                           ReadScalar(*context, norm.view));
      const double ref_norm = ReferenceNorm(grads);
      EXPECT_NEAR(out_norm, ref_norm, norm_rtol * ref_norm);
    }
    ReferenceUpdate(ref, grads, options, lr, step, kDecayCount,
                    ReferenceNorm(grads));
    ASSERT_OK_AND_ASSIGN(Flat out, ReadFlat(*context, sharded));
    EXPECT_TRUE(AllClose(out.m, ref.m, moments_tol * MaxAbs(ref.m), 1e-5));
    EXPECT_TRUE(AllClose(out.v, ref.v, moments_tol * MaxAbs(ref.v), 1e-5));
    EXPECT_TRUE(AllClose(out.params, ref.params, params_tol, 0.0));
    if (c.copy_dtype.has_value()) {
      // Each element the rounding of its own updated master.
      EXPECT_TRUE(
          AllClose(out.copy, Rounded(*c.copy_dtype, out.params), 0.0, 0.0));
    }
  }
}

std::vector<ShardCase> ShardCases() {
  std::vector<ShardCase> cases;
  for (bool clip : {true, false}) {
    cases.push_back({Device::Cpu(), DType::kF64, DType::kF64, clip});
    cases.push_back({Device::Cpu(), DType::kF32, DType::kF32, clip});
    cases.push_back({Device::Cuda(0), DType::kF32, DType::kBF16, clip});
    cases.push_back({Device::Cuda(0), DType::kF32, DType::kF32, clip});
  }
  cases.push_back({Device::Cpu(), DType::kF32, std::nullopt, true});
  cases.push_back({Device::Cuda(0), DType::kF32, std::nullopt, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, ShardedStepTest,
                         ::testing::ValuesIn(ShardCases()),
                         [](const ::testing::TestParamInfo<ShardCase>& info) {
                           return info.param.Name();
                         });

// The GPU spells out the CPU's float operations and both take the norm from
// the same double, so from the same f32 state and sum of squares the two give
// the same bits, clipped or not (AdamWStep's differ in the norm's last bits:
// its two devices sum in different orders).
TEST(ShardedStepParityTest, CpuMatchesGpuBitwise) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const int64_t n = 4 * 25000 + 1;
  const int64_t decay_count = 60001;
  const std::vector<double> params =
      Rounded(DType::kF32, RandomValues(n, seed, -1.0, 1.0));
  ASSERT_OK_AND_ASSIGN(FlatState on_cpu,
                       MakeFlatState(*cpu, DType::kF32, DType::kF32, params));
  ASSERT_OK_AND_ASSIGN(FlatState on_gpu,
                       MakeFlatState(*gpu, DType::kF32, DType::kBF16, params));
  ASSERT_OK_AND_ASSIGN(OwnedTensor cpu_sum,
                       PoisonedTensor(*cpu, DType::kF64, {}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor gpu_sum,
                       PoisonedTensor(*gpu, DType::kF64, {}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor cpu_norm,
                       PoisonedTensor(*cpu, DType::kF32, {}));
  ASSERT_OK_AND_ASSIGN(OwnedTensor gpu_norm,
                       PoisonedTensor(*gpu, DType::kF32, {}));
  AdamWOptions options;  // clipping at 1: active for these gradients
  // An aligned shard and one misaligned for vector accesses (both kernel
  // paths), at a decay boundary inside neither's first vector.
  const std::vector<std::pair<int64_t, int64_t>> shards = {{0, 40000},
                                                           {40001, n}};
  for (int64_t step = 1; step <= 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<double> grads =
        Rounded(DType::kF32, RandomValues(n, seed + step, -0.1, 0.1));
    ASSERT_OK(SetGrads(*cpu, on_cpu, grads));
    ASSERT_OK(SetGrads(*gpu, on_gpu, grads));
    // One value of the sum for both: the CPU's.
    ASSERT_OK(GradientSumOfSquares(*cpu, on_cpu.grads.view, cpu_sum.view));
    ASSERT_OK_AND_ASSIGN(const double sum, ReadScalar(*cpu, cpu_sum.view));
    ASSERT_OK(SetScalar(*gpu, gpu_sum.view, sum));
    for (const auto& [begin, end] : shards) {
      ASSERT_OK(AdamWStepWithSumOfSquares(
          *cpu, on_cpu.Shard(begin, end, decay_count), options, 3e-3f, step,
          cpu_sum.view, cpu_norm.view));
      ASSERT_OK(AdamWStepWithSumOfSquares(
          *gpu, on_gpu.Shard(begin, end, decay_count), options, 3e-3f, step,
          gpu_sum.view, gpu_norm.view));
    }
    ASSERT_OK_AND_ASSIGN(const double c_norm, ReadScalar(*cpu, cpu_norm.view));
    ASSERT_OK_AND_ASSIGN(const double g_norm, ReadScalar(*gpu, gpu_norm.view));
    EXPECT_EQ(g_norm, c_norm);
  }
  ASSERT_OK_AND_ASSIGN(Flat c, ReadFlat(*cpu, on_cpu));
  ASSERT_OK_AND_ASSIGN(Flat g, ReadFlat(*gpu, on_gpu));
  // Element 40000 belongs to no shard: untouched (the initial params, zero
  // moments) on both.
  EXPECT_EQ(g.params[40000], params[40000]);
  EXPECT_EQ(g.m[40000], 0.0);
  EXPECT_TRUE(AllClose(g.params, c.params, 0.0, 0.0));
  EXPECT_TRUE(AllClose(g.m, c.m, 0.0, 0.0));
  EXPECT_TRUE(AllClose(g.v, c.v, 0.0, 0.0));
  for (const auto& [begin, end] : shards) {
    for (int64_t i = begin; i < end; ++i) {
      ASSERT_EQ(g.copy[i], test::RoundTo(DType::kBF16, g.params[i])) << i;
      ASSERT_EQ(c.copy[i], c.params[i]) << i;
    }
  }
}

// An empty shard (a last rank past the parameters) writes the norm only.
TEST(ShardedStepTest, EmptyShardWritesOnlyTheNorm) {
  for (const Device& device : test::TestDevices()) {
    SCOPED_TRACE(device.ToString());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(device));
    const std::vector<double> params = {0.25, -0.5, 0.75, 1.0};
    ASSERT_OK_AND_ASSIGN(FlatState state, MakeFlatState(*context, DType::kF32,
                                                        DType::kF32, params));
    ASSERT_OK(SetGrads(*context, state, {1.0, 1.0, 1.0, 1.0}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor sum,
                         PoisonedTensor(*context, DType::kF64, {}));
    ASSERT_OK(SetScalar(*context, sum.view, 2.25));
    ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                         PoisonedTensor(*context, DType::kF32, {}));
    ASSERT_OK(AdamWStepWithSumOfSquares(*context, state.Shard(4, 4, 4),
                                        AdamWOptions(), 1e-2f, 1, sum.view,
                                        norm.view));
    ASSERT_OK_AND_ASSIGN(const double out, ReadScalar(*context, norm.view));
    EXPECT_EQ(out, 1.5);
    ASSERT_OK_AND_ASSIGN(Flat flat, ReadFlat(*context, state));
    EXPECT_TRUE(AllClose(flat.params, params, 0.0, 0.0));
    EXPECT_TRUE(AllClose(flat.m, std::vector<double>(4, 0.0), 0.0, 0.0));
    ASSERT_OK_AND_ASSIGN(int64_t poisoned,
                         CountPoison(*context, state.copy->view));
    EXPECT_EQ(poisoned, 4);
  }
}

// ---- Invalid arguments: InvalidArgument naming the culprit, nothing written
// ----

TEST(SumOfSquaresInvalidTest, BadSumOfSquares) {
  for (const Device& device : test::TestDevices()) {
    SCOPED_TRACE(device.ToString());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(device));
    const std::vector<double> params =
        Rounded(DType::kF32, RandomValues(37, TestSeed(), -1.0, 1.0));
    ASSERT_OK_AND_ASSIGN(FlatState state, MakeFlatState(*context, DType::kF32,
                                                        DType::kF32, params));
    ASSERT_OK(SetGrads(*context, state, std::vector<double>(37, 0.5)));
    ASSERT_OK_AND_ASSIGN(OwnedTensor sum,
                         PoisonedTensor(*context, DType::kF64, {}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                         PoisonedTensor(*context, DType::kF32, {}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor f32_sum,
                         PoisonedTensor(*context, DType::kF32, {}));
    ASSERT_OK_AND_ASSIGN(OwnedTensor wide_sum,
                         PoisonedTensor(*context, DType::kF64, {2}));
    Tensor elsewhere = sum.view;
    elsewhere.device = device.is_cpu() ? Device::Cuda(0) : Device::Cpu();
    Tensor no_data = sum.view;
    no_data.data = nullptr;
    // grads' own first element: f32, and overlapping grads.
    const Tensor grads_as_sum = Slice(state.grads.view, 0, 1);
    for (const Tensor* bad :
         {&f32_sum.view, &wide_sum.view, &elsewhere, &no_data}) {
      const absl::Status s1 =
          GradientSumOfSquares(*context, state.grads.view, *bad);
      EXPECT_EQ(s1.code(), absl::StatusCode::kInvalidArgument) << s1;
      EXPECT_NE(s1.message().find("sum_squares"), std::string::npos) << s1;
      const absl::Status s2 =
          AdamWStepWithSumOfSquares(*context, state.Shard(0, 37, 10),
                                    AdamWOptions(), 1e-3f, 1, *bad, norm.view);
      EXPECT_EQ(s2.code(), absl::StatusCode::kInvalidArgument) << s2;
      EXPECT_NE(s2.message().find("sum_squares"), std::string::npos) << s2;
    }
    EXPECT_EQ(
        GradientSumOfSquares(*context, state.grads.view, grads_as_sum).code(),
        absl::StatusCode::kInvalidArgument);
    // A bad state or norm is named too, with a good sum.
    ASSERT_OK(SetScalar(*context, sum.view, 9.0));
    AdamWState bad_state = state.Shard(0, 37, 10);
    bad_state.m.shape = {36};
    absl::Status s3 = AdamWStepWithSumOfSquares(
        *context, bad_state, AdamWOptions(), 1e-3f, 1, sum.view, norm.view);
    EXPECT_EQ(s3.code(), absl::StatusCode::kInvalidArgument) << s3;
    EXPECT_NE(s3.message().find("m"), std::string::npos) << s3;
    s3 = AdamWStepWithSumOfSquares(*context, state.Shard(0, 37, 10),
                                   AdamWOptions(), 1e-3f, 0, sum.view,
                                   norm.view);
    EXPECT_EQ(s3.code(), absl::StatusCode::kInvalidArgument) << s3;
    EXPECT_NE(s3.message().find("step"), std::string::npos) << s3;
    // The sum as the norm: an overlap.
    Tensor sum_as_norm = sum.view;
    s3 = AdamWStepWithSumOfSquares(*context, state.Shard(0, 37, 10),
                                   AdamWOptions(), 1e-3f, 1, sum.view,
                                   sum_as_norm);
    EXPECT_EQ(s3.code(), absl::StatusCode::kInvalidArgument) << s3;
    // Nothing written.
    ASSERT_OK_AND_ASSIGN(Flat flat, ReadFlat(*context, state));
    EXPECT_TRUE(AllClose(flat.params, params, 0.0, 0.0));
    EXPECT_TRUE(AllClose(flat.m, std::vector<double>(37, 0.0), 0.0, 0.0));
    ASSERT_OK_AND_ASSIGN(int64_t poisoned, CountPoison(*context, norm.view));
    EXPECT_EQ(poisoned, 1) << "norm written";
    ASSERT_OK_AND_ASSIGN(poisoned, CountPoison(*context, state.copy->view));
    EXPECT_EQ(poisoned, 37) << "compute copy written";
    ASSERT_OK_AND_ASSIGN(poisoned, CountPoison(*context, f32_sum.view));
    EXPECT_EQ(poisoned, 1);
    ASSERT_OK_AND_ASSIGN(poisoned, CountPoison(*context, wide_sum.view));
    EXPECT_EQ(poisoned, 2);
    ASSERT_OK_AND_ASSIGN(const double kept, ReadScalar(*context, sum.view));
    EXPECT_EQ(kept, 9.0);
  }
}

}  // namespace
}  // namespace optim
}  // namespace lossrt
