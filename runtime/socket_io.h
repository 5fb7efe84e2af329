// Blocking-with-deadline helpers over non-blocking POSIX TCP sockets, shared
// by the coordinator (runtime/coordinator.h) and the socket communicator
// (runtime/socket_communicator.h): every wait is a poll bounded by a deadline,
// a closed or failed peer is Unavailable and a missed deadline
// DeadlineExceeded. Internal.
#ifndef LOSSRT_RUNTIME_SOCKET_IO_H_
#define LOSSRT_RUNTIME_SOCKET_IO_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lossrt {
namespace net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

Deadline DeadlineAfter(absl::Duration timeout);
std::string ErrnoText(int error);  // "strerror (errno N)"

// Closes the descriptor it owns.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() { *this = ScopedFd(); }

 private:
  int fd_;
};

absl::Status SetNonBlocking(int fd);
// Waits until `fd` has `events` (poll's) or the deadline passes (false then).
absl::StatusOr<bool> WaitFor(int fd, short events, Deadline deadline);
// Reads exactly `bytes`: Unavailable when the peer closes or fails first,
// DeadlineExceeded at the deadline; `what` names the exchange.
absl::Status ReadFull(int fd, void* data, size_t bytes, Deadline deadline,
                      absl::string_view what);
// Writes exactly `bytes` (no SIGPIPE), with ReadFull's errors.
absl::Status WriteFull(int fd, const void* data, size_t bytes,
                       Deadline deadline, absl::string_view what);

// Big-endian integers.
void PutU32(char* at, uint32_t value);
uint32_t GetU32(const char* at);
void PutU64(char* at, uint64_t value);
uint64_t GetU64(const char* at);

// One attempt to connect to any address of host:port before the deadline;
// the connected non-blocking socket, or -1 with the last error in `error`.
int TryConnect(const std::string& host, int port, Deadline deadline,
               std::string* error);

// A non-blocking socket listening on `port` of every IPv4 interface (0: any
// free port), and the port it got. `what` names the caller in errors.
struct Listener {
  ScopedFd fd;
  int port = 0;
};
absl::StatusOr<Listener> ListenTcp(int port, int backlog,
                                   absl::string_view what);

}  // namespace net
}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_SOCKET_IO_H_
