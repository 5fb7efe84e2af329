// NcclCommunicator: the NCCL backend of Communicator, one per GPU rank (one
// process or thread per GPU). Rank 0 makes a unique id (NewUniqueId), every
// rank gets it (runtime/coordinator.h does that across processes and hosts)
// and joins with Create on the context whose device and stream it will use.
// Collectives are queued on the Context's stream.
//
//   ASSIGN_OR_RETURN(std::string id, rank == 0 ?
//   NcclCommunicator::NewUniqueId()
//                                              : ...);  // shared by rank 0
//   ASSIGN_OR_RETURN(auto comm,
//                    NcclCommunicator::Create(id, rank, world_size, *context));
//   RETURN_IF_ERROR(comm->AllReduce(grad, grad, ReduceOp::kSum, *context));
//
// The communicator runs in NCCL's non-blocking mode so that nothing waits
// forever on the host: Create and each call's enqueueing give up with
// DeadlineExceeded after `timeout` (the collective itself, on the stream, is
// not bounded). A failed peer shows up as an error of a later call (NCCL
// reports it asynchronously); Abort() tears this rank's communicator down, and
// the other ranks must abort theirs on their own errors or timeouts.
//
// Built without NCCL (no CUDA toolkit, or one without NCCL), NewUniqueId and
// Create fail with Unimplemented.
#ifndef LOSSRT_RUNTIME_NCCL_COMMUNICATOR_H_
#define LOSSRT_RUNTIME_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/device.h"

namespace lossrt {

class NcclCommunicator : public Communicator {
 public:
  // Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
  static constexpr int kUniqueIdBytes = 128;
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(300);

  // Whether this build has the NCCL backend.
  static bool Available();

  // A fresh unique id (kUniqueIdBytes bytes) for rank 0 to share.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins the group `unique_id` as `rank` of `world_size` on the context's
  // GPU; returns once every rank has joined (or after `timeout`).
  // InvalidArgument for a CPU context, a rank outside [0, world_size) or an id
  // of the wrong size.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      absl::string_view unique_id, int rank, int world_size, Context& context,
      absl::Duration timeout = kDefaultTimeout);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  // NCCL's collectives are stream-ordered and may be captured.
  bool capturable() const override { return true; }
  const Device& device() const { return device_; }

  // f32, bf16, f16, f64, i32 and i64; the context must be on device().
  absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op,
                         Context& context) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                             Context& context) override;
  absl::Status AllGather(const Tensor& in, const Tensor& out,
                         Context& context) override;
  absl::Status Broadcast(const Tensor& in, const Tensor& out, int root,
                         Context& context) override;
  // ncclCommAbort: later calls fail with Aborted.
  absl::Status Abort(absl::string_view reason) override;

 private:
  NcclCommunicator(void* comm, int rank, int world_size, Device device,
                   absl::Duration timeout);
  // Checks the arguments and that the communicator is usable on `context`.
  absl::Status Prepare(CollectiveKind kind, const Tensor& in, const Tensor& out,
                       int root, const Context& context) const;
  // Waits, up to the timeout, while NCCL's last call on the communicator is
  // in progress; its error, if any, as a Status naming `call` and `line`.
  absl::Status Settle(int result, const char* call, int line);

  void* comm_;  // ncclComm_t; null once aborted
  const int rank_;
  const int world_size_;
  const Device device_;
  const absl::Duration timeout_;
  absl::Status aborted_;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_NCCL_COMMUNICATOR_H_
