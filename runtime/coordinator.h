// Start-up of a group of processes (on one host or several): a tiny TCP
// coordinator through which rank 0 publishes a blob, typically the 128-byte
// NCCL unique id (runtime/nccl_communicator.h), and every other rank fetches
// it. Plain POSIX sockets; every wait is bounded by a timeout.
//
//   // Every process, with --coordinator=HOST:PORT (HOST: rank 0's host):
//   ASSIGN_OR_RETURN(std::string id,
//                    lossrt::ShareBlob(flag_coordinator, rank, world_size,
//                                      rank == 0 ? fresh_id : "",
//                                      absl::Seconds(120)));
//
// Protocol (integers big-endian): a rank connects and sends "LRTC", version 1,
// its rank and the world size (u32 each); rank 0 answers "LRTC", a u32 code (0
// OK; otherwise the rank is refused) and a u64 length followed by the blob;
// the rank acknowledges with one byte. Rank 0 is done once every other rank
// has acknowledged.
#ifndef LOSSRT_RUNTIME_COORDINATOR_H_
#define LOSSRT_RUNTIME_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lossrt {

// The most bytes a blob may have (the fetching ranks allocate what rank 0
// announces).
inline constexpr int64_t kMaxCoordinatorBlobBytes = 1 << 20;

struct CoordinatorAddress {
  std::string host;  // a name or an address; IPv6 without the brackets
  int port = 0;
  std::string ToString() const;  // "host:port", "[::1]:port"
};

// "HOST:PORT" or "[IPV6]:PORT" with 1 <= PORT <= 65535; InvalidArgument
// otherwise.
absl::StatusOr<CoordinatorAddress> ParseCoordinatorAddress(
    absl::string_view text);

// Rank 0's side: a listening socket and the hand-out of the blob.
class CoordinatorServer {
 public:
  // Listens on `port` of every IPv4 interface (0: any free port; see port())
  // for the other world_size - 1 ranks.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Listen(
      int port, int world_size);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  int port() const { return port_; }

  // Hands `blob` to each of ranks 1 .. world_size - 1 and returns once every
  // one has acknowledged it. DeadlineExceeded naming the ranks that never
  // came within `timeout`; Unavailable when a rank disconnects before its
  // acknowledgement; InvalidArgument when a peer gives a bad or repeated rank
  // or another world size (that peer is told so too). Connections that do
  // not speak the protocol are dropped and ignored.
  absl::Status Serve(absl::string_view blob, absl::Duration timeout);

 private:
  CoordinatorServer(int fd, int port, int world_size)
      : fd_(fd), port_(port), world_size_(world_size) {}
  int fd_;
  int port_;
  int world_size_;
};

// Rank `rank` (1 .. world_size - 1) fetches rank 0's blob, retrying the
// connection while rank 0 is not up yet. DeadlineExceeded when rank 0 did not
// answer within `timeout`; Unavailable when it closed the connection early;
// InvalidArgument for bad arguments or when rank 0 refused this rank.
absl::StatusOr<std::string> FetchBlob(const CoordinatorAddress& address,
                                      int rank, int world_size,
                                      absl::Duration timeout);

// Both sides in one call: rank 0 listens on the address's port and serves
// `blob` (returning it), the other ranks fetch it (their `blob` is unused).
absl::StatusOr<std::string> ShareBlob(absl::string_view coordinator, int rank,
                                      int world_size, absl::string_view blob,
                                      absl::Duration timeout);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_COORDINATOR_H_
