// The TCP coordinator: non-blocking POSIX sockets whose every wait is a poll
// bounded by the caller's deadline.
#include "runtime/coordinator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/socket_io.h"
#include "runtime/status.h"

namespace lossrt {
namespace {

using net::Deadline;
using net::DeadlineAfter;
using net::ErrnoText;
using net::GetU32;
using net::GetU64;
using net::PutU32;
using net::PutU64;
using net::ReadFull;
using net::ScopedFd;
using net::WaitFor;
using net::WriteFull;

constexpr char kMagic[4] = {'L', 'R', 'T', 'C'};
constexpr uint32_t kVersion = 1;
constexpr int kHelloBytes = 16;  // magic, version, rank, world size
constexpr int kReplyBytes = 16;  // magic, code, u64 length
enum ReplyCode : uint32_t {
  kOk = 0,
  kBadRank = 1,
  kBadWorldSize = 2,
  kRepeatedRank = 3,
};

absl::Status CheckWorld(absl::string_view who, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument(who, ": rank ", rank, " is not in a world of ",
                           world_size);
  }
  return absl::OkStatus();
}

}  // namespace

std::string CoordinatorAddress::ToString() const {
  return host.find(':') != std::string::npos
             ? absl::StrCat("[", host, "]:", port)
             : absl::StrCat(host, ":", port);
}

absl::StatusOr<CoordinatorAddress> ParseCoordinatorAddress(
    absl::string_view text) {
  CoordinatorAddress address;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return InvalidArgument("coordinator address \"", text,
                             "\" is not [IPV6]:PORT");
    }
    address.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos ||
        text.substr(0, colon).find(':') != absl::string_view::npos) {
      return InvalidArgument("coordinator address \"", text,
                             "\" is not HOST:PORT");
    }
    address.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  int port = 0;
  if (address.host.empty() || !absl::SimpleAtoi(port_text, &port) || port < 1 ||
      port > 65535 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return InvalidArgument("coordinator address \"", text,
                           "\" needs a host and a port in [1, 65535]");
  }
  address.port = port;
  return address;
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Listen(
    int port, int world_size) {
  RETURN_IF_ERROR(CheckWorld("coordinator", 0, world_size));
  if (port < 0 || port > 65535) {
    return InvalidArgument("coordinator: port ", port, " is not in [0, 65535]");
  }
  ASSIGN_OR_RETURN(net::Listener listener,
                   net::ListenTcp(port, world_size + 16, "coordinator"));
  return std::unique_ptr<CoordinatorServer>(
      new CoordinatorServer(listener.fd.release(), listener.port, world_size));
}

CoordinatorServer::~CoordinatorServer() {
  if (fd_ >= 0) close(fd_);
}

absl::Status CoordinatorServer::Serve(absl::string_view blob,
                                      absl::Duration timeout) {
  if (static_cast<int64_t>(blob.size()) > kMaxCoordinatorBlobBytes) {
    return InvalidArgument("coordinator: the blob has ", blob.size(),
                           " bytes, more than ", kMaxCoordinatorBlobBytes);
  }
  const Deadline deadline = DeadlineAfter(timeout);
  std::set<int> served;
  while (static_cast<int>(served.size()) < world_size_ - 1) {
    ASSIGN_OR_RETURN(const bool pending, WaitFor(fd_, POLLIN, deadline));
    if (!pending) {
      std::vector<int> missing;
      for (int r = 1; r < world_size_; ++r) {
        if (served.count(r) == 0) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "coordinator on port ", port_, ": rank(s) ",
          absl::StrJoin(missing, ", "), " of ", world_size_,
          " did not fetch the blob within ", absl::FormatDuration(timeout)));
    }
    ScopedFd peer(accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (peer.get() < 0) continue;  // the peer went away already; or EINTR
    char hello[kHelloBytes];
    if (!ReadFull(peer.get(), hello, kHelloBytes, deadline, "coordinator")
             .ok() ||
        std::memcmp(hello, kMagic, 4) != 0 || GetU32(hello + 4) != kVersion) {
      continue;  // not one of ours
    }
    const int64_t rank = GetU32(hello + 8);
    const int64_t world = GetU32(hello + 12);
    char reply[kReplyBytes];
    std::memcpy(reply, kMagic, 4);
    ReplyCode code = kOk;
    absl::Status refused;
    if (world != world_size_) {
      code = kBadWorldSize;
      refused = InvalidArgument("coordinator: rank ", rank,
                                " joined with world size ", world, ", not ",
                                world_size_);
    } else if (rank < 1 || rank >= world_size_) {
      code = kBadRank;
      refused = InvalidArgument("coordinator: a peer joined as rank ", rank,
                                ", not one of 1..", world_size_ - 1);
    } else if (served.count(static_cast<int>(rank)) != 0) {
      code = kRepeatedRank;
      refused =
          InvalidArgument("coordinator: rank ", rank, " joined a second time");
    }
    PutU32(reply + 4, code);
    PutU64(reply + 8, code == kOk ? blob.size() : 0);
    const std::string what = absl::StrCat("coordinator: rank ", rank);
    absl::Status sent =
        WriteFull(peer.get(), reply, kReplyBytes, deadline, what);
    if (!refused.ok()) return refused;
    if (sent.ok()) {
      sent = WriteFull(peer.get(), blob.data(), blob.size(), deadline, what);
    }
    char ack = 0;
    if (sent.ok()) sent = ReadFull(peer.get(), &ack, 1, deadline, what);
    if (!sent.ok()) {
      return absl::Status(
          sent.code(),
          absl::StrCat(sent.message(),
                       " (it disconnected before acknowledging the blob)"));
    }
    served.insert(static_cast<int>(rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FetchBlob(const CoordinatorAddress& address,
                                      int rank, int world_size,
                                      absl::Duration timeout) {
  RETURN_IF_ERROR(CheckWorld("coordinator", rank, world_size));
  if (rank == 0) {
    return InvalidArgument(
        "coordinator: rank 0 serves the blob, it does not "
        "fetch it");
  }
  const Deadline deadline = DeadlineAfter(timeout);
  std::string error = "no attempt";
  int connected = -1;
  for (;;) {
    connected = net::TryConnect(address.host, address.port, deadline, &error);
    if (connected >= 0) break;
    const net::Clock::time_point now = net::Clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "coordinator ", address.ToString(),
          " (rank 0) did not come up within ", absl::FormatDuration(timeout),
          " (last error: ", error, ")"));
    }
    // Rank 0 may start after the others: retry.
    std::this_thread::sleep_for(std::min<net::Clock::duration>(
        std::chrono::milliseconds(50), deadline - now));
  }
  ScopedFd fd(connected);
  const std::string what =
      absl::StrCat("coordinator ", address.ToString(), " (rank 0)");
  char hello[kHelloBytes];
  std::memcpy(hello, kMagic, 4);
  PutU32(hello + 4, kVersion);
  PutU32(hello + 8, static_cast<uint32_t>(rank));
  PutU32(hello + 12, static_cast<uint32_t>(world_size));
  RETURN_IF_ERROR(WriteFull(fd.get(), hello, kHelloBytes, deadline, what));
  char reply[kReplyBytes];
  RETURN_IF_ERROR(ReadFull(fd.get(), reply, kReplyBytes, deadline, what));
  if (std::memcmp(reply, kMagic, 4) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the peer does not speak the protocol"));
  }
  const uint32_t code = GetU32(reply + 4);
  if (code != kOk) {
    return InvalidArgument(what, " refused rank ", rank, " of ", world_size,
                           code == kBadWorldSize   ? ": another world size"
                           : code == kRepeatedRank ? ": the rank came twice"
                                                   : ": a bad rank");
  }
  const uint64_t bytes = GetU64(reply + 8);
  if (bytes > static_cast<uint64_t>(kMaxCoordinatorBlobBytes)) {
    return absl::UnavailableError(
        absl::StrCat(what, " announced a blob of ", bytes, " bytes"));
  }
  std::string blob(bytes, '\0');
  RETURN_IF_ERROR(ReadFull(fd.get(), blob.data(), bytes, deadline, what));
  const char ack = 1;
  RETURN_IF_ERROR(WriteFull(fd.get(), &ack, 1, deadline, what));
  return blob;
}

absl::StatusOr<std::string> ShareBlob(absl::string_view coordinator, int rank,
                                      int world_size, absl::string_view blob,
                                      absl::Duration timeout) {
  ASSIGN_OR_RETURN(const CoordinatorAddress address,
                   ParseCoordinatorAddress(coordinator));
  RETURN_IF_ERROR(CheckWorld("coordinator", rank, world_size));
  if (rank != 0) return FetchBlob(address, rank, world_size, timeout);
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
                   CoordinatorServer::Listen(address.port, world_size));
  RETURN_IF_ERROR(server->Serve(blob, timeout));
  return std::string(blob);
}

}  // namespace lossrt
