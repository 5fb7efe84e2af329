// Tests of runtime/coordinator.h on loopback: rank 0 and its peers in threads
// of this process exchange random blobs; rank 0 starting late; the timeouts
// when rank 0 never comes up or a rank never fetches; a peer or rank 0 that
// disappears mid-exchange; refused ranks; stray connections; bad arguments.
#include "runtime/coordinator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

constexpr char kLoopback[] = "127.0.0.1";

std::string RandomBlob(size_t bytes) {
  std::mt19937_64 rng(test::TestSeed());
  std::string blob(bytes, '\0');
  for (char& c : blob) c = static_cast<char>(rng());
  return blob;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// A loopback socket bound to a free port (listening when `listening`).
struct RawSocket {
  int fd = -1;
  int port = 0;
  ~RawSocket() {
    if (fd >= 0) close(fd);
  }
};

std::unique_ptr<RawSocket> BoundSocket(bool listening) {
  auto raw = std::make_unique<RawSocket>();
  raw->fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(raw->fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listening) {
    EXPECT_EQ(listen(raw->fd, 4), 0);
  }
  socklen_t length = sizeof(addr);
  getsockname(raw->fd, reinterpret_cast<sockaddr*>(&addr), &length);
  raw->port = ntohs(addr.sin_port);
  return raw;
}

// A port with nothing listening on it (bound, not listening: connections are
// refused and nobody else gets the port meanwhile).
int DeadPort(std::unique_ptr<RawSocket>& holder) {
  holder = BoundSocket(/*listening=*/false);
  return holder->port;
}

int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// The protocol's greeting (see coordinator.h).
std::string Hello(uint32_t rank, uint32_t world_size) {
  std::string hello = "LRTC";
  for (uint32_t value : {uint32_t{1}, rank, world_size}) {
    const uint32_t big = htonl(value);
    hello.append(reinterpret_cast<const char*>(&big), 4);
  }
  return hello;
}

std::unique_ptr<CoordinatorServer> MustListen(int world_size) {
  auto server = CoordinatorServer::Listen(0, world_size);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

CoordinatorAddress Loopback(int port) { return {kLoopback, port}; }

TEST(CoordinatorAddressTest, ParsesHostAndPort) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  };
  for (const Case& c : {Case{"127.0.0.1:1234", "127.0.0.1", 1234},
                        Case{"node-7.cluster:65535", "node-7.cluster", 65535},
                        Case{"[::1]:29500", "::1", 29500}}) {
    absl::StatusOr<CoordinatorAddress> address =
        ParseCoordinatorAddress(c.text);
    ASSERT_TRUE(address.ok()) << c.text << ": " << address.status();
    EXPECT_EQ(address->host, c.host);
    EXPECT_EQ(address->port, c.port);
    EXPECT_EQ(address->ToString(), c.text);
  }
}

TEST(CoordinatorAddressTest, RejectsMalformedAddresses) {
  for (const char* text :
       {"", "host", "host:", ":80", "host:0", "host:65536", "host:12a",
        "host:-1", "host:+80", "[::1]", "[::1]80", "::1:80", "[]:80"}) {
    const absl::Status status = ParseCoordinatorAddress(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << text << ": " << status;
    EXPECT_NE(status.message().find(text), absl::string_view::npos) << status;
  }
}

TEST(CoordinatorTest, Rank0HandsItsBlobToThreePeers) {
  constexpr int kWorld = 4;
  const std::string blob = RandomBlob(128);
  auto server = MustListen(kWorld);
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  std::vector<absl::StatusOr<std::string>> fetched(
      kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> peers;
  for (int r = 1; r < kWorld; ++r) {
    peers.emplace_back([&, r] {
      fetched[r] =
          FetchBlob(Loopback(server->port()), r, kWorld, absl::Seconds(10));
    });
  }
  const absl::Status served = server->Serve(blob, absl::Seconds(10));
  for (std::thread& peer : peers) peer.join();
  EXPECT_TRUE(served.ok()) << served;
  for (int r = 1; r < kWorld; ++r) {
    ASSERT_TRUE(fetched[r].ok()) << "rank " << r << ": " << fetched[r].status();
    EXPECT_EQ(*fetched[r], blob) << "rank " << r;
  }
}

// ShareBlob on every rank, rank 0 coming up after the others started
// retrying; one peer names the host "localhost".
TEST(CoordinatorTest, ShareBlobWaitsForALateRank0) {
  constexpr int kWorld = 4;
  const std::string blob = RandomBlob(128);
  std::unique_ptr<RawSocket> holder;
  const int port = DeadPort(holder);
  holder.reset();  // free the port for rank 0
  std::vector<absl::StatusOr<std::string>> got(kWorld,
                                               absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const std::string host = r == 2 ? "localhost" : kLoopback;
      got[r] = ShareBlob(absl::StrCat(host, ":", port), r, kWorld,
                         r == 0 ? blob : "", absl::Seconds(10));
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], blob) << "rank " << r;
  }
}

TEST(CoordinatorTest, FetchTimesOutWhenRank0NeverComesUp) {
  std::unique_ptr<RawSocket> holder;
  const int port = DeadPort(holder);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status =
      FetchBlob(Loopback(port), 1, 2, absl::Milliseconds(200)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("did not come up"), absl::string_view::npos)
      << status;
  EXPECT_NE(status.message().find(absl::StrCat(port)), absl::string_view::npos)
      << status;
  const double seconds = SecondsSince(start);
  EXPECT_GE(seconds, 0.19);  // it kept trying until the timeout
  EXPECT_LT(seconds, 3.0);
}

TEST(CoordinatorTest, ServeTimesOutNamingTheMissingRanks) {
  constexpr int kWorld = 4;
  const std::string blob = RandomBlob(128);
  auto server = MustListen(kWorld);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::string> fetched = absl::UnknownError("not run");
  std::thread peer([&] {
    fetched = FetchBlob(Loopback(server->port()), 2, kWorld, absl::Seconds(10));
  });
  const auto start = std::chrono::steady_clock::now();
  const absl::Status served = server->Serve(blob, absl::Milliseconds(300));
  peer.join();
  EXPECT_EQ(served.code(), absl::StatusCode::kDeadlineExceeded) << served;
  EXPECT_NE(served.message().find("rank(s) 1, 3 of 4"), absl::string_view::npos)
      << served;
  EXPECT_LT(SecondsSince(start), 3.0);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(*fetched, blob);
}

TEST(CoordinatorTest, ServeFailsWhenAPeerDisappears) {
  auto server = MustListen(2);
  ASSERT_NE(server, nullptr);
  // Rank 1 says hello and goes away without reading or acknowledging.
  std::thread peer([&] {
    const int fd = ConnectRaw(server->port());
    const std::string hello = Hello(1, 2);
    EXPECT_EQ(send(fd, hello.data(), hello.size(), 0), hello.size());
    close(fd);
  });
  const absl::Status served = server->Serve(RandomBlob(128), absl::Seconds(10));
  peer.join();
  EXPECT_EQ(served.code(), absl::StatusCode::kUnavailable) << served;
  EXPECT_NE(served.message().find("rank 1"), absl::string_view::npos) << served;
  EXPECT_NE(served.message().find("disconnected"), absl::string_view::npos)
      << served;
}

// Rank 1 reads the whole blob but goes away without acknowledging it: rank 0
// cannot know that it has the blob.
TEST(CoordinatorTest, ServeFailsWithoutTheAcknowledgement) {
  auto server = MustListen(2);
  ASSERT_NE(server, nullptr);
  const std::string blob = RandomBlob(128);
  std::string received;
  std::thread peer([&] {
    const int fd = ConnectRaw(server->port());
    const std::string hello = Hello(1, 2);
    EXPECT_EQ(send(fd, hello.data(), hello.size(), 0), hello.size());
    char buffer[256];
    while (received.size() < 16 + blob.size()) {
      const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) break;
      received.append(buffer, got);
    }
    close(fd);
  });
  const absl::Status served = server->Serve(blob, absl::Seconds(10));
  peer.join();
  ASSERT_EQ(received.size(), 16 + blob.size());
  EXPECT_EQ(received.substr(16), blob);
  EXPECT_EQ(served.code(), absl::StatusCode::kUnavailable) << served;
  EXPECT_NE(served.message().find("acknowledging"), absl::string_view::npos)
      << served;
}

TEST(CoordinatorTest, FetchFailsWhenRank0Disappears) {
  // "Rank 0" accepts and closes at once.
  std::unique_ptr<RawSocket> listener = BoundSocket(/*listening=*/true);
  std::thread rank0([&] {
    const int fd = accept(listener->fd, nullptr, nullptr);
    EXPECT_GE(fd, 0);
    close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status =
      FetchBlob(Loopback(listener->port), 1, 2, absl::Seconds(10)).status();
  rank0.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("rank 0"), absl::string_view::npos) << status;
  EXPECT_LT(SecondsSince(start), 3.0);
}

TEST(CoordinatorTest, RefusesAnotherWorldSize) {
  auto server = MustListen(3);
  ASSERT_NE(server, nullptr);
  absl::Status fetched;
  std::thread peer([&] {
    fetched =
        FetchBlob(Loopback(server->port()), 1, 4, absl::Seconds(10)).status();
  });
  const absl::Status served = server->Serve(RandomBlob(16), absl::Seconds(10));
  peer.join();
  EXPECT_EQ(served.code(), absl::StatusCode::kInvalidArgument) << served;
  EXPECT_NE(served.message().find("world size 4"), absl::string_view::npos)
      << served;
  EXPECT_EQ(fetched.code(), absl::StatusCode::kInvalidArgument) << fetched;
  EXPECT_NE(fetched.message().find("world size"), absl::string_view::npos)
      << fetched;
}

TEST(CoordinatorTest, RefusesARankThatComesTwice) {
  auto server = MustListen(3);
  ASSERT_NE(server, nullptr);
  const std::string blob = RandomBlob(32);
  absl::StatusOr<std::string> first = absl::UnknownError("not run");
  absl::Status second;
  std::thread peer([&] {
    first = FetchBlob(Loopback(server->port()), 1, 3, absl::Seconds(10));
    second =
        FetchBlob(Loopback(server->port()), 1, 3, absl::Seconds(10)).status();
  });
  const absl::Status served = server->Serve(blob, absl::Seconds(10));
  peer.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, blob);
  EXPECT_EQ(second.code(), absl::StatusCode::kInvalidArgument) << second;
  EXPECT_NE(second.message().find("twice"), absl::string_view::npos) << second;
  EXPECT_EQ(served.code(), absl::StatusCode::kInvalidArgument) << served;
  EXPECT_NE(served.message().find("rank 1 joined a second time"),
            absl::string_view::npos)
      << served;
}

TEST(CoordinatorTest, IgnoresStrayConnections) {
  auto server = MustListen(2);
  ASSERT_NE(server, nullptr);
  const std::string blob = RandomBlob(128);
  absl::StatusOr<std::string> fetched = absl::UnknownError("not run");
  std::thread peers([&] {
    // Garbage, then a connection that says nothing, then the real rank 1.
    const int garbage = ConnectRaw(server->port());
    const std::string noise(16, 'x');
    EXPECT_EQ(send(garbage, noise.data(), noise.size(), 0), noise.size());
    close(garbage);
    close(ConnectRaw(server->port()));
    fetched = FetchBlob(Loopback(server->port()), 1, 2, absl::Seconds(10));
  });
  const absl::Status served = server->Serve(blob, absl::Seconds(10));
  peers.join();
  EXPECT_TRUE(served.ok()) << served;
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(*fetched, blob);
}

TEST(CoordinatorTest, RejectsBadArguments) {
  const CoordinatorAddress address = Loopback(1);
  for (const auto& [rank, world] :
       std::vector<std::pair<int, int>>{{0, 2}, {2, 2}, {-1, 2}, {1, 0}}) {
    const absl::Status status =
        FetchBlob(address, rank, world, absl::Seconds(1)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << rank << "/" << world << ": " << status;
  }
  for (const auto& [port, world] :
       std::vector<std::pair<int, int>>{{0, 0}, {-1, 2}, {65536, 2}}) {
    const absl::Status status = CoordinatorServer::Listen(port, world).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << port << "/" << world << ": " << status;
  }
  auto server = MustListen(2);
  ASSERT_NE(server, nullptr);
  const absl::Status too_big = server->Serve(
      std::string(kMaxCoordinatorBlobBytes + 1, 'x'), absl::Seconds(1));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  const absl::Status bad_address =
      ShareBlob("no-port", 0, 2, "blob", absl::Seconds(1)).status();
  EXPECT_EQ(bad_address.code(), absl::StatusCode::kInvalidArgument)
      << bad_address;
}

// A world of one: rank 0 serves nobody and returns its blob at once.
TEST(CoordinatorTest, WorldOfOneNeedsNoPeers) {
  const std::string blob = RandomBlob(128);
  auto server = MustListen(1);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->Serve(blob, absl::Milliseconds(100)).ok());
}

}  // namespace
}  // namespace lossrt
