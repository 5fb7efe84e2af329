// The in-process CPU backend of Communicator: a group of world_size
// communicators, one per rank, each meant to be driven by its own thread.
// Collectives meet at a rendezvous (a mutex and a condition variable); the
// last rank to arrive computes the result in rank order, so every rank gets
// the same bits: a sum is ((in_0 + in_1) + in_2) + ..., accumulated in the
// dtype itself for f32, f64 and the integers (which wrap) and in f32 for
// bf16 and f16, which are rounded once at the end.
//
// Failures never hang: a rank that waits longer than the group's timeout for
// the others fails with DeadlineExceeded and breaks the group, so that every
// rank's pending and later collectives fail with that error; Abort() breaks it
// the same way with an Aborted error naming the rank and its reason. A rank
// whose arguments are bad still takes part in the rendezvous: it gets its
// InvalidArgument and the other ranks an InvalidArgument naming it, no rank
// writes anything, and the group stays usable.
//
//   ASSIGN_OR_RETURN(auto comms, lossrt::CpuCommunicatorGroup::Create(4));
//   // Thread r: comms[r]->AllReduce(in_r, out_r, ReduceOp::kSum, *ctx_r);
#ifndef LOSSRT_RUNTIME_CPU_COMMUNICATOR_H_
#define LOSSRT_RUNTIME_CPU_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/communicator.h"

namespace lossrt {

class CpuCommunicatorGroup {
 public:
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(60);

  // One communicator per rank (index = rank) sharing a rendezvous; the group
  // lives until the last of them is destroyed. InvalidArgument unless
  // world_size >= 1 and timeout > 0.
  static absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> Create(
      int world_size, absl::Duration timeout = kDefaultTimeout);
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CPU_COMMUNICATOR_H_
