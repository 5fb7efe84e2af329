// Tests of the causal attention op (graph/ops/attention.h): the CPU forward
// against a naive double computation (seq 1, odd head dims, query blocks past
// 64, causal masking), the CPU backward against central differences in f64 in
// both accumulate modes, GPU parity of out, lse and d_qkv for f32 and bf16
// (cuBLAS path, chunked cuBLAS path, flash kernels, cuDNN's fused attention,
// the default choice) against the f64 CPU op with poisoned outputs, workspace
// sizes, and invalid arguments that must leave every output untouched. The
// cuDNN kernel also: run-to-run bits of its backward, its lse feeding the flash
// backward and the reverse, CUDA graph captures, and its workspace figures. Its
// cases skip, saying so, in builds without cuDNN.
#include "graph/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_context.h"
#include "tests/cuda_graph_capture.h"
#endif

namespace lossrt {
namespace ops {
namespace {

using test::AllClose;
using test::CountPoison;
using test::FromHost;
using test::MaxAbs;
using test::NumericalGradient;
using test::Plus;
using test::PoisonedTensor;
using test::RandomValues;
using test::Rounded;
using test::TestSeed;
using test::ToHost;

struct AttentionShape {
  int64_t batch, seq, heads, head_dim;

  int64_t rows() const { return batch * seq; }
  int64_t channels() const { return heads * head_dim; }
  int64_t qkv_size() const { return rows() * 3 * channels(); }
  int64_t out_size() const { return rows() * channels(); }
  int64_t lse_size() const { return batch * heads * seq; }
};

std::string Describe(const AttentionShape& s) {
  return absl::StrCat("batch ", s.batch, " seq ", s.seq, " heads ", s.heads,
                      " head_dim ", s.head_dim);
}

// How gtest names a shape parameter.
void PrintTo(const AttentionShape& s, std::ostream* os) { *os << Describe(s); }

// out and lse in plain double loops, straight from the definition.
struct ForwardValues {
  std::vector<double> out, lse;
};

ForwardValues NaiveForward(const AttentionShape& s,
                           const std::vector<double>& qkv) {
  const int64_t c = s.channels();
  const int64_t d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ForwardValues result{std::vector<double>(s.out_size()),
                       std::vector<double>(s.lse_size())};
  std::vector<double> scores(s.seq);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t t = 0; t < s.seq; ++t) {
        const double* q = &qkv[(b * s.seq + t) * 3 * c + h * d];
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * s.seq + j) * 3 * c + c + h * d];
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
          scores[j] = dot * scale;
          max = std::max(max, scores[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(scores[j] - max);
        const double lse = max + std::log(sum);
        result.lse[(b * s.heads + h) * s.seq + t] = lse;
        for (int64_t i = 0; i < d; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) {
            o += std::exp(scores[j] - lse) *
                 qkv[(b * s.seq + j) * 3 * c + 2 * c + h * d + i];
          }
          result.out[(b * s.seq + t) * c + h * d + i] = o;
        }
      }
    }
  }
  return result;
}

DType LseDType(DType dtype) {
  return dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

// The forward's tensors on a context: qkv from values, out and lse poisoned
// before the call.
struct Forward {
  OwnedTensor qkv, out, lse;
};

absl::StatusOr<Forward> RunForward(Context& context, DType dtype,
                                   const AttentionShape& s,
                                   const std::vector<double>& qkv,
                                   const CausalAttentionOptions& options) {
  Forward f;
  ASSIGN_OR_RETURN(f.qkv,
                   FromHost(context, dtype, {s.rows(), 3 * s.channels()}, qkv));
  ASSIGN_OR_RETURN(f.out,
                   PoisonedTensor(context, dtype, {s.rows(), s.channels()}));
  ASSIGN_OR_RETURN(f.lse, PoisonedTensor(context, LseDType(dtype),
                                         {s.batch, s.heads, s.seq}));
  RETURN_IF_ERROR(CausalAttentionForward(context, f.qkv.view, s.batch, s.seq,
                                         s.heads, f.out.view, f.lse.view,
                                         options));
  return f;
}

// d_qkv after the backward from the forward's tensors: poisoned before the
// call, or holding `start` when accumulating.
absl::StatusOr<OwnedTensor> RunBackward(
    Context& context, DType dtype, const AttentionShape& s, const Forward& f,
    const std::vector<double>& d_out, bool accumulate,
    const std::vector<double>& start, const CausalAttentionOptions& options) {
  ASSIGN_OR_RETURN(OwnedTensor d_out_tensor,
                   FromHost(context, dtype, {s.rows(), s.channels()}, d_out));
  OwnedTensor d_qkv;
  if (accumulate) {
    ASSIGN_OR_RETURN(
        d_qkv, FromHost(context, dtype, {s.rows(), 3 * s.channels()}, start));
  } else {
    ASSIGN_OR_RETURN(
        d_qkv, PoisonedTensor(context, dtype, {s.rows(), 3 * s.channels()}));
  }
  RETURN_IF_ERROR(CausalAttentionBackward(
      context, f.qkv.view, f.out.view, f.lse.view, d_out_tensor.view, s.batch,
      s.seq, s.heads, d_qkv.view, accumulate, options));
  return d_qkv;
}

// Forward and backward values of one run.
struct Results {
  std::vector<double> out, lse, d_qkv;
  int64_t poisoned = 0;  // output elements the calls left unwritten
};

absl::StatusOr<Results> RunBoth(Context& context, DType dtype,
                                const AttentionShape& s,
                                const std::vector<double>& qkv,
                                const std::vector<double>& d_out,
                                bool accumulate,
                                const std::vector<double>& start,
                                const CausalAttentionOptions& options) {
  ASSIGN_OR_RETURN(Forward f, RunForward(context, dtype, s, qkv, options));
  ASSIGN_OR_RETURN(OwnedTensor d_qkv, RunBackward(context, dtype, s, f, d_out,
                                                  accumulate, start, options));
  Results r;
  ASSIGN_OR_RETURN(r.out, ToHost(context, f.out.view));
  ASSIGN_OR_RETURN(r.lse, ToHost(context, f.lse.view));
  ASSIGN_OR_RETURN(r.d_qkv, ToHost(context, d_qkv.view));
  for (const Tensor* t : {&f.out.view, &f.lse.view, &d_qkv.view}) {
    ASSIGN_OR_RETURN(int64_t poisoned, CountPoison(context, *t));
    r.poisoned += poisoned;
  }
  return r;
}

// One of the q, k, v parts (0, 1, 2) of a [rows, 3C] tensor's values.
std::vector<double> Part(const AttentionShape& s,
                         const std::vector<double>& values, int part) {
  const int64_t c = s.channels();
  std::vector<double> result;
  result.reserve(s.out_size());
  for (int64_t row = 0; row < s.rows(); ++row) {
    for (int64_t i = 0; i < c; ++i) {
      result.push_back(values[row * 3 * c + part * c + i]);
    }
  }
  return result;
}

// d_qkv close to `expected` part by part (dQ, dK and dV have their own
// scales): |error| <= rel_atol * max(max|expected part|, 0.1) + rtol
// |expected|. (The floor: with one token dQ and dK are exactly 0, and a GPU
// gives rounding noise.)
::testing::AssertionResult GradientsClose(const AttentionShape& s,
                                          const std::vector<double>& actual,
                                          const std::vector<double>& expected,
                                          double rel_atol, double rtol) {
  static const char* const kNames[] = {"dQ", "dK", "dV"};
  for (int part = 0; part < 3; ++part) {
    const std::vector<double> want = Part(s, expected, part);
    const double atol = rel_atol * std::max(MaxAbs(want), 0.1);
    ::testing::AssertionResult close =
        AllClose(Part(s, actual, part), want, atol, rtol);
    if (!close) return close << " in " << kNames[part];
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// CPU.

class AttentionCpuTest : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(AttentionCpuTest, ForwardMatchesNaiveDouble) {
  const AttentionShape s = GetParam();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  for (DType dtype : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(absl::StrCat(Describe(s), " ", DTypeName(dtype)));
    const std::vector<double> qkv =
        Rounded(dtype, RandomValues(s.qkv_size(), seed, -2, 2));
    const ForwardValues want = NaiveForward(s, qkv);
    ASSERT_OK_AND_ASSIGN(Forward f, RunForward(*context, dtype, s, qkv,
                                               CausalAttentionOptions()));
    ASSERT_OK_AND_ASSIGN(std::vector<double> out, ToHost(*context, f.out.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> lse, ToHost(*context, f.lse.view));
    const double tol = dtype == DType::kF64 ? 1e-12 : 2e-6;
    EXPECT_TRUE(AllClose(out, want.out, tol, tol));
    EXPECT_TRUE(AllClose(lse, want.lse, tol, tol));
  }
}

TEST_P(AttentionCpuTest, F32BackwardMatchesF64) {
  const AttentionShape s = GetParam();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const std::vector<double> qkv =
      Rounded(DType::kF32, RandomValues(s.qkv_size(), seed, -2, 2));
  const std::vector<double> d_out =
      Rounded(DType::kF32, RandomValues(s.out_size(), seed + 1, -1, 1));
  ASSERT_OK_AND_ASSIGN(Results want,
                       RunBoth(*context, DType::kF64, s, qkv, d_out, false, {},
                               CausalAttentionOptions()));
  ASSERT_OK_AND_ASSIGN(Results got,
                       RunBoth(*context, DType::kF32, s, qkv, d_out, false, {},
                               CausalAttentionOptions()));
  EXPECT_EQ(got.poisoned, 0);
  EXPECT_TRUE(GradientsClose(s, got.d_qkv, want.d_qkv, 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCpuTest,
    ::testing::Values(AttentionShape{1, 1, 1, 8},    // one token
                      AttentionShape{2, 5, 2, 4},    // small: batch, heads > 1
                      AttentionShape{1, 3, 2, 1},    // head_dim 1
                      AttentionShape{2, 6, 3, 3},    // odd head_dim
                      AttentionShape{1, 7, 1, 24},   // head_dim 24
                      AttentionShape{1, 70, 1, 2},   // a second query block
                      AttentionShape{2, 130, 2, 8},  // three query blocks
                      AttentionShape{1, 200, 1, 64}));

TEST(AttentionCpuGradTest, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  for (const AttentionShape& s :
       {AttentionShape{2, 5, 2, 4}, AttentionShape{1, 1, 1, 8},
        AttentionShape{1, 3, 2, 1}, AttentionShape{2, 6, 3, 3},
        AttentionShape{1, 7, 1, 24}, AttentionShape{1, 70, 1, 2}}) {
    std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -2, 2);
    const std::vector<double> d_out =
        RandomValues(s.out_size(), seed + 1, -1, 1);
    const std::vector<double> start =
        RandomValues(s.qkv_size(), seed + 2, -1, 1);

    // The objective sum(out * d_out) has gradient d_qkv.
    const std::vector<double> numerical = NumericalGradient(
        [&]() {
          const ForwardValues f = NaiveForward(s, qkv);
          double sum = 0;
          for (int64_t i = 0; i < s.out_size(); ++i) {
            sum += f.out[i] * d_out[i];
          }
          return sum;
        },
        qkv, 1e-5);

    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(absl::StrCat(Describe(s), " accumulate ", accumulate));
      ASSERT_OK_AND_ASSIGN(
          Results r, RunBoth(*context, DType::kF64, s, qkv, d_out, accumulate,
                             start, CausalAttentionOptions()));
      EXPECT_EQ(r.poisoned, 0);
      const std::vector<double> want =
          accumulate ? Plus(start, numerical) : numerical;
      EXPECT_TRUE(AllClose(r.d_qkv, want, 1e-7, 1e-6));
    }
  }
}

TEST(AttentionCpuMaskTest, FutureTokensDoNotChangeEarlierOutputs) {
  const AttentionShape s{2, 9, 2, 4};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -2, 2);
  // Token 5 of every sequence gets new q, k and v.
  constexpr int64_t kChanged = 5;
  std::vector<double> changed = qkv;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < 3 * s.channels(); ++i) {
      changed[(b * s.seq + kChanged) * 3 * s.channels() + i] += 0.5;
    }
  }
  for (DType dtype : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(Forward before, RunForward(*context, dtype, s, qkv,
                                                    CausalAttentionOptions()));
    ASSERT_OK_AND_ASSIGN(Forward after, RunForward(*context, dtype, s, changed,
                                                   CausalAttentionOptions()));
    ASSERT_OK_AND_ASSIGN(std::vector<double> out0,
                         ToHost(*context, before.out.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> out1,
                         ToHost(*context, after.out.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> lse0,
                         ToHost(*context, before.lse.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> lse1,
                         ToHost(*context, after.lse.view));
    int64_t later_changes = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq; ++t) {
        for (int64_t i = 0; i < s.channels(); ++i) {
          const int64_t at = (b * s.seq + t) * s.channels() + i;
          if (t < kChanged) {
            EXPECT_EQ(out0[at], out1[at]) << "batch " << b << " token " << t;
          } else {
            later_changes += out0[at] != out1[at] ? 1 : 0;
          }
        }
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t at = (b * s.heads + h) * s.seq + t;
          if (t < kChanged) {
            EXPECT_EQ(lse0[at], lse1[at]);
          }
        }
      }
    }
    // The change is seen from token 5 on (else the check above proves
    // nothing).
    EXPECT_EQ(later_changes, s.batch * (s.seq - kChanged) * s.channels());
  }
}

TEST(AttentionCpuWorkspaceTest, ReservedWorkspaceIsEnough) {
  const AttentionShape s{2, 150, 2, 16};
  const uint64_t seed = TestSeed();
  for (DType dtype : {DType::kF64, DType::kF32}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                         Context::Create(Device::Cpu()));
    const int64_t bytes = CausalAttentionWorkspaceBytes(
        context->device(), dtype, s.batch, s.seq, s.heads, s.head_dim);
    EXPECT_GT(bytes, 0);
    ASSERT_OK(context->ReserveWorkspace(bytes));
    const int64_t reserved = context->workspace_bytes();
    ASSERT_OK_AND_ASSIGN(
        Results r,
        RunBoth(*context, dtype, s, RandomValues(s.qkv_size(), seed, -1, 1),
                RandomValues(s.out_size(), seed + 1, -1, 1), false, {},
                CausalAttentionOptions()));
    EXPECT_EQ(r.poisoned, 0);
    EXPECT_EQ(context->workspace_bytes(), reserved) << DTypeName(dtype);
  }
  EXPECT_EQ(
      CausalAttentionWorkspaceBytes(Device::Cpu(), DType::kF32, 0, 1, 1, 8), 0);
}

// ---------------------------------------------------------------------------
// Invalid arguments: InvalidArgument, and every output keeps its poison.

struct Outputs {
  OwnedTensor out, lse, d_qkv;
};

absl::StatusOr<Outputs> PoisonedOutputs(Context& context, DType dtype,
                                        const AttentionShape& s) {
  Outputs o;
  ASSIGN_OR_RETURN(o.out,
                   PoisonedTensor(context, dtype, {s.rows(), s.channels()}));
  ASSIGN_OR_RETURN(o.lse, PoisonedTensor(context, LseDType(dtype),
                                         {s.batch, s.heads, s.seq}));
  ASSIGN_OR_RETURN(
      o.d_qkv, PoisonedTensor(context, dtype, {s.rows(), 3 * s.channels()}));
  return o;
}

void ExpectUntouched(Context& context, const std::vector<const Tensor*>& ts) {
  for (const Tensor* t : ts) {
    ASSERT_OK_AND_ASSIGN(int64_t poisoned, CountPoison(context, *t));
    EXPECT_EQ(poisoned, t->numel()) << t->ShapeString();
  }
}

// The backward (and, unless `backward_only`, the forward) with the given
// tensors must be InvalidArgument and write nothing to the poisoned outputs
// (out, lse for the forward; d_qkv for the backward, whose out/lse inputs are
// the same poisoned tensors).
void ExpectRejected(
    Context& context, const Tensor& qkv, int64_t batch, int64_t seq,
    int64_t heads, const Tensor& out, const Tensor& lse, const Tensor& d_out,
    const Tensor& d_qkv, const std::string& what,
    const CausalAttentionOptions& options = CausalAttentionOptions(),
    bool backward_only = false) {
  SCOPED_TRACE(what);
  if (!backward_only) {
    const absl::Status forward = CausalAttentionForward(
        context, qkv, batch, seq, heads, out, lse, options);
    EXPECT_TRUE(absl::IsInvalidArgument(forward)) << forward;
  }
  for (bool accumulate : {false, true}) {
    const absl::Status backward =
        CausalAttentionBackward(context, qkv, out, lse, d_out, batch, seq,
                                heads, d_qkv, accumulate, options);
    EXPECT_TRUE(absl::IsInvalidArgument(backward)) << backward;
  }
  ExpectUntouched(context, {&out, &lse, &d_qkv});
}

// Random inputs on a context: qkv and d_out in [-1, 1), d_out from seed + 1.
struct Inputs {
  OwnedTensor qkv, d_out;
};

absl::StatusOr<Inputs> RandomInputs(Context& context, DType dtype,
                                    const AttentionShape& s, uint64_t seed) {
  Inputs in;
  ASSIGN_OR_RETURN(in.qkv,
                   FromHost(context, dtype, {s.rows(), 3 * s.channels()},
                            RandomValues(s.qkv_size(), seed, -1, 1)));
  ASSIGN_OR_RETURN(in.d_out,
                   FromHost(context, dtype, {s.rows(), s.channels()},
                            RandomValues(s.out_size(), seed + 1, -1, 1)));
  return in;
}

// ExpectRejected on valid tensors of `s` in `dtype` that `options` refuses.
void ExpectShapeRejected(Context& context, DType dtype, const AttentionShape& s,
                         uint64_t seed, const std::string& what,
                         const CausalAttentionOptions& options) {
  ASSERT_OK_AND_ASSIGN(Inputs in, RandomInputs(context, dtype, s, seed));
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(context, dtype, s));
  ExpectRejected(context, in.qkv.view, s.batch, s.seq, s.heads, o.out.view,
                 o.lse.view, in.d_out.view, o.d_qkv.view, what, options);
}

void CheckCommonRejections(Context& context, DType dtype,
                           const CausalAttentionOptions& options) {
  const AttentionShape s{2, 4, 2, 8};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(Inputs in, RandomInputs(context, dtype, s, seed));
  const OwnedTensor& d_out = in.d_out;
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(context, dtype, s));
  const Tensor& q = in.qkv.view;

  // qkv's width is not 3 * heads * head_dim (heads = 3 does not divide 48).
  ExpectRejected(context, q, s.batch, s.seq, 3, o.out.view, o.lse.view,
                 d_out.view, o.d_qkv.view, "width vs heads", options);
  {
    ASSERT_OK_AND_ASSIGN(OwnedTensor wide,
                         FromHost(context, dtype, {s.rows(), 49},
                                  RandomValues(s.rows() * 49, seed, -1, 1)));
    ExpectRejected(context, wide.view, s.batch, s.seq, 1, o.out.view,
                   o.lse.view, d_out.view, o.d_qkv.view, "width 49", options);
  }
  // rows != batch * seq.
  ExpectRejected(context, q, s.batch, s.seq + 1, s.heads, o.out.view,
                 o.lse.view, d_out.view, o.d_qkv.view, "rows", options);
  ExpectRejected(context, q, 0, s.seq, s.heads, o.out.view, o.lse.view,
                 d_out.view, o.d_qkv.view, "batch 0", options);
  ExpectRejected(context, q, s.batch, s.seq, 0, o.out.view, o.lse.view,
                 d_out.view, o.d_qkv.view, "heads 0", options);
  // Wrong output shapes and dtypes.
  {
    Tensor out = o.out.view;
    out.shape = {s.rows(), s.channels() / 2};
    ExpectRejected(context, q, s.batch, s.seq, s.heads, out, o.lse.view,
                   d_out.view, o.d_qkv.view, "out shape", options);
    Tensor lse = o.lse.view;
    lse.shape = {s.batch, s.seq, s.heads};
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view, lse,
                   d_out.view, o.d_qkv.view, "lse shape", options);
    Tensor d_qkv = o.d_qkv.view;
    d_qkv.shape = {s.rows(), s.channels()};
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view, o.lse.view,
                   d_out.view, d_qkv, "d_qkv shape", options,
                   /*backward_only=*/true);
    Tensor d_out_short = d_out.view;
    d_out_short.shape = {s.rows() - 1, s.channels()};
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view, o.lse.view,
                   d_out_short, o.d_qkv.view, "d_out shape", options,
                   /*backward_only=*/true);
  }
  {
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor lse_other,
        PoisonedTensor(
            context, LseDType(dtype) == DType::kF64 ? DType::kF32 : DType::kF64,
            {s.batch, s.heads, s.seq}));
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view,
                   lse_other.view, d_out.view, o.d_qkv.view, "lse dtype",
                   options);
    const DType other = dtype == DType::kF32 ? DType::kF64 : DType::kF32;
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor out_other,
        PoisonedTensor(context, other, {s.rows(), s.channels()}));
    ExpectRejected(context, q, s.batch, s.seq, s.heads, out_other.view,
                   o.lse.view, d_out.view, o.d_qkv.view, "out dtype", options);
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor d_qkv_other,
        PoisonedTensor(context, other, {s.rows(), 3 * s.channels()}));
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view, o.lse.view,
                   d_out.view, d_qkv_other.view, "d_qkv dtype", options,
                   /*backward_only=*/true);
    ExpectUntouched(context, {&d_qkv_other.view});
  }
  // Outputs overlapping an input (qkv itself, which must stay as it was).
  {
    Tensor out_in_qkv = q;
    out_in_qkv.shape = {s.rows(), s.channels()};
    const absl::Status forward = CausalAttentionForward(
        context, q, s.batch, s.seq, s.heads, out_in_qkv, o.lse.view, options);
    EXPECT_TRUE(absl::IsInvalidArgument(forward)) << forward;
    const absl::Status backward =
        CausalAttentionBackward(context, q, o.out.view, o.lse.view, d_out.view,
                                s.batch, s.seq, s.heads, q,
                                /*accumulate=*/false, options);
    EXPECT_TRUE(absl::IsInvalidArgument(backward)) << backward;
    ASSERT_OK_AND_ASSIGN(std::vector<double> after, ToHost(context, q));
    EXPECT_EQ(after, Rounded(dtype, RandomValues(s.qkv_size(), seed, -1, 1)));
    ExpectUntouched(context, {&o.out.view, &o.lse.view});
  }
  // A non-positive chunk budget.
  {
    CausalAttentionOptions bad = options;
    bad.cublas_chunk_bytes = 0;
    ExpectRejected(context, q, s.batch, s.seq, s.heads, o.out.view, o.lse.view,
                   d_out.view, o.d_qkv.view, "chunk bytes", bad);
  }
}

TEST(AttentionCpuArgsTest, RejectsBadArguments) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  CheckCommonRejections(*context, DType::kF32, CausalAttentionOptions());
  CheckCommonRejections(*context, DType::kF64, CausalAttentionOptions());
  // bf16 is not a CPU activation dtype.
  const AttentionShape s{1, 2, 1, 8};
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor qkv,
      FromHost(*context, DType::kBF16, {s.rows(), 3 * s.channels()},
               RandomValues(s.qkv_size(), 1, -1, 1)));
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor d_out,
      FromHost(*context, DType::kBF16, {s.rows(), s.channels()},
               RandomValues(s.out_size(), 2, -1, 1)));
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(*context, DType::kBF16, s));
  ExpectRejected(*context, qkv.view, s.batch, s.seq, s.heads, o.out.view,
                 o.lse.view, d_out.view, o.d_qkv.view, "bf16 on the CPU");
}

// The kernel option is the GPU's: on the CPU kCudnn runs the CPU code.
TEST(AttentionCpuKernelOptionTest, CudnnRunsTheCpuCode) {
  const AttentionShape s{2, 70, 2, 8};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -2, 2);
  const std::vector<double> d_out = RandomValues(s.out_size(), seed + 1, -1, 1);
  CausalAttentionOptions cudnn;
  cudnn.kernel = AttentionKernel::kCudnn;
  ASSERT_OK_AND_ASSIGN(Results want,
                       RunBoth(*context, DType::kF32, s, qkv, d_out, false, {},
                               CausalAttentionOptions()));
  ASSERT_OK_AND_ASSIGN(Results got, RunBoth(*context, DType::kF32, s, qkv,
                                            d_out, false, {}, cudnn));
  EXPECT_EQ(got.poisoned, 0);
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.lse, want.lse);
  EXPECT_EQ(got.d_qkv, want.d_qkv);
  // The Context overload on a CPU context: the CPU's need.
  ASSERT_OK_AND_ASSIGN(
      const int64_t bytes,
      CausalAttentionWorkspaceBytes(*context, DType::kF32, s.batch, s.seq,
                                    s.heads, s.head_dim, cudnn));
  EXPECT_EQ(bytes,
            CausalAttentionWorkspaceBytes(Device::Cpu(), DType::kF32, s.batch,
                                          s.seq, s.heads, s.head_dim));
}

TEST(AttentionKernelTest, NamesAndBuilds) {
  EXPECT_STREQ(AttentionKernelName(AttentionKernel::kAuto), "auto");
  EXPECT_STREQ(AttentionKernelName(AttentionKernel::kCublas), "cublas");
  EXPECT_STREQ(AttentionKernelName(AttentionKernel::kFlash), "flash");
  EXPECT_STREQ(AttentionKernelName(AttentionKernel::kCudnn), "cudnn");
  for (AttentionKernel kernel :
       {AttentionKernel::kAuto, AttentionKernel::kCublas,
        AttentionKernel::kFlash, AttentionKernel::kCudnn}) {
    const absl::StatusOr<AttentionKernel> parsed =
        ParseAttentionKernel(AttentionKernelName(kernel));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kernel);
  }
  for (const char* bad : {"", "Flash", "cudnn ", "fa3"}) {
    EXPECT_EQ(ParseAttentionKernel(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_TRUE(AttentionKernelBuilt(AttentionKernel::kAuto).ok());
  for (AttentionKernel kernel :
       {AttentionKernel::kCublas, AttentionKernel::kFlash}) {
    const absl::Status built = AttentionKernelBuilt(kernel);
    EXPECT_EQ(built.ok(), BuiltWithCuda()) << built;
  }
  const absl::Status cudnn = AttentionKernelBuilt(AttentionKernel::kCudnn);
  if (!cudnn.ok()) {
    EXPECT_EQ(cudnn.code(), absl::StatusCode::kUnimplemented) << cudnn;
    std::printf("cuDNN kernel not in this build: %s\n",
                std::string(cudnn.message()).c_str());
  }
}

// The Device overload's kCudnn figure, an estimate (the GPU cases check it
// against cuDNN's): at least the accumulate mode's [rows, 3C] bf16 buffer and
// dP of the causal square in bf16, and growing with the shape.
TEST(AttentionKernelTest, CudnnWorkspaceEstimate) {
  CausalAttentionOptions cudnn;
  cudnn.kernel = AttentionKernel::kCudnn;
  const int64_t small = CausalAttentionWorkspaceBytes(
      Device::Cuda(0), DType::kBF16, 2, 100, 3, 64, cudnn);
  EXPECT_GE(small, 2 * 100 * 3 * 3 * 64 * 2 + 2 * 3 * 128 * 128 * 2);
  const int64_t large = CausalAttentionWorkspaceBytes(
      Device::Cuda(0), DType::kBF16, 16, 1024, 12, 64, cudnn);
  EXPECT_GE(large,
            16 * 1024 * 3 * 768 * 2 + int64_t{16} * 12 * 1024 * 1024 * 2);
  EXPECT_EQ(CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16, 0, 1,
                                          1, 8, cudnn),
            0);
  // The atomic backward keeps no dP: less, but still the accumulate buffer
  // and an f32 dQ.
  CausalAttentionOptions atomic = cudnn;
  atomic.deterministic = false;
  const int64_t large_atomic = CausalAttentionWorkspaceBytes(
      Device::Cuda(0), DType::kBF16, 16, 1024, 12, 64, atomic);
  EXPECT_LT(large_atomic, large);
  EXPECT_GE(large_atomic, 16 * 1024 * 3 * 768 * 2 + 16 * 1024 * 768 * 4);
  // kAuto picks cuDNN where it is built in, else the flash kernels.
  CausalAttentionOptions flash;
  flash.kernel = AttentionKernel::kFlash;
  EXPECT_EQ(CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16, 16,
                                          1024, 12, 64, flash),
            16 * 12 * 1024 * 4 + 16 * 12 * (16 * 17 / 2) * 64 * 64 * 2);
  EXPECT_EQ(CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16, 16,
                                          1024, 12, 64),
            AttentionKernelBuilt(AttentionKernel::kCudnn).ok()
                ? large
                : CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16,
                                                16, 1024, 12, 64, flash));
}

// ---------------------------------------------------------------------------
// GPU.

// Why the cuDNN kernel cannot be tested in this build, or "" when it can.
std::string CudnnUnavailableReason() {
  const absl::Status built = AttentionKernelBuilt(AttentionKernel::kCudnn);
  return built.ok() ? "" : std::string(built.message());
}

#define SKIP_WITHOUT_CUDNN()                                               \
  do {                                                                     \
    const std::string lossrt_cudnn_unavailable = CudnnUnavailableReason(); \
    if (!lossrt_cudnn_unavailable.empty()) {                               \
      GTEST_SKIP() << "no cuDNN kernel: " << lossrt_cudnn_unavailable;     \
    }                                                                      \
  } while (false)

// A GPU configuration under test.
struct GpuConfig {
  const char* name;
  DType dtype;
  AttentionKernel kernel;
  int64_t chunk_pairs;  // > 0: a cuBLAS budget of this many (batch, head) pairs
  bool deterministic = true;  // CausalAttentionOptions::deterministic
};

constexpr GpuConfig kGpuConfigs[] = {
    {"cublas f32", DType::kF32, AttentionKernel::kCublas, 0},
    {"cublas f32, chunks of 3 pairs", DType::kF32, AttentionKernel::kCublas, 3},
    {"cublas bf16", DType::kBF16, AttentionKernel::kCublas, 0},
    {"cublas bf16, chunks of 1 pair", DType::kBF16, AttentionKernel::kCublas,
     1},
    {"flash bf16", DType::kBF16, AttentionKernel::kFlash, 0},
    {"cudnn bf16", DType::kBF16, AttentionKernel::kCudnn, 0},
    {"cudnn bf16, atomic dQ", DType::kBF16, AttentionKernel::kCudnn, 0, false},
    {"default bf16", DType::kBF16, AttentionKernel::kAuto, 0},
    {"default f32", DType::kF32, AttentionKernel::kAuto, 0},
};

CausalAttentionOptions KernelOptions(AttentionKernel kernel) {
  CausalAttentionOptions options;
  options.kernel = kernel;
  return options;
}

// Whether LOSSRT_TEST_ATTENTION_KERNELS (comma-separated first words of the
// configurations' names: cublas, flash, cudnn, default) keeps `config`; unset,
// every configuration runs. It lets a slow tool (compute-sanitizer's initcheck
// in tools/run_gpu_tests.sh) take one kernel's cases in a process of its own.
bool Selected(const GpuConfig& config) {
  const char* env = std::getenv("LOSSRT_TEST_ATTENTION_KERNELS");
  if (env == nullptr || *env == '\0') return true;
  const std::string name = config.name;
  const std::string kernel = name.substr(0, name.find(' '));
  for (absl::string_view wanted : absl::StrSplit(env, ',')) {
    if (wanted == kernel) return true;
  }
  return false;
}

// Whether this build has the configuration's kernel and the run selects it
// (it prints why not, once per configuration and call).
bool Runnable(const GpuConfig& config) {
  if (!Selected(config)) {
    std::printf("skipping %s: not in LOSSRT_TEST_ATTENTION_KERNELS\n",
                config.name);
    return false;
  }
  const absl::Status built = AttentionKernelBuilt(config.kernel);
  if (!built.ok()) {
    std::printf("skipping %s: %s\n", config.name,
                std::string(built.message()).c_str());
  }
  return built.ok();
}

CausalAttentionOptions OptionsOf(const GpuConfig& config,
                                 const AttentionShape& s) {
  CausalAttentionOptions options;
  options.kernel = config.kernel;
  options.deterministic = config.deterministic;
  if (config.chunk_pairs > 0) {
    // The op's per-pair need: [seq, seq rounded up to 8] floats twice and
    // activations twice (the backward's buffers).
    const int64_t ld = (s.seq + 7) / 8 * 8;
    options.cublas_chunk_bytes =
        config.chunk_pairs * s.seq * ld * (8 + 2 * DTypeSize(config.dtype));
  }
  return options;
}

struct Tolerances {
  double out_atol, out_rtol;
  double lse_atol, lse_rtol;
  double grad_rel_atol, grad_rtol;
};

Tolerances TolerancesOf(DType dtype) {
  if (dtype == DType::kF32) return {3e-5, 1e-4, 3e-5, 1e-5, 1e-4, 1e-3};
  // bf16: probabilities, products and outputs are rounded to 8 bits.
  return {2.5e-2, 2e-2, 2e-3, 1e-3, 3e-2, 3e-2};
}

// Every configuration of `configs` on `s`, forward and backward in both
// accumulate modes, against the f64 CPU op on the same (rounded) values.
void ExpectMatchesCpu(const AttentionShape& s, uint64_t seed,
                      const std::vector<GpuConfig>& configs) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const std::vector<double> qkv_values =
      RandomValues(s.qkv_size(), seed, -1.5, 1.5);
  const std::vector<double> d_out_values =
      RandomValues(s.out_size(), seed + 1, -1, 1);
  const std::vector<double> start_values =
      RandomValues(s.qkv_size(), seed + 2, -1, 1);

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    bool any = false;
    for (const GpuConfig& config : configs) any |= config.dtype == dtype;
    if (!any) continue;
    // The reference: the f64 CPU op on the values as the dtype holds them.
    const std::vector<double> qkv = Rounded(dtype, qkv_values);
    const std::vector<double> d_out = Rounded(dtype, d_out_values);
    const std::vector<double> start = Rounded(dtype, start_values);
    ASSERT_OK_AND_ASSIGN(Results want,
                         RunBoth(*cpu, DType::kF64, s, qkv, d_out, false, {},
                                 CausalAttentionOptions()));
    const std::vector<double> want_accumulated = Plus(start, want.d_qkv);
    const Tolerances tol = TolerancesOf(dtype);

    for (const GpuConfig& config : configs) {
      if (config.dtype != dtype || !Runnable(config)) continue;
      // cuDNN refuses a single token (RejectsBadArguments checks that).
      if (config.kernel == AttentionKernel::kCudnn && s.seq < 2) continue;
      SCOPED_TRACE(absl::StrCat(Describe(s), ", ", config.name));
      const CausalAttentionOptions options = OptionsOf(config, s);
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(absl::StrCat("accumulate ", accumulate));
        ASSERT_OK_AND_ASSIGN(Results got, RunBoth(*gpu, dtype, s, qkv, d_out,
                                                  accumulate, start, options));
        EXPECT_EQ(got.poisoned, 0);
        EXPECT_TRUE(AllClose(got.out, want.out, tol.out_atol, tol.out_rtol));
        EXPECT_TRUE(AllClose(got.lse, want.lse, tol.lse_atol, tol.lse_rtol));
        EXPECT_TRUE(GradientsClose(s, got.d_qkv,
                                   accumulate ? want_accumulated : want.d_qkv,
                                   tol.grad_rel_atol, tol.grad_rtol));
      }
    }
  }
}

class AttentionGpuTest : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(AttentionGpuTest, MatchesCpuInDouble) {
  SKIP_WITHOUT_GPU();
  ExpectMatchesCpu(
      GetParam(), TestSeed(),
      std::vector<GpuConfig>(std::begin(kGpuConfigs), std::end(kGpuConfigs)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGpuTest,
    ::testing::Values(AttentionShape{1, 1, 1, 64},       // one token
                      AttentionShape{2, 5, 2, 8},        // head_dim 8 (padded)
                      AttentionShape{3, 37, 2, 16},      // runs across batches
                      AttentionShape{2, 37, 3, 24},      // head_dim 24
                      AttentionShape{1, 65, 2, 32},      // one past a block
                      AttentionShape{2, 100, 2, 64},     // seq % 64 != 0
                      AttentionShape{1, 130, 2, 40},     // head_dim 40 (padded)
                      AttentionShape{1, 129, 1, 96},     // head_dim 96
                      AttentionShape{1, 200, 2, 128},    // head_dim 128
                      AttentionShape{2, 1024, 2, 64}));  // GPT-2's heads

// Runs of `kernel` agree bit for bit, forward and backward (several, as a race
// would show only now and then), on a small case and GPT-2 small's layer at
// batch 8 (several waves of blocks, so that blocks wait on others).
void ExpectBitwiseReproducible(AttentionKernel kernel, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions options = KernelOptions(kernel);
  for (const AttentionShape& s :
       {AttentionShape{2, 300, 3, 64}, AttentionShape{8, 1024, 12, 64}}) {
    SCOPED_TRACE(Describe(s));
    const std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -1.5, 1.5);
    const std::vector<double> d_out =
        RandomValues(s.out_size(), seed + 1, -1, 1);
    ASSERT_OK_AND_ASSIGN(Results first, RunBoth(*gpu, DType::kBF16, s, qkv,
                                                d_out, false, {}, options));
    EXPECT_EQ(first.poisoned, 0);
    for (int run = 0; run < 3; ++run) {
      ASSERT_OK_AND_ASSIGN(Results again, RunBoth(*gpu, DType::kBF16, s, qkv,
                                                  d_out, false, {}, options));
      EXPECT_TRUE(first.out == again.out) << run;
      EXPECT_TRUE(first.lse == again.lse) << run;
      EXPECT_TRUE(first.d_qkv == again.d_qkv) << run;
    }
  }
}

// The flash backward has one writer per element and sums in a fixed order.
TEST(AttentionGpuFlashTest, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  ExpectBitwiseReproducible(AttentionKernel::kFlash, TestSeed());
}

// A sequence long enough that the flash backward recomputes dS for dQ rather
// than storing it (66 MiB per (batch, head), 264 MiB in all): the same
// gradients as the cuBLAS path.
TEST(AttentionGpuFlashTest, LongSequenceBackwardMatchesCublas) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{1, 8192, 4, 64};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const std::vector<double> qkv =
      Rounded(DType::kBF16, RandomValues(s.qkv_size(), seed, -1.5, 1.5));
  const std::vector<double> d_out =
      Rounded(DType::kBF16, RandomValues(s.out_size(), seed + 1, -1, 1));
  CausalAttentionOptions flash, cublas;
  flash.kernel = AttentionKernel::kFlash;
  cublas.kernel = AttentionKernel::kCublas;
  ASSERT_OK_AND_ASSIGN(Results want, RunBoth(*gpu, DType::kBF16, s, qkv, d_out,
                                             false, {}, cublas));
  ASSERT_OK_AND_ASSIGN(Results got, RunBoth(*gpu, DType::kBF16, s, qkv, d_out,
                                            false, {}, flash));
  EXPECT_EQ(got.poisoned, 0);
  const Tolerances tol = TolerancesOf(DType::kBF16);
  EXPECT_TRUE(GradientsClose(s, got.d_qkv, want.d_qkv, tol.grad_rel_atol,
                             tol.grad_rtol));
}

TEST(AttentionGpuMaskTest, FutureTokensDoNotChangeEarlierOutputs) {
  SKIP_WITHOUT_GPU();
  // Token 70 sits in the second 64-key block; 100 tokens end mid-block.
  const AttentionShape s{2, 100, 2, 64};
  constexpr int64_t kChanged = 70;
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -1.5, 1.5);
  std::vector<double> changed = qkv;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < 3 * s.channels(); ++i) {
      changed[(b * s.seq + kChanged) * 3 * s.channels() + i] = 3.0;
    }
  }
  for (const GpuConfig& config : kGpuConfigs) {
    if (!Runnable(config)) continue;
    SCOPED_TRACE(config.name);
    const CausalAttentionOptions options = OptionsOf(config, s);
    ASSERT_OK_AND_ASSIGN(Forward before,
                         RunForward(*gpu, config.dtype, s, qkv, options));
    ASSERT_OK_AND_ASSIGN(Forward after,
                         RunForward(*gpu, config.dtype, s, changed, options));
    ASSERT_OK_AND_ASSIGN(std::vector<double> out0,
                         ToHost(*gpu, before.out.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> out1,
                         ToHost(*gpu, after.out.view));
    int64_t earlier_changes = 0;
    int64_t later_changes = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq; ++t) {
        for (int64_t i = 0; i < s.channels(); ++i) {
          const int64_t at = (b * s.seq + t) * s.channels() + i;
          const bool differs = out0[at] != out1[at];
          (t < kChanged ? earlier_changes : later_changes) += differs ? 1 : 0;
        }
      }
    }
    // Masked probabilities are exactly 0, so earlier rows are bit-identical.
    EXPECT_EQ(earlier_changes, 0);
    EXPECT_GT(later_changes, s.batch * (s.seq - kChanged) * s.channels() / 2);
  }
}

TEST(AttentionGpuWorkspaceTest, ReservedWorkspaceIsEnough) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{2, 150, 3, 32};
  const uint64_t seed = TestSeed();
  for (const GpuConfig& config : kGpuConfigs) {
    if (!Runnable(config)) continue;
    SCOPED_TRACE(config.name);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                         Context::Create(Device::Cuda(0)));
    const CausalAttentionOptions options = OptionsOf(config, s);
    const int64_t bytes =
        CausalAttentionWorkspaceBytes(gpu->device(), config.dtype, s.batch,
                                      s.seq, s.heads, s.head_dim, options);
    EXPECT_GT(bytes, 0);
    ASSERT_OK(gpu->ReserveWorkspace(bytes));
    const int64_t reserved = gpu->workspace_bytes();
    ASSERT_OK_AND_ASSIGN(
        Results r,
        RunBoth(*gpu, config.dtype, s, RandomValues(s.qkv_size(), seed, -1, 1),
                RandomValues(s.out_size(), seed + 1, -1, 1), false, {},
                options));
    EXPECT_EQ(r.poisoned, 0);
    EXPECT_EQ(gpu->workspace_bytes(), reserved);
  }
  // GPT-2 small's layer on the flash path: the backward's delta, batch *
  // heads * seq floats, and dS in bf16, 64 x 64 tiles for the 16 * 17 / 2
  // block pairs of the causal triangle of every (batch, head).
  CausalAttentionOptions flash;
  flash.kernel = AttentionKernel::kFlash;
  EXPECT_EQ(CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16, 16,
                                          1024, 12, 64, flash),
            16 * 12 * 1024 * 4 + 16 * 12 * (16 * 17 / 2) * 64 * 64 * 2);
  // Past 256 MiB of dS the dQ kernel recomputes it: only delta.
  EXPECT_EQ(CausalAttentionWorkspaceBytes(Device::Cuda(0), DType::kBF16, 16,
                                          2048, 12, 64, flash),
            16 * 12 * 2048 * 4);
}

// bf16 tensors that are not 16-byte aligned: the default falls back to the
// cuBLAS path (same results), an explicit kFlash is refused.
TEST(AttentionGpuArgsTest, MisalignedBf16FallsBackToCublas) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{1, 20, 2, 16};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const std::vector<double> qkv =
      Rounded(DType::kBF16, RandomValues(s.qkv_size(), seed, -1.5, 1.5));
  ASSERT_OK_AND_ASSIGN(
      Results want,
      RunBoth(*cpu, DType::kF64, s, qkv, std::vector<double>(s.out_size(), 0.0),
              false, {}, CausalAttentionOptions()));
  // qkv one element past an aligned start.
  std::vector<double> shifted(s.qkv_size() + 1, 0.0);
  std::copy(qkv.begin(), qkv.end(), shifted.begin() + 1);
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor buffer,
      FromHost(*gpu, DType::kBF16, {s.qkv_size() + 1}, shifted));
  const Tensor misaligned =
      Tensor::Of(static_cast<char*>(buffer.view.data) + DTypeSize(DType::kBF16),
                 DType::kBF16, {s.rows(), 3 * s.channels()}, gpu->device());
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(*gpu, DType::kBF16, s));

  CausalAttentionOptions flash;
  flash.kernel = AttentionKernel::kFlash;
  const absl::Status refused = CausalAttentionForward(
      *gpu, misaligned, s.batch, s.seq, s.heads, o.out.view, o.lse.view, flash);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  ExpectUntouched(*gpu, {&o.out.view, &o.lse.view});

  ASSERT_OK(CausalAttentionForward(*gpu, misaligned, s.batch, s.seq, s.heads,
                                   o.out.view, o.lse.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> out, ToHost(*gpu, o.out.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> lse, ToHost(*gpu, o.lse.view));
  const Tolerances tol = TolerancesOf(DType::kBF16);
  EXPECT_TRUE(AllClose(out, want.out, tol.out_atol, tol.out_rtol));
  EXPECT_TRUE(AllClose(lse, want.lse, tol.lse_atol, tol.lse_rtol));
}

TEST(AttentionGpuArgsTest, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  for (const GpuConfig& config : kGpuConfigs) {
    SCOPED_TRACE(config.name);
    CheckCommonRejections(*gpu, config.dtype, OptionsOf(config, {2, 4, 2, 8}));
  }
  const uint64_t seed = TestSeed();
  const CausalAttentionOptions flash = KernelOptions(AttentionKernel::kFlash);
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  // Head dims the GPU kernels do not take: not a multiple of 8, above 128.
  for (int64_t head_dim : {12, 4, 136}) {
    const AttentionShape s{1, 3, 2, head_dim};
    ExpectShapeRejected(*gpu, DType::kBF16, s, seed,
                        absl::StrCat("head_dim ", head_dim),
                        CausalAttentionOptions());
    ExpectShapeRejected(*gpu, DType::kBF16, s, seed,
                        absl::StrCat("head_dim ", head_dim, " with kCudnn"),
                        cudnn);
  }
  // f64 is not a GPU activation dtype; the fused kernels take bf16 only.
  for (DType dtype : {DType::kF64, DType::kF32}) {
    const AttentionShape s{1, 3, 1, 8};
    ExpectShapeRejected(*gpu, dtype, s, seed,
                        absl::StrCat(DTypeName(dtype), " with kFlash"), flash);
    ExpectShapeRejected(*gpu, dtype, s, seed,
                        absl::StrCat(DTypeName(dtype), " with kCudnn"), cudnn);
  }
  // A single token, which cuDNN's attention refuses.
  ExpectShapeRejected(*gpu, DType::kBF16, {2, 1, 2, 64}, seed,
                      "seq 1 with kCudnn", cudnn);
  // Tensors on another device than the context.
  {
    const AttentionShape s{1, 3, 1, 8};
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                         Context::Create(Device::Cpu()));
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor qkv,
        FromHost(*cpu, DType::kF32, {s.rows(), 3 * s.channels()},
                 RandomValues(s.qkv_size(), seed, -1, 1)));
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_out,
                         FromHost(*gpu, DType::kF32, {s.rows(), s.channels()},
                                  RandomValues(s.out_size(), seed, -1, 1)));
    ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(*gpu, DType::kF32, s));
    ExpectRejected(*gpu, qkv.view, s.batch, s.seq, s.heads, o.out.view,
                   o.lse.view, d_out.view, o.d_qkv.view, "qkv on the CPU");
  }
}

// ---------------------------------------------------------------------------
// GPU: the cuDNN kernel.

class AttentionGpuCudnnShapeTest
    : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(AttentionGpuCudnnShapeTest, MatchesCpuInDouble) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  ExpectMatchesCpu(GetParam(), TestSeed(),
                   {{"cudnn bf16", DType::kBF16, AttentionKernel::kCudnn, 0},
                    {"cudnn bf16, atomic dQ", DType::kBF16,
                     AttentionKernel::kCudnn, 0, false}});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGpuCudnnShapeTest,
    ::testing::Values(AttentionShape{1, 2, 1, 64},      // two tokens
                      AttentionShape{2, 100, 3, 64},    // seq % 64 != 0
                      AttentionShape{3, 257, 2, 128},   // one past 256
                      AttentionShape{1, 257, 1, 64},    // one head
                      AttentionShape{2, 64, 5, 128},    // one block
                      AttentionShape{3, 100, 12, 128},  // 12 heads, D 128
                      AttentionShape{1, 1024, 12, 64},  // GPT-2 small's layer
                      AttentionShape{2, 1024, 4, 128}));

// cuDNN's deterministic backward algorithm (set_deterministic_algorithm).
TEST(AttentionGpuCudnnTest, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  ExpectBitwiseReproducible(AttentionKernel::kCudnn, TestSeed());
}

// cuDNN's softmax Stats is the same natural-log log-sum-exp as the other
// kernels' lse: the flash forward feeds the cuDNN backward and the reverse,
// and either pair matches the f64 CPU op.
TEST(AttentionGpuCudnnTest, MixesWithTheFlashKernels) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions flash = KernelOptions(AttentionKernel::kFlash);
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  const Tolerances tol = TolerancesOf(DType::kBF16);
  for (const AttentionShape& s :
       {AttentionShape{2, 300, 3, 64}, AttentionShape{1, 257, 2, 128}}) {
    const std::vector<double> qkv =
        Rounded(DType::kBF16, RandomValues(s.qkv_size(), seed, -1.5, 1.5));
    const std::vector<double> d_out =
        Rounded(DType::kBF16, RandomValues(s.out_size(), seed + 1, -1, 1));
    ASSERT_OK_AND_ASSIGN(Results want,
                         RunBoth(*cpu, DType::kF64, s, qkv, d_out, false, {},
                                 CausalAttentionOptions()));
    std::vector<double> lse_of[2];
    for (int pair = 0; pair < 2; ++pair) {
      const CausalAttentionOptions& forward = pair == 0 ? flash : cudnn;
      const CausalAttentionOptions& backward = pair == 0 ? cudnn : flash;
      SCOPED_TRACE(absl::StrCat(Describe(s), pair == 0
                                                 ? ", flash forward, cudnn "
                                                   "backward"
                                                 : ", cudnn forward, flash "
                                                   "backward"));
      ASSERT_OK_AND_ASSIGN(Forward f,
                           RunForward(*gpu, DType::kBF16, s, qkv, forward));
      ASSERT_OK_AND_ASSIGN(
          OwnedTensor d_qkv,
          RunBackward(*gpu, DType::kBF16, s, f, d_out, false, {}, backward));
      ASSERT_OK_AND_ASSIGN(std::vector<double> out, ToHost(*gpu, f.out.view));
      ASSERT_OK_AND_ASSIGN(lse_of[pair], ToHost(*gpu, f.lse.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*gpu, d_qkv.view));
      ASSERT_OK_AND_ASSIGN(int64_t poisoned, CountPoison(*gpu, d_qkv.view));
      EXPECT_EQ(poisoned, 0);
      EXPECT_TRUE(AllClose(out, want.out, tol.out_atol, tol.out_rtol));
      EXPECT_TRUE(AllClose(lse_of[pair], want.lse, tol.lse_atol, tol.lse_rtol));
      EXPECT_TRUE(
          GradientsClose(s, got, want.d_qkv, tol.grad_rel_atol, tol.grad_rtol));
    }
    // Both kernels' lse agree with each other as closely as with the CPU's.
    EXPECT_TRUE(
        AllClose(lse_of[1], lse_of[0], 2 * tol.lse_atol, 2 * tol.lse_rtol));
  }
}

// The exact workspace (the Context overload, which builds the shape's graphs)
// is positive and within the Device overload's estimate; reserving it leaves
// nothing to grow, in either accumulate mode.
TEST(AttentionGpuCudnnTest, WorkspaceFigures) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  for (bool deterministic : {true, false}) {
    cudnn.deterministic = deterministic;
    for (const AttentionShape& s :
         {AttentionShape{1, 2, 1, 64}, AttentionShape{2, 100, 3, 64},
          AttentionShape{3, 257, 2, 128}, AttentionShape{16, 1024, 12, 64},
          AttentionShape{4, 4096, 12, 128}, AttentionShape{2, 8192, 12, 64}}) {
      SCOPED_TRACE(
          absl::StrCat(Describe(s), ", deterministic ", deterministic));
      ASSERT_OK_AND_ASSIGN(
          const int64_t exact,
          CausalAttentionWorkspaceBytes(*gpu, DType::kBF16, s.batch, s.seq,
                                        s.heads, s.head_dim, cudnn));
      const int64_t estimate =
          CausalAttentionWorkspaceBytes(gpu->device(), DType::kBF16, s.batch,
                                        s.seq, s.heads, s.head_dim, cudnn);
      const int64_t accumulate_buffer = s.qkv_size() * 2;
      std::printf(
          "%s, deterministic %d: workspace %lld bytes (cuDNN's share about "
          "%lld), estimate %lld\n",
          Describe(s).c_str(), deterministic ? 1 : 0,
          static_cast<long long>(exact),
          static_cast<long long>(exact - accumulate_buffer),
          static_cast<long long>(estimate));
      EXPECT_GE(exact, accumulate_buffer);
      EXPECT_LE(exact, estimate);
    }
  }
  const AttentionShape s{3, 257, 2, 128};
  const uint64_t seed = TestSeed();
  const std::vector<double> qkv = RandomValues(s.qkv_size(), seed, -1, 1);
  const std::vector<double> d_out = RandomValues(s.out_size(), seed + 1, -1, 1);
  const std::vector<double> start = RandomValues(s.qkv_size(), seed + 2, -1, 1);
  for (bool deterministic : {true, false}) {
    cudnn.deterministic = deterministic;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> fresh,
                         Context::Create(Device::Cuda(0)));
    ASSERT_OK_AND_ASSIGN(
        const int64_t bytes,
        CausalAttentionWorkspaceBytes(*fresh, DType::kBF16, s.batch, s.seq,
                                      s.heads, s.head_dim, cudnn));
    ASSERT_OK(fresh->ReserveWorkspace(bytes));
    const int64_t reserved = fresh->workspace_bytes();
    for (bool accumulate : {false, true}) {
      ASSERT_OK_AND_ASSIGN(Results r, RunBoth(*fresh, DType::kBF16, s, qkv,
                                              d_out, accumulate, start, cudnn));
      EXPECT_EQ(r.poisoned, 0);
      EXPECT_EQ(fresh->workspace_bytes(), reserved)
          << "deterministic " << deterministic << ", accumulate " << accumulate;
    }
  }
}

// bf16 tensors that are not 16-byte aligned (qkv, or lse, which only cuDNN
// needs aligned): an explicit kCudnn is refused and writes nothing.
TEST(AttentionGpuCudnnTest, RejectsMisalignedTensors) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{1, 20, 2, 16};
  const uint64_t seed = TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  ASSERT_OK_AND_ASSIGN(Inputs in, RandomInputs(*gpu, DType::kBF16, s, seed));
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(*gpu, DType::kBF16, s));
  // qkv one element, lse one float past an aligned start.
  ASSERT_OK_AND_ASSIGN(OwnedTensor qkv_buffer,
                       FromHost(*gpu, DType::kBF16, {s.qkv_size() + 1},
                                RandomValues(s.qkv_size() + 1, seed, -1, 1)));
  const Tensor misaligned_qkv = Tensor::Of(
      static_cast<char*>(qkv_buffer.view.data) + DTypeSize(DType::kBF16),
      DType::kBF16, {s.rows(), 3 * s.channels()}, gpu->device());
  ExpectRejected(*gpu, misaligned_qkv, s.batch, s.seq, s.heads, o.out.view,
                 o.lse.view, in.d_out.view, o.d_qkv.view, "misaligned qkv",
                 cudnn);
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor lse_buffer,
      PoisonedTensor(*gpu, DType::kF32, {s.batch * s.heads * s.seq + 1}));
  const Tensor misaligned_lse =
      Tensor::Of(static_cast<char*>(lse_buffer.view.data) + 4, DType::kF32,
                 {s.batch, s.heads, s.seq}, gpu->device());
  ExpectRejected(*gpu, in.qkv.view, s.batch, s.seq, s.heads, o.out.view,
                 misaligned_lse, in.d_out.view, o.d_qkv.view, "misaligned lse",
                 cudnn);
}

// A build without cuDNN: kCudnn is Unimplemented, says why, writes nothing.
TEST(AttentionGpuCudnnTest, UnimplementedWithoutCudnn) {
  SKIP_WITHOUT_GPU();
  if (CudnnUnavailableReason().empty()) {
    GTEST_SKIP() << "this build has the cuDNN kernel";
  }
  const AttentionShape s{1, 20, 2, 64};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  ASSERT_OK_AND_ASSIGN(Inputs in,
                       RandomInputs(*gpu, DType::kBF16, s, TestSeed()));
  ASSERT_OK_AND_ASSIGN(Outputs o, PoisonedOutputs(*gpu, DType::kBF16, s));
  const absl::Status forward =
      CausalAttentionForward(*gpu, in.qkv.view, s.batch, s.seq, s.heads,
                             o.out.view, o.lse.view, cudnn);
  EXPECT_EQ(forward.code(), absl::StatusCode::kUnimplemented) << forward;
  EXPECT_NE(forward.message().find("build time"), absl::string_view::npos)
      << forward;
  ExpectUntouched(*gpu, {&o.out.view, &o.lse.view});
  EXPECT_EQ(CausalAttentionWorkspaceBytes(*gpu, DType::kBF16, s.batch, s.seq,
                                          s.heads, s.head_dim, cudnn)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

#ifdef LOSSRT_WITH_CUDA

// A training step's attention calls: the forward into o.out and o.lse, then
// the backward into o.d_qkv twice, written and then accumulated.
absl::Status RunStep(Context& context, const AttentionShape& s,
                     const Inputs& in, const Outputs& o,
                     const CausalAttentionOptions& options) {
  RETURN_IF_ERROR(CausalAttentionForward(context, in.qkv.view, s.batch, s.seq,
                                         s.heads, o.out.view, o.lse.view,
                                         options));
  for (bool accumulate : {false, true}) {
    RETURN_IF_ERROR(CausalAttentionBackward(
        context, in.qkv.view, o.out.view, o.lse.view, in.d_out.view, s.batch,
        s.seq, s.heads, o.d_qkv.view, accumulate, options));
  }
  return absl::OkStatus();
}

// The step's outputs as the host sees them: out, lse, d_qkv.
absl::StatusOr<std::vector<std::vector<double>>> StepValues(Context& context,
                                                            const Outputs& o) {
  std::vector<std::vector<double>> values;
  for (const Tensor* t : {&o.out.view, &o.lse.view, &o.d_qkv.view}) {
    ASSIGN_OR_RETURN(std::vector<double> v, ToHost(context, *t));
    values.push_back(std::move(v));
  }
  return values;
}

// A shape run before the capture (its graphs built, the workspace grown): the
// capture in global mode, which fails on any allocation or synchronization,
// records the forward and both backwards without allocating, and the replays
// write the eager run's bits.
TEST(AttentionGpuCudnnTest, SeenShapeRunsInsideACapture) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  const AttentionShape s{2, 257, 4, 64};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  ASSERT_OK_AND_ASSIGN(Inputs in,
                       RandomInputs(*gpu, DType::kBF16, s, TestSeed()));
  ASSERT_OK_AND_ASSIGN(Outputs eager, PoisonedOutputs(*gpu, DType::kBF16, s));
  ASSERT_OK(RunStep(*gpu, s, in, eager, cudnn));
  ASSERT_OK_AND_ASSIGN(auto want, StepValues(*gpu, eager));

  ASSERT_OK_AND_ASSIGN(Outputs captured,
                       PoisonedOutputs(*gpu, DType::kBF16, s));
  ASSERT_OK(gpu->Synchronize());
  const int64_t workspace = gpu->workspace_bytes();
  const int64_t allocated = gpu->allocator().current_bytes();
  ASSERT_OK_AND_ASSIGN(cudaStream_t stream, CudaStreamOf(*gpu));
  test::CapturedGraph graph;
  ASSERT_OK(graph.Capture(stream, cudaStreamCaptureModeGlobal, [&] {
    return RunStep(*gpu, s, in, captured, cudnn);
  }));
  EXPECT_EQ(gpu->workspace_bytes(), workspace);
  EXPECT_EQ(gpu->allocator().current_bytes(), allocated);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_OK(graph.Replay(stream));
    ASSERT_OK_AND_ASSIGN(auto got, StepValues(*gpu, captured));
    EXPECT_TRUE(got == want) << "replay " << replay;
  }
}

// A shape first seen inside a capture (a fresh context: no cuDNN handle yet),
// its workspace reserved beforehand: cuDNN builds the graph with the thread's
// capture mode relaxed. Either the capture works and its replay writes the
// bits of the same step run eagerly after it, or the call fails with a clear
// error (and the context works after); which one is printed. The capture is in
// global mode, the strictest.
TEST(AttentionGpuCudnnTest, ShapeFirstSeenInsideACapture) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  const AttentionShape s{1, 300, 3, 128};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> gpu,
                       Context::Create(Device::Cuda(0)));
  const CausalAttentionOptions cudnn = KernelOptions(AttentionKernel::kCudnn);
  ASSERT_OK(gpu->ReserveWorkspace(
      CausalAttentionWorkspaceBytes(gpu->device(), DType::kBF16, s.batch, s.seq,
                                    s.heads, s.head_dim, cudnn)));
  ASSERT_OK_AND_ASSIGN(Inputs in,
                       RandomInputs(*gpu, DType::kBF16, s, TestSeed()));
  ASSERT_OK_AND_ASSIGN(Outputs captured,
                       PoisonedOutputs(*gpu, DType::kBF16, s));
  ASSERT_OK(gpu->Synchronize());
  ASSERT_OK_AND_ASSIGN(cudaStream_t stream, CudaStreamOf(*gpu));
  test::CapturedGraph graph;
  const absl::Status status =
      graph.Capture(stream, cudaStreamCaptureModeGlobal,
                    [&] { return RunStep(*gpu, s, in, captured, cudnn); });
  std::printf("first call of a shape inside a capture: %s\n",
              status.ToString().c_str());
  if (status.ok()) ASSERT_OK(graph.Replay(stream));
  ASSERT_OK_AND_ASSIGN(Outputs eager, PoisonedOutputs(*gpu, DType::kBF16, s));
  ASSERT_OK(RunStep(*gpu, s, in, eager, cudnn));
  ASSERT_OK_AND_ASSIGN(auto want, StepValues(*gpu, eager));
  if (!status.ok()) {
    EXPECT_FALSE(status.message().empty());
    return;
  }
  ASSERT_OK_AND_ASSIGN(auto got, StepValues(*gpu, captured));
  EXPECT_TRUE(got == want);
}

#endif  // LOSSRT_WITH_CUDA

}  // namespace
}  // namespace ops
}  // namespace lossrt
