// Tests of the vocabulary-parallel linear cross-entropy
// (loss/vocab_parallel_linear_cross_entropy.h), one thread per rank over the
// in-process communicator (runtime/cpu_communicator.h), against the
// single-device LinearCrossEntropyForwardBackward / Forward / Backward on the
// full weight (loss/linear_cross_entropy.h) on the same device.
//
// On the CPU every rank has a CPU context. On the GPU every rank has its own
// CUDA context on cuda:0 and talks through HostStagedCommunicator
// (tests/loss/host_staged_communicator.h: the CPU communicator takes host
// tensors only, so the adapter copies the device tensors to the host, calls it
// and copies the result back on the context's stream), so P = 1..4 run on one
// GPU; built with LOSSRT_TEST_NCCL (the _nccl_test target), P = 1 also runs
// over a real one-rank NCCL communicator. GPU cases skip, saying why, without a
// GPU (or without NCCL).
//
// One parameterized case per device x scenario x operand dtype (f32, bf16,
// f16) x world size (1, 2, 3, 4), with a random uneven split of the
// vocabulary: the fused
// call (with and without grad_loss), a repeat that must give the same bytes on
// every rank, the split forward (loss, lse) and the split backward from that
// lse. Scenarios cover the options and combinations of
// tests/loss/linear_cross_entropy_test.cc (bias kinds, reductions, ignored
// tokens, i32 targets, padded rows, small budgets: many chunks),
// entropy_weight, all tokens ignored and N = 0. Then bad inputs: a rank-local
// error gives every rank an InvalidArgument (no hang) and nothing is written
// anywhere.
//
// Outputs are poisoned with NaN before every call: an element left unwritten
// is caught. Tolerances: the two ops sum over the vocabulary in different
// orders, so results agree to fp32 rounding: losses and lse within 1e-5
// relative (plus 1e-6 absolute), f32 gradients within 1e-5 of the largest
// magnitude of their tensor; 16-bit operands round dlogits to 16 bits, where a
// last-bit difference may flip a rounding, so their gradients are compared
// norm-wise within 2e-3 and elementwise within 2e-2 of the largest magnitude,
// except 16-bit d_hidden, judged norm-wise against an f32 run of the
// single-device op (see CheckAgainst).
#include "loss/vocab_parallel_linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "loss/linear_cross_entropy.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/loss/vocab_parallel_test_util.h"
#include "tests/status_assertions.h"

#ifdef LOSSRT_TEST_NCCL
#include "runtime/nccl_communicator.h"
#endif

namespace lossrt {
namespace {

using test::Array;
using test::MakeArray;
using test::MakeVector;
using test::SameBytes;

// ---------------------------------------------------------------------------
// Scenarios.

enum class BiasKind { kNone, kF32, kOperand };

// The shared fields (n = 37, V = 203, ...:
// tests/loss/vocab_parallel_test_util.h) and the linear op's own.
struct Scenario : test::LossScenario {
  int64_t h = 24;
  BiasKind bias = BiasKind::kNone;
  bool d_hidden_f32 = false;
  bool d_weight_f32 = true;
  bool d_bias_f32 = true;
  int64_t budget = int64_t{1} << 30;  // the vocabulary-parallel op's
  int64_t chunk_rows = 0;             // LinearCrossEntropyOptions::chunk_rows
  double logit_scale = 1.0;
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> all;
  Scenario s;
  s.name = "plain";
  all.push_back(s);

  s = Scenario();
  s.name = "bias_f32_sum_ignored";
  s.bias = BiasKind::kF32;
  s.reduction = Reduction::kSum;
  s.ignore_fraction = 0.2;
  all.push_back(s);

  s = Scenario();
  s.name = "bias_operand_none_i32";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
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
  s.logit_scale = 3.0;
  s.reduction = Reduction::kSum;
  all.push_back(s);

  s = Scenario();
  s.name = "everything_small_budget";
  s.bias = BiasKind::kOperand;
  s.d_bias_f32 = false;
  s.d_weight_f32 = false;
  s.smoothing = 0.05f;
  s.z_loss = 1e-3f;
  s.softcap = 5.0f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.budget = 40 << 10;  // chunks of a few rows
  all.push_back(s);

  s = Scenario();
  s.name = "entropy_weight_smoothing";
  s.entropy_weight = 0.05f;
  s.smoothing = 0.1f;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.z_loss = 1e-3f;
  all.push_back(s);

  s = Scenario();
  s.name = "chunk_rows";  // chunks of 8 rows within the default budget
  s.bias = BiasKind::kF32;
  s.ignore_fraction = 0.2;
  s.chunk_rows = 8;
  all.push_back(s);

  s = Scenario();
  s.name = "none_padded_small_budget";
  s.reduction = Reduction::kNone;
  s.pad = 3;
  s.targets_i32 = true;
  s.d_hidden_f32 = true;
  s.bias = BiasKind::kF32;
  s.budget = 24 << 10;
  s.n = 45;
  s.v = 301;
  all.push_back(s);

  s = Scenario();
  s.name = "one_token";
  s.n = 1;
  s.h = 16;
  s.v = 50;
  s.bias = BiasKind::kF32;
  s.smoothing = 0.1f;
  all.push_back(s);

  s = Scenario();
  s.name = "wide_vocab";
  s.n = 64;
  s.h = 40;
  s.v = 1001;
  s.class_weights = true;
  s.ignore_fraction = 0.1;
  s.z_loss = 1e-4f;
  all.push_back(s);

  s = Scenario();
  s.name = "tiny_vocab";
  s.n = 9;
  s.h = 8;
  s.v = 5;
  s.smoothing = 0.2f;
  all.push_back(s);

  s = Scenario();
  s.name = "all_ignored";
  s.ignore_fraction = 1.0;
  s.smoothing = 0.1f;
  s.z_loss = 1e-3f;
  s.bias = BiasKind::kF32;
  all.push_back(s);

  s = Scenario();
  s.name = "no_tokens";
  s.n = 0;
  s.bias = BiasKind::kF32;
  all.push_back(s);
  return all;
}

// ---------------------------------------------------------------------------
// A problem: the full inputs on the host and the ranks' split.

// The operands, and the targets, class weights and grad_loss of
// test::LossInputs.
struct Data : test::LossInputs {
  Array hidden;               // [N, H]
  Array weight;               // [V, H]
  std::optional<Array> bias;  // [V]
};

Data MakeData(const Scenario& s, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  Data d;
  d.hidden = MakeArray(dtype, s.n, s.h, s.pad);
  d.weight = MakeArray(dtype, s.v, s.h, s.pad);
  const double scale = s.logit_scale / std::sqrt(static_cast<double>(s.h));
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t k = 0; k < s.h; ++k) d.hidden.Set(i, k, normal(rng));
  for (int64_t j = 0; j < s.v; ++j)
    for (int64_t k = 0; k < s.h; ++k) d.weight.Set(j, k, scale * normal(rng));
  if (s.bias != BiasKind::kNone) {
    d.bias = MakeVector(s.bias == BiasKind::kF32 ? DType::kF32 : dtype, s.v);
    for (int64_t j = 0; j < s.v; ++j) d.bias->Set(0, j, 0.5 * normal(rng));
  }
  // The targets, class weights and grad_loss, from the same `normal`.
  static_cast<test::LossInputs&>(d) = test::MakeLossInputs(s, normal, rng);
  return d;
}

// The outputs of one call: loss and lse, d_hidden per rank, d_weight and
// d_bias of the whole vocabulary (rank r writes its rows).
struct Outputs {
  Array loss;
  Array lse;
  std::vector<Array> d_hidden;  // one per rank (one for the single device)
  Array d_weight;
  std::optional<Array> d_bias;
  std::vector<Array> loss_per_rank;
  std::vector<Array> lse_per_rank;
};

Array MakeLoss(const Scenario& s) {
  return s.reduction == Reduction::kNone ? MakeVector(DType::kF32, s.n)
                                         : test::MakeScalar();
}

Outputs MakeOutputs(const Scenario& s, DType dtype, int ranks) {
  Outputs o;
  o.loss = MakeLoss(s);
  o.lse = MakeVector(DType::kF32, s.n);
  for (int r = 0; r < ranks; ++r) {
    o.d_hidden.push_back(
        MakeArray(s.d_hidden_f32 ? DType::kF32 : dtype, s.n, s.h, s.pad));
    o.loss_per_rank.push_back(MakeLoss(s));
    o.lse_per_rank.push_back(MakeVector(DType::kF32, s.n));
  }
  o.d_weight = MakeArray(s.d_weight_f32 ? DType::kF32 : dtype, s.v, s.h, s.pad);
  if (s.bias != BiasKind::kNone) {
    const DType bias_type = s.bias == BiasKind::kF32 ? DType::kF32 : dtype;
    o.d_bias = MakeVector(s.d_bias_f32 ? DType::kF32 : bias_type, s.v);
  }
  return o;
}

LinearCrossEntropyOptions Options(const Scenario& s,
                                  std::optional<Tensor> class_weights) {
  LinearCrossEntropyOptions options;
  options.cross_entropy = test::LossOptions(s, class_weights);
  return options;
}

enum class Call { kFused, kFusedGradLoss, kForward, kBackward };

// The single-device op on the full weight, on `device`. kBackward takes
// `saved_lse`.
absl::Status RunSingle(const Device& device, const Scenario& s, Data& d,
                       Outputs& o, Call call, const Array* saved_lse) {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
  test::Staging stage(*context);
  LinearCrossEntropyInputs in;
  ASSIGN_OR_RETURN(in.hidden, stage.In(d.hidden.View()));
  ASSIGN_OR_RETURN(in.weight, stage.In(d.weight.View()));
  if (d.bias.has_value()) {
    ASSIGN_OR_RETURN(in.bias, stage.In(d.bias->View()));
  }
  ASSIGN_OR_RETURN(in.targets, stage.In(d.targets.View()));
  std::optional<Tensor> cw;
  if (d.class_weights.has_value()) {
    ASSIGN_OR_RETURN(cw, stage.In(d.class_weights->View()));
  }
  LinearCrossEntropyOptions options = Options(s, cw);
  LinearCrossEntropyGradients g;
  ASSIGN_OR_RETURN(g.d_hidden, stage.Out(o.d_hidden[0].View()));
  ASSIGN_OR_RETURN(g.d_weight, stage.Out(o.d_weight.View()));
  if (o.d_bias.has_value()) {
    ASSIGN_OR_RETURN(g.d_bias, stage.Out(o.d_bias->View()));
  }
  ASSIGN_OR_RETURN(const Tensor loss, stage.Out(o.loss.View()));
  ASSIGN_OR_RETURN(const Tensor lse, stage.Out(o.lse.View()));
  ASSIGN_OR_RETURN(const Tensor grad_loss, stage.In(d.grad_loss.View()));
  absl::Status status;
  switch (call) {
    case Call::kFused:
      status = LinearCrossEntropyForwardBackward(*context, in, options, loss,
                                                 &lse, g);
      break;
    case Call::kFusedGradLoss:
      status = LinearCrossEntropyForwardBackward(*context, in, options, loss,
                                                 &lse, g, &grad_loss);
      break;
    case Call::kForward:
      status = LinearCrossEntropyForward(*context, in, options, loss, &lse);
      break;
    case Call::kBackward: {
      Array copy = *saved_lse;
      ASSIGN_OR_RETURN(const Tensor saved, stage.In(copy.View()));
      status = LinearCrossEntropyBackward(*context, in, saved, grad_loss,
                                          options, g);
      break;
    }
  }
  RETURN_IF_ERROR(status);
  return stage.Download();
}

// Changes one rank's arguments (bad-input tests) before its call (on the
// host views, before they go to the device).
using Tamper =
    std::function<void(int rank, VocabShard&, LinearCrossEntropyInputs&,
                       LinearCrossEntropyOptions&)>;

// Which communicator the ranks use: the CPU one (host-staged for CUDA
// contexts) or, for one rank on a GPU, NCCL.
enum class Backend { kInProcess, kNccl };

// One rank's call: its views staged on its context's device, the call, the
// outputs brought back (also on failure, so that a test sees what was
// written).
absl::Status RunRank(Context& context, Communicator* comm, int r,
                     const Scenario& s, Data& d, Outputs& o,
                     const std::vector<int64_t>& cuts, Call call,
                     const Array* saved_lse, const Tamper& tamper) {
  const int64_t begin = cuts[r];
  const int64_t count = cuts[r + 1] - begin;
  VocabShard shard{comm, begin, s.v};
  LinearCrossEntropyInputs host;
  host.hidden = d.hidden.View();
  host.weight = d.weight.View(begin, count);
  if (d.bias.has_value()) host.bias = d.bias->Columns(begin, count);
  host.targets = d.targets.View();
  std::optional<Tensor> host_cw;
  if (d.class_weights.has_value())
    host_cw = d.class_weights->Columns(begin, count);
  LinearCrossEntropyOptions options = Options(s, host_cw);
  options.max_workspace_bytes = s.budget;
  options.chunk_rows = s.chunk_rows;
  options.use_tf32 = false;
  if (tamper) tamper(r, shard, host, options);

  test::Staging stage(context);
  LinearCrossEntropyInputs in = host;
  auto stage_in = [&stage](Tensor& t) -> absl::Status {
    ASSIGN_OR_RETURN(t, stage.In(t));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(stage_in(in.hidden));
  RETURN_IF_ERROR(stage_in(in.weight));
  if (in.bias.has_value()) RETURN_IF_ERROR(stage_in(*in.bias));
  RETURN_IF_ERROR(stage_in(in.targets));
  if (options.cross_entropy.class_weights.has_value())
    RETURN_IF_ERROR(stage_in(*options.cross_entropy.class_weights));
  LinearCrossEntropyGradients g;
  ASSIGN_OR_RETURN(g.d_hidden, stage.Out(o.d_hidden[r].View()));
  ASSIGN_OR_RETURN(g.d_weight, stage.Out(o.d_weight.View(begin, count)));
  if (o.d_bias.has_value()) {
    ASSIGN_OR_RETURN(g.d_bias, stage.Out(o.d_bias->Columns(begin, count)));
  }
  ASSIGN_OR_RETURN(const Tensor loss, stage.Out(o.loss_per_rank[r].View()));
  ASSIGN_OR_RETURN(const Tensor lse, stage.Out(o.lse_per_rank[r].View()));
  ASSIGN_OR_RETURN(const Tensor grad_loss, stage.In(d.grad_loss.View()));
  absl::Status status;
  switch (call) {
    case Call::kFused:
      status = VocabParallelLinearCrossEntropyForwardBackward(
          context, shard, in, options, loss, &lse, g);
      break;
    case Call::kFusedGradLoss:
      status = VocabParallelLinearCrossEntropyForwardBackward(
          context, shard, in, options, loss, &lse, g, &grad_loss);
      break;
    case Call::kForward:
      status = VocabParallelLinearCrossEntropyForward(context, shard, in,
                                                      options, loss, &lse);
      break;
    case Call::kBackward: {
      Array copy = *saved_lse;
      ASSIGN_OR_RETURN(const Tensor saved, stage.In(copy.View()));
      status = VocabParallelLinearCrossEntropyBackward(
          context, shard, in, saved, grad_loss, options, g);
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
                                      Call call, const Array* saved_lse,
                                      const Tamper& tamper = nullptr,
                                      Backend backend = Backend::kInProcess) {
  const int world = static_cast<int>(cuts.size()) - 1;
  std::vector<std::unique_ptr<Communicator>> comms;
  if (backend == Backend::kInProcess) {
    auto group = test::InProcessCommunicators(device, world);
    if (!group.ok()) return std::vector<absl::Status>(world, group.status());
    comms = std::move(*group);
  }
  return test::RunOnRanks(
      device, world, comms,
      [&](Context& context, Communicator* comm, int r) -> absl::Status {
#ifdef LOSSRT_TEST_NCCL
        std::unique_ptr<Communicator> own;
        if (backend == Backend::kNccl) {
          ASSIGN_OR_RETURN(const std::string id,
                           NcclCommunicator::NewUniqueId());
          ASSIGN_OR_RETURN(own, NcclCommunicator::Create(id, 0, 1, context,
                                                         absl::Seconds(60)));
          comm = own.get();
        }
#endif
        return RunRank(context, comm, r, s, d, o, cuts, call, saved_lse,
                       tamper);
      });
}

// ---------------------------------------------------------------------------
// Comparisons.

void ExpectAllWritten(const Array& a, const std::string& what) {
  int64_t unwritten = 0;
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j)
      if (std::isnan(a.Get(i, j))) ++unwritten;
  EXPECT_EQ(unwritten, 0) << what << ": NaN or unwritten elements";
}

void ExpectLossClose(const Array& got, const Array& want,
                     const std::string& what) {
  for (int64_t j = 0; j < want.cols; ++j) {
    const double w = want.Get(0, j), g = got.Get(0, j);
    EXPECT_NEAR(g, w, 1e-5 * std::abs(w) + 1e-6) << what << "[" << j << "]";
  }
}

void ExpectGradClose(const Array& got, const Array& want, bool sixteen_bit,
                     const std::string& what, bool norm_wise = true) {
  double max_abs = 0.0, diff2 = 0.0, norm2 = 0.0, worst = 0.0;
  int64_t worst_index = -1;
  for (int64_t i = 0; i < want.rows; ++i) {
    for (int64_t j = 0; j < want.cols; ++j) {
      const double w = want.Get(i, j), g = got.Get(i, j);
      ASSERT_FALSE(std::isnan(g)) << what << "[" << i << ", " << j << "]";
      max_abs = std::max(max_abs, std::abs(w));
      diff2 += (g - w) * (g - w);
      norm2 += w * w;
      if (std::abs(g - w) > worst) {
        worst = std::abs(g - w);
        worst_index = i * want.cols + j;
      }
    }
  }
  const double tolerance = (sixteen_bit ? 2e-2 : 1e-5) * max_abs + 1e-30;
  EXPECT_LE(worst, tolerance) << what << ": worst element " << worst_index
                              << " of max |" << max_abs << "|";
  if (norm_wise && sixteen_bit && norm2 > 0) {
    EXPECT_LE(std::sqrt(diff2 / norm2), 2e-3) << what << ": norm-wise";
  }
}

// ||got - want|| / ||want|| over every element (0 for a zero `want`).
double NormRelativeError(const Array& got, const Array& want) {
  double diff2 = 0.0, norm2 = 0.0;
  for (int64_t i = 0; i < want.rows; ++i) {
    for (int64_t j = 0; j < want.cols; ++j) {
      const double w = want.Get(i, j), g = got.Get(i, j);
      diff2 += (g - w) * (g - w);
      norm2 += w * w;
    }
  }
  return norm2 > 0 ? std::sqrt(diff2 / norm2) : 0.0;
}

// `a` with the same values in f32 (16-bit values are exact in f32).
Array Widened(const Array& a) {
  Array w = a;
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) return w;
  w.dtype = DType::kF32;
  w.bytes.assign(std::max<int64_t>(a.span(), 1) * 4, 0);
  w.Poison();
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < a.cols; ++j) w.Set(i, j, a.Get(i, j));
  return w;
}

// The problem's inputs, the same values widened to f32.
Data Widened(const Data& d) {
  Data w = d;
  w.hidden = Widened(d.hidden);
  w.weight = Widened(d.weight);
  if (d.bias.has_value()) w.bias = Widened(*d.bias);
  return w;
}

// ---------------------------------------------------------------------------
// The parameterized cases.

struct Case {
  Device device;
  Scenario scenario;
  DType dtype;
  int world;
  Backend backend = Backend::kInProcess;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.device.ToString() << " " << c.scenario.name << " "
      << DTypeName(c.dtype) << " P=" << c.world
      << (c.backend == Backend::kNccl ? " nccl" : "");
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return absl::StrCat(info.param.device.is_cpu() ? "cpu" : "cuda", "_",
                      info.param.scenario.name, "_",
                      DTypeName(info.param.dtype), "_P", info.param.world,
                      info.param.backend == Backend::kNccl ? "_nccl" : "");
}

// Every case on the CPU and on cuda:0 (skipped without a GPU); built with
// NCCL, P = 1 over NCCL on cuda:0 too.
std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const Device& device : {Device::Cpu(), Device::Cuda(0)}) {
    for (const Scenario& s : Scenarios()) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (int world : {1, 2, 3, 4}) {
          if (world > s.v) continue;
          cases.push_back({device, s, dtype, world});
        }
#ifdef LOSSRT_TEST_NCCL
        if (!device.is_cpu())
          cases.push_back({device, s, dtype, 1, Backend::kNccl});
#endif
      }
    }
  }
  return cases;
}

// Ends a GPU case as skipped without a usable GPU (or NCCL for its cases).
#define SKIP_UNLESS_RUNNABLE(device, backend)                   \
  do {                                                          \
    if (!(device).is_cpu()) SKIP_WITHOUT_GPU();                 \
    if ((backend) == Backend::kNccl) SKIP_WITHOUT_NCCL_BUILD(); \
  } while (false)

#ifdef LOSSRT_TEST_NCCL
#define SKIP_WITHOUT_NCCL_BUILD()                                      \
  do {                                                                 \
    if (!NcclCommunicator::Available())                                \
      GTEST_SKIP() << "no NCCL: lossrt was built without the NCCL "    \
                      "backend (NcclCommunicator::Available() false)"; \
  } while (false)
#else
#define SKIP_WITHOUT_NCCL_BUILD() \
  do {                            \
  } while (false)
#endif

// A creation failure of the NCCL communicator (no libnccl at run time, no
// usable transport): the case is skipped, saying so.
bool NcclUnavailable(const std::vector<absl::Status>& results, Backend backend,
                     std::string* why) {
  if (backend != Backend::kNccl || results.empty() || results[0].ok())
    return false;
  const absl::StatusCode code = results[0].code();
  if (code == absl::StatusCode::kInvalidArgument) return false;  // the op's
  *why = results[0].ToString();
  return true;
}

class VocabParallelTest : public testing::TestWithParam<Case> {};

// `precise`: the single-device op on the CPU over the same input values in
// f32 with f32 gradients (f32 rounding only, far below 16-bit rounding).
// Why: with 16-bit operands d_hidden comes from dlogits rounded to the
// operand dtype (bf16: eps 2^-8), and the two ops sum it in different orders,
// so two 16-bit results can differ from each other by more than either differs
// from the exact gradient. A 16-bit d_hidden is therefore judged against
// `precise`: within the single-device op's own 16-bit tolerance (1e-2
// norm-wise, tests/loss/linear_cross_entropy_test.cc), and no more than 1.5x
// the single-device op's error plus 1e-3 (the vocabulary-parallel op must not
// be markedly less accurate). Elementwise it still stays within 2e-2 of the
// largest magnitude of the single-device result; f32 checks are unchanged.
void CheckAgainst(DType dtype, int world, Outputs& got, Outputs& want,
                  bool gradients, bool loss, const Outputs* precise = nullptr) {
  const bool sixteen = dtype != DType::kF32;
  for (int r = 0; r < world; ++r) {
    const std::string rank = absl::StrCat("rank ", r, ": ");
    if (loss) {
      ExpectAllWritten(got.loss_per_rank[r], rank + "loss");
      ExpectLossClose(got.loss_per_rank[r], want.loss, rank + "loss");
      ExpectAllWritten(got.lse_per_rank[r], rank + "lse");
      ExpectLossClose(got.lse_per_rank[r], want.lse, rank + "lse");
      EXPECT_TRUE(SameBytes(got.loss_per_rank[r], got.loss_per_rank[0]))
          << rank << "loss differs from rank 0's";
      EXPECT_TRUE(SameBytes(got.lse_per_rank[r], got.lse_per_rank[0]))
          << rank << "lse differs from rank 0's";
    }
    if (gradients) {
      const bool judged = sixteen && precise != nullptr;
      ExpectGradClose(got.d_hidden[r], want.d_hidden[0], sixteen,
                      rank + "d_hidden", /*norm_wise=*/!judged);
      if (judged) {
        const double mine =
            NormRelativeError(got.d_hidden[r], precise->d_hidden[0]);
        const double single =
            NormRelativeError(want.d_hidden[0], precise->d_hidden[0]);
        EXPECT_LE(mine, 1e-2) << rank << "d_hidden: norm-wise vs f32";
        EXPECT_LE(mine, 1.5 * single + 1e-3)
            << rank << "d_hidden: norm-wise vs f32, single-device op's error "
            << single;
      }
      EXPECT_TRUE(SameBytes(got.d_hidden[r], got.d_hidden[0]))
          << rank << "d_hidden differs from rank 0's";
    }
  }
  if (gradients) {
    ExpectGradClose(got.d_weight, want.d_weight, sixteen, "d_weight");
    if (want.d_bias.has_value())
      ExpectGradClose(*got.d_bias, *want.d_bias, sixteen, "d_bias");
  }
}

TEST_P(VocabParallelTest, MatchesSingleDevice) {
  const Case& c = GetParam();
  SKIP_UNLESS_RUNNABLE(c.device, c.backend);
  const Scenario& s = c.scenario;
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  Data d = MakeData(s, c.dtype, rng);
  const std::vector<int64_t> cuts = test::RandomCuts(s.v, c.world, rng);
  SCOPED_TRACE(absl::StrCat("split ", absl::StrJoin(cuts, ",")));
  // The f32 judge of 16-bit d_hidden (see CheckAgainst).
  const bool sixteen = c.dtype != DType::kF32;
  Data wide = Widened(d);
  Scenario precise_scenario = s;
  precise_scenario.d_hidden_f32 = true;
  precise_scenario.d_weight_f32 = true;
  precise_scenario.d_bias_f32 = true;

  for (Call call : {Call::kFused, Call::kFusedGradLoss}) {
    SCOPED_TRACE(call == Call::kFused ? "fused" : "fused with grad_loss");
    Outputs want = MakeOutputs(s, c.dtype, 1);
    ASSERT_OK(RunSingle(c.device, s, d, want, call, nullptr));
    Outputs precise = MakeOutputs(precise_scenario, DType::kF32, 1);
    if (sixteen) {
      ASSERT_OK(RunSingle(Device::Cpu(), precise_scenario, wide, precise, call,
                          nullptr));
    }
    Outputs got = MakeOutputs(s, c.dtype, c.world);
    const std::vector<absl::Status> results = RunParallel(
        c.device, s, d, got, cuts, call, nullptr, nullptr, c.backend);
    std::string why;
    if (NcclUnavailable(results, c.backend, &why))
      GTEST_SKIP() << "no usable NCCL communicator: " << why;
    for (const absl::Status& status : results) ASSERT_OK(status);
    CheckAgainst(c.dtype, c.world, got, want, true, true,
                 sixteen ? &precise : nullptr);
    // Run to run: the same bytes.
    Outputs again = MakeOutputs(s, c.dtype, c.world);
    for (const absl::Status& status : RunParallel(
             c.device, s, d, again, cuts, call, nullptr, nullptr, c.backend))
      ASSERT_OK(status);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_TRUE(SameBytes(again.loss_per_rank[r], got.loss_per_rank[r]));
      EXPECT_TRUE(SameBytes(again.lse_per_rank[r], got.lse_per_rank[r]));
      EXPECT_TRUE(SameBytes(again.d_hidden[r], got.d_hidden[r]));
    }
    EXPECT_TRUE(SameBytes(again.d_weight, got.d_weight));
    if (got.d_bias.has_value()) {
      EXPECT_TRUE(SameBytes(*again.d_bias, *got.d_bias));
    }
  }

  // The split forward, then the split backward from its lse.
  Outputs want = MakeOutputs(s, c.dtype, 1);
  ASSERT_OK(RunSingle(c.device, s, d, want, Call::kForward, nullptr));
  Outputs got = MakeOutputs(s, c.dtype, c.world);
  for (const absl::Status& status :
       RunParallel(c.device, s, d, got, cuts, Call::kForward, nullptr, nullptr,
                   c.backend))
    ASSERT_OK(status);
  CheckAgainst(c.dtype, c.world, got, want, false, true);
  if (s.entropy_weight != 0.0f) return;  // no split backward
  const Array saved = got.lse_per_rank[0];
  Outputs want_grad = MakeOutputs(s, c.dtype, 1);
  ASSERT_OK(RunSingle(c.device, s, d, want_grad, Call::kBackward, &saved));
  Outputs got_grad = MakeOutputs(s, c.dtype, c.world);
  for (const absl::Status& status :
       RunParallel(c.device, s, d, got_grad, cuts, Call::kBackward, &saved,
                   nullptr, c.backend))
    ASSERT_OK(status);
  // The judge: the f32 backward from the same saved lse.
  Outputs precise = MakeOutputs(precise_scenario, DType::kF32, 1);
  if (sixteen) {
    ASSERT_OK(RunSingle(Device::Cpu(), precise_scenario, wide, precise,
                        Call::kBackward, &saved));
  }
  CheckAgainst(c.dtype, c.world, got_grad, want_grad, true, false,
               sixteen ? &precise : nullptr);
}

INSTANTIATE_TEST_SUITE_P(All, VocabParallelTest, testing::ValuesIn(Cases()),
                         CaseName);

// ---------------------------------------------------------------------------
// Bad inputs: every rank gets an InvalidArgument, none hangs, nothing is
// written.

struct BadCase {
  std::string name;
  bool rank_local;  // only the tampered rank can see it
  Tamper tamper;
  // Changes the data that every rank reads (null: none).
  std::function<void(Data&)> mutate = nullptr;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  cases.push_back({"weight_hidden_size", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs& in,
                      LinearCrossEntropyOptions&) {
                     if (rank == 1) in.weight.shape[1] -= 1;
                   }});
  cases.push_back({"offset_gap", false,
                   [](int rank, VocabShard& shard, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions&) {
                     if (rank == 2) shard.vocab_offset += 1;
                   }});
  cases.push_back({"vocab_mismatch", false,
                   [](int rank, VocabShard& shard, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions&) {
                     if (rank == 0) shard.vocab += 1;
                   }});
  cases.push_back({"offset_outside", true,
                   [](int rank, VocabShard& shard, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions&) {
                     if (rank == 2) shard.vocab_offset = shard.vocab;
                   }});
  cases.push_back(
      {"negative_class_weight", true,
       [](int rank, VocabShard&, LinearCrossEntropyInputs&,
          LinearCrossEntropyOptions& options) {
         if (rank == 1) {
           options.cross_entropy.class_weights->data_as<float>()[2] = -1.0f;
         }
       }});
  cases.push_back({"budget_too_small_on_one_rank", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 3) options.max_workspace_bytes = 1024;
                   }});
  cases.push_back({"negative_chunk_rows", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 1) options.chunk_rows = -1;
                   }});
  cases.push_back({"chunk_rows_beyond_the_budget", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 2) {
                       // Room for about 16 of the 37 rows.
                       options.max_workspace_bytes = 8 << 10;
                       options.chunk_rows = 1000;
                     }
                   }});
  cases.push_back({"two_pass", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 0)
                       options.schedule = LinearCrossEntropySchedule::kTwoPass;
                   }});
  cases.push_back({"output_dtype_accumulation", true,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 1) options.fp32_gradient_accumulation = false;
                   }});
  cases.push_back({"class_weights_on_one_rank_only", false,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank != 2) options.cross_entropy.class_weights.reset();
                   }});
  cases.push_back({"smoothing_differs", false,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs&,
                      LinearCrossEntropyOptions& options) {
                     if (rank == 3)
                       options.cross_entropy.label_smoothing = 0.1f;
                   }});
  cases.push_back({"targets_differ", false,
                   [](int rank, VocabShard&, LinearCrossEntropyInputs& in,
                      LinearCrossEntropyOptions&) {
                     // Rank 1's first target differs.
                     if (rank == 1) test::ChangeFirstTarget(in.targets);
                   }});
  cases.push_back({"target_out_of_range", false, nullptr,
                   [](Data& d) { test::SetI64Target(d.targets, 3, 1000); }});
  return cases;
}

class VocabParallelBadInput : public testing::TestWithParam<Device> {};

TEST_P(VocabParallelBadInput, EveryRankRejectsAndNothingIsWritten) {
  const Device device = GetParam();
  if (!device.is_cpu()) SKIP_WITHOUT_GPU();
  Scenario s;
  s.class_weights = true;
  s.bias = BiasKind::kF32;
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> cuts = {0, 40, 101, 150, s.v};
  for (const BadCase& bad : BadCases()) {
    SCOPED_TRACE(bad.name);
    // Fresh data per case: some cases change values behind the views.
    Data d = MakeData(s, DType::kF32, rng);
    if (bad.mutate) bad.mutate(d);
    Outputs o = MakeOutputs(s, DType::kF32, 4);
    const std::vector<absl::Status> results = RunParallel(
        device, s, d, o, cuts, Call::kFusedGradLoss, nullptr, bad.tamper);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
          << "rank " << r << ": " << results[r];
      const Array* outputs[] = {&o.loss_per_rank[r], &o.lse_per_rank[r],
                                &o.d_hidden[r]};
      for (const Array* a : outputs) {
        EXPECT_TRUE(a->Poisoned()) << "rank " << r << " wrote an output";
      }
    }
    for (const Array* a : {&o.d_weight, &*o.d_bias}) {
      EXPECT_TRUE(a->Poisoned()) << "a gradient was written";
    }
    if (bad.rank_local) {
      // The other ranks name the rank that rejected its inputs.
      int naming = 0;
      for (int r = 0; r < 4; ++r) {
        if (absl::StrContains(results[r].message(), "rejected its inputs"))
          ++naming;
      }
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

INSTANTIATE_TEST_SUITE_P(Devices, VocabParallelBadInput,
                         testing::Values(Device::Cpu(), Device::Cuda(0)),
                         test::DeviceName);

// accumulate (LinearCrossEntropyGradients) is the single-device op's only:
// refused with nothing written.
TEST(VocabParallelAccumulate, Rejected) {
  Scenario s;
  std::mt19937_64 rng(test::TestSeed());
  Data d = MakeData(s, DType::kF32, rng);
  Outputs o = MakeOutputs(s, DType::kF32, 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(auto comms,
                       test::InProcessCommunicators(Device::Cpu(), 1));
  VocabShard shard{comms[0].get(), 0, s.v};
  LinearCrossEntropyInputs in{d.hidden.View(), d.weight.View(), std::nullopt,
                              d.targets.View()};
  LinearCrossEntropyGradients g{o.d_hidden[0].View(), o.d_weight.View(),
                                std::nullopt};
  g.accumulate = true;
  const Tensor lse = o.lse.View();
  const absl::Status status = VocabParallelLinearCrossEntropyForwardBackward(
      *context, shard, in, LinearCrossEntropyOptions(), o.loss.View(), &lse, g);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(o.loss.Poisoned());
  EXPECT_TRUE(o.lse.Poisoned());
  EXPECT_TRUE(o.d_hidden[0].Poisoned());
  EXPECT_TRUE(o.d_weight.Poisoned());
}

TEST(VocabParallelNullCommunicator, Rejected) {
  Scenario s;
  std::mt19937_64 rng(test::TestSeed());
  Data d = MakeData(s, DType::kF32, rng);
  Outputs o = MakeOutputs(s, DType::kF32, 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  VocabShard shard{nullptr, 0, s.v};
  LinearCrossEntropyInputs in{d.hidden.View(), d.weight.View(), std::nullopt,
                              d.targets.View()};
  const absl::Status status = VocabParallelLinearCrossEntropyForward(
      *context, shard, in, LinearCrossEntropyOptions(), o.loss.View());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(std::isnan(o.loss.Get(0, 0)));
}

}  // namespace
}  // namespace lossrt
