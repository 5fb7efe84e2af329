// Tests of the embedding (graph/ops/embedding.h): the CPU forward against the
// exact sums computed here, the CPU f64 backward against finite differences
// (accumulating into preset gradients, repeated ids), CUDA f32 and bf16
// against the CPU (vector and scalar paths, misaligned tables) with poisoned
// outputs, the GPU's sorted token scatter under stressing id patterns (one id
// thousands of times, all distinct, vocabulary ends, skewed), its bitwise
// reproducibility and its CUDA graph capture, out-of-range ids on both
// devices (InvalidArgument, nothing written), and the other invalid
// arguments.
#include "graph/ops/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
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

#ifdef LOSSRT_WITH_CUDA
// From the toolkit, which //graph/ops:embedding links (cudart).
#include <cuda_runtime.h>
#endif

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
using test::RoundTo;
using test::ToHost;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor IdView(std::vector<int32_t>& ids) {
  return Tensor::Of(ids.data(), DType::kI32, {static_cast<int64_t>(ids.size())},
                    Device::Cpu());
}

// Ids uniform in [0, vocab) with both ends present and repeats.
std::vector<int32_t> RandomIds(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids;
  for (double v : RandomValues(rows, seed, 0, static_cast<double>(vocab))) {
    ids.push_back(std::min<int32_t>(static_cast<int32_t>(v), vocab - 1));
  }
  ids[0] = 0;
  if (rows > 1) ids[rows - 1] = static_cast<int32_t>(vocab - 1);
  if (rows > 2) ids[1] = ids[rows - 1];  // a repeat
  return ids;
}

std::vector<double> AsDoubles(const std::vector<int32_t>& ids) {
  return std::vector<double>(ids.begin(), ids.end());
}

// ---------------------------------------------------------------------------
// CPU forward against exact sums.

struct Dims {
  int64_t vocab = 11;
  int64_t cols = 6;
  int64_t seq = 4;
  int64_t batch = 3;
  int64_t positions = 5;  // > seq: only the first seq rows are used
  int64_t rows() const { return seq * batch; }
};

class EmbeddingCpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(EmbeddingCpuTest, ForwardMatchesExactSum) {
  const DType dtype = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const Dims d;
  std::vector<int32_t> ids = RandomIds(d.rows(), d.vocab, seed);
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor tokens,
      FromHost(*cpu, dtype, {d.vocab, d.cols},
               RandomValues(d.vocab * d.cols, seed + 1, -1, 1)));
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor positions,
      FromHost(*cpu, dtype, {d.positions, d.cols},
               RandomValues(d.positions * d.cols, seed + 2, -1, 1)));
  ASSERT_OK_AND_ASSIGN(std::vector<double> tok, ToHost(*cpu, tokens.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> pos, ToHost(*cpu, positions.view));
  for (bool with_positions : {false, true}) {
    SCOPED_TRACE(with_positions ? "positions" : "no positions");
    ASSERT_OK_AND_ASSIGN(OwnedTensor out,
                         PoisonedTensor(*cpu, dtype, {d.rows(), d.cols}));
    ASSERT_OK(EmbeddingForward(*cpu, IdView(ids), tokens.view,
                               with_positions ? &positions.view : nullptr,
                               d.seq, out.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*cpu, out.view));
    std::vector<double> expected;
    for (int64_t r = 0; r < d.rows(); ++r) {
      for (int64_t c = 0; c < d.cols; ++c) {
        const double t = tok[ids[r] * d.cols + c];
        const double p = with_positions ? pos[(r % d.seq) * d.cols + c] : 0.0;
        expected.push_back(RoundTo(dtype, t + p));
      }
    }
    EXPECT_EQ(got, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmbeddingCpuTest,
                         ::testing::Values(DType::kF64, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// CPU f64 backward against finite differences of the forward.

class EmbeddingGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(EmbeddingGradientTest, MatchesFiniteDifferences) {
  const bool with_positions = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const Dims d;
  std::vector<int32_t> ids = RandomIds(d.rows(), d.vocab, seed);
  std::vector<double> tok = RandomValues(d.vocab * d.cols, seed + 1, -1, 1);
  std::vector<double> pos = RandomValues(d.positions * d.cols, seed + 2, -1, 1);
  const std::vector<double> w =
      RandomValues(d.rows() * d.cols, seed + 3, -1, 1);
  std::vector<double> out(d.rows() * d.cols);
  const Tensor pos_view = F64View(pos, {d.positions, d.cols});
  auto objective = [&]() {
    const absl::Status status =
        EmbeddingForward(*cpu, IdView(ids), F64View(tok, {d.vocab, d.cols}),
                         with_positions ? &pos_view : nullptr, d.seq,
                         F64View(out, {d.rows(), d.cols}));
    EXPECT_TRUE(status.ok()) << status;
    return Dot(w, out);
  };
  // L is linear in the tables: central differences are exact to rounding.
  const std::vector<double> fd_tok =
      test::NumericalGradient(objective, tok, 0.5);
  const std::vector<double> fd_pos =
      test::NumericalGradient(objective, pos, 0.5);

  std::vector<double> d_out = w;
  const std::vector<double> d_tok0 =
      RandomValues(d.vocab * d.cols, seed + 4, -1, 1);
  const std::vector<double> d_pos0 =
      RandomValues(d.positions * d.cols, seed + 5, -1, 1);
  std::vector<double> d_tok = d_tok0;
  std::vector<double> d_pos = d_pos0;
  const Tensor d_pos_view = F64View(d_pos, {d.positions, d.cols});
  ASSERT_OK(EmbeddingBackward(*cpu, IdView(ids),
                              F64View(d_out, {d.rows(), d.cols}), d.seq,
                              F64View(d_tok, {d.vocab, d.cols}),
                              with_positions ? &d_pos_view : nullptr));
  EXPECT_TRUE(AllClose(d_tok, Plus(d_tok0, fd_tok), 1e-12, 1e-12));
  if (with_positions) {
    EXPECT_TRUE(AllClose(d_pos, Plus(d_pos0, fd_pos), 1e-12, 1e-12));
  } else {
    EXPECT_EQ(d_pos, d_pos0);
  }
}

INSTANTIATE_TEST_SUITE_P(CpuF64, EmbeddingGradientTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithPositions" : "TokensOnly";
                         });

TEST(EmbeddingCpuTest, F32BackwardMatchesF64) {
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const Dims d;
  std::vector<int32_t> ids = RandomIds(d.rows(), d.vocab, seed);
  std::vector<double> d_out = RandomValues(d.rows() * d.cols, seed + 1, -1, 1);
  std::vector<double> d_tok(d.vocab * d.cols, 0.0);
  std::vector<double> d_pos(d.positions * d.cols, 0.0);
  const Tensor d_pos_view = F64View(d_pos, {d.positions, d.cols});
  ASSERT_OK_AND_ASSIGN(OwnedTensor d_out32,
                       FromHost(*cpu, DType::kF32, {d.rows(), d.cols}, d_out));
  ASSERT_OK_AND_ASSIGN(d_out, ToHost(*cpu, d_out32.view));
  ASSERT_OK(EmbeddingBackward(*cpu, IdView(ids),
                              F64View(d_out, {d.rows(), d.cols}), d.seq,
                              F64View(d_tok, {d.vocab, d.cols}), &d_pos_view));
  ASSERT_OK_AND_ASSIGN(OwnedTensor d_tok32,
                       FromHost(*cpu, DType::kF32, {d.vocab, d.cols},
                                std::vector<double>(d.vocab * d.cols, 0.0)));
  ASSERT_OK_AND_ASSIGN(
      OwnedTensor d_pos32,
      FromHost(*cpu, DType::kF32, {d.positions, d.cols},
               std::vector<double>(d.positions * d.cols, 0.0)));
  ASSERT_OK(EmbeddingBackward(*cpu, IdView(ids), d_out32.view, d.seq,
                              d_tok32.view, &d_pos32.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> got_tok, ToHost(*cpu, d_tok32.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> got_pos, ToHost(*cpu, d_pos32.view));
  EXPECT_TRUE(AllClose(got_tok, d_tok, 1e-6, 1e-6));
  EXPECT_TRUE(AllClose(got_pos, d_pos, 1e-6, 1e-6));
}

// ---------------------------------------------------------------------------
// GPU f32 and bf16 against the CPU f64 results.

struct GpuCase {
  int64_t vocab;
  int64_t cols;
  int64_t seq;
  int64_t batch;
  bool misaligned;
  const char* name;
};

class EmbeddingGpuTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(EmbeddingGpuTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const GpuCase g = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t rows = g.seq * g.batch, positions = g.seq + 3;
  std::vector<int32_t> ids = RandomIds(rows, g.vocab, seed);
  ASSERT_OK_AND_ASSIGN(OwnedTensor ids_gpu,
                       FromHost(*gpu, DType::kI32, {rows}, AsDoubles(ids)));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool with_positions : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), with_positions ? " positions" : ""));
      const bool mis = g.misaligned;
      ASSERT_OK_AND_ASSIGN(
          Placed tok,
          Place(*gpu, dtype, {g.vocab, g.cols},
                RandomValues(g.vocab * g.cols, seed + 1, -1, 1), mis));
      ASSERT_OK_AND_ASSIGN(
          Placed pos,
          Place(*gpu, dtype, {positions, g.cols},
                RandomValues(positions * g.cols, seed + 2, -1, 1), mis));
      ASSERT_OK_AND_ASSIGN(Placed out,
                           Place(*gpu, dtype, {rows, g.cols}, {}, mis, true));
      ASSERT_OK_AND_ASSIGN(std::vector<double> tok_h, ToHost(*gpu, tok.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> pos_h, ToHost(*gpu, pos.view));
      ASSERT_OK(EmbeddingForward(*gpu, ids_gpu.view, tok.view,
                                 with_positions ? &pos.view : nullptr, g.seq,
                                 out.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*gpu, out.view));
      // One f32 add of two representable values, rounded once: exact.
      std::vector<double> expected;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < g.cols; ++c) {
          const float t = static_cast<float>(tok_h[ids[r] * g.cols + c]);
          const float p =
              with_positions
                  ? static_cast<float>(pos_h[(r % g.seq) * g.cols + c])
                  : 0.0f;
          expected.push_back(RoundTo(dtype, t + p));
        }
      }
      EXPECT_EQ(got, expected);

      // Backward, accumulating into preset f32 gradients.
      ASSERT_OK_AND_ASSIGN(
          Placed d_out,
          Place(*gpu, dtype, {rows, g.cols},
                RandomValues(rows * g.cols, seed + 3, -1, 1), mis));
      std::vector<double> d_tok =
          RandomValues(g.vocab * g.cols, seed + 4, -1, 1);
      std::vector<double> d_pos =
          RandomValues(positions * g.cols, seed + 5, -1, 1);
      ASSERT_OK_AND_ASSIGN(
          Placed d_tok_gpu,
          Place(*gpu, DType::kF32, {g.vocab, g.cols}, d_tok, mis));
      ASSERT_OK_AND_ASSIGN(
          Placed d_pos_gpu,
          Place(*gpu, DType::kF32, {positions, g.cols}, d_pos, mis));
      ASSERT_OK_AND_ASSIGN(d_tok, ToHost(*gpu, d_tok_gpu.view));
      ASSERT_OK_AND_ASSIGN(d_pos, ToHost(*gpu, d_pos_gpu.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> d_out_h,
                           ToHost(*gpu, d_out.view));
      ASSERT_OK(EmbeddingBackward(*gpu, ids_gpu.view, d_out.view, g.seq,
                                  d_tok_gpu.view,
                                  with_positions ? &d_pos_gpu.view : nullptr));
      const Tensor d_pos_view = F64View(d_pos, {positions, g.cols});
      ASSERT_OK(EmbeddingBackward(*cpu, IdView(ids),
                                  F64View(d_out_h, {rows, g.cols}), g.seq,
                                  F64View(d_tok, {g.vocab, g.cols}),
                                  with_positions ? &d_pos_view : nullptr));
      ASSERT_OK_AND_ASSIGN(std::vector<double> got_tok,
                           ToHost(*gpu, d_tok_gpu.view));
      ASSERT_OK_AND_ASSIGN(std::vector<double> got_pos,
                           ToHost(*gpu, d_pos_gpu.view));
      // fp32 sums of a few dozen terms of magnitude <= 1.
      EXPECT_TRUE(AllClose(got_tok, d_tok, 1e-5 * MaxAbs(d_tok), 1e-5));
      EXPECT_TRUE(AllClose(got_pos, d_pos, 1e-5 * MaxAbs(d_pos), 1e-5));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingGpuTest,
    ::testing::Values(GpuCase{50, 768, 16, 8, false, "Gpt2Width"},
                      GpuCase{7, 20, 5, 3, false, "OddWidth"},
                      GpuCase{3, 64, 32, 4, false, "FewIdsManyRepeats"},
                      GpuCase{40, 64, 8, 2, true, "Misaligned"}),
    [](const ::testing::TestParamInfo<GpuCase>& info) {
      return std::string(info.param.name);
    });

// ---------------------------------------------------------------------------
// The GPU token gradient's sorted scatter under the id patterns that stress it
// (one id thousands of times, every id distinct, ids at both ends of a 16-bit
// vocabulary, a skewed mix), accumulating into preset gradients, against the
// f64 CPU backward of the same d_out values.

enum class IdPattern {
  kOneId,
  kLongRunAmongOthers,
  kAllDistinct,
  kVocabEnds,
  kSkewed
};

struct ScatterCase {
  IdPattern pattern;
  int64_t vocab;
  int64_t cols;
  int64_t seq;
  int64_t batch;
  bool misaligned;
  const char* name;
};

// Ids skewed towards 0 as text's tokens are: vocab * u^6 for u uniform in
// [0, 1) gives id 0 about 16% of the tokens at vocab 50304, id 1 2%, and a
// long tail of ids seen once.
std::vector<int32_t> SkewedIds(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids;
  for (double u : RandomValues(rows, seed, 0, 1)) {
    const double id = std::floor(static_cast<double>(vocab) * std::pow(u, 6));
    ids.push_back(static_cast<int32_t>(
        std::min<double>(id, static_cast<double>(vocab - 1))));
  }
  return ids;
}

std::vector<int32_t> PatternIds(IdPattern pattern, int64_t rows, int64_t vocab,
                                uint64_t seed) {
  std::vector<int32_t> ids;
  switch (pattern) {
    case IdPattern::kOneId:  // vocab - 1 at every row
      return std::vector<int32_t>(rows, static_cast<int32_t>(vocab - 1));
    case IdPattern::kLongRunAmongOthers: {
      // Random ids, then 2100 rows of id vocab / 2 from row 100 on: a run
      // that neither starts nor ends at a round position of the sorted ids.
      ids = RandomIds(rows, vocab, seed);
      for (int64_t r = 100; r < 2200 && r < rows; ++r) {
        ids[r] = static_cast<int32_t>(vocab / 2);
      }
      return ids;
    }
    case IdPattern::kAllDistinct: {  // a random permutation of [0, vocab)
      for (int64_t v = 0; v < vocab; ++v)
        ids.push_back(static_cast<int32_t>(v));
      const std::vector<double> u = RandomValues(vocab, seed, 0, 1);
      for (int64_t i = vocab - 1; i > 0; --i) {
        const int64_t j =
            std::min<int64_t>(static_cast<int64_t>(u[i] * (i + 1)), i);
        std::swap(ids[i], ids[j]);
      }
      ids.resize(rows);
      return ids;
    }
    case IdPattern::kVocabEnds: {
      // The extremes of the id bits the sort looks at, in random order.
      const int32_t v = static_cast<int32_t>(vocab);
      const int32_t choices[] = {0, 1, v / 2 - 1, v / 2, v - 2, v - 1};
      for (double u : RandomValues(rows, seed, 0, 6)) {
        ids.push_back(choices[std::min<int>(static_cast<int>(u), 5)]);
      }
      return ids;
    }
    case IdPattern::kSkewed:
      return SkewedIds(rows, vocab, seed);
  }
  return ids;
}

// |actual[i] - expected[i]| <= rel * scale[i] + 1e-6 for every i, where
// scale[i] is the sum of the magnitudes of the terms that made expected[i]:
// a sum's rounding error grows with its terms' magnitudes, while a lost or
// doubled d_out row moves the result by one term (far more).
::testing::AssertionResult WithinSumBound(const std::vector<double>& actual,
                                          const std::vector<double>& expected,
                                          const std::vector<double>& scale,
                                          double rel) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " values, expected " << expected.size();
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double bound = rel * scale[i] + 1e-6;
    const double error = std::abs(actual[i] - expected[i]);
    if (!(error <= bound)) {
      ++bad;
      if (worst < 0 || !(error - bound <= worst_excess)) {
        worst = static_cast<int64_t>(i);
        worst_excess = error - bound;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " outside the bound; worst ["
         << worst << "]: " << actual[worst] << " vs " << expected[worst]
         << " (bound " << rel * scale[worst] + 1e-6 << ")";
}

class EmbeddingGpuScatterTest : public ::testing::TestWithParam<ScatterCase> {};

TEST_P(EmbeddingGpuScatterTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const ScatterCase g = GetParam();
  const uint64_t seed = test::TestSeed();
  auto cpu = MakeContext(Device::Cpu());
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const int64_t rows = g.seq * g.batch;
  std::vector<int32_t> ids = PatternIds(g.pattern, rows, g.vocab, seed);
  ASSERT_EQ(static_cast<int64_t>(ids.size()), rows);
  ASSERT_OK_AND_ASSIGN(OwnedTensor ids_gpu,
                       FromHost(*gpu, DType::kI32, {rows}, AsDoubles(ids)));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(
        Placed d_out,
        Place(*gpu, dtype, {rows, g.cols},
              RandomValues(rows * g.cols, seed + 1, -1, 1), g.misaligned));
    ASSERT_OK_AND_ASSIGN(
        Placed d_tok_gpu,
        Place(*gpu, DType::kF32, {g.vocab, g.cols},
              RandomValues(g.vocab * g.cols, seed + 2, -1, 1), g.misaligned));
    ASSERT_OK_AND_ASSIGN(std::vector<double> d_tok,
                         ToHost(*gpu, d_tok_gpu.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> d_out_h, ToHost(*gpu, d_out.view));
    std::vector<double> scale(d_tok.size());
    for (size_t i = 0; i < d_tok.size(); ++i) scale[i] = std::abs(d_tok[i]);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < g.cols; ++c) {
        scale[ids[r] * g.cols + c] += std::abs(d_out_h[r * g.cols + c]);
      }
    }
    ASSERT_OK(EmbeddingBackward(*gpu, ids_gpu.view, d_out.view, g.seq,
                                d_tok_gpu.view, nullptr));
    ASSERT_OK(EmbeddingBackward(*cpu, IdView(ids),
                                F64View(d_out_h, {rows, g.cols}), g.seq,
                                F64View(d_tok, {g.vocab, g.cols}), nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<double> got, ToHost(*gpu, d_tok_gpu.view));
    // fp32 sums: a few dozen roundings deep, each within 2^-24 of the sum of
    // magnitudes so far.
    EXPECT_TRUE(WithinSumBound(got, d_tok, scale, 2e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, EmbeddingGpuScatterTest,
    ::testing::Values(ScatterCase{IdPattern::kOneId, 9, 64, 512, 5, false,
                                  "OneId2560Times"},
                      ScatterCase{IdPattern::kOneId, 1, 24, 100, 21, false,
                                  "OneRowVocabOddWidth"},
                      ScatterCase{IdPattern::kLongRunAmongOthers, 300, 1280,
                                  400, 6, false, "LongRunWiderThanABlock"},
                      ScatterCase{IdPattern::kLongRunAmongOthers, 70, 64, 1200,
                                  2, true, "LongRunMisaligned"},
                      ScatterCase{IdPattern::kAllDistinct, 4096, 96, 1024, 4,
                                  false, "AllDistinct"},
                      ScatterCase{IdPattern::kAllDistinct, 5000, 40, 333, 3,
                                  false, "DistinctOddCount"},
                      ScatterCase{IdPattern::kVocabEnds, 50304, 24, 1000, 3,
                                  false, "Gpt2VocabEnds"},
                      ScatterCase{IdPattern::kSkewed, 50304, 64, 1024, 16,
                                  false, "Gpt2Skewed16K"}),
    [](const ::testing::TestParamInfo<ScatterCase>& info) {
      return std::string(info.param.name);
    });

// ---------------------------------------------------------------------------
// Bitwise reproducibility on the GPU: the same inputs give the same bits, for
// GPT-2 small's step shape (16K tokens, 768 columns, the 50304-id vocabulary)
// with skewed ids, where scattering with fp32 atomics gave different bits.

// Whether a and b hold the same bits (f32 values read back as doubles, which
// hold every float exactly and keep -0 apart from +0).
bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// One case per dtype, so that a slow tool (compute-sanitizer) can run them
// apart.
class EmbeddingGpuReproducibilityTest : public ::testing::TestWithParam<DType> {
};

TEST_P(EmbeddingGpuReproducibilityTest, BackwardIsBitwiseReproducible) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const uint64_t seed = test::TestSeed();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  const int64_t seq = 1024, batch = 16, cols = 768, vocab = 50304;
  const int64_t rows = seq * batch;
  ASSERT_OK_AND_ASSIGN(OwnedTensor ids,
                       FromHost(*gpu, DType::kI32, {rows},
                                AsDoubles(SkewedIds(rows, vocab, seed))));
  const std::vector<double> d_tok0 =
      test::Rounded(DType::kF32, RandomValues(vocab * cols, seed + 2, -1, 1));
  const std::vector<double> d_pos0 = RandomValues(seq * cols, seed + 3, -1, 1);
  ASSERT_OK_AND_ASSIGN(OwnedTensor d_out,
                       FromHost(*gpu, dtype, {rows, cols},
                                RandomValues(rows * cols, seed + 1, -1, 1)));
  std::vector<double> first_tok, first_pos;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(absl::StrCat("run ", run));
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_tok,
                         FromHost(*gpu, DType::kF32, {vocab, cols}, d_tok0));
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_pos,
                         FromHost(*gpu, DType::kF32, {seq, cols}, d_pos0));
    ASSERT_OK(EmbeddingBackward(*gpu, ids.view, d_out.view, seq, d_tok.view,
                                &d_pos.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> tok, ToHost(*gpu, d_tok.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> pos, ToHost(*gpu, d_pos.view));
    if (run == 0) {
      ASSERT_FALSE(SameBits(tok, d_tok0));  // it did add something
      first_tok = std::move(tok);
      first_pos = std::move(pos);
    } else {
      EXPECT_TRUE(SameBits(tok, first_tok));
      EXPECT_TRUE(SameBits(pos, first_pos));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EmbeddingGpuReproducibilityTest,
                         ::testing::Values(DType::kBF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(EmbeddingGpuTest, WorkspaceBytes) {
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(Device::Cpu(), 16384, 50304, 768),
            0);
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(Device::Cuda(0), 0, 50304, 768), 0);
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(Device::Cuda(0), 16384, 50304, 0),
            0);
  // The sorted ids and rows, the row order, and two f32 partial rows per
  // 32 sorted ids, at least.
  const int64_t bytes =
      EmbeddingBackwardWorkspaceBytes(Device::Cuda(0), 16384, 50304, 768);
  EXPECT_GE(bytes, 3 * 16384 * 4 + 2 * (16384 / 32) * 768 * 4);
  EXPECT_LT(bytes, 16 << 20);
}

#ifdef LOSSRT_WITH_CUDA
// The backward with check_ids false, captured in a CUDA graph (relaxed mode,
// as Graph::ForwardBackward captures) after reserving its workspace: the
// capture neither allocates nor waits, and the replay writes the eager call's
// bits.
TEST(EmbeddingGpuTest, BackwardCapturesInACudaGraph) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::TestSeed();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  const int64_t seq = 256, batch = 12, cols = 256, vocab = 1000;
  const int64_t rows = seq * batch;
  ASSERT_OK_AND_ASSIGN(OwnedTensor ids,
                       FromHost(*gpu, DType::kI32, {rows},
                                AsDoubles(SkewedIds(rows, vocab, seed))));
  ASSERT_OK_AND_ASSIGN(OwnedTensor d_out,
                       FromHost(*gpu, DType::kBF16, {rows, cols},
                                RandomValues(rows * cols, seed + 1, -1, 1)));
  const std::vector<double> d_tok0 =
      test::Rounded(DType::kF32, RandomValues(vocab * cols, seed + 2, -1, 1));
  const std::vector<double> d_pos0 = RandomValues(seq * cols, seed + 3, -1, 1);
  ASSERT_OK_AND_ASSIGN(OwnedTensor eager_tok,
                       FromHost(*gpu, DType::kF32, {vocab, cols}, d_tok0));
  ASSERT_OK_AND_ASSIGN(OwnedTensor eager_pos,
                       FromHost(*gpu, DType::kF32, {seq, cols}, d_pos0));
  ASSERT_OK(EmbeddingBackward(*gpu, ids.view, d_out.view, seq, eager_tok.view,
                              &eager_pos.view, /*check_ids=*/false));

  auto fresh = MakeContext(Device::Cuda(0));
  ASSERT_NE(fresh, nullptr);
  ASSERT_OK(fresh->ReserveWorkspace(
      EmbeddingBackwardWorkspaceBytes(fresh->device(), rows, vocab, cols)));
  const int64_t reserved = fresh->workspace_bytes();
  ASSERT_OK_AND_ASSIGN(OwnedTensor tok,
                       FromHost(*fresh, DType::kF32, {vocab, cols}, d_tok0));
  ASSERT_OK_AND_ASSIGN(OwnedTensor pos,
                       FromHost(*fresh, DType::kF32, {seq, cols}, d_pos0));
  ASSERT_OK(fresh->Synchronize());
  ASSERT_OK_AND_ASSIGN(void* stream_handle, fresh->stream());
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed),
            cudaSuccess);
  const absl::Status captured =
      EmbeddingBackward(*fresh, ids.view, d_out.view, seq, tok.view, &pos.view,
                        /*check_ids=*/false);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  ASSERT_OK(captured);
  ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  EXPECT_EQ(fresh->workspace_bytes(), reserved);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ASSERT_EQ(made, cudaSuccess) << cudaGetErrorString(made);
  const cudaError_t launched = cudaGraphLaunch(exec, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaGraphExecDestroy(exec);
  ASSERT_EQ(launched, cudaSuccess) << cudaGetErrorString(launched);
  ASSERT_EQ(synced, cudaSuccess) << cudaGetErrorString(synced);

  ASSERT_OK_AND_ASSIGN(std::vector<double> want_tok,
                       ToHost(*gpu, eager_tok.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> want_pos,
                       ToHost(*gpu, eager_pos.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> got_tok, ToHost(*fresh, tok.view));
  ASSERT_OK_AND_ASSIGN(std::vector<double> got_pos, ToHost(*fresh, pos.view));
  ASSERT_FALSE(SameBits(got_tok, d_tok0));  // the replay did add something
  EXPECT_TRUE(SameBits(got_tok, want_tok));
  EXPECT_TRUE(SameBits(got_pos, want_pos));
}
#endif  // LOSSRT_WITH_CUDA

TEST(EmbeddingGpuTest, BadIdWritesNothing) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  const int64_t vocab = 10, cols = 16, seq = 4, rows = 8;
  for (int32_t bad : {-1, 10, std::numeric_limits<int32_t>::max()}) {
    SCOPED_TRACE(bad);
    std::vector<double> ids(rows, 3.0);
    ids[5] = bad;
    ASSERT_OK_AND_ASSIGN(OwnedTensor ids_t,
                         FromHost(*gpu, DType::kI32, {rows}, ids));
    ASSERT_OK_AND_ASSIGN(OwnedTensor tok,
                         FromHost(*gpu, DType::kBF16, {vocab, cols},
                                  std::vector<double>(vocab * cols, 1.0)));
    ASSERT_OK_AND_ASSIGN(OwnedTensor out,
                         PoisonedTensor(*gpu, DType::kBF16, {rows, cols}));
    const absl::Status forward =
        EmbeddingForward(*gpu, ids_t.view, tok.view, nullptr, seq, out.view);
    EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument) << forward;
    ASSERT_OK_AND_ASSIGN(int64_t poisoned, test::CountPoison(*gpu, out.view));
    EXPECT_EQ(poisoned, rows * cols);
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_tok,
                         FromHost(*gpu, DType::kF32, {vocab, cols},
                                  std::vector<double>(vocab * cols, 2.0)));
    const absl::Status backward =
        EmbeddingBackward(*gpu, ids_t.view, out.view, seq, d_tok.view, nullptr);
    EXPECT_EQ(backward.code(), absl::StatusCode::kInvalidArgument) << backward;
    ASSERT_OK_AND_ASSIGN(std::vector<double> d_tok_h, ToHost(*gpu, d_tok.view));
    for (double v : d_tok_h) EXPECT_EQ(v, 2.0);
  }
}

// ---------------------------------------------------------------------------
// Invalid arguments on the CPU: InvalidArgument, and nothing written.

TEST(EmbeddingInvalidTest, Forward) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const Dims d;
  std::vector<int32_t> ids = RandomIds(d.rows(), d.vocab, test::TestSeed());
  std::vector<double> tok = RandomValues(d.vocab * d.cols, 1, -1, 1);
  std::vector<double> pos = RandomValues(d.positions * d.cols, 2, -1, 1);
  std::vector<double> out(d.rows() * d.cols, kNaN);
  const Tensor tok_v = F64View(tok, {d.vocab, d.cols});
  const Tensor pos_v = F64View(pos, {d.positions, d.cols});
  const Tensor out_v = F64View(out, {d.rows(), d.cols});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (double v : out) EXPECT_TRUE(std::isnan(v));
  };
  // Out-of-range ids, at the first and the last row.
  for (int32_t bad : {-1, static_cast<int32_t>(d.vocab)}) {
    for (size_t at : {size_t{0}, ids.size() - 1}) {
      std::vector<int32_t> bad_ids = ids;
      bad_ids[at] = bad;
      expect_invalid(
          EmbeddingForward(*cpu, IdView(bad_ids), tok_v, &pos_v, d.seq, out_v));
    }
  }
  // rows % seq != 0, seq < 1, too few positions.
  std::vector<int32_t> short_ids(ids.begin(), ids.end() - 1);
  expect_invalid(EmbeddingForward(*cpu, IdView(short_ids), tok_v, &pos_v, d.seq,
                                  F64View(out, {d.rows() - 1, d.cols})));
  expect_invalid(EmbeddingForward(*cpu, IdView(ids), tok_v, &pos_v, 0, out_v));
  expect_invalid(
      EmbeddingForward(*cpu, IdView(ids), tok_v, &pos_v, d.rows(), out_v));
  // Dtypes: f32 or i64 ids, integer tables, out unlike the tables.
  Tensor ids_f32 = IdView(ids);
  ids_f32.dtype = DType::kF32;
  expect_invalid(EmbeddingForward(*cpu, ids_f32, tok_v, &pos_v, d.seq, out_v));
  Tensor ids_i64 = IdView(ids);
  ids_i64.dtype = DType::kI64;
  ids_i64.shape = {d.rows() / 2};
  expect_invalid(EmbeddingForward(*cpu, ids_i64, tok_v, &pos_v, d.seq / 2,
                                  F64View(out, {d.rows() / 2, d.cols})));
  Tensor tok_i32 = tok_v;
  tok_i32.dtype = DType::kI32;
  expect_invalid(
      EmbeddingForward(*cpu, IdView(ids), tok_i32, nullptr, d.seq, out_v));
  Tensor out_f32 = out_v;
  out_f32.dtype = DType::kF32;
  expect_invalid(
      EmbeddingForward(*cpu, IdView(ids), tok_v, &pos_v, d.seq, out_f32));
  // Shapes.
  expect_invalid(EmbeddingForward(*cpu, IdView(ids), tok_v, &pos_v, d.seq,
                                  F64View(out, {d.rows(), d.cols - 1})));
  const Tensor narrow_positions = F64View(pos, {d.positions, d.cols - 1});
  expect_invalid(EmbeddingForward(*cpu, IdView(ids), tok_v, &narrow_positions,
                                  d.seq, out_v));
  // Null data, device, overlap.
  Tensor ids_null = IdView(ids);
  ids_null.data = nullptr;
  expect_invalid(EmbeddingForward(*cpu, ids_null, tok_v, &pos_v, d.seq, out_v));
  Tensor tok_gpu = tok_v;
  tok_gpu.device = Device::Cuda(0);
  expect_invalid(
      EmbeddingForward(*cpu, IdView(ids), tok_gpu, &pos_v, d.seq, out_v));
  expect_invalid(EmbeddingForward(*cpu, IdView(ids),
                                  F64View(out, {d.vocab, d.cols}), nullptr,
                                  d.seq, out_v));
}

TEST(EmbeddingInvalidTest, Backward) {
  auto cpu = MakeContext(Device::Cpu());
  ASSERT_NE(cpu, nullptr);
  const Dims d;
  std::vector<int32_t> ids = RandomIds(d.rows(), d.vocab, test::TestSeed());
  std::vector<double> d_out = RandomValues(d.rows() * d.cols, 3, -1, 1);
  std::vector<double> d_tok(d.vocab * d.cols, 4.0);
  std::vector<double> d_pos(d.positions * d.cols, 4.0);
  const Tensor d_out_v = F64View(d_out, {d.rows(), d.cols});
  const Tensor d_tok_v = F64View(d_tok, {d.vocab, d.cols});
  const Tensor d_pos_v = F64View(d_pos, {d.positions, d.cols});
  auto expect_invalid = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (double v : d_tok) EXPECT_EQ(v, 4.0);
    for (double v : d_pos) EXPECT_EQ(v, 4.0);
  };
  std::vector<int32_t> bad_ids = ids;
  bad_ids.back() = static_cast<int32_t>(d.vocab);
  expect_invalid(EmbeddingBackward(*cpu, IdView(bad_ids), d_out_v, d.seq,
                                   d_tok_v, &d_pos_v));
  expect_invalid(
      EmbeddingBackward(*cpu, IdView(ids), d_out_v, 5, d_tok_v, &d_pos_v));
  expect_invalid(EmbeddingBackward(*cpu, IdView(ids),
                                   F64View(d_out, {d.rows() / 2, 2 * d.cols}),
                                   d.seq, d_tok_v, &d_pos_v));
  Tensor d_tok_f32 = d_tok_v;
  d_tok_f32.dtype = DType::kF32;  // f64 d_out accumulates into f64
  expect_invalid(EmbeddingBackward(*cpu, IdView(ids), d_out_v, d.seq, d_tok_f32,
                                   &d_pos_v));
  const Tensor few_positions = F64View(d_pos, {d.seq - 1, d.cols});
  expect_invalid(EmbeddingBackward(*cpu, IdView(ids), d_out_v, d.seq, d_tok_v,
                                   &few_positions));
  expect_invalid(
      EmbeddingBackward(*cpu, IdView(ids), d_out_v, d.seq, d_tok_v, &d_tok_v));
  Tensor d_out_null = d_out_v;
  d_out_null.data = nullptr;
  expect_invalid(EmbeddingBackward(*cpu, IdView(ids), d_out_null, d.seq,
                                   d_tok_v, &d_pos_v));
}

}  // namespace
}  // namespace ops
}  // namespace lossrt
