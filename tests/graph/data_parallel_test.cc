// Tests of data-parallel training through a Communicator: N CPU ranks (one
// thread, context, model and trainer each, over a CpuCommunicatorGroup), each
// given its rows of the global batch (RankRows), give the per-step losses and
// the weights of one device trained on the whole global batch; a rank that
// fails makes the others fail instead of waiting; RankRows splits in rank
// order and checks its arguments.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "data/batcher.h"
#include "graph/gpt.h"
#include "graph/trainer.h"
#include "gtest/gtest.h"
#include "runtime/cpu_communicator.h"
#include "runtime/status.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace graph {
namespace {

constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int kSeq = 8;
constexpr int kSteps = 5;
constexpr int64_t kVocab = 64;

GptConfig TinyConfig() {
  GptConfig config;
  config.layers = 2;
  config.heads = 2;
  config.width = 32;
  config.context = 16;
  config.vocab = kVocab;
  return config;
}

TrainerOptions Options(int64_t micro_batches, Communicator* communicator) {
  TrainerOptions options;
  options.schedule = {2e-3f, 2e-4f, 2, 8};
  options.micro_batches = micro_batches;
  options.communicator = communicator;
  return options;
}

// How a run trains, beyond the data and the seed.
struct RunSpec {
  int64_t micro_batches = 1;
  int64_t bucket_bytes = TrainerOptions().bucket_bytes;
  bool shard_optimizer_state = false;
  // Steps [first_step, first_step + steps) of the data; a run with
  // first_step > 0 starts from the checkpoint in load_dir.
  int first_step = 0;
  int steps = kSteps;
  std::string load_dir;
  std::string save_dir;  // non-empty: every rank calls Save at the end
};

std::vector<int32_t> Tokens(int64_t count, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = static_cast<int32_t>(engine() % kVocab);
  return tokens;
}

struct RunResult {
  std::vector<float> losses;   // [kSteps]
  std::vector<float> norms;    // [kSteps]
  std::vector<float> weights;  // [parameter count] master weights
  // The parameter each weight belongs to (for the messages).
  std::vector<std::string> names;
  std::vector<int64_t> offsets;
};

// Trains rank `rank` of `world_size` (communicator null: one device) for
// kSteps steps; global batch k of `batcher` (micro_batches * kGlobalBatch
// rows) is step k's data, micro-batch j its rows [j * kGlobalBatch,
// (j + 1) * kGlobalBatch).
absl::StatusOr<RunResult> Train(const data::Batcher& batcher,
                                const RunSpec& spec, uint64_t seed,
                                Communicator* communicator) {
  const int64_t micro_batches = spec.micro_batches;
  const int rank = communicator != nullptr ? communicator->rank() : 0;
  const int world = communicator != nullptr ? communicator->world_size() : 1;
  const int64_t global_tokens = kGlobalBatch * kSeq;
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cpu()));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Gpt> model,
      Gpt::Create(*context, TinyConfig(), {kGlobalBatch / world, kSeq},
                  DType::kF32, GptHead::kFusedLoss));
  RETURN_IF_ERROR(model->Initialize(seed));
  TrainerOptions options = Options(micro_batches, communicator);
  options.bucket_bytes = spec.bucket_bytes;
  options.shard_optimizer_state = spec.shard_optimizer_state;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(*model, options));
  if (spec.first_step > 0) {
    RETURN_IF_ERROR(trainer->Load(spec.load_dir).status());
    if (trainer->step() != spec.first_step) {
      return absl::InternalError(absl::StrCat("the checkpoint is at step ",
                                              trainer->step(), ", not ",
                                              spec.first_step));
    }
  }
  RunResult result;
  std::vector<int32_t> ids, targets;  // [micro_batches * rows] this rank's
  for (int step = spec.first_step; step < spec.first_step + spec.steps;
       ++step) {
    ASSIGN_OR_RETURN(data::Batch batch, batcher.Get(step));
    ids.clear();
    targets.clear();
    for (int64_t j = 0; j < micro_batches; ++j) {
      const absl::Span<const int32_t> all_ids(batch.inputs);
      const absl::Span<const int32_t> all_targets(batch.targets);
      ASSIGN_OR_RETURN(
          absl::Span<const int32_t> rank_ids,
          RankRows(all_ids.subspan(j * global_tokens, global_tokens), kSeq,
                   rank, world));
      ASSIGN_OR_RETURN(
          absl::Span<const int32_t> rank_targets,
          RankRows(all_targets.subspan(j * global_tokens, global_tokens), kSeq,
                   rank, world));
      ids.insert(ids.end(), rank_ids.begin(), rank_ids.end());
      targets.insert(targets.end(), rank_targets.begin(), rank_targets.end());
    }
    ASSIGN_OR_RETURN(Trainer::StepStats stats, trainer->Step(ids, targets));
    result.losses.push_back(stats.loss);
    result.norms.push_back(stats.grad_norm);
  }
  if (!spec.save_dir.empty()) {
    RETURN_IF_ERROR(trainer->Save(spec.save_dir, {}).status());
  }
  const Tensor master = model->graph().parameter_buffers().master;
  result.weights.resize(master.numel());
  RETURN_IF_ERROR(CopyTensor(master,
                             Tensor::Of(result.weights.data(), DType::kF32,
                                        master.shape, Device::Cpu()),
                             *context));
  RETURN_IF_ERROR(context->Synchronize());
  for (const GptParameter& parameter : model->named_parameters()) {
    result.names.push_back(parameter.name);
    result.offsets.push_back(model->graph().info(parameter.value).param_offset);
  }
  return result;
}

// Runs Train on every rank of a CpuCommunicatorGroup, one thread per rank.
std::vector<absl::StatusOr<RunResult>> TrainRanks(const data::Batcher& batcher,
                                                  const RunSpec& spec,
                                                  uint64_t seed, int world) {
  std::vector<absl::StatusOr<RunResult>> results(world,
                                                 absl::UnknownError("not run"));
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> comms =
      CpuCommunicatorGroup::Create(world, absl::Seconds(30));
  if (!comms.ok()) {
    results[0] = comms.status();
    return results;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = Train(batcher, spec, seed, (*comms)[r].get()); });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// "name + index" of weight i, for the messages.
std::string ParameterOf(const RunResult& run, size_t i) {
  std::string name;
  int64_t best = -1;
  for (size_t p = 0; p < run.names.size(); ++p) {
    if (run.offsets[p] <= static_cast<int64_t>(i) && run.offsets[p] > best) {
      best = run.offsets[p];
      name = run.names[p];
    }
  }
  return absl::StrCat(name, " + ", static_cast<int64_t>(i) - best);
}

// The weights of two runs whose sums differ in order (other rank counts):
// within fp32 rounding but for a few (see below). `world`: for the message.
void ExpectWeightsNear(const RunResult& actual, const RunResult& expected,
                       int world) {
  ASSERT_EQ(actual.weights.size(), expected.weights.size());
  // The key biases (attn.c_attn.bias [width, 2 width)) are left out: their
  // gradient is 0 in exact arithmetic (a bias on every key adds one constant
  // to a query's scores, which the softmax ignores), so in fp32 it is
  // rounding noise that changes with the order of the sums, and Adam turns
  // noise into steps. They only have to stay near their initial 0.
  std::vector<bool> key_bias(expected.weights.size(), false);
  const int64_t width = TinyConfig().width;
  for (size_t p = 0; p < expected.names.size(); ++p) {
    if (absl::EndsWith(expected.names[p], ".attn.c_attn.bias")) {
      for (int64_t i = width; i < 2 * width; ++i) {
        key_bias[expected.offsets[p] + i] = true;
      }
    }
  }
  // Every other weight is within fp32 rounding of one device's (tight),
  // except a few whose gradient is a near-cancellation of many terms, where
  // the rounding is a larger part of g and so of Adam's m / sqrt(v): those
  // may be off by a small part of a step (loose = 5% of the peak lr), but
  // only a few of them (at most 1 in 1000 weights).
  const float loose = 1e-4f;
  int64_t outside_tight = 0, outside_loose = 0, compared = 0;
  float max_difference = 0;
  for (size_t i = 0; i < expected.weights.size(); ++i) {
    if (key_bias[i]) {
      EXPECT_LT(std::abs(actual.weights[i]), 1e-4f) << "key bias " << i;
      EXPECT_LT(std::abs(expected.weights[i]), 1e-4f) << "key bias " << i;
      continue;
    }
    ++compared;
    const float difference = std::abs(actual.weights[i] - expected.weights[i]);
    max_difference = std::max(max_difference, difference);
    if (difference <= 1e-5f * std::abs(expected.weights[i]) + 2e-6f) continue;
    ++outside_tight;
    if (difference > loose && ++outside_loose <= 5) {
      ADD_FAILURE() << "weight " << i << " (" << ParameterOf(expected, i)
                    << "): " << actual.weights[i] << " vs "
                    << expected.weights[i];
    }
  }
  std::printf(
      "%d ranks: %lld of %lld weights outside fp32 rounding, the "
      "largest difference %g\n",
      world, static_cast<long long>(outside_tight),
      static_cast<long long>(compared), max_difference);
  EXPECT_EQ(outside_loose, 0);
  EXPECT_LE(outside_tight, compared / 1000);
}

// N ranks against one device, for N = 1..4 and 1 or 2 micro-batches.
void ExpectDataParallelMatchesOneDevice(int64_t micro_batches) {
  const uint64_t seed = test::TestSeed();
  const std::vector<int32_t> tokens = Tokens(4096, seed + 1);
  ASSERT_OK_AND_ASSIGN(
      data::Batcher batcher,
      data::Batcher::Create(tokens, micro_batches * kGlobalBatch, kSeq,
                            seed + 2));
  RunSpec spec;
  spec.micro_batches = micro_batches;
  ASSERT_OK_AND_ASSIGN(RunResult single, Train(batcher, spec, seed, nullptr));
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(testing::Message() << world << " ranks");
    std::vector<absl::StatusOr<RunResult>> ranks =
        TrainRanks(batcher, spec, seed, world);
    for (int r = 0; r < world; ++r) ASSERT_OK(ranks[r].status());
    const RunResult& rank0 = *ranks[0];
    // The all-reduce gives every rank the same bits, so the ranks agree
    // exactly: the same losses, norms and weights.
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(ranks[r]->losses, rank0.losses) << "rank " << r;
      EXPECT_EQ(ranks[r]->norms, rank0.norms) << "rank " << r;
      EXPECT_TRUE(ranks[r]->weights == rank0.weights) << "rank " << r;
    }
    if (world == 1) {
      // One rank computes exactly what one device does (the all-reduce of
      // one rank copies, the loss scale is the same).
      EXPECT_EQ(rank0.losses, single.losses);
      EXPECT_EQ(rank0.norms, single.norms);
      EXPECT_TRUE(rank0.weights == single.weights);
      continue;
    }
    // Against one device, only the order of the fp32 sums differs (the mean
    // over a rank's rows then the sum over the ranks, instead of one mean),
    // a few ulps (~1e-7 relative) per step; 1e-5 leaves room for that to grow
    // over the steps.
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(rank0.losses[step], single.losses[step],
                  1e-5 * std::abs(single.losses[step]))
          << "step " << step;
      EXPECT_NEAR(rank0.norms[step], single.norms[step],
                  1e-4 * std::abs(single.norms[step]))
          << "step " << step;
    }
    // Weights: AdamW's update lr * m / (sqrt(v) + eps) is about lr * sign(g)
    // for most gradients, so rounding barely moves it, but for a gradient
    // near 0 the rounding of g changes m / sqrt(v) itself; the bound is a
    // small part of the 2e-3 learning rate on top of fp32 rounding.
    ExpectWeightsNear(rank0, single, world);
  }
}

TEST(DataParallelTest, RanksMatchOneDevice) {
  ExpectDataParallelMatchesOneDevice(/*micro_batches=*/1);
}

TEST(DataParallelTest, RanksWithMicroBatchesMatchOneDevice) {
  ExpectDataParallelMatchesOneDevice(/*micro_batches=*/2);
}

// Runs `spec` on `world` CPU ranks; fails the test unless every rank
// succeeds, and gives rank 0's result (the ranks agree bitwise: checked).
RunResult RunRanks(const data::Batcher& batcher, const RunSpec& spec,
                   uint64_t seed, int world) {
  std::vector<absl::StatusOr<RunResult>> ranks =
      TrainRanks(batcher, spec, seed, world);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
    if (!ranks[r].ok()) return RunResult();
  }
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(ranks[r]->losses, ranks[0]->losses) << "rank " << r;
    EXPECT_TRUE(ranks[r]->weights == ranks[0]->weights) << "rank " << r;
  }
  return *ranks[0];
}

// The weights of two runs that differ only in fp32 rounding: every weight
// within 1e-5 relative (+ 2e-6 absolute) and the losses within 1e-6.
void ExpectWithinRounding(const RunResult& actual, const RunResult& expected) {
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    EXPECT_NEAR(actual.losses[step], expected.losses[step],
                1e-6 * std::abs(expected.losses[step]))
        << "step " << step;
  }
  ASSERT_EQ(actual.weights.size(), expected.weights.size());
  int64_t failures = 0;
  for (size_t i = 0; i < expected.weights.size(); ++i) {
    const float difference = std::abs(actual.weights[i] - expected.weights[i]);
    if (difference > 1e-5f * std::abs(expected.weights[i]) + 2e-6f &&
        ++failures <= 5) {
      ADD_FAILURE() << "weight " << i << " (" << ParameterOf(expected, i)
                    << "): " << actual.weights[i] << " vs "
                    << expected.weights[i];
    }
  }
  EXPECT_EQ(failures, 0);
}

int64_t ParameterCount() {
  absl::StatusOr<std::unique_ptr<Context>> context =
      Context::Create(Device::Cpu());
  if (!context.ok()) return -1;
  absl::StatusOr<std::unique_ptr<Gpt>> model =
      Gpt::Create(**context, TinyConfig(), {kGlobalBatch, kSeq}, DType::kF32,
                  GptHead::kFusedLoss);
  if (!model.ok()) return -1;
  return (*model)->graph().parameter_buffers().count;
}

// Buckets of one element (each a collective of its own, many splitting a
// parameter), a few hundred elements and more than the whole buffer give the
// bits of one all-reduce of the whole buffer (the previous path), with two
// micro-batches (only the last one's backward launches buckets).
TEST(DataParallelTest, BucketsGiveTheBitsOfOneAllReduce) {
  const uint64_t seed = test::TestSeed();
  const std::vector<int32_t> tokens = Tokens(4096, seed + 1);
  ASSERT_OK_AND_ASSIGN(
      data::Batcher batcher,
      data::Batcher::Create(tokens, 2 * kGlobalBatch, kSeq, seed + 2));
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(testing::Message() << world << " ranks");
    RunSpec spec;
    spec.micro_batches = 2;
    spec.steps = 3;
    spec.bucket_bytes = int64_t{1} << 40;  // one bucket
    const RunResult whole = RunRanks(batcher, spec, seed, world);
    for (int64_t bytes : {int64_t{4}, int64_t{4 * 300 + 2}}) {
      SCOPED_TRACE(testing::Message() << bytes << " bytes per bucket");
      spec.bucket_bytes = bytes;
      const RunResult bucketed = RunRanks(batcher, spec, seed, world);
      EXPECT_EQ(bucketed.losses, whole.losses);
      EXPECT_EQ(bucketed.norms, whole.norms);
      ASSERT_EQ(bucketed.weights.size(), whole.weights.size());
      int64_t differing = 0;
      for (size_t i = 0; i < whole.weights.size(); ++i) {
        if (bucketed.weights[i] != whole.weights[i] && ++differing <= 5) {
          ADD_FAILURE() << "weight " << i << " (" << ParameterOf(whole, i)
                        << "): " << bucketed.weights[i] << " vs "
                        << whole.weights[i];
        }
      }
      EXPECT_EQ(differing, 0);
    }
  }
}

TEST(DataParallelTest, BucketBytesBelowOneElementAreRejected) {
  ASSERT_OK_AND_ASSIGN(auto comms, CpuCommunicatorGroup::Create(1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Gpt> model,
                       Gpt::Create(*context, TinyConfig(), {2, kSeq},
                                   DType::kF32, GptHead::kFusedLoss));
  TrainerOptions options = Options(1, comms[0].get());
  for (int64_t bytes : {int64_t{0}, int64_t{3}, int64_t{-4}}) {
    options.bucket_bytes = bytes;
    EXPECT_EQ(Trainer::Create(*model, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bytes;
  }
}

// ZeRO-1 (the moments sharded, the gradients reduce-scattered, the weights
// all-gathered) against the unsharded run of the same ranks, for 1 to 4
// ranks, some of which do not divide the parameter count (padding).
TEST(DataParallelTest, ShardedOptimizerStateMatchesUnsharded) {
  const uint64_t seed = test::TestSeed();
  const int64_t count = ParameterCount();
  ASSERT_GT(count, 0);
  EXPECT_TRUE(count % 3 != 0 || count % 4 != 0)
      << count << " parameters: no rank count pads";
  const std::vector<int32_t> tokens = Tokens(4096, seed + 1);
  ASSERT_OK_AND_ASSIGN(
      data::Batcher batcher,
      data::Batcher::Create(tokens, kGlobalBatch, kSeq, seed + 2));
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(testing::Message()
                 << world << " ranks, " << count << " parameters");
    RunSpec spec;
    const RunResult unsharded = RunRanks(batcher, spec, seed, world);
    spec.shard_optimizer_state = true;
    const RunResult sharded = RunRanks(batcher, spec, seed, world);
    ExpectWithinRounding(sharded, unsharded);
    for (size_t step = 0; step < unsharded.norms.size(); ++step) {
      EXPECT_NEAR(sharded.norms[step], unsharded.norms[step],
                  1e-6 * std::abs(unsharded.norms[step]));
    }
  }
}

// A checkpoint written by 2 ranks (rank 0 writes; with ZeRO-1 the moments
// gathered) resumed by 1, 2 and 3 ranks, sharded or not, gives the losses
// and weights of a 2-rank run that never stopped, to fp32 rounding.
TEST(DataParallelTest, ResumesWithAnotherNumberOfRanks) {
  const uint64_t seed = test::TestSeed();
  const std::vector<int32_t> tokens = Tokens(4096, seed + 1);
  ASSERT_OK_AND_ASSIGN(
      data::Batcher batcher,
      data::Batcher::Create(tokens, kGlobalBatch, kSeq, seed + 2));
  constexpr int kFirst = 2;
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "ZeRO-1" : "unsharded");
    RunSpec spec;
    spec.shard_optimizer_state = sharded;
    const RunResult straight = RunRanks(batcher, spec, seed, 2);
    RunSpec first = spec;
    first.steps = kFirst;
    first.save_dir = absl::StrCat(testing::TempDir(), "/resume_",
                                  sharded ? "sharded" : "plain");
    RunRanks(batcher, first, seed, 2);
    RunResult expected = straight;
    expected.losses.erase(expected.losses.begin(),
                          expected.losses.begin() + kFirst);
    for (int world : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "resumed on " << world << " ranks");
      RunSpec rest = spec;
      rest.first_step = kFirst;
      rest.steps = kSteps - kFirst;
      rest.load_dir = first.save_dir;
      const RunResult resumed = RunRanks(batcher, rest, seed, world);
      if (world == 2) {
        // The same ranks: the bits of the run that never stopped.
        EXPECT_EQ(resumed.losses, expected.losses);
        EXPECT_TRUE(resumed.weights == expected.weights);
        continue;
      }
      // Other ranks sum in another order (see
      // ExpectDataParallelMatchesOneDevice).
      for (size_t step = 0; step < expected.losses.size(); ++step) {
        EXPECT_NEAR(resumed.losses[step], expected.losses[step],
                    1e-5 * std::abs(expected.losses[step]))
            << "step " << step;
      }
      ExpectWeightsNear(resumed, expected, world);
    }
  }
}

TEST(DataParallelTest, AFailingRankFailsTheOthers) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(auto comms,
                       CpuCommunicatorGroup::Create(2, absl::Seconds(30)));
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                         Context::Create(Device::Cpu()));
        ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model,
                         Gpt::Create(*context, TinyConfig(), {2, kSeq},
                                     DType::kF32, GptHead::kFusedLoss));
        RETURN_IF_ERROR(model->Initialize(seed));
        ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                         Trainer::Create(*model, Options(1, comms[r].get())));
        // Rank 1 passes one token too few.
        const int64_t count = 2 * kSeq - (r == 1 ? 1 : 0);
        return trainer->Step(Tokens(count, seed + 1), Tokens(count, seed + 2))
            .status();
      }();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kInvalidArgument)
      << statuses[1];
  // Aborted by rank 1, well before the group's timeout.
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kAborted) << statuses[0];
}

TEST(DataParallelTest, RankRowsSplitsInRankOrder) {
  const uint64_t seed = test::TestSeed();
  const std::vector<int32_t> global = Tokens(kGlobalBatch * kSeq, seed);
  for (int world = 1; world <= 4; ++world) {
    const int64_t part = kGlobalBatch * kSeq / world;
    for (int r = 0; r < world; ++r) {
      ASSERT_OK_AND_ASSIGN(absl::Span<const int32_t> rows,
                           RankRows(global, kSeq, r, world));
      ASSERT_EQ(static_cast<int64_t>(rows.size()), part);
      for (int64_t i = 0; i < part; ++i) {
        EXPECT_EQ(rows[i], global[r * part + i]) << r << "/" << world;
      }
    }
  }
  EXPECT_EQ(RankRows(global, kSeq, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankRows(global, kSeq, -1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankRows(global, kSeq, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // 12 rows do not split into 5 ranks, nor 96 tokens into rows of 7.
  EXPECT_EQ(RankRows(global, kSeq, 0, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankRows(global, 7, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankRows(global, 0, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace graph
}  // namespace lossrt
