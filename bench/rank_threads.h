// RunRankThreads: one thread per data-parallel rank in one process (the
// pattern of examples/train_lm's --ranks / --gpus), joined, with one Status
// back: the cause of a failure rather than its echoes. A rank that fails is
// expected to abort its communicator, so that the others fail with Aborted
// instead of waiting for it; the cause is then the first rank's error that is
// not Aborted.
//
//   RETURN_IF_ERROR(RunRankThreads(gpus, [&](int rank) -> absl::Status {
//     ...  // this rank's Context, communicator, model and trainer
//   }));
#ifndef LOSSRT_BENCH_RANK_THREADS_H_
#define LOSSRT_BENCH_RANK_THREADS_H_

#include <functional>

#include "absl/status/status.h"

namespace lossrt {
namespace bench {

// Runs fn(rank) for every rank in [0, ranks) on a thread of its own and waits
// for all of them. OK when every rank is; else the first rank's error (in rank
// order) that is not Aborted, else the first error. InvalidArgument when
// ranks < 1 (nothing runs).
absl::Status RunRankThreads(int ranks,
                            const std::function<absl::Status(int rank)>& fn);

}  // namespace bench
}  // namespace lossrt

#endif  // LOSSRT_BENCH_RANK_THREADS_H_
