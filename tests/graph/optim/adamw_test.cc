// Tests of AdamW (graph/optim/adamw.h): several steps on the CPU (f32 and f64
// masters) and the GPU (f32 masters, bf16 and f32 compute copies) against a
// double-precision reference written here from the textbook formulas (bias-
// corrected m-hat and v-hat, decoupled decay lr * wd * p), with clipping on,
// on but inactive, and off; the decay mask's boundary exactly; the compute copy
// (poisoned before every step) equal to the rounding of the updated masters;
// the gradient norm against a double sum; CPU-vs-GPU parity from the same f32
// state (aligned and misaligned views, so both kernel paths run); bitwise
// reproducibility on the GPU; invalid arguments (nothing written).
#include "graph/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

using test::AllClose;
using test::CountPoison;
using test::FromHost;
using test::MaxAbs;
using test::PoisonedTensor;
using test::RandomValues;
using test::Rounded;
using test::RoundTo;
using test::TestSeed;
using test::ToHost;

// ASSERT_OK and ASSERT_OK_AND_ASSIGN come from tests/graph/op_test_util.h.

// ---- The double-precision reference (adamw_reference.h) ----

using Reference = test::AdamWReference;
using test::ReferenceNorm;
using test::ReferenceStep;

// ---- Tensors of one optimizer state on a device ----

struct Owned {
  OwnedTensor params, grads, m, v, norm;
  std::optional<OwnedTensor> copy;
  int64_t offset = 0;  // elements the views start into their buffers
  int64_t n = 0;

  // A view of n elements starting `offset` elements into `owned`.
  Tensor View(const OwnedTensor& owned) const {
    char* data = static_cast<char*>(owned.view.data) +
                 offset * DTypeSize(owned.view.dtype);
    return Tensor::Of(data, owned.view.dtype, {n}, owned.view.device);
  }

  AdamWState State(int64_t decay_count) const {
    AdamWState state;
    state.params = View(params);
    state.grads = View(grads);
    state.m = View(m);
    state.v = View(v);
    if (copy.has_value()) state.compute_copy = View(*copy);
    state.decay_count = decay_count;
    return state;
  }
};

// Values padded in front with `offset` zeros (the misaligned views skip them).
std::vector<double> Padded(const std::vector<double>& values, int64_t offset) {
  std::vector<double> padded(offset, 0.0);
  padded.insert(padded.end(), values.begin(), values.end());
  return padded;
}

absl::StatusOr<Owned> MakeState(Context& context, DType dtype,
                                std::optional<DType> copy_dtype,
                                DType norm_dtype,
                                const std::vector<double>& params,
                                int64_t offset) {
  Owned owned;
  owned.n = static_cast<int64_t>(params.size());
  owned.offset = offset;
  const int64_t size = owned.n + offset;
  const std::vector<double> zeros(owned.n, 0.0);
  ASSIGN_OR_RETURN(owned.params,
                   FromHost(context, dtype, {size}, Padded(params, offset)));
  ASSIGN_OR_RETURN(owned.grads,
                   FromHost(context, dtype, {size}, Padded(zeros, offset)));
  ASSIGN_OR_RETURN(owned.m,
                   FromHost(context, dtype, {size}, Padded(zeros, offset)));
  ASSIGN_OR_RETURN(owned.v,
                   FromHost(context, dtype, {size}, Padded(zeros, offset)));
  ASSIGN_OR_RETURN(owned.norm, PoisonedTensor(context, norm_dtype, {}));
  if (copy_dtype.has_value()) {
    ASSIGN_OR_RETURN(OwnedTensor copy,
                     PoisonedTensor(context, *copy_dtype, {size}));
    owned.copy = std::move(copy);
  }
  return owned;
}

// Writes `values` into the grads view.
absl::Status SetGrads(Context& context, Owned& owned,
                      const std::vector<double>& values) {
  ASSIGN_OR_RETURN(OwnedTensor host, FromHost(context, owned.grads.view.dtype,
                                              {owned.n}, values));
  RETURN_IF_ERROR(CopyTensor(host.view, owned.View(owned.grads), context));
  return context.Synchronize();
}

// Poisons the compute copy again (every element must be rewritten).
absl::Status PoisonCopy(Context& context, Owned& owned) {
  if (!owned.copy.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      OwnedTensor poison,
      PoisonedTensor(context, owned.copy->view.dtype, owned.copy->view.shape));
  RETURN_IF_ERROR(CopyTensor(poison.view, owned.copy->view, context));
  return context.Synchronize();
}

struct Readback {
  std::vector<double> params, m, v, copy;
  double norm = 0.0;
};

absl::StatusOr<Readback> Read(Context& context, const Owned& owned) {
  Readback out;
  ASSIGN_OR_RETURN(out.params, ToHost(context, owned.View(owned.params)));
  ASSIGN_OR_RETURN(out.m, ToHost(context, owned.View(owned.m)));
  ASSIGN_OR_RETURN(out.v, ToHost(context, owned.View(owned.v)));
  if (owned.copy.has_value()) {
    ASSIGN_OR_RETURN(out.copy, ToHost(context, owned.View(*owned.copy)));
  }
  ASSIGN_OR_RETURN(std::vector<double> norm, ToHost(context, owned.norm.view));
  out.norm = norm[0];
  return out;
}

// Tolerances for masters of `dtype` (params of magnitude ~1, lr 1e-2): the
// params' absolute error, the moments' error relative to their largest
// element (a moment can cancel to near 0 and keep the absolute error of its
// terms) and the norm's relative error.
struct Tolerance {
  double params, moments, norm_rtol;
};

Tolerance ToleranceFor(DType dtype) {
  if (dtype == DType::kF64) return {1e-12, 1e-14, 1e-13};
  return {2e-6, 1e-6, 1e-6};
}

// ---- Steps against the reference ----

enum class Clip { kActive, kInactive, kOff };

struct StepCase {
  Device device;
  DType dtype;
  std::optional<DType> copy_dtype;
  Clip clip;
  int64_t offset;  // 1: views misaligned for vector accesses

  std::string Name() const {
    std::string name =
        absl::StrCat(device.is_cpu() ? "Cpu" : "Gpu", DTypeName(dtype), "_copy",
                     copy_dtype ? DTypeName(*copy_dtype) : "none");
    switch (clip) {
      case Clip::kActive:
        absl::StrAppend(&name, "_clipped");
        break;
      case Clip::kInactive:
        absl::StrAppend(&name, "_clipInactive");
        break;
      case Clip::kOff:
        absl::StrAppend(&name, "_noClip");
        break;
    }
    if (offset != 0) absl::StrAppend(&name, "_misaligned");
    return name;
  }
};

void PrintTo(const StepCase& c, std::ostream* os) { *os << c.Name(); }

class AdamWStepTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(AdamWStepTest, MatchesDoubleReference) {
  const StepCase& c = GetParam();
  if (c.device.is_cuda()) SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(c.device));
  // n not a multiple of 4 and a decay boundary inside a vector of 4.
  const int64_t n = 4 * 1500 + 3;
  const int64_t decay_count = 2 * 1001 + 1;
  AdamWOptions options;
  options.weight_decay = 0.5f;
  // Gradients uniform in [-1, 1): the norm is about sqrt(n / 3) = 45.
  options.max_grad_norm = c.clip == Clip::kActive     ? 1.0f
                          : c.clip == Clip::kInactive ? 1000.0f
                                                      : 0.0f;
  const DType norm_dtype = c.dtype;
  Reference ref;
  ref.params = Rounded(c.dtype, RandomValues(n, seed, -1.0, 1.0));
  ref.m.assign(n, 0.0);
  ref.v.assign(n, 0.0);
  ASSERT_OK_AND_ASSIGN(Owned owned,
                       MakeState(*context, c.dtype, c.copy_dtype, norm_dtype,
                                 ref.params, c.offset));
  const Tolerance tol = ToleranceFor(c.dtype);
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const double lr = 1e-2 / static_cast<double>(step);  // varies per step
    const std::vector<double> grads =
        Rounded(c.dtype, RandomValues(n, seed + step, -1.0, 1.0));
    ASSERT_OK(SetGrads(*context, owned, grads));
    ASSERT_OK(PoisonCopy(*context, owned));
    const float lr_f = static_cast<float>(lr);
    ASSERT_OK(AdamWStep(*context, owned.State(decay_count), options, lr_f, step,
                        owned.norm.view));
    const double ref_norm =
        ReferenceStep(ref, grads, options, lr_f, step, decay_count);
    ASSERT_OK_AND_ASSIGN(Readback out, Read(*context, owned));
    EXPECT_NEAR(out.norm, ref_norm, tol.norm_rtol * ref_norm);
    EXPECT_TRUE(AllClose(out.m, ref.m, tol.moments * MaxAbs(ref.m), 1e-5));
    EXPECT_TRUE(AllClose(out.v, ref.v, tol.moments * MaxAbs(ref.v), 1e-5));
    EXPECT_TRUE(AllClose(out.params, ref.params, tol.params, 0.0));
    if (c.copy_dtype.has_value()) {
      // Exactly the rounding of this device's own updated masters.
      ASSERT_OK_AND_ASSIGN(int64_t poisoned,
                           CountPoison(*context, owned.View(*owned.copy)));
      EXPECT_EQ(poisoned, 0);
      EXPECT_TRUE(
          AllClose(out.copy, Rounded(*c.copy_dtype, out.params), 0.0, 0.0));
    }
    // The norm the step wrote is the one GradientNorm gives.
    ASSERT_OK_AND_ASSIGN(OwnedTensor alone,
                         PoisonedTensor(*context, norm_dtype, {}));
    ASSERT_OK(GradientNorm(*context, owned.View(owned.grads), alone.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> alone_norm,
                         ToHost(*context, alone.view));
    EXPECT_EQ(alone_norm[0], out.norm);
  }
}

std::vector<StepCase> StepCases() {
  std::vector<StepCase> cases;
  for (Clip clip : {Clip::kActive, Clip::kInactive, Clip::kOff}) {
    cases.push_back({Device::Cpu(), DType::kF64, DType::kF64, clip, 0});
    cases.push_back({Device::Cpu(), DType::kF32, DType::kF32, clip, 0});
    cases.push_back({Device::Cuda(0), DType::kF32, DType::kBF16, clip, 0});
    cases.push_back({Device::Cuda(0), DType::kF32, DType::kBF16, clip, 1});
  }
  cases.push_back({Device::Cpu(), DType::kF32, std::nullopt, Clip::kActive, 0});
  cases.push_back({Device::Cpu(), DType::kF64, DType::kF32, Clip::kActive, 1});
  cases.push_back(
      {Device::Cuda(0), DType::kF32, std::nullopt, Clip::kActive, 0});
  cases.push_back(
      {Device::Cuda(0), DType::kF32, DType::kF32, Clip::kActive, 0});
  cases.push_back(
      {Device::Cuda(0), DType::kF32, DType::kF32, Clip::kActive, 1});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, AdamWStepTest, ::testing::ValuesIn(StepCases()),
                         [](const ::testing::TestParamInfo<StepCase>& info) {
                           return info.param.Name();
                         });

// ---- The decay mask, exactly ----

// With zero gradients and zero moments the Adam term is exactly 0, so a step
// multiplies params [0, decay_count) by (1 - lr * wd) and leaves the rest as
// they were, bit for bit.
TEST(AdamWTest, DecayMaskBoundaryIsExact) {
  const uint64_t seed = TestSeed();
  for (const Device& device : test::TestDevices()) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(device));
    const int64_t n = 1027;
    const std::vector<double> params =
        Rounded(DType::kF32, RandomValues(n, seed, 0.5, 2.0));
    for (int64_t decay_count :
         {int64_t{0}, int64_t{1}, int64_t{513}, int64_t{516}, n - 1, n}) {
      SCOPED_TRACE(
          absl::StrCat(device.ToString(), " decay_count ", decay_count));
      ASSERT_OK_AND_ASSIGN(Owned owned,
                           MakeState(*context, DType::kF32, std::nullopt,
                                     DType::kF32, params, 0));
      AdamWOptions options;
      options.weight_decay = 0.25f;
      const float lr = 0.5f;
      ASSERT_OK(AdamWStep(*context, owned.State(decay_count), options, lr, 1,
                          owned.norm.view));
      ASSERT_OK_AND_ASSIGN(Readback out, Read(*context, owned));
      EXPECT_EQ(out.norm, 0.0);
      const float factor = static_cast<float>(1.0 - 0.5 * 0.25);
      for (int64_t i = 0; i < n; ++i) {
        const double expected =
            i < decay_count
                ? static_cast<double>(static_cast<float>(params[i]) * factor)
                : params[i];
        ASSERT_EQ(out.params[i], expected) << "element " << i;
      }
    }
  }
}

// ---- The gradient norm ----

TEST(GradientNormTest, MatchesDoubleSum) {
  const uint64_t seed = TestSeed();
  for (const Device& device : test::TestDevices()) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(device));
    std::vector<DType> dtypes = {DType::kF32};
    if (device.is_cpu()) dtypes.push_back(DType::kF64);
    // Sizes below one vector, ragged, and (on the GPU) past the 1024-block cap
    // of the first stage.
    const std::vector<Shape> shapes = {{0},    {1},    {3},
                                       {5, 7}, {4097}, {3, 3000, 1001}};
    for (DType dtype : dtypes) {
      for (const Shape& shape : shapes) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        SCOPED_TRACE(
            absl::StrCat(device.ToString(), " ", DTypeName(dtype), " n ", n));
        // Magnitudes spread over many octaves, some negative.
        std::vector<double> values = RandomValues(n, seed + n, -1.0, 1.0);
        for (int64_t i = 0; i < n; ++i) values[i] *= std::exp2(i % 20 - 10);
        values = Rounded(dtype, values);
        ASSERT_OK_AND_ASSIGN(OwnedTensor grads,
                             FromHost(*context, dtype, shape, values));
        ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                             PoisonedTensor(*context, dtype, {}));
        ASSERT_OK(context->ReserveWorkspace(
            AdamWWorkspaceBytes(context->device(), n)));
        ASSERT_OK(GradientNorm(*context, grads.view, norm.view));
        ASSERT_OK_AND_ASSIGN(std::vector<double> out,
                             ToHost(*context, norm.view));
        const double expected = ReferenceNorm(values);
        if (dtype == DType::kF64) {
          // A double sum of 9M squares in any order: ~n * 2^-53 at worst.
          EXPECT_NEAR(out[0], expected, 1e-11 * expected);
        } else {
          // The f32 rounding of the exact value: within half an ulp, plus a
          // hair for the double sum's own rounding.
          EXPECT_NEAR(out[0], expected, 0x1p-24 * 1.01 * expected);
        }
        if (!device.is_cpu()) {
          // Bitwise reproducible.
          ASSERT_OK_AND_ASSIGN(OwnedTensor again,
                               PoisonedTensor(*context, dtype, {}));
          ASSERT_OK(GradientNorm(*context, grads.view, again.view));
          ASSERT_OK_AND_ASSIGN(std::vector<double> out_again,
                               ToHost(*context, again.view));
          EXPECT_EQ(out_again[0], out[0]);
        }
      }
    }
  }
}

TEST(GradientNormTest, F64GradientsIntoF32Norm) {
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const std::vector<double> values = RandomValues(1000, seed, -3.0, 3.0);
  ASSERT_OK_AND_ASSIGN(OwnedTensor grads,
                       FromHost(*context, DType::kF64, {1000}, values));
  ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                       PoisonedTensor(*context, DType::kF32, {1}));
  ASSERT_OK(GradientNorm(*context, grads.view, norm.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> out, ToHost(*context, norm.view));
  EXPECT_EQ(out[0], RoundTo(DType::kF32, ReferenceNorm(values)));
}

TEST(GradientNormTest, WorkspaceBytes) {
  EXPECT_EQ(AdamWWorkspaceBytes(Device::Cpu(), 1 << 20), 0);
  EXPECT_EQ(AdamWWorkspaceBytes(Device::Cuda(0), 0), 0);
  EXPECT_GE(AdamWWorkspaceBytes(Device::Cuda(0), 1), 8);
  // The partial sums are capped: the workspace stops growing with n.
  EXPECT_EQ(AdamWWorkspaceBytes(Device::Cuda(0), int64_t{1} << 30),
            AdamWWorkspaceBytes(Device::Cuda(0), int64_t{350} << 20));
  EXPECT_LE(AdamWWorkspaceBytes(Device::Cuda(0), int64_t{1} << 30), 1 << 20);
}

// ---- CPU vs GPU ----

// The GPU spells out the CPU's float operations (no FMA contraction), so from
// the same f32 state the two agree to the last bit up to the norm, whose
// double sums differ only in their order; bf16 copies are each the rounding
// of their own masters.
TEST(AdamWParityTest, CpuMatchesGpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  for (int64_t offset : {0, 1}) {
    for (bool clip : {true, false}) {
      SCOPED_TRACE(absl::StrCat("offset ", offset, " clip ", clip));
      const int64_t n = 4 * 25000 + 1;
      const int64_t decay_count = 60001;
      const std::vector<double> params =
          Rounded(DType::kF32, RandomValues(n, seed, -1.0, 1.0));
      ASSERT_OK_AND_ASSIGN(
          Owned on_cpu, MakeState(*cpu, DType::kF32, DType::kF32, DType::kF32,
                                  params, offset));
      ASSERT_OK_AND_ASSIGN(
          Owned on_gpu, MakeState(*gpu, DType::kF32, DType::kBF16, DType::kF32,
                                  params, offset));
      AdamWOptions options;
      options.max_grad_norm = clip ? 1.0f : 0.0f;
      ASSERT_OK(gpu->ReserveWorkspace(AdamWWorkspaceBytes(gpu->device(), n)));
      for (int64_t step = 1; step <= 3; ++step) {
        const std::vector<double> grads =
            Rounded(DType::kF32, RandomValues(n, seed + step, -0.1, 0.1));
        ASSERT_OK(SetGrads(*cpu, on_cpu, grads));
        ASSERT_OK(SetGrads(*gpu, on_gpu, grads));
        ASSERT_OK(PoisonCopy(*cpu, on_cpu));
        ASSERT_OK(PoisonCopy(*gpu, on_gpu));
        const float lr = 3e-3f;
        ASSERT_OK(AdamWStep(*cpu, on_cpu.State(decay_count), options, lr, step,
                            on_cpu.norm.view));
        ASSERT_OK(AdamWStep(*gpu, on_gpu.State(decay_count), options, lr, step,
                            on_gpu.norm.view));
      }
      ASSERT_OK_AND_ASSIGN(Readback c, Read(*cpu, on_cpu));
      ASSERT_OK_AND_ASSIGN(Readback g, Read(*gpu, on_gpu));
      EXPECT_NEAR(g.norm, c.norm, 0x1p-23 * c.norm);
      // One f32 ulp of the clip scale moves an update by ~1e-7 of lr.
      EXPECT_TRUE(AllClose(g.params, c.params, 1e-9, 0x1p-23));
      EXPECT_TRUE(AllClose(g.m, c.m, 1e-12, 1e-6));
      EXPECT_TRUE(AllClose(g.v, c.v, 1e-15, 1e-6));
      if (!clip) {
        // Without clipping the norm plays no part: identical bits.
        EXPECT_TRUE(AllClose(g.params, c.params, 0.0, 0.0));
        EXPECT_TRUE(AllClose(g.m, c.m, 0.0, 0.0));
        EXPECT_TRUE(AllClose(g.v, c.v, 0.0, 0.0));
      }
      ASSERT_OK_AND_ASSIGN(int64_t poisoned,
                           CountPoison(*gpu, on_gpu.View(*on_gpu.copy)));
      EXPECT_EQ(poisoned, 0);
      EXPECT_TRUE(AllClose(g.copy, Rounded(DType::kBF16, g.params), 0.0, 0.0));
      EXPECT_TRUE(AllClose(c.copy, c.params, 0.0, 0.0));
    }
  }
}

// Two GPU runs from the same state give the same bits.
TEST(AdamWParityTest, GpuIsReproducible) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const int64_t n = (int64_t{9} << 20) + 5;  // past the norm's block cap
  const std::vector<double> params =
      Rounded(DType::kF32, RandomValues(n, seed, -1.0, 1.0));
  const std::vector<double> grads =
      Rounded(DType::kF32, RandomValues(n, seed + 1, -1.0, 1.0));
  std::vector<Readback> runs;
  for (int run = 0; run < 2; ++run) {
    ASSERT_OK_AND_ASSIGN(Owned owned, MakeState(*gpu, DType::kF32, DType::kBF16,
                                                DType::kF32, params, 0));
    ASSERT_OK(SetGrads(*gpu, owned, grads));
    ASSERT_OK(AdamWStep(*gpu, owned.State(n / 2), AdamWOptions(), 1e-3f, 1,
                        owned.norm.view));
    ASSERT_OK_AND_ASSIGN(Readback out, Read(*gpu, owned));
    runs.push_back(std::move(out));
  }
  EXPECT_EQ(runs[0].norm, runs[1].norm);
  EXPECT_NEAR(runs[0].norm, ReferenceNorm(grads), 0x1p-23 * runs[0].norm);
  EXPECT_TRUE(AllClose(runs[0].params, runs[1].params, 0.0, 0.0));
  EXPECT_TRUE(AllClose(runs[0].copy, runs[1].copy, 0.0, 0.0));
}

// ---- Invalid arguments ----

class AdamWInvalidTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto context = Context::Create(Device::Cpu());
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::move(context).value();
    params_ = RandomValues(kN, TestSeed(), -1.0, 1.0);
    auto owned =
        MakeState(*context_, DType::kF32, DType::kF32, DType::kF32, params_, 0);
    ASSERT_TRUE(owned.ok()) << owned.status();
    owned_ = std::move(owned).value();
    ASSERT_OK(SetGrads(*context_, owned_, std::vector<double>(kN, 0.5)));
  }

  // The call fails with InvalidArgument naming `what`, and writes nothing.
  void ExpectInvalid(const AdamWState& state, const AdamWOptions& options,
                     float lr, int64_t step, const Tensor& norm,
                     const std::string& what) {
    const absl::Status status =
        AdamWStep(*context_, state, options, lr, step, norm);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(what), std::string::npos) << status;
    auto out = Read(*context_, owned_);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(AllClose(out->params, Rounded(DType::kF32, params_), 0, 0));
    EXPECT_TRUE(AllClose(out->m, std::vector<double>(kN, 0.0), 0, 0));
    auto poisoned = CountPoison(*context_, owned_.norm.view);
    ASSERT_TRUE(poisoned.ok());
    EXPECT_EQ(*poisoned, 1) << "norm written";
    poisoned = CountPoison(*context_, owned_.copy->view);
    ASSERT_TRUE(poisoned.ok());
    EXPECT_EQ(*poisoned, kN) << "compute copy written";
  }

  static constexpr int64_t kN = 37;
  std::unique_ptr<Context> context_;
  std::vector<double> params_;
  Owned owned_;
};

TEST_F(AdamWInvalidTest, LengthMismatch) {
  AdamWState state = owned_.State(10);
  state.grads.shape = {kN - 1};
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "grads");
  state = owned_.State(10);
  state.v.shape = {kN + 1};
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "v");
  state = owned_.State(10);
  state.compute_copy->shape = {kN - 1};
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view,
                "compute_copy");
  state = owned_.State(10);
  state.params.shape = {1, kN};
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "params");
}

TEST_F(AdamWInvalidTest, DecayCountOutOfRange) {
  ExpectInvalid(owned_.State(kN + 1), AdamWOptions(), 1e-3f, 1,
                owned_.norm.view, "decay_count");
  ExpectInvalid(owned_.State(-1), AdamWOptions(), 1e-3f, 1, owned_.norm.view,
                "decay_count");
}

TEST_F(AdamWInvalidTest, DTypeMismatch) {
  AdamWState state = owned_.State(10);
  state.m.dtype = DType::kF64;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "m");
  state = owned_.State(10);
  state.params.dtype = DType::kBF16;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "params");
  state = owned_.State(10);
  state.compute_copy->dtype = DType::kBF16;  // not a CPU activation dtype
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view,
                "compute_copy");
  Tensor norm = owned_.norm.view;
  norm.dtype = DType::kF64;  // f64 norms only for f64 gradients
  ExpectInvalid(owned_.State(10), AdamWOptions(), 1e-3f, 1, norm, "norm");
}

TEST_F(AdamWInvalidTest, BadNormAndOverlaps) {
  Tensor norm = owned_.norm.view;
  norm.shape = {2};
  ExpectInvalid(owned_.State(10), AdamWOptions(), 1e-3f, 1, norm, "norm");
  AdamWState state = owned_.State(10);
  state.v = state.m;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "overlap");
  state = owned_.State(10);
  state.compute_copy = state.params;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "overlap");
  state = owned_.State(10);
  state.grads.data = nullptr;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 1, owned_.norm.view, "grads");
}

TEST_F(AdamWInvalidTest, BadScalars) {
  const AdamWState state = owned_.State(10);
  const Tensor& norm = owned_.norm.view;
  ExpectInvalid(state, AdamWOptions(), 1e-3f, 0, norm, "step");
  ExpectInvalid(state, AdamWOptions(), -1e-3f, 1, norm, "lr");
  ExpectInvalid(state, AdamWOptions(), NAN, 1, norm, "lr");
  AdamWOptions options;
  options.beta1 = 1.0f;
  ExpectInvalid(state, options, 1e-3f, 1, norm, "beta1");
  options = AdamWOptions();
  options.beta2 = -0.5f;
  ExpectInvalid(state, options, 1e-3f, 1, norm, "beta2");
  options = AdamWOptions();
  options.eps = 0.0f;
  ExpectInvalid(state, options, 1e-3f, 1, norm, "eps");
  options = AdamWOptions();
  options.weight_decay = -0.1f;
  ExpectInvalid(state, options, 1e-3f, 1, norm, "weight_decay");
  options = AdamWOptions();
  options.max_grad_norm = NAN;
  ExpectInvalid(state, options, 1e-3f, 1, norm, "max_grad_norm");
}

TEST(GradientNormTest, InvalidArguments) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor grads,
      FromHost(*context, DType::kF32, {4, 3}, std::vector<double>(12, 1.0)));
  ASSERT_OK_AND_ASSIGN(OwnedTensor norm,
                       PoisonedTensor(*context, DType::kF32, {}));
  Tensor bad = grads.view;
  bad.dtype = DType::kBF16;
  EXPECT_EQ(GradientNorm(*context, bad, norm.view).code(),
            absl::StatusCode::kInvalidArgument);
  bad = grads.view;
  bad.row_stride = 5;  // not contiguous
  EXPECT_EQ(GradientNorm(*context, bad, norm.view).code(),
            absl::StatusCode::kInvalidArgument);
  bad = grads.view;
  bad.device = Device::Cuda(0);
  EXPECT_EQ(GradientNorm(*context, bad, norm.view).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor bad_norm = norm.view;
  bad_norm.shape = {1, 2};
  EXPECT_EQ(GradientNorm(*context, grads.view, bad_norm).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(int64_t poisoned, CountPoison(*context, norm.view));
  EXPECT_EQ(poisoned, 1);
  ASSERT_OK(GradientNorm(*context, grads.view, norm.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> out, ToHost(*context, norm.view));
  EXPECT_NEAR(out[0], std::sqrt(12.0), 1e-6);
}

TEST(AdamWGpuTest, RejectsF64AndCpuTensors) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const std::vector<double> params(64, 1.0);
  ASSERT_OK_AND_ASSIGN(Owned f64, MakeState(*gpu, DType::kF64, std::nullopt,
                                            DType::kF32, params, 0));
  EXPECT_EQ(
      AdamWStep(*gpu, f64.State(0), AdamWOptions(), 1e-3f, 1, f64.norm.view)
          .code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(Owned host, MakeState(*cpu, DType::kF32, std::nullopt,
                                             DType::kF32, params, 0));
  EXPECT_EQ(
      AdamWStep(*gpu, host.State(0), AdamWOptions(), 1e-3f, 1, host.norm.view)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace optim
}  // namespace lossrt
