// Tests of the embedding (graph/ops/embedding.h): the CPU forward against the
// exact sums computed here, the CPU f64 backward against finite differences
// (accumulating into preset gradients, repeated ids), CUDA f32 and bf16
// against the CPU (vector and scalar paths, misaligned tables) with poisoned
// outputs, out-of-range ids on both devices (InvalidArgument, nothing
// written), and the other invalid arguments.
#include "graph/ops/embedding.h"

#include <algorithm>
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

TEST(EmbeddingGpuTest, PositionGradientIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::TestSeed();
  auto gpu = MakeContext(Device::Cuda(0));
  ASSERT_NE(gpu, nullptr);
  const int64_t seq = 64, batch = 32, cols = 768, vocab = 100;
  const int64_t rows = seq * batch;
  ASSERT_OK_AND_ASSIGN(OwnedTensor ids,
                       FromHost(*gpu, DType::kI32, {rows},
                                AsDoubles(RandomIds(rows, vocab, seed))));
  ASSERT_OK_AND_ASSIGN(OwnedTensor d_out,
                       FromHost(*gpu, DType::kBF16, {rows, cols},
                                RandomValues(rows * cols, seed + 1, -1, 1)));
  std::vector<std::vector<double>> results;
  for (int run = 0; run < 2; ++run) {
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_tok,
                         FromHost(*gpu, DType::kF32, {vocab, cols},
                                  std::vector<double>(vocab * cols, 0.0)));
    ASSERT_OK_AND_ASSIGN(OwnedTensor d_pos,
                         FromHost(*gpu, DType::kF32, {seq, cols},
                                  std::vector<double>(seq * cols, 0.5)));
    ASSERT_OK(EmbeddingBackward(*gpu, ids.view, d_out.view, seq, d_tok.view,
                                &d_pos.view));
    ASSERT_OK_AND_ASSIGN(std::vector<double> values, ToHost(*gpu, d_pos.view));
    results.push_back(values);
  }
  EXPECT_EQ(results[0], results[1]);
}

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
