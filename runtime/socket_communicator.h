// SocketCommunicator: a CPU backend of Communicator across processes (on one
// host or several) over TCP, for running and testing multi-process training
// without GPUs. Correct rather than fast: rank 0 is a hub that every other
// rank connects to; in each collective every rank sends its input to rank 0,
// which reduces in rank order (the bits of CpuCommunicatorGroup) and sends
// every rank its result.
//
//   // Every process, with --coordinator=HOST:PORT (HOST: rank 0's host):
//   ASSIGN_OR_RETURN(lossrt::CoordinatorAddress address,
//                    lossrt::ParseCoordinatorAddress(flag_coordinator));
//   ASSIGN_OR_RETURN(auto comm, lossrt::SocketCommunicator::Create(
//                                   address, rank, world_size, timeout));
//   RETURN_IF_ERROR(comm->AllReduce(grad, grad, ReduceOp::kSum, *cpu_ctx));
//
// Failures never hang. Create returns once every rank has joined, or fails
// with DeadlineExceeded naming the ranks that never came within `timeout`.
// In a collective rank 0 waits at most `timeout` for each rank's input: a
// rank that never arrives gives DeadlineExceeded, one whose process died (its
// connection closed) Unavailable, one that called Abort Aborted, and rank 0
// passes that error on to every other rank. The other ranks wait at most
// `timeout` plus a second for rank 0's answer, and get Unavailable when rank
// 0's connection closes. A rank with bad arguments gets its InvalidArgument
// and the others one naming it. After any failure the communicator is broken:
// every later call fails with the first error.
#ifndef LOSSRT_RUNTIME_SOCKET_COMMUNICATOR_H_
#define LOSSRT_RUNTIME_SOCKET_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/communicator.h"
#include "runtime/coordinator.h"

namespace lossrt {

class SocketCommunicator : public Communicator {
 public:
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(60);

  // Rank 0 listens on address.port (every IPv4 interface) and the others
  // connect to address (retrying until rank 0 is up). InvalidArgument for a
  // rank outside [0, world_size), a timeout <= 0 or port 0.
  static absl::StatusOr<std::unique_ptr<SocketCommunicator>> Create(
      const CoordinatorAddress& address, int rank, int world_size,
      absl::Duration timeout = kDefaultTimeout);

  ~SocketCommunicator() override;
  SocketCommunicator(const SocketCommunicator&) = delete;
  SocketCommunicator& operator=(const SocketCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  // CPU contexts only; f32, bf16, f16, f64, i32 and i64.
  absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op,
                         Context& context) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                             Context& context) override;
  absl::Status AllGather(const Tensor& in, const Tensor& out,
                         Context& context) override;
  absl::Status Broadcast(const Tensor& in, const Tensor& out, int root,
                         Context& context) override;
  // Tells rank 0 (or, on rank 0, every rank) and closes the connections.
  absl::Status Abort(absl::string_view reason) override;

 private:
  struct Request;
  SocketCommunicator(int rank, int world_size, absl::Duration timeout,
                     std::vector<int> fds);
  absl::Status Run(CollectiveKind kind, const Tensor& in, const Tensor& out,
                   ReduceOp op, int root, Context& context);
  absl::Status RunHub(const Request& own, const Tensor& in, const Tensor& out);
  absl::Status RunPeer(const Request& own, const Tensor& in, const Tensor& out);
  // Rank 0: sends `status` to every rank still connected (but `skip`).
  void BroadcastError(const absl::Status& status, int skip);
  // Marks the communicator broken with `status` (the first one sticks),
  // closes the connections; returns the sticking status.
  absl::Status Break(const absl::Status& status);

  const int rank_;
  const int world_size_;
  const absl::Duration timeout_;
  // Rank 0: fds_[r] is rank r's connection (fds_[0] = -1); other ranks:
  // fds_[0] is the connection to rank 0.
  std::vector<int> fds_;
  absl::Status broken_;
  uint64_t sequence_ = 0;  // collectives so far
  // Rank 0: each rank's input of the current collective, and the result.
  std::vector<std::vector<unsigned char>> inputs_;
  std::vector<const void*> input_pointers_;
  std::vector<unsigned char> result_;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_SOCKET_COMMUNICATOR_H_
