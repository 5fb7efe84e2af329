// One thread per rank, joined; the cause of a failure (see rank_threads.h).
#include "bench/rank_threads.h"

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "runtime/status.h"

namespace lossrt {
namespace bench {

absl::Status RunRankThreads(int ranks,
                            const std::function<absl::Status(int rank)>& fn) {
  if (ranks < 1) {
    return InvalidArgument("RunRankThreads: ranks must be >= 1, got ", ranks);
  }
  std::vector<absl::Status> results(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&fn, &results, rank] { results[rank] = fn(rank); });
  }
  for (std::thread& thread : threads) thread.join();
  // Another rank's abort is an echo of the cause, not the cause.
  for (const absl::Status& status : results) {
    if (!status.ok() && !absl::IsAborted(status)) return status;
  }
  for (const absl::Status& status : results) RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

}  // namespace bench
}  // namespace lossrt
