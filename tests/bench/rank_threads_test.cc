// Tests of RunRankThreads (bench/rank_threads.h): every rank runs once on its
// own thread, all at the same time (a barrier that every rank must reach);
// the cause of a failure wins over the other ranks' Aborted echoes, in rank
// order; ranks < 1 is rejected.
#include "bench/rank_threads.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace lossrt {
namespace bench {
namespace {

TEST(RankThreadsTest, EveryRankRunsOnceConcurrently) {
  for (int ranks : {1, 2, 3, 8}) {
    std::mutex mutex;
    std::condition_variable all_here;
    int arrived = 0;
    std::vector<int> runs(ranks, 0);
    std::set<std::thread::id> threads;
    const absl::Status status =
        RunRankThreads(ranks, [&](int rank) -> absl::Status {
          std::unique_lock<std::mutex> lock(mutex);
          ++runs[rank];
          threads.insert(std::this_thread::get_id());
          ++arrived;
          all_here.notify_all();
          // Returns only once every rank has started: they run at once.
          all_here.wait(lock, [&] { return arrived == ranks; });
          return absl::OkStatus();
        });
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(runs, std::vector<int>(ranks, 1));
    EXPECT_EQ(static_cast<int>(threads.size()), ranks);
  }
}

TEST(RankThreadsTest, TheCauseWinsOverAborts) {
  const absl::Status status = RunRankThreads(4, [](int rank) -> absl::Status {
    if (rank == 2) return absl::ResourceExhaustedError("rank 2: out of memory");
    return absl::AbortedError("aborted by another rank");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

TEST(RankThreadsTest, FirstCauseInRankOrder) {
  const absl::Status status = RunRankThreads(3, [](int rank) -> absl::Status {
    if (rank == 0) return absl::OkStatus();
    return absl::InternalError(rank == 1 ? "one" : "two");
  });
  EXPECT_EQ(status.message(), "one");
}

TEST(RankThreadsTest, OnlyAbortsGiveAborted) {
  std::atomic<int> calls{0};
  const absl::Status status = RunRankThreads(2, [&](int) -> absl::Status {
    ++calls;
    return absl::AbortedError("aborted");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(calls.load(), 2);
}

TEST(RankThreadsTest, RejectsNoRanks) {
  for (int ranks : {0, -1}) {
    bool ran = false;
    const absl::Status status = RunRankThreads(ranks, [&](int) {
      ran = true;
      return absl::OkStatus();
    });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(ran);
  }
}

}  // namespace
}  // namespace bench
}  // namespace lossrt
