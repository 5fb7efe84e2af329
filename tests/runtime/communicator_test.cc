// Tests of runtime/communicator.h through the CPU backend
// (runtime/cpu_communicator.h): every collective for world sizes 1 to 4 and
// every dtype, checked element by element against a reference in rank order
// and bitwise across ranks, in place and out of place; the missing-rank
// timeout, Abort, mismatched calls, and bad arguments, which are rejected with
// InvalidArgument before anything is written.
#include "runtime/communicator.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/cpu_communicator.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/tensor_image.h"

namespace lossrt {
namespace {

using test::Bytes;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                             DType::kF64, DType::kI32,  DType::kI64};

std::unique_ptr<Context> CpuContext() {
  absl::StatusOr<std::unique_ptr<Context>> context =
      Context::Create(Device::Cpu());
  EXPECT_TRUE(context.ok()) << context.status();
  return context.ok() ? *std::move(context) : nullptr;
}

std::vector<std::unique_ptr<Communicator>> MakeGroup(
    int world_size, absl::Duration timeout = absl::Seconds(20)) {
  auto group = CpuCommunicatorGroup::Create(world_size, timeout);
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *std::move(group)
                    : std::vector<std::unique_ptr<Communicator>>();
}

// Runs body(rank) on one thread per rank and joins them.
void OnEveryRank(int world_size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  for (std::thread& thread : threads) thread.join();
}

Bytes Image(DType dtype, int64_t elements) {
  return Bytes(static_cast<size_t>(elements * DTypeSize(dtype)));
}

Tensor View(Bytes& image, DType dtype, std::initializer_list<int64_t> shape) {
  return Tensor::Of(image.data(), dtype, shape, Device::Cpu());
}

// Random values exact in `dtype`: integers for the integer types, values in
// [-4, 4) rounded to the dtype for the floats.
Bytes RandomImage(DType dtype, int64_t elements, std::mt19937_64& rng) {
  Bytes image = Image(dtype, elements);
  std::uniform_real_distribution<double> real(-4.0, 4.0);
  std::uniform_int_distribution<int64_t> integer(-100000, 100000);
  for (int64_t i = 0; i < elements; ++i) {
    test::Store(
        dtype, image, i,
        IsFloating(dtype) ? real(rng) : static_cast<double>(integer(rng)));
  }
  return image;
}

// The expected reduction of element i over the ranks' images (offset into
// each image): the sum in rank order in the dtype itself for f32, f64 and the
// integers (exact bits), or in f32 rounded once for bf16 and f16; the max.
double ExpectedReduction(DType dtype, ReduceOp op,
                         const std::vector<Bytes>& ins, int64_t i) {
  if (op == ReduceOp::kMax) {
    double best = test::Load(dtype, ins[0], i);
    for (const Bytes& in : ins) best = std::max(best, test::Load(dtype, in, i));
    return best;
  }
  if (dtype == DType::kF64 || dtype == DType::kI32 || dtype == DType::kI64) {
    // Integers here stay far below 2^53: the double sum is exact.
    double sum = 0;
    for (const Bytes& in : ins) sum += test::Load(dtype, in, i);
    return sum;
  }
  float sum = static_cast<float>(test::Load(dtype, ins[0], i));
  for (size_t r = 1; r < ins.size(); ++r) {
    sum += static_cast<float>(test::Load(dtype, ins[r], i));
  }
  Bytes rounded = Image(dtype, 1);
  test::Store(dtype, rounded, 0, sum);
  return test::Load(dtype, rounded, 0);
}

// Checks element i of `got` against the rank-order reduction and a double
// reference (the half-precision sums to their rounding).
void ExpectReduced(DType dtype, ReduceOp op, const std::vector<Bytes>& ins,
                   int64_t in_index, const Bytes& got, int64_t out_index,
                   const std::string& where) {
  const double value = test::Load(dtype, got, out_index);
  EXPECT_EQ(value, ExpectedReduction(dtype, op, ins, in_index))
      << where << " element " << out_index;
  if (op == ReduceOp::kSum) {
    double exact = 0, magnitude = 0;
    for (const Bytes& in : ins) {
      exact += test::Load(dtype, in, in_index);
      magnitude += std::fabs(test::Load(dtype, in, in_index));
    }
    const double epsilon = dtype == DType::kBF16  ? 1.0 / 128
                           : dtype == DType::kF16 ? 1.0 / 1024
                           : dtype == DType::kF32 ? 1e-6
                                                  : 1e-15;
    EXPECT_NEAR(value, exact, epsilon * (magnitude + 1e-30))
        << where << " element " << out_index;
  }
}

struct Sizes {
  int64_t rows;
  int64_t cols;
};

Sizes RandomSizes(std::mt19937_64& rng) {
  // Zero rows now and then: empty collectives must work too.
  const int64_t rows = std::uniform_int_distribution<int64_t>(0, 9)(rng);
  return {rows, std::uniform_int_distribution<int64_t>(1, 40)(rng)};
}

TEST(CpuCommunicatorTest, RanksAndWorldSize) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = MakeGroup(world);
    ASSERT_EQ(comms.size(), world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(comms[r]->rank(), r);
      EXPECT_EQ(comms[r]->world_size(), world);
    }
  }
}

TEST(CpuCommunicatorTest, CreateRejectsBadGroups) {
  for (int world : {0, -1}) {
    const absl::Status status = CpuCommunicatorGroup::Create(world).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("world_size"), absl::string_view::npos);
  }
  const absl::Status status =
      CpuCommunicatorGroup::Create(2, absl::ZeroDuration()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("timeout"), absl::string_view::npos);
}

TEST(CpuCommunicatorTest, AllReduceMatchesRankOrderReference) {
  std::mt19937_64 rng(test::TestSeed());
  for (int world : {1, 2, 3, 4}) {
    for (DType dtype : kDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (bool in_place : {false, true}) {
          const Sizes sizes = RandomSizes(rng);
          const int64_t n = sizes.rows * sizes.cols;
          std::vector<Bytes> ins(world), outs(world);
          for (int r = 0; r < world; ++r) {
            ins[r] = RandomImage(dtype, n, rng);
            outs[r] = in_place ? ins[r] : Image(dtype, n);
            if (!in_place) test::Poison(dtype, outs[r]);
          }
          auto comms = MakeGroup(world);
          std::vector<absl::Status> results(world);
          OnEveryRank(world, [&](int r) {
            auto context = CpuContext();
            const Tensor out = View(outs[r], dtype, {sizes.rows, sizes.cols});
            const Tensor in =
                in_place ? out : View(ins[r], dtype, {sizes.rows, sizes.cols});
            results[r] = comms[r]->AllReduce(in, out, op, *context);
          });
          const std::string where =
              absl::StrCat("world ", world, " ", DTypeName(dtype), " ",
                           ReduceOpName(op), in_place ? " in place" : "");
          for (int r = 0; r < world; ++r) {
            ASSERT_TRUE(results[r].ok()) << where << ": " << results[r];
            EXPECT_EQ(outs[r], outs[0]) << where << ": rank " << r;
          }
          for (int64_t i = 0; i < n; ++i) {
            ExpectReduced(dtype, op, ins, i, outs[0], i, where);
          }
        }
      }
    }
  }
}

TEST(CpuCommunicatorTest, ReduceScatterMatchesRankOrderReference) {
  std::mt19937_64 rng(test::TestSeed());
  for (int world : {1, 2, 3, 4}) {
    for (DType dtype : kDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const Sizes sizes = RandomSizes(rng);
        const int64_t n = sizes.rows * sizes.cols;
        std::vector<Bytes> ins(world), outs(world);
        for (int r = 0; r < world; ++r) {
          ins[r] = RandomImage(dtype, world * n, rng);
          outs[r] = Image(dtype, n);
          test::Poison(dtype, outs[r]);
        }
        auto comms = MakeGroup(world);
        std::vector<absl::Status> results(world);
        OnEveryRank(world, [&](int r) {
          auto context = CpuContext();
          results[r] = comms[r]->ReduceScatter(
              View(ins[r], dtype, {world * sizes.rows, sizes.cols}),
              View(outs[r], dtype, {sizes.rows, sizes.cols}), op, *context);
        });
        for (int r = 0; r < world; ++r) {
          const std::string where =
              absl::StrCat("world ", world, " ", DTypeName(dtype), " ",
                           ReduceOpName(op), " rank ", r);
          ASSERT_TRUE(results[r].ok()) << where << ": " << results[r];
          for (int64_t i = 0; i < n; ++i) {
            ExpectReduced(dtype, op, ins, r * n + i, outs[r], i, where);
          }
        }
      }
    }
  }
}

TEST(CpuCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  std::mt19937_64 rng(test::TestSeed());
  for (int world : {1, 2, 3, 4}) {
    for (DType dtype : kDTypes) {
      const Sizes sizes = RandomSizes(rng);
      const int64_t n = sizes.rows * sizes.cols;
      std::vector<Bytes> ins(world), outs(world);
      for (int r = 0; r < world; ++r) {
        ins[r] = RandomImage(dtype, n, rng);
        outs[r] = Image(dtype, world * n);
        test::Poison(dtype, outs[r]);
      }
      auto comms = MakeGroup(world);
      std::vector<absl::Status> results(world);
      OnEveryRank(world, [&](int r) {
        auto context = CpuContext();
        results[r] = comms[r]->AllGather(
            View(ins[r], dtype, {sizes.rows, sizes.cols}),
            View(outs[r], dtype, {world * sizes.rows, sizes.cols}), *context);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(results[r].ok()) << results[r];
        Bytes expected;
        for (const Bytes& in : ins) {
          expected.insert(expected.end(), in.begin(), in.end());
        }
        EXPECT_EQ(outs[r], expected)
            << "world " << world << " " << DTypeName(dtype) << " rank " << r;
      }
    }
  }
}

TEST(CpuCommunicatorTest, BroadcastCopiesTheRootsInput) {
  std::mt19937_64 rng(test::TestSeed());
  for (int world : {1, 2, 3, 4}) {
    for (DType dtype : kDTypes) {
      for (bool in_place : {false, true}) {
        const int root = std::uniform_int_distribution<int>(0, world - 1)(rng);
        const Sizes sizes = RandomSizes(rng);
        const int64_t n = sizes.rows * sizes.cols;
        std::vector<Bytes> ins(world), outs(world);
        for (int r = 0; r < world; ++r) {
          ins[r] = RandomImage(dtype, n, rng);
          outs[r] = in_place ? ins[r] : Image(dtype, n);
          if (!in_place) test::Poison(dtype, outs[r]);
        }
        const Bytes expected = ins[root];
        auto comms = MakeGroup(world);
        std::vector<absl::Status> results(world);
        OnEveryRank(world, [&](int r) {
          auto context = CpuContext();
          const Tensor out = View(outs[r], dtype, {sizes.rows, sizes.cols});
          const Tensor in =
              in_place ? out : View(ins[r], dtype, {sizes.rows, sizes.cols});
          results[r] = comms[r]->Broadcast(in, out, root, *context);
        });
        for (int r = 0; r < world; ++r) {
          ASSERT_TRUE(results[r].ok()) << results[r];
          EXPECT_EQ(outs[r], expected)
              << "world " << world << " " << DTypeName(dtype) << " root "
              << root << " rank " << r;
        }
      }
    }
  }
}

// Many collectives back to back on one group, each rank checking its results:
// the rendezvous must keep rounds apart.
TEST(CpuCommunicatorTest, ManyRoundsOnOneGroup) {
  const uint64_t seed = test::TestSeed();
  constexpr int kWorld = 4;
  constexpr int kRounds = 200;
  auto comms = MakeGroup(kWorld);
  std::vector<int> failures(kWorld, 0);
  OnEveryRank(kWorld, [&](int r) {
    auto context = CpuContext();
    for (int round = 0; round < kRounds; ++round) {
      // Every rank draws every rank's value from the round's seed: each knows
      // the sum.
      std::mt19937_64 rng(seed + round);
      int64_t values[kWorld], sum = 0;
      for (int64_t& value : values) {
        value = std::uniform_int_distribution<int64_t>(-1000, 1000)(rng);
        sum += value;
      }
      int64_t value = values[r];
      Tensor tensor = Tensor::Of(&value, DType::kI64, {1}, Device::Cpu());
      if (!comms[r]->AllReduce(tensor, tensor, ReduceOp::kSum, *context).ok() ||
          value != sum) {
        ++failures[r];
      }
    }
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

TEST(CpuCommunicatorTest, MissingRankTimesOutOnEveryOtherRank) {
  constexpr int kWorld = 3;
  auto comms = MakeGroup(kWorld, absl::Milliseconds(200));
  std::vector<absl::Status> results(kWorld);
  std::vector<double> seconds(kWorld);
  std::vector<float> values(kWorld, 1.0f);
  OnEveryRank(kWorld - 1, [&](int r) {  // rank 2 never calls
    auto context = CpuContext();
    const auto start = std::chrono::steady_clock::now();
    Tensor tensor = Tensor::Of(&values[r], DType::kF32, {1}, Device::Cpu());
    results[r] = comms[r]->AllReduce(tensor, tensor, ReduceOp::kSum, *context);
    seconds[r] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  });
  for (int r = 0; r < kWorld - 1; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kDeadlineExceeded)
        << results[r];
    EXPECT_NE(results[r].message().find("rank(s) 2"), absl::string_view::npos)
        << results[r];
    EXPECT_LT(seconds[r], 5.0);
    EXPECT_EQ(values[r], 1.0f);  // untouched
  }
  // The group is broken: the late rank fails at once, as do later calls.
  auto context = CpuContext();
  Tensor tensor = Tensor::Of(&values[2], DType::kF32, {1}, Device::Cpu());
  const absl::Status late =
      comms[2]->AllReduce(tensor, tensor, ReduceOp::kSum, *context);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
}

TEST(CpuCommunicatorTest, AbortFailsTheOtherRanks) {
  constexpr int kWorld = 3;
  // A long timeout: only the abort can end the waits early.
  auto comms = MakeGroup(kWorld, absl::Seconds(60));
  std::vector<absl::Status> results(kWorld);
  std::vector<double> seconds(kWorld);
  std::vector<float> values(kWorld, 1.0f);
  OnEveryRank(kWorld, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      results[r] = comms[r]->Abort("out of memory");
      return;
    }
    auto context = CpuContext();
    const auto start = std::chrono::steady_clock::now();
    Tensor tensor = Tensor::Of(&values[r], DType::kF32, {1}, Device::Cpu());
    results[r] = comms[r]->AllReduce(tensor, tensor, ReduceOp::kSum, *context);
    seconds[r] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  });
  EXPECT_TRUE(results[2].ok()) << results[2];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kAborted) << results[r];
    EXPECT_NE(results[r].message().find("rank 2"), absl::string_view::npos)
        << results[r];
    EXPECT_NE(results[r].message().find("out of memory"),
              absl::string_view::npos)
        << results[r];
    EXPECT_LT(seconds[r], 5.0);
    EXPECT_EQ(values[r], 1.0f);
  }
  auto context = CpuContext();
  Tensor tensor = Tensor::Of(&values[2], DType::kF32, {1}, Device::Cpu());
  EXPECT_EQ(
      comms[2]->AllReduce(tensor, tensor, ReduceOp::kSum, *context).code(),
      absl::StatusCode::kAborted);
  EXPECT_TRUE(comms[2]->Abort("again").ok());
}

TEST(CpuCommunicatorTest, MismatchedCallsFailOnEveryRankAndWriteNothing) {
  constexpr int kWorld = 2;
  auto comms = MakeGroup(kWorld);
  std::vector<Bytes> ins(kWorld, Image(DType::kF32, 4));
  std::vector<Bytes> outs(kWorld, Image(DType::kF32, 8));
  for (Bytes& out : outs) test::Poison(DType::kF32, out);
  std::vector<absl::Status> results(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    auto context = CpuContext();
    const Tensor in = View(ins[r], DType::kF32, {4});
    if (r == 0) {
      results[r] = comms[r]->AllReduce(in, View(outs[r], DType::kF32, {4}),
                                       ReduceOp::kSum, *context);
    } else {
      results[r] =
          comms[r]->AllGather(in, View(outs[r], DType::kF32, {8}), *context);
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
        << results[r];
    EXPECT_NE(results[r].message().find("AllGather"), absl::string_view::npos)
        << results[r];
    for (int64_t i = 0; i < 8; ++i) {
      EXPECT_TRUE(test::IsPoison(DType::kF32, outs[r], i)) << i;
    }
  }
}

// One rank's bad arguments: it gets its InvalidArgument, the other ranks one
// naming it, nothing is written anywhere, and the group stays usable.
TEST(CpuCommunicatorTest, BadArgumentsOnOneRankFailEveryRank) {
  constexpr int kWorld = 3;
  auto comms = MakeGroup(kWorld);
  std::vector<Bytes> ins(kWorld, Image(DType::kF32, 6));
  std::vector<Bytes> outs(kWorld, Image(DType::kF32, 6));
  for (Bytes& out : outs) test::Poison(DType::kF32, out);
  std::vector<absl::Status> results(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    auto context = CpuContext();
    const Tensor in = View(ins[r], DType::kF32, {2, 3});
    const Tensor out = r == 1 ? View(outs[r], DType::kF32, {3, 2})
                              : View(outs[r], DType::kF32, {2, 3});
    results[r] = comms[r]->AllReduce(in, out, ReduceOp::kSum, *context);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
        << results[r];
    if (r != 1) {
      EXPECT_NE(results[r].message().find("rank 1"), absl::string_view::npos)
          << results[r];
    }
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_TRUE(test::IsPoison(DType::kF32, outs[r], i)) << i;
    }
  }
  std::vector<absl::Status> after(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    auto context = CpuContext();
    after[r] = comms[r]->AllReduce(View(ins[r], DType::kF32, {2, 3}),
                                   View(outs[r], DType::kF32, {2, 3}),
                                   ReduceOp::kMax, *context);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(after[r].ok()) << after[r];
}

// A single rank's checks, one bad argument at a time: InvalidArgument naming
// the problem, output untouched.
TEST(CpuCommunicatorTest, RejectsBadArgumentsWritingNothing) {
  auto comms = MakeGroup(2);
  Communicator& comm = *comms[0];
  auto context = CpuContext();
  Bytes in_image = Image(DType::kF32, 24);
  Bytes out_image = Image(DType::kF32, 24);
  test::Poison(DType::kF32, out_image);
  const Bytes poisoned = out_image;
  float* in_data = reinterpret_cast<float*>(in_image.data());
  float* out_data = reinterpret_cast<float*>(out_image.data());
  const Device cpu = Device::Cpu();
  auto f32 = [&](float* data, std::initializer_list<int64_t> shape) {
    return Tensor::Of(data, DType::kF32, shape, cpu);
  };
  struct Case {
    std::string name;
    std::function<absl::Status()> call;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"shape mismatch",
       [&] {
         return comm.AllReduce(f32(in_data, {4}), f32(out_data, {5}),
                               ReduceOp::kSum, *context);
       },
       "shape"},
      {"dtype mismatch",
       [&] {
         return comm.AllReduce(f32(in_data, {4}),
                               Tensor::Of(out_data, DType::kI32, {4}, cpu),
                               ReduceOp::kSum, *context);
       },
       "i32"},
      {"device",
       [&] {
         return comm.AllReduce(
             Tensor::Of(in_data, DType::kF32, {4}, Device::Cuda(0)),
             f32(out_data, {4}), ReduceOp::kSum, *context);
       },
       "cuda:0"},
      {"strided",
       [&] {
         return comm.AllReduce(
             f32(in_data, {2, 3}),
             Tensor::Of(out_data, DType::kF32, {2, 3}, cpu, 4), ReduceOp::kSum,
             *context);
       },
       "contiguous"},
      {"no data",
       [&] {
         return comm.AllReduce(f32(nullptr, {4}), f32(out_data, {4}),
                               ReduceOp::kSum, *context);
       },
       "no data"},
      {"partial overlap",
       [&] {
         return comm.AllReduce(f32(out_data, {4}), f32(out_data + 1, {4}),
                               ReduceOp::kSum, *context);
       },
       "overlaps"},
      {"reduce-scatter rows",
       [&] {
         return comm.ReduceScatter(f32(in_data, {5, 2}), f32(out_data, {2, 2}),
                                   ReduceOp::kSum, *context);
       },
       "world size 2"},
      {"reduce-scatter cols",
       [&] {
         return comm.ReduceScatter(f32(in_data, {4, 2}), f32(out_data, {2, 3}),
                                   ReduceOp::kSum, *context);
       },
       "ReduceScatter"},
      {"reduce-scatter scalar",
       [&] {
         return comm.ReduceScatter(f32(in_data, {}), f32(out_data, {}),
                                   ReduceOp::kSum, *context);
       },
       "rank >= 1"},
      {"reduce-scatter in place",
       [&] {
         return comm.ReduceScatter(f32(out_data, {4}), f32(out_data, {2}),
                                   ReduceOp::kSum, *context);
       },
       "overlaps"},
      {"all-gather rows",
       [&] {
         return comm.AllGather(f32(in_data, {2, 2}), f32(out_data, {2, 2}),
                               *context);
       },
       "AllGather"},
      {"all-gather overlap",
       [&] {
         return comm.AllGather(f32(out_data, {2}), f32(out_data, {4}),
                               *context);
       },
       "overlaps"},
      {"broadcast root",
       [&] {
         return comm.Broadcast(f32(in_data, {4}), f32(out_data, {4}), 2,
                               *context);
       },
       "root 2"},
      {"broadcast negative root",
       [&] {
         return comm.Broadcast(f32(in_data, {4}), f32(out_data, {4}), -1,
                               *context);
       },
       "root -1"},
  };
  for (const Case& c : cases) {
    // Rank 1 makes a valid call, so that the rendezvous completes.
    absl::Status other;
    std::thread rank1([&] {
      auto context1 = CpuContext();
      float value[4] = {0, 0, 0, 0};
      other = comms[1]->AllReduce(f32(value, {4}), f32(value, {4}),
                                  ReduceOp::kSum, *context1);
    });
    const absl::Status status = c.call();
    rank1.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << status;
    EXPECT_NE(status.message().find(c.message), absl::string_view::npos)
        << c.name << ": " << status;
    EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << other;
    EXPECT_EQ(out_image, poisoned) << c.name;
  }
}

TEST(CpuCommunicatorTest, RejectsAGpuContext) {
  if (!test::GpuUnavailableReason().empty()) {
    GTEST_SKIP() << test::GpuUnavailableReason();
  }
  auto comms = MakeGroup(1);
  auto context = Context::Create(Device::Cuda(0));
  ASSERT_TRUE(context.ok()) << context.status();
  float value = 1;
  Tensor tensor = Tensor::Of(&value, DType::kF32, {1}, Device::Cuda(0));
  const absl::Status status =
      comms[0]->AllReduce(tensor, tensor, ReduceOp::kSum, **context);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("CPU context"), absl::string_view::npos);
}

}  // namespace
}  // namespace lossrt
