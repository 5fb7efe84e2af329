// Tests of the vocabulary-parallel cross-entropy
// (loss/vocab_parallel_cross_entropy.h), one thread per rank over the
// in-process communicator (runtime/cpu_communicator.h), against the
// single-device CrossEntropyForwardBackward / Forward / Backward on the full
// logits (loss/cross_entropy.h) on the same device. On the GPU every rank has
// its own CUDA context on cuda:0 and talks through HostStagedCommunicator
// (tests/loss/host_staged_communicator.h); GPU cases skip, saying why, without
// a GPU.
//
// One parameterized case per device x scenario x logits dtype (f32, bf16,
// f16) x world size (1, 2, 3, 4), with a random uneven split of a vocabulary
// that 2, 3 and 4 do not divide, over column slices of one padded [N, V]
// array (each rank's logits a strided view): the fused call (with and without
// grad_loss, out of place and in place), a repeat that must give the same
// bytes, the split forward (loss, lse) and the split backward from that lse.
// Scenarios cover every option (reductions, ignore_index, i32 targets,
// smoothing, z-loss, soft cap, class weights, entropy_weight) and all tokens
// ignored. Then bad inputs: every rank gets an InvalidArgument (no hang) and
// nothing is written anywhere.
//
// Outputs are poisoned with NaN before every call: an element left unwritten
// is caught. Tolerances (those of tests/loss/cross_entropy_test.cc; the two
// ops sum over the vocabulary in different orders): f32 loss and lse within
// 1e-6 relative plus two f32 ulps of the lse (scaled as the loss is), 16-bit
// logits 1e-5 relative; gradient elements within 1e-6 of the largest, plus
// one unit in the last place of a 16-bit dtype, and f32 gradients within
// 1e-5 relative in norm.
#include "loss/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/loss/vocab_parallel_test_util.h"
#include "tests/status_assertions.h"

namespace lossrt {
namespace {

using test::Array;
using test::MakeArray;
using test::MakeVector;
using test::SameBytes;

// ---------------------------------------------------------------------------
// Scenarios.

// The shared fields (n = 37, V = 203, ...:
// tests/loss/vocab_parallel_test_util.h) and the logits' scale.
struct Scenario : test::LossScenario {
  double logit_scale = 2.0;
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> all;
  Scenario s;
  s.name = "plain";
  all.push_back(s);

  s = Scenario();
  s.name = "sum_ignored_padded";
  s.reduction = Reduction::kSum;
  s.ignore_fraction = 0.2;
  s.pad = 5;
  all.push_back(s);

  s = Scenario();
  s.name = "none_i32";
  s.reduction = Reduction::kNone;
  s.ignore_fraction = 0.2;
  s.targets_i32 = true;
  all.push_back(s);

  s = Scenario();
  s.name = "smoothing_weights";
  s.smoothing = 0.1f;
  s.class_weights = true;
  s.ignore_fraction = 0.15;
  all.push_back(s);

  s = Scenario();
  s.name = "zloss_softcap";
  s.z_loss = 1e-2f;
  s.softcap = 3.0f;
  s.logit_scale = 6.0;
  s.reduction = Reduction::kSum;
  all.push_back(s);

  s = Scenario();
  s.name = "entropy_everything";
  s.entropy_weight = 0.05f;
  s.smoothing = 0.1f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.z_loss = 1e-3f;
  s.softcap = 5.0f;
  s.pad = 3;
  all.push_back(s);

  s = Scenario();
  s.name = "entropy_none";
  s.entropy_weight = -0.1f;
  s.reduction = Reduction::kNone;
  all.push_back(s);

  s = Scenario();
  s.name = "one_token_tiny_vocab";
  s.n = 1;
  s.v = 5;
  s.smoothing = 0.2f;
  all.push_back(s);

  s = Scenario();
  s.name = "wide_vocab";
  s.n = 24;
  s.v = 4099;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.z_loss = 1e-4f;
  all.push_back(s);

  s = Scenario();
  s.name = "all_ignored";
  s.ignore_fraction = 1.0;
  s.smoothing = 0.1f;
  s.z_loss = 1e-3f;
  s.class_weights = true;
  all.push_back(s);
  return all;
}

// The full problem on the host: the logits, and the targets, class weights
// and grad_loss of test::LossInputs.
struct Data : test::LossInputs {
  Array logits;  // [N, V] (row stride V + pad)
};

Data MakeData(const Scenario& s, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  Data d;
  d.logits = MakeArray(dtype, s.n, s.v, s.pad);
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t j = 0; j < s.v; ++j)
      d.logits.Set(i, j, s.logit_scale * normal(rng));
  // The targets, class weights and grad_loss, from the same `normal`.
  static_cast<test::LossInputs&>(d) = test::MakeLossInputs(s, normal, rng);
  return d;
}

// The outputs: loss and lse per rank (one for the single device), the whole
// grad_logits (rank r writes its columns).
struct Outputs {
  std::vector<Array> loss;
  std::vector<Array> lse;
  Array grad;
};

Outputs MakeOutputs(const Scenario& s, DType dtype, int ranks) {
  Outputs o;
  for (int r = 0; r < ranks; ++r) {
    o.loss.push_back(s.reduction == Reduction::kNone
                         ? MakeVector(DType::kF32, s.n)
                         : test::MakeScalar());
    o.lse.push_back(MakeVector(DType::kF32, s.n));
  }
  o.grad = MakeArray(dtype, s.n, s.v, s.pad);
  return o;
}

enum class Call { kFused, kFusedGradLoss, kFusedInPlace, kForward, kBackward };

const char* CallName(Call call) {
  switch (call) {
    case Call::kFused:
      return "fused";
    case Call::kFusedGradLoss:
      return "fused with grad_loss";
    case Call::kFusedInPlace:
      return "fused in place";
    case Call::kForward:
      return "forward";
    default:
      return "backward";
  }
}

// The single-device op on the full logits. kBackward takes `saved_lse`;
// kFusedInPlace runs out of place (the results are the same).
absl::Status RunSingle(const Device& device, const Scenario& s, Data& d,
                       Outputs& o, Call call, Array* saved_lse) {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
  test::Staging stage(*context);
  ASSIGN_OR_RETURN(const Tensor logits, stage.In(d.logits.View()));
  ASSIGN_OR_RETURN(const Tensor targets, stage.In(d.targets.View()));
  std::optional<Tensor> cw;
  if (d.class_weights.has_value()) {
    ASSIGN_OR_RETURN(cw, stage.In(d.class_weights->View()));
  }
  const CrossEntropyOptions options = test::LossOptions(s, cw);
  ASSIGN_OR_RETURN(const Tensor loss, stage.Out(o.loss[0].View()));
  ASSIGN_OR_RETURN(const Tensor lse, stage.Out(o.lse[0].View()));
  ASSIGN_OR_RETURN(const Tensor grad, stage.Out(o.grad.View()));
  ASSIGN_OR_RETURN(const Tensor grad_loss, stage.In(d.grad_loss.View()));
  absl::Status status;
  switch (call) {
    case Call::kFused:
    case Call::kFusedInPlace:
      status = CrossEntropyForwardBackward(*context, logits, targets, options,
                                           loss, &lse, grad);
      break;
    case Call::kFusedGradLoss:
      status = CrossEntropyForwardBackward(*context, logits, targets, options,
                                           loss, &lse, grad, &grad_loss);
      break;
    case Call::kForward:
      status =
          CrossEntropyForward(*context, logits, targets, options, loss, &lse);
      break;
    case Call::kBackward: {
      ASSIGN_OR_RETURN(const Tensor saved, stage.In(saved_lse->View()));
      status = CrossEntropyBackward(*context, logits, targets, saved, grad_loss,
                                    options, grad);
      break;
    }
  }
  RETURN_IF_ERROR(status);
  return stage.Download();
}

// Changes one rank's arguments (bad-input tests) before its call.
struct RankArgs {
  VocabShard shard;
  Tensor logits;
  Tensor targets;
  CrossEntropyOptions options;
  Tensor grad;
};
using Tamper = std::function<void(int rank, RankArgs&)>;

// One rank's call: its views staged on its context's device, the call, the
// outputs brought back (also on failure: a test sees what was written).
// kFusedInPlace: `inplace` holds a copy of the logits that the ranks turn
// into the gradient.
absl::Status RunRank(Context& context, Communicator* comm, int r,
                     const Scenario& s, Data& d, Outputs& o,
                     const std::vector<int64_t>& cuts, Call call,
                     Array* saved_lse, const Tamper& tamper) {
  const int64_t begin = cuts[r];
  const int64_t count = cuts[r + 1] - begin;
  RankArgs host;
  host.shard = VocabShard{comm, begin, s.v};
  host.logits = call == Call::kFusedInPlace ? o.grad.Columns(begin, count)
                                            : d.logits.Columns(begin, count);
  host.targets = d.targets.View();
  std::optional<Tensor> cw;
  if (d.class_weights.has_value()) cw = d.class_weights->Columns(begin, count);
  host.options = test::LossOptions(s, cw);
  host.grad = o.grad.Columns(begin, count);
  if (tamper) tamper(r, host);

  test::Staging stage(context);
  RankArgs in = host;
  if (call == Call::kFusedInPlace) {
    ASSIGN_OR_RETURN(in.logits, stage.Out(host.logits));
    in.grad = in.logits;
  } else {
    ASSIGN_OR_RETURN(in.logits, stage.In(host.logits));
    if (Overlaps(host.grad, host.logits)) {
      // A tampered grad that aliases the logits: staging copies each view on
      // its own, so the same aliasing is rebuilt on the staged logits.
      in.grad = in.logits;
      in.grad.data = static_cast<char*>(in.logits.data) +
                     (static_cast<const char*>(host.grad.data) -
                      static_cast<const char*>(host.logits.data));
    } else {
      ASSIGN_OR_RETURN(in.grad, stage.Out(host.grad));
    }
  }
  ASSIGN_OR_RETURN(in.targets, stage.In(host.targets));
  if (host.options.class_weights.has_value()) {
    ASSIGN_OR_RETURN(in.options.class_weights,
                     stage.In(*host.options.class_weights));
  }
  ASSIGN_OR_RETURN(const Tensor loss, stage.Out(o.loss[r].View()));
  ASSIGN_OR_RETURN(const Tensor lse, stage.Out(o.lse[r].View()));
  ASSIGN_OR_RETURN(const Tensor grad_loss, stage.In(d.grad_loss.View()));
  absl::Status status;
  switch (call) {
    case Call::kFused:
    case Call::kFusedInPlace:
      status = VocabParallelCrossEntropyForwardBackward(
          context, in.shard, in.logits, in.targets, in.options, loss, &lse,
          in.grad);
      break;
    case Call::kFusedGradLoss:
      status = VocabParallelCrossEntropyForwardBackward(
          context, in.shard, in.logits, in.targets, in.options, loss, &lse,
          in.grad, &grad_loss);
      break;
    case Call::kForward:
      status = VocabParallelCrossEntropyForward(
          context, in.shard, in.logits, in.targets, in.options, loss, &lse);
      break;
    case Call::kBackward: {
      ASSIGN_OR_RETURN(const Tensor saved, stage.In(saved_lse->View()));
      status = VocabParallelCrossEntropyBackward(context, in.shard, in.logits,
                                                 in.targets, saved, grad_loss,
                                                 in.options, in.grad);
      break;
    }
  }
  const absl::Status downloaded = stage.Download();
  RETURN_IF_ERROR(status);
  return downloaded;
}

// The vocabulary-parallel op over `cuts.size() - 1` ranks, one thread and one
// context on `device` each.
std::vector<absl::Status> RunParallel(const Device& device, const Scenario& s,
                                      Data& d, Outputs& o,
                                      const std::vector<int64_t>& cuts,
                                      Call call, Array* saved_lse,
                                      const Tamper& tamper = nullptr) {
  const int world = static_cast<int>(cuts.size()) - 1;
  auto comms = test::InProcessCommunicators(device, world);
  if (!comms.ok()) return std::vector<absl::Status>(world, comms.status());
  if (call == Call::kFusedInPlace) o.grad = d.logits;
  return test::RunOnRanks(device, world, *comms,
                          [&](Context& context, Communicator* comm, int r) {
                            return RunRank(context, comm, r, s, d, o, cuts,
                                           call, saved_lse, tamper);
                          });
}

// ---------------------------------------------------------------------------
// Comparisons.

// One unit in the last place of `value` in a 16-bit dtype (0 for f32).
double Ulp16(DType dtype, double value) {
  if (dtype == DType::kF32) return 0.0;
  const int bits = dtype == DType::kBF16 ? 8 : 11;
  // Below the smallest normal number the spacing stays that of the smallest
  // normal binade (f16: 2^-24; bf16 shares f32's range).
  const double smallest = std::ldexp(1.0, dtype == DType::kF16 ? -14 : -126);
  const double magnitude = std::max(std::abs(value), smallest);
  return std::ldexp(1.0, std::ilogb(magnitude) - bits + 1);
}

// Loss-like values: 1e-6 relative (1e-5 for 16-bit logits) plus two f32 ulps
// of `floor` (the lse's scale, scaled as the loss is).
void ExpectLossClose(const Array& got, const Array& want, bool sixteen,
                     double floor, const std::string& what) {
  for (int64_t j = 0; j < want.cols; ++j) {
    const double w = want.Get(0, j), g = got.Get(0, j);
    ASSERT_FALSE(std::isnan(g)) << what << "[" << j << "] unwritten";
    EXPECT_NEAR(g, w, (sixteen ? 1e-5 : 1e-6) * std::abs(w) + 2.4e-7 * floor)
        << what << "[" << j << "]";
  }
}

void ExpectGradClose(const Array& got, const Array& want,
                     const std::string& what) {
  double max_abs = 0.0, diff2 = 0.0, norm2 = 0.0;
  for (int64_t i = 0; i < want.rows; ++i)
    for (int64_t j = 0; j < want.cols; ++j)
      max_abs = std::max(max_abs, std::abs(want.Get(i, j)));
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < want.rows; ++i) {
    for (int64_t j = 0; j < want.cols; ++j) {
      const double w = want.Get(i, j), g = got.Get(i, j);
      diff2 += (g - w) * (g - w);
      norm2 += w * w;
      const double tolerance = 1e-6 * max_abs + Ulp16(got.dtype, w);
      if (!(std::abs(g - w) <= tolerance)) {
        if (bad++ == 0)
          first = absl::StrCat("[", i, ", ", j, "] ", g, " vs ", w);
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements off, first " << first << " (max |"
                    << max_abs << "|)";
  if (got.dtype == DType::kF32 && norm2 > 0) {
    EXPECT_LE(std::sqrt(diff2 / norm2), 1e-5) << what << ": norm-wise";
  }
}

// The lse's scale for the loss floor: max |lse| + 1, over the tokens' count
// for a mean.
double LossFloor(const Scenario& s, const Array& lse, bool per_token) {
  double top = 1.0;
  for (int64_t i = 0; i < s.n; ++i)
    if (!std::isnan(lse.Get(0, i)))
      top = std::max(top, std::abs(lse.Get(0, i)) + 1.0);
  return per_token || s.reduction == Reduction::kNone ? top : top * s.n;
}

void CheckAgainst(const Scenario& s, int world, const Outputs& got,
                  const Outputs& want, bool gradients, bool loss) {
  const bool sixteen = want.grad.dtype != DType::kF32;
  for (int r = 0; r < world && loss; ++r) {
    const std::string rank = absl::StrCat("rank ", r, ": ");
    ExpectLossClose(got.loss[r], want.loss[0], sixteen,
                    LossFloor(s, want.lse[0], false), rank + "loss");
    ExpectLossClose(got.lse[r], want.lse[0], sixteen,
                    LossFloor(s, want.lse[0], true), rank + "lse");
    EXPECT_TRUE(SameBytes(got.loss[r], got.loss[0]))
        << rank << "loss differs from rank 0's";
    EXPECT_TRUE(SameBytes(got.lse[r], got.lse[0]))
        << rank << "lse differs from rank 0's";
  }
  if (gradients) ExpectGradClose(got.grad, want.grad, "grad_logits");
}

// ---------------------------------------------------------------------------
// The parameterized cases.

struct Case {
  Device device;
  Scenario scenario;
  DType dtype;
  int world;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.device.ToString() << " " << c.scenario.name << " "
      << DTypeName(c.dtype) << " P=" << c.world;
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return absl::StrCat(info.param.device.is_cpu() ? "cpu" : "cuda", "_",
                      info.param.scenario.name, "_",
                      DTypeName(info.param.dtype), "_P", info.param.world);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const Device& device : {Device::Cpu(), Device::Cuda(0)}) {
    for (const Scenario& s : Scenarios()) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int world : {1, 2, 3, 4}) {
          if (world > s.v) continue;
          cases.push_back({device, s, dtype, world});
        }
      }
    }
  }
  return cases;
}

class VocabParallelCrossEntropyTest : public testing::TestWithParam<Case> {};

TEST_P(VocabParallelCrossEntropyTest, MatchesSingleDevice) {
  const Case& c = GetParam();
  if (!c.device.is_cpu()) SKIP_WITHOUT_GPU();
  const Scenario& s = c.scenario;
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  Data d = MakeData(s, c.dtype, rng);
  const std::vector<int64_t> cuts = test::RandomCuts(s.v, c.world, rng);
  SCOPED_TRACE(absl::StrCat("split ", absl::StrJoin(cuts, ",")));

  for (Call call : {Call::kFused, Call::kFusedGradLoss, Call::kFusedInPlace}) {
    SCOPED_TRACE(CallName(call));
    Outputs want = MakeOutputs(s, c.dtype, 1);
    ASSERT_OK(RunSingle(c.device, s, d, want, call, nullptr));
    Outputs got = MakeOutputs(s, c.dtype, c.world);
    for (const absl::Status& status :
         RunParallel(c.device, s, d, got, cuts, call, nullptr))
      ASSERT_OK(status);
    CheckAgainst(s, c.world, got, want, true, true);
    // Run to run: the same bytes.
    Outputs again = MakeOutputs(s, c.dtype, c.world);
    for (const absl::Status& status :
         RunParallel(c.device, s, d, again, cuts, call, nullptr))
      ASSERT_OK(status);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(SameBytes(again.loss[r], got.loss[r]));
      EXPECT_TRUE(SameBytes(again.lse[r], got.lse[r]));
    }
    EXPECT_TRUE(SameBytes(again.grad, got.grad));
  }

  // The split forward, then the split backward from its lse.
  Outputs want = MakeOutputs(s, c.dtype, 1);
  ASSERT_OK(RunSingle(c.device, s, d, want, Call::kForward, nullptr));
  Outputs got = MakeOutputs(s, c.dtype, c.world);
  for (const absl::Status& status :
       RunParallel(c.device, s, d, got, cuts, Call::kForward, nullptr))
    ASSERT_OK(status);
  CheckAgainst(s, c.world, got, want, false, true);
  EXPECT_TRUE(got.grad.Poisoned()) << "the forward wrote grad_logits";
  Array saved = got.lse[0];
  Outputs want_grad = MakeOutputs(s, c.dtype, 1);
  ASSERT_OK(RunSingle(c.device, s, d, want_grad, Call::kBackward, &saved));
  Outputs got_grad = MakeOutputs(s, c.dtype, c.world);
  for (const absl::Status& status :
       RunParallel(c.device, s, d, got_grad, cuts, Call::kBackward, &saved))
    ASSERT_OK(status);
  CheckAgainst(s, c.world, got_grad, want_grad, true, false);
  for (int r = 0; r < c.world; ++r) {
    EXPECT_TRUE(got_grad.loss[r].Poisoned()) << "the backward wrote a loss";
    EXPECT_TRUE(got_grad.lse[r].Poisoned()) << "the backward wrote an lse";
  }
}

INSTANTIATE_TEST_SUITE_P(All, VocabParallelCrossEntropyTest,
                         testing::ValuesIn(Cases()), CaseName);

// ---------------------------------------------------------------------------
// Bad inputs: every rank gets an InvalidArgument, none hangs, nothing is
// written.

struct BadCase {
  std::string name;
  bool rank_local;  // only the tampered rank can see it
  Tamper tamper;
  std::function<void(Data&)> mutate = nullptr;  // on the data every rank reads
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  cases.push_back({"grad_logits_dtype", true, [](int rank, RankArgs& a) {
                     if (rank == 1) a.grad.dtype = DType::kBF16;
                   }});
  cases.push_back({"grad_logits_shape", true, [](int rank, RankArgs& a) {
                     if (rank == 3) a.grad.shape[1] -= 1;
                   }});
  cases.push_back({"logits_overlap_grad", true, [](int rank, RankArgs& a) {
                     if (rank == 0) {
                       a.grad = a.logits;
                       a.grad.data = a.logits.data_as<float>() + 1;
                     }
                   }});
  cases.push_back({"offset_gap", false, [](int rank, RankArgs& a) {
                     if (rank == 2) a.shard.vocab_offset += 1;
                   }});
  cases.push_back({"vocab_mismatch", false, [](int rank, RankArgs& a) {
                     if (rank == 0) a.shard.vocab += 1;
                   }});
  cases.push_back({"offset_outside", true, [](int rank, RankArgs& a) {
                     if (rank == 2) a.shard.vocab_offset = a.shard.vocab;
                   }});
  cases.push_back({"negative_class_weight", true, [](int rank, RankArgs& a) {
                     if (rank == 1)
                       a.options.class_weights->data_as<float>()[2] = -1.0f;
                   }});
  cases.push_back(
      {"class_weights_on_one_rank_only", false, [](int rank, RankArgs& a) {
         if (rank != 2) a.options.class_weights.reset();
       }});
  cases.push_back({"smoothing_differs", false, [](int rank, RankArgs& a) {
                     if (rank == 3) a.options.label_smoothing = 0.1f;
                   }});
  cases.push_back({"targets_differ", false, [](int rank, RankArgs& a) {
                     if (rank == 1) test::ChangeFirstTarget(a.targets);
                   }});
  cases.push_back({"target_out_of_range", false, nullptr,
                   [](Data& d) { test::SetI64Target(d.targets, 3, 1000); }});
  return cases;
}

class VocabParallelCrossEntropyBadInput
    : public testing::TestWithParam<Device> {};

TEST_P(VocabParallelCrossEntropyBadInput, EveryRankRejectsNothingWritten) {
  const Device device = GetParam();
  if (!device.is_cpu()) SKIP_WITHOUT_GPU();
  Scenario s;
  s.class_weights = true;
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> cuts = {0, 40, 101, 150, s.v};
  for (const BadCase& bad : BadCases()) {
    SCOPED_TRACE(bad.name);
    Data d = MakeData(s, DType::kF32, rng);
    if (bad.mutate) bad.mutate(d);
    Outputs o = MakeOutputs(s, DType::kF32, 4);
    const std::vector<absl::Status> results = RunParallel(
        device, s, d, o, cuts, Call::kFusedGradLoss, nullptr, bad.tamper);
    int naming = 0;
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
          << "rank " << r << ": " << results[r];
      EXPECT_TRUE(o.loss[r].Poisoned()) << "rank " << r << " wrote its loss";
      EXPECT_TRUE(o.lse[r].Poisoned()) << "rank " << r << " wrote its lse";
      if (absl::StrContains(results[r].message(), "rejected its inputs"))
        ++naming;
    }
    EXPECT_TRUE(o.grad.Poisoned()) << "a gradient was written";
    // The other ranks name the rank that rejected its inputs.
    if (bad.rank_local) {
      EXPECT_EQ(naming, 3) << results[0] << " / " << results[1];
    }
    // The group still works after a rejected call.
    Outputs good = MakeOutputs(s, DType::kF32, 4);
    Data fresh = MakeData(s, DType::kF32, rng);
    for (const absl::Status& status :
         RunParallel(device, s, fresh, good, cuts, Call::kFused, nullptr))
      EXPECT_TRUE(status.ok()) << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, VocabParallelCrossEntropyBadInput,
                         testing::Values(Device::Cpu(), Device::Cuda(0)),
                         test::DeviceName);

TEST(VocabParallelCrossEntropyNullCommunicator, Rejected) {
  Scenario s;
  std::mt19937_64 rng(test::TestSeed());
  Data d = MakeData(s, DType::kF32, rng);
  Outputs o = MakeOutputs(s, DType::kF32, 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const VocabShard shard{nullptr, 0, s.v};
  const absl::Status status = VocabParallelCrossEntropyForward(
      *context, shard, d.logits.View(), d.targets.View(), CrossEntropyOptions(),
      o.loss[0].View());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(o.loss[0].Poisoned());
}

}  // namespace
}  // namespace lossrt
