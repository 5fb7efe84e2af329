// The socket communicator: a hub at rank 0 over TCP connections with
// poll-bounded reads and writes (runtime/socket_io.h).
//
// Protocol (integers big-endian). Joining: a rank sends "LRTS", version, its
// rank and the world size (u32 each); once every rank has joined, rank 0
// answers each "LRTS", a u32 code (0: joined) and a u64 0. A collective: each
// rank sends a request, "LRTQ" and u32 kind (kAbortKind: the rank aborts, the
// payload is its reason), dtype, op, root and argument check (1: the
// arguments are good), u64 sequence number, input and output bytes, then its
// input (none from a rank with bad arguments or, in a Broadcast, from every
// rank but the root); rank 0 answers "LRTA", a u32 absl status code (0: OK)
// and a u64 length, then the rank's result (OK) or the error message.
#include "runtime/socket_communicator.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/rank_order_reduce.h"
#include "runtime/socket_io.h"
#include "runtime/status.h"

namespace lossrt {
namespace {

using net::Deadline;
using net::DeadlineAfter;
using net::GetU32;
using net::GetU64;
using net::PutU32;
using net::PutU64;
using net::ReadFull;
using net::ScopedFd;
using net::WriteFull;

constexpr char kJoinMagic[4] = {'L', 'R', 'T', 'S'};
constexpr char kRequestMagic[4] = {'L', 'R', 'T', 'Q'};
constexpr char kAnswerMagic[4] = {'L', 'R', 'T', 'A'};
constexpr uint32_t kVersion = 1;
constexpr int kJoinBytes = 16;
constexpr int kRequestBytes = 48;
constexpr int kAnswerBytes = 16;
constexpr uint32_t kAbortKind = 255;
// The longest error message or abort reason sent.
constexpr uint64_t kMaxMessageBytes = 1 << 16;
// How much longer than rank 0 the other ranks wait for an answer, so that
// rank 0's account of a missing rank usually reaches them first.
constexpr absl::Duration kAnswerGrace = absl::Seconds(1);

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string Describe(CollectiveKind kind, ReduceOp op, int root, DType dtype,
                     uint64_t in_bytes) {
  std::string text = CollectiveName(kind);
  if (kind == CollectiveKind::kAllReduce ||
      kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&text, "(", ReduceOpName(op), ")");
  } else if (kind == CollectiveKind::kBroadcast) {
    absl::StrAppend(&text, "(root ", root, ")");
  }
  absl::StrAppend(&text, " of ", in_bytes / DTypeSize(dtype), " ",
                  DTypeName(dtype), " elements");
  return text;
}

}  // namespace

// One rank's side of a collective, as sent to rank 0.
struct SocketCommunicator::Request {
  uint32_t kind = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  bool valid = true;
  uint64_t sequence = 0;
  uint64_t in_bytes = 0, out_bytes = 0;

  void Encode(char* at) const {
    std::memcpy(at, kRequestMagic, 4);
    PutU32(at + 4, kind);
    PutU32(at + 8, static_cast<uint32_t>(dtype));
    PutU32(at + 12, static_cast<uint32_t>(op));
    PutU32(at + 16, static_cast<uint32_t>(root));
    PutU32(at + 20, valid ? 1 : 0);
    PutU64(at + 24, sequence);
    PutU64(at + 32, in_bytes);
    PutU64(at + 40, out_bytes);
  }
  bool Decode(const char* at) {
    if (std::memcmp(at, kRequestMagic, 4) != 0) return false;
    kind = GetU32(at + 4);
    dtype = static_cast<DType>(GetU32(at + 8));
    op = static_cast<ReduceOp>(GetU32(at + 12));
    root = static_cast<int>(GetU32(at + 16));
    valid = GetU32(at + 20) == 1;
    sequence = GetU64(at + 24);
    in_bytes = GetU64(at + 32);
    out_bytes = GetU64(at + 40);
    return true;
  }
  bool Matches(const Request& other) const {
    const bool reduces =
        kind == static_cast<uint32_t>(CollectiveKind::kAllReduce) ||
        kind == static_cast<uint32_t>(CollectiveKind::kReduceScatter);
    return kind == other.kind && dtype == other.dtype &&
           in_bytes == other.in_bytes && out_bytes == other.out_bytes &&
           sequence == other.sequence && (!reduces || op == other.op) &&
           (kind != static_cast<uint32_t>(CollectiveKind::kBroadcast) ||
            root == other.root);
  }
  std::string Text() const {
    return Describe(static_cast<CollectiveKind>(kind), op, root, dtype,
                    in_bytes);
  }
};

absl::StatusOr<std::unique_ptr<SocketCommunicator>> SocketCommunicator::Create(
    const CoordinatorAddress& address, int rank, int world_size,
    absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument("SocketCommunicator: rank ", rank,
                           " is not in a world of ", world_size);
  }
  if (timeout <= absl::ZeroDuration()) {
    return InvalidArgument("SocketCommunicator: timeout ",
                           absl::FormatDuration(timeout), " is not positive");
  }
  if (address.port < 1 || address.port > 65535) {
    return InvalidArgument("SocketCommunicator: port ", address.port,
                           " is not in [1, 65535]");
  }
  const Deadline deadline = DeadlineAfter(timeout);
  const std::string where =
      absl::StrCat("SocketCommunicator at ", address.ToString());
  if (world_size == 1) {
    return std::unique_ptr<SocketCommunicator>(
        new SocketCommunicator(0, 1, timeout, {-1}));
  }
  if (rank == 0) {
    ASSIGN_OR_RETURN(net::Listener listener,
                     net::ListenTcp(address.port, world_size + 16, where));
    std::vector<ScopedFd> peers(world_size);
    int joined = 0;
    while (joined < world_size - 1) {
      ASSIGN_OR_RETURN(const bool pending,
                       net::WaitFor(listener.fd.get(), POLLIN, deadline));
      if (!pending) {
        std::vector<int> missing;
        for (int r = 1; r < world_size; ++r) {
          if (peers[r].get() < 0) missing.push_back(r);
        }
        return absl::DeadlineExceededError(
            absl::StrCat(where, ": rank(s) ", absl::StrJoin(missing, ", "),
                         " of ", world_size, " did not join within ",
                         absl::FormatDuration(timeout)));
      }
      ScopedFd peer(accept4(listener.fd.get(), nullptr, nullptr,
                            SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (peer.get() < 0) continue;
      char hello[kJoinBytes];
      if (!ReadFull(peer.get(), hello, kJoinBytes, deadline, where).ok() ||
          std::memcmp(hello, kJoinMagic, 4) != 0 ||
          GetU32(hello + 4) != kVersion) {
        continue;  // not one of ours
      }
      const int64_t peer_rank = GetU32(hello + 8);
      const int64_t peer_world = GetU32(hello + 12);
      if (peer_world != world_size || peer_rank < 1 ||
          peer_rank >= world_size || peers[peer_rank].get() >= 0) {
        return InvalidArgument(where, ": a peer joined as rank ", peer_rank,
                               " of ", peer_world, " (world size ", world_size,
                               peer_rank >= 1 && peer_rank < world_size &&
                                       peers[peer_rank].get() >= 0
                                   ? "; that rank joined already)"
                                   : ")");
      }
      SetNoDelay(peer.get());
      peers[peer_rank] = std::move(peer);
      ++joined;
    }
    char answer[kAnswerBytes];
    std::memcpy(answer, kJoinMagic, 4);
    PutU32(answer + 4, 0);
    PutU64(answer + 8, 0);
    std::vector<int> fds(world_size, -1);
    for (int r = 1; r < world_size; ++r) {
      RETURN_IF_ERROR(WriteFull(peers[r].get(), answer, kAnswerBytes, deadline,
                                absl::StrCat(where, ": rank ", r)));
    }
    for (int r = 1; r < world_size; ++r) fds[r] = peers[r].release();
    return std::unique_ptr<SocketCommunicator>(
        new SocketCommunicator(0, world_size, timeout, std::move(fds)));
  }
  std::string error = "no attempt";
  int connected = -1;
  for (;;) {
    connected = net::TryConnect(address.host, address.port, deadline, &error);
    if (connected >= 0) break;
    const net::Clock::time_point now = net::Clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": rank 0 did not come up within ",
          absl::FormatDuration(timeout), " (last error: ", error, ")"));
    }
    // Rank 0 may start after the others: retry.
    std::this_thread::sleep_for(std::min<net::Clock::duration>(
        std::chrono::milliseconds(50), deadline - now));
  }
  ScopedFd fd(connected);
  SetNoDelay(fd.get());
  char hello[kJoinBytes];
  std::memcpy(hello, kJoinMagic, 4);
  PutU32(hello + 4, kVersion);
  PutU32(hello + 8, static_cast<uint32_t>(rank));
  PutU32(hello + 12, static_cast<uint32_t>(world_size));
  const std::string what = absl::StrCat(where, " (rank 0)");
  RETURN_IF_ERROR(WriteFull(fd.get(), hello, kJoinBytes, deadline, what));
  char answer[kAnswerBytes];
  absl::Status joined =
      ReadFull(fd.get(), answer, kAnswerBytes, deadline, what);
  if (joined.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": not every rank joined within ", absl::FormatDuration(timeout),
        " (", joined.message(), ")"));
  }
  RETURN_IF_ERROR(joined);
  if (std::memcmp(answer, kJoinMagic, 4) != 0 || GetU32(answer + 4) != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, " refused rank ", rank, " of ", world_size));
  }
  std::vector<int> fds = {fd.release()};
  return std::unique_ptr<SocketCommunicator>(
      new SocketCommunicator(rank, world_size, timeout, std::move(fds)));
}

SocketCommunicator::SocketCommunicator(int rank, int world_size,
                                       absl::Duration timeout,
                                       std::vector<int> fds)
    : rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      fds_(std::move(fds)),
      inputs_(rank == 0 ? world_size : 0),
      input_pointers_(rank == 0 ? world_size : 0, nullptr) {}

SocketCommunicator::~SocketCommunicator() {
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

absl::Status SocketCommunicator::Break(const absl::Status& status) {
  if (broken_.ok()) broken_ = status;
  for (int& fd : fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  return broken_;
}

void SocketCommunicator::BroadcastError(const absl::Status& status, int skip) {
  const std::string message(status.message().substr(0, kMaxMessageBytes));
  char answer[kAnswerBytes];
  std::memcpy(answer, kAnswerMagic, 4);
  PutU32(answer + 4, static_cast<uint32_t>(status.code()));
  PutU64(answer + 8, message.size());
  // Best effort, briefly: a rank that does not read is gone anyway.
  const Deadline deadline = DeadlineAfter(absl::Seconds(1));
  for (int r = 1; r < world_size_; ++r) {
    if (r == skip || fds_[r] < 0) continue;
    if (WriteFull(fds_[r], answer, kAnswerBytes, deadline, "").ok()) {
      WriteFull(fds_[r], message.data(), message.size(), deadline, "")
          .IgnoreError();
    }
  }
}

absl::Status SocketCommunicator::AllReduce(const Tensor& in, const Tensor& out,
                                           ReduceOp op, Context& context) {
  return Run(CollectiveKind::kAllReduce, in, out, op, 0, context);
}
absl::Status SocketCommunicator::ReduceScatter(const Tensor& in,
                                               const Tensor& out, ReduceOp op,
                                               Context& context) {
  return Run(CollectiveKind::kReduceScatter, in, out, op, 0, context);
}
absl::Status SocketCommunicator::AllGather(const Tensor& in, const Tensor& out,
                                           Context& context) {
  return Run(CollectiveKind::kAllGather, in, out, ReduceOp::kSum, 0, context);
}
absl::Status SocketCommunicator::Broadcast(const Tensor& in, const Tensor& out,
                                           int root, Context& context) {
  return Run(CollectiveKind::kBroadcast, in, out, ReduceOp::kSum, root,
             context);
}

absl::Status SocketCommunicator::Run(CollectiveKind kind, const Tensor& in,
                                     const Tensor& out, ReduceOp op, int root,
                                     Context& context) {
  if (!broken_.ok()) return broken_;
  const absl::Status local =
      context.device().is_cpu()
          ? CheckCollectiveArguments(kind, world_size_, root, context, in, out,
                                     {DType::kF32, DType::kBF16, DType::kF16,
                                      DType::kF64, DType::kI32, DType::kI64})
          : InvalidArgument(CollectiveName(kind),
                            ": the socket communicator needs a CPU context, "
                            "not ",
                            context.device().ToString());
  Request own;
  own.kind = static_cast<uint32_t>(kind);
  own.dtype = in.dtype;
  own.op = op;
  own.root = root;
  own.valid = local.ok();
  own.sequence = sequence_++;
  if (own.valid) {
    own.in_bytes = in.span_bytes();
    own.out_bytes = out.span_bytes();
  }
  if (world_size_ == 1) {
    RETURN_IF_ERROR(local);
    if (out.data != in.data && own.in_bytes > 0) {
      std::memcpy(out.data, in.data, own.in_bytes);
    }
    return absl::OkStatus();
  }
  absl::Status status =
      rank_ == 0 ? RunHub(own, in, out) : RunPeer(own, in, out);
  if (!local.ok()) return local;
  return status;
}

absl::Status SocketCommunicator::RunHub(const Request& own, const Tensor& in,
                                        const Tensor& out) {
  const Deadline deadline = DeadlineAfter(timeout_);
  const std::string collective =
      absl::StrCat("collective #", own.sequence, " (", own.Text(), ")");
  const CollectiveKind kind = static_cast<CollectiveKind>(own.kind);
  // Every rank's request and input, in rank order.
  absl::Status shared =
      own.valid ? absl::OkStatus()
                : InvalidArgument(CollectiveName(kind),
                                  ": rank 0's arguments were rejected");
  for (int r = 1; r < world_size_; ++r) {
    char header[kRequestBytes];
    absl::Status got = ReadFull(fds_[r], header, kRequestBytes, deadline, "");
    if (got.code() == absl::StatusCode::kDeadlineExceeded) {
      got = absl::DeadlineExceededError(absl::StrCat(
          "socket communicator: rank 0 waited ", absl::FormatDuration(timeout_),
          " in ", collective, " for rank ", r,
          ", which never arrived; the group is broken"));
    } else if (!got.ok()) {
      got = absl::UnavailableError(absl::StrCat(
          "socket communicator: rank ", r, " closed its connection in ",
          collective, " (its process died or gave up: ", got.message(),
          "); the group is broken"));
    }
    Request request;
    if (got.ok() && !request.Decode(header)) {
      got = absl::UnavailableError(
          absl::StrCat("socket communicator: rank ", r, " sent a bad request"));
    }
    if (got.ok() && request.kind == kAbortKind) {
      std::string reason(std::min(request.in_bytes, kMaxMessageBytes), '\0');
      ReadFull(fds_[r], reason.data(), reason.size(),
               DeadlineAfter(absl::Seconds(1)), "")
          .IgnoreError();
      got = absl::AbortedError(absl::StrCat("socket communicator: rank ", r,
                                            " aborted the group: ", reason));
    }
    if (!got.ok()) {
      BroadcastError(got, r);
      return Break(got);
    }
    if (shared.ok() && !request.valid) {
      shared = InvalidArgument(CollectiveName(kind), ": rank ", r,
                               "'s arguments were rejected");
    } else if (shared.ok() && own.valid && !request.Matches(own)) {
      shared = InvalidArgument(collective, ": rank 0 called ", own.Text(),
                               ", rank ", r, " ", request.Text(),
                               " (collective #", request.sequence, ")");
    }
    // A rank sends its input when its arguments are good and it has one
    // (every rank but the root sends none in a Broadcast).
    const bool sends = request.valid && (kind != CollectiveKind::kBroadcast ||
                                         request.root == r);
    const uint64_t bytes = sends ? request.in_bytes : 0;
    if (inputs_[r].size() < bytes) inputs_[r].resize(bytes);
    got = ReadFull(fds_[r], inputs_[r].data(), bytes, deadline,
                   absl::StrCat("socket communicator: rank ", r, "'s input"));
    if (!got.ok()) {
      BroadcastError(got, r);
      return Break(got);
    }
  }
  if (!shared.ok()) {
    BroadcastError(shared, -1);
    return Break(shared);
  }
  // The result, computed once in rank order.
  const uint64_t in_bytes = own.in_bytes;
  const int64_t size = DTypeSize(own.dtype);
  for (int r = 0; r < world_size_; ++r) {
    input_pointers_[r] = r == 0 ? in.data : inputs_[r].data();
  }
  const uint64_t result_bytes =
      kind == CollectiveKind::kAllGather ? own.out_bytes : in_bytes;
  if (result_.size() < result_bytes) result_.resize(result_bytes);
  switch (kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduceScatter:
      ReduceInRankOrder(own.dtype, own.op, input_pointers_.data(), world_size_,
                        static_cast<int64_t>(in_bytes) / size, result_.data());
      break;
    case CollectiveKind::kAllGather:
      for (int r = 0; r < world_size_; ++r) {
        if (in_bytes > 0) {
          std::memcpy(result_.data() + r * in_bytes, input_pointers_[r],
                      in_bytes);
        }
      }
      break;
    case CollectiveKind::kBroadcast:
      if (in_bytes > 0) {
        std::memcpy(result_.data(), input_pointers_[own.root], in_bytes);
      }
      break;
  }
  // Each rank's part: its rows for ReduceScatter, all of it otherwise.
  const uint64_t part = own.out_bytes;
  for (int r = 1; r < world_size_; ++r) {
    const unsigned char* source =
        result_.data() +
        (kind == CollectiveKind::kReduceScatter ? r * part : 0);
    char answer[kAnswerBytes];
    std::memcpy(answer, kAnswerMagic, 4);
    PutU32(answer + 4, 0);
    PutU64(answer + 8, part);
    const std::string what =
        absl::StrCat("socket communicator: the result for rank ", r);
    absl::Status sent =
        WriteFull(fds_[r], answer, kAnswerBytes, deadline, what);
    if (sent.ok()) sent = WriteFull(fds_[r], source, part, deadline, what);
    if (!sent.ok()) {
      BroadcastError(sent, r);
      return Break(sent);
    }
  }
  if (part > 0) {
    std::memcpy(out.data, result_.data(), part);
  }
  return absl::OkStatus();
}

absl::Status SocketCommunicator::RunPeer(const Request& own, const Tensor& in,
                                         const Tensor& out) {
  const int fd = fds_[0];
  const std::string what = absl::StrCat("socket communicator: rank ", rank_,
                                        " in collective #", own.sequence);
  char header[kRequestBytes];
  own.Encode(header);
  const CollectiveKind kind = static_cast<CollectiveKind>(own.kind);
  const bool sends =
      own.valid && (kind != CollectiveKind::kBroadcast || own.root == rank_);
  absl::Status status =
      WriteFull(fd, header, kRequestBytes, DeadlineAfter(timeout_), what);
  if (status.ok() && sends) {
    status =
        WriteFull(fd, in.data, own.in_bytes, DeadlineAfter(timeout_), what);
  }
  const Deadline deadline = DeadlineAfter(timeout_ + kAnswerGrace);
  char answer[kAnswerBytes];
  if (status.ok()) status = ReadFull(fd, answer, kAnswerBytes, deadline, what);
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return Break(absl::DeadlineExceededError(
        absl::StrCat(what, ": no answer from rank 0 within ",
                     absl::FormatDuration(timeout_ + kAnswerGrace),
                     "; the group is broken")));
  }
  if (!status.ok()) {
    return Break(absl::UnavailableError(absl::StrCat(
        what, ": lost rank 0 (", status.message(), "); the group is broken")));
  }
  if (std::memcmp(answer, kAnswerMagic, 4) != 0) {
    return Break(absl::UnavailableError(
        absl::StrCat(what, ": rank 0 sent a bad answer")));
  }
  const uint32_t code = GetU32(answer + 4);
  const uint64_t bytes = GetU64(answer + 8);
  if (code != 0) {
    std::string message(std::min(bytes, kMaxMessageBytes), '\0');
    ReadFull(fd, message.data(), message.size(), deadline, what).IgnoreError();
    return Break(absl::Status(static_cast<absl::StatusCode>(code), message));
  }
  if (!own.valid) return absl::OkStatus();  // Run returns the local error
  if (bytes != own.out_bytes) {
    return Break(absl::UnavailableError(absl::StrCat(
        what, ": rank 0 sent ", bytes, " bytes for ", own.out_bytes)));
  }
  status = ReadFull(fd, out.data, bytes, deadline, what);
  if (!status.ok()) return Break(status);
  return absl::OkStatus();
}

absl::Status SocketCommunicator::Abort(absl::string_view reason) {
  if (!broken_.ok()) return absl::OkStatus();
  const absl::Status aborted = absl::AbortedError(absl::StrCat(
      "socket communicator: rank ", rank_, " aborted the group: ", reason));
  if (rank_ == 0) {
    BroadcastError(aborted, -1);
  } else if (fds_[0] >= 0) {
    const std::string message(reason.substr(0, kMaxMessageBytes));
    Request request;
    request.kind = kAbortKind;
    request.in_bytes = message.size();
    char header[kRequestBytes];
    request.Encode(header);
    const Deadline deadline = DeadlineAfter(absl::Seconds(1));
    if (WriteFull(fds_[0], header, kRequestBytes, deadline, "").ok()) {
      WriteFull(fds_[0], message.data(), message.size(), deadline, "")
          .IgnoreError();
    }
  }
  Break(aborted).IgnoreError();
  return absl::OkStatus();
}

}  // namespace lossrt
