// The socket helpers: poll-bounded reads, writes, connects and listens.
#include "runtime/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace lossrt {
namespace net {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Deadline DeadlineAfter(absl::Duration timeout) {
  return Clock::now() + absl::ToChronoNanoseconds(timeout);
}

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(
        absl::StrCat("socket: fcntl O_NONBLOCK: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// Waits until `fd` has `events` or the deadline passes (false then).
absl::StatusOr<bool> WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() < 0) return false;
    pollfd entry{fd, events, 0};
    const int ready =
        poll(&entry, 1,
             static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("socket: poll: ", ErrnoText(errno)));
    }
  }
}

// Reads exactly `bytes`: Unavailable when the peer closes or fails first,
// DeadlineExceeded at the deadline; `what` names the exchange.
absl::Status ReadFull(int fd, void* data, size_t bytes, Deadline deadline,
                      absl::string_view what) {
  char* at = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = recv(fd, at + done, bytes - done, 0);
    if (got > 0) {
      done += got;
      continue;
    }
    if (got == 0) {
      return absl::UnavailableError(
          absl::StrCat(what, ": the peer closed the connection after ", done,
                       " of ", bytes, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat(what, ": recv: ", ErrnoText(errno)));
    }
    ASSIGN_OR_RETURN(const bool ready, WaitFor(fd, POLLIN, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": timed out after ", done, " of ", bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* data, size_t bytes,
                       Deadline deadline, absl::string_view what) {
  const char* at = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    // MSG_NOSIGNAL: a closed peer is an error here, not a SIGPIPE.
    const ssize_t sent = send(fd, at + done, bytes - done, MSG_NOSIGNAL);
    if (sent >= 0) {
      done += sent;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat(what, ": send: ", ErrnoText(errno)));
    }
    ASSIGN_OR_RETURN(const bool ready, WaitFor(fd, POLLOUT, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": timed out sending"));
    }
  }
  return absl::OkStatus();
}

void PutU32(char* at, uint32_t value) {
  const uint32_t big = htonl(value);
  std::memcpy(at, &big, 4);
}
uint32_t GetU32(const char* at) {
  uint32_t big;
  std::memcpy(&big, at, 4);
  return ntohl(big);
}
void PutU64(char* at, uint64_t value) {
  PutU32(at, static_cast<uint32_t>(value >> 32));
  PutU32(at + 4, static_cast<uint32_t>(value));
}
uint64_t GetU64(const char* at) {
  return (uint64_t{GetU32(at)} << 32) | GetU32(at + 4);
}

int TryConnect(const std::string& host, int port_number, Deadline deadline,
               std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(port_number);
  const int resolved = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (resolved != 0) {
    *error =
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(resolved));
    return -1;
  }
  int connected = -1;
  for (addrinfo* entry = found; entry != nullptr && connected < 0;
       entry = entry->ai_next) {
    ScopedFd fd(socket(entry->ai_family, entry->ai_socktype | SOCK_CLOEXEC,
                       entry->ai_protocol));
    if (fd.get() < 0 || !SetNonBlocking(fd.get()).ok()) {
      *error = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    if (connect(fd.get(), entry->ai_addr, entry->ai_addrlen) == 0) {
      connected = fd.release();
      break;
    }
    if (errno != EINPROGRESS) {
      *error = ErrnoText(errno);
      continue;
    }
    // At most a second per attempt, so that a lost SYN is retried.
    const Deadline attempt =
        std::min(deadline, Clock::now() + std::chrono::seconds(1));
    absl::StatusOr<bool> ready = WaitFor(fd.get(), POLLOUT, attempt);
    int so_error = 0;
    socklen_t length = sizeof(so_error);
    if (!ready.ok() || !*ready) {
      *error = "connect timed out";
    } else if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &length) !=
                   0 ||
               so_error != 0) {
      *error = ErrnoText(so_error != 0 ? so_error : errno);
    } else {
      connected = fd.release();
    }
  }
  freeaddrinfo(found);
  return connected;
}

absl::StatusOr<Listener> ListenTcp(int port, int backlog,
                                   absl::string_view what) {
  if (port < 0 || port > 65535) {
    return InvalidArgument(what, ": port ", port, " is not in [0, 65535]");
  }
  ScopedFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return absl::InternalError(
        absl::StrCat(what, ": socket: ", ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on port ",
                                               port, ": ", ErrnoText(errno)));
  }
  if (listen(fd.get(), std::min(backlog, SOMAXCONN)) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": listen: ", ErrnoText(errno)));
  }
  RETURN_IF_ERROR(SetNonBlocking(fd.get()));
  socklen_t length = sizeof(addr);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    return absl::InternalError(
        absl::StrCat(what, ": getsockname: ", ErrnoText(errno)));
  }
  Listener listener;
  listener.fd = std::move(fd);
  listener.port = ntohs(addr.sin_port);
  return listener;
}

}  // namespace net
}  // namespace lossrt
