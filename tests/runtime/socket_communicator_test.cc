// Tests of SocketCommunicator: every collective and dtype against the
// reduction in rank order (the bits of the CPU backend) for 1 to 4 ranks, one
// thread and socket each on loopback; argument errors; and, with processes
// of tests/runtime/socket_rank_main, a rank that dies, hangs or never joins
// makes every other rank fail with Unavailable or DeadlineExceeded within the
// timeout instead of waiting.
#include "runtime/socket_communicator.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/context.h"
#include "runtime/cpu_communicator.h"
#include "runtime/dtype.h"
#include "runtime/socket_io.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"

extern char** environ;

namespace lossrt {
namespace {

// A port that was free a moment ago (the kernel's pick for port 0).
int FreePort() {
  absl::StatusOr<net::Listener> listener = net::ListenTcp(0, 1, "test");
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener.ok() ? listener->port : 0;
}

CoordinatorAddress Loopback(int port) {
  CoordinatorAddress address;
  address.host = "127.0.0.1";
  address.port = port;
  return address;
}

// Runs body(rank, comm) on `world` threads, each with its own
// SocketCommunicator on one loopback port.
void OnRanks(int world, absl::Duration timeout,
             const std::function<void(int, Communicator&)>& body) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<SocketCommunicator>> comm =
          SocketCommunicator::Create(Loopback(port), r, world, timeout);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
      EXPECT_EQ((*comm)->rank(), r);
      EXPECT_EQ((*comm)->world_size(), world);
      body(r, **comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// The same collectives on a CpuCommunicatorGroup, the reference.
void OnCpuRanks(int world,
                const std::function<void(int, Communicator&)>& body) {
  auto comms = CpuCommunicatorGroup::Create(world);
  ASSERT_TRUE(comms.ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { body(r, *(*comms)[r]); });
  }
  for (std::thread& thread : threads) thread.join();
}

Tensor View(std::vector<uint8_t>& bytes, DType dtype, int64_t n) {
  return Tensor::Of(bytes.data(), dtype, {n}, Device::Cpu());
}

// Random bytes that are finite values of `dtype` ([n] elements).
std::vector<uint8_t> RandomValues(DType dtype, int64_t n, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<uint8_t> bytes(n * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = uniform(engine);
    switch (dtype) {
      case DType::kF32:
        reinterpret_cast<float*>(bytes.data())[i] = x;
        break;
      case DType::kF64:
        reinterpret_cast<double*>(bytes.data())[i] = x * 1.000001;
        break;
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = FloatToBf16Bits(x);
        break;
      case DType::kF16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = FloatToF16Bits(x);
        break;
      case DType::kI32:
        reinterpret_cast<int32_t*>(bytes.data())[i] =
            static_cast<int32_t>(engine());
        break;
      case DType::kI64:
        reinterpret_cast<int64_t*>(bytes.data())[i] =
            static_cast<int64_t>(engine());
        break;
    }
  }
  return bytes;
}

// Every collective of every dtype on `comm` (rank `rank` of `world`); each
// rank's outputs, in call order, appended to `outputs`.
void RunEverything(int rank, int world, uint64_t seed, Communicator& comm,
                   std::vector<std::vector<uint8_t>>* outputs) {
  auto context = Context::Create(Device::Cpu());
  ASSERT_TRUE(context.ok());
  constexpr int64_t kRows = 13;  // per rank, odd
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                      DType::kI32, DType::kI64}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = kRows * world;
    std::vector<uint8_t> in = RandomValues(dtype, n, seed + rank * 7 + 1);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<uint8_t> out(in.size());
      ASSERT_TRUE(
          comm.AllReduce(View(in, dtype, n), View(out, dtype, n), op, **context)
              .ok());
      outputs->push_back(out);
      std::vector<uint8_t> part(kRows * DTypeSize(dtype));
      ASSERT_TRUE(comm.ReduceScatter(View(in, dtype, n),
                                     View(part, dtype, kRows), op, **context)
                      .ok());
      outputs->push_back(part);
    }
    std::vector<uint8_t> own = RandomValues(dtype, kRows, seed + rank * 7 + 2);
    std::vector<uint8_t> gathered(in.size());
    ASSERT_TRUE(comm.AllGather(View(own, dtype, kRows),
                               View(gathered, dtype, n), **context)
                    .ok());
    outputs->push_back(gathered);
    for (int root = 0; root < world; ++root) {
      std::vector<uint8_t> value = in;  // in place
      ASSERT_TRUE(comm.Broadcast(View(value, dtype, n), View(value, dtype, n),
                                 root, **context)
                      .ok());
      outputs->push_back(value);
    }
    // In place AllReduce.
    ASSERT_TRUE(comm.AllReduce(View(in, dtype, n), View(in, dtype, n),
                               ReduceOp::kSum, **context)
                    .ok());
    outputs->push_back(in);
  }
}

TEST(SocketCommunicatorTest, EveryCollectiveGivesTheBitsOfTheCpuBackend) {
  const uint64_t seed = test::TestSeed();
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(testing::Message() << world << " ranks");
    std::vector<std::vector<std::vector<uint8_t>>> sockets(world), cpu(world);
    OnRanks(world, absl::Seconds(30), [&](int r, Communicator& comm) {
      RunEverything(r, world, seed, comm, &sockets[r]);
    });
    OnCpuRanks(world, [&](int r, Communicator& comm) {
      RunEverything(r, world, seed, comm, &cpu[r]);
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(sockets[r].size(), cpu[r].size()) << "rank " << r;
      for (size_t k = 0; k < cpu[r].size(); ++k) {
        EXPECT_TRUE(sockets[r][k] == cpu[r][k])
            << "rank " << r << ", output " << k;
      }
    }
  }
}

TEST(SocketCommunicatorTest, BadArgumentsFailEveryRankAndNameTheRank) {
  OnRanks(3, absl::Seconds(30), [&](int r, Communicator& comm) {
    auto context = Context::Create(Device::Cpu());
    ASSERT_TRUE(context.ok());
    std::vector<float> in(6), out(r == 1 ? 5 : 6);  // rank 1: wrong shape
    const absl::Status status = comm.AllReduce(
        Tensor::Of(in.data(), DType::kF32, {6}, Device::Cpu()),
        Tensor::Of(out.data(), DType::kF32, {static_cast<int64_t>(out.size())},
                   Device::Cpu()),
        ReduceOp::kSum, **context);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    if (r != 1) {
      EXPECT_NE(status.message().find("rank 1"), absl::string_view::npos)
          << status;
    }
  });
}

TEST(SocketCommunicatorTest, RejectsBadArguments) {
  EXPECT_EQ(SocketCommunicator::Create(Loopback(1234), 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SocketCommunicator::Create(Loopback(1234), -1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SocketCommunicator::Create(Loopback(0), 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SocketCommunicator::Create(Loopback(1234), 0, 2, absl::ZeroDuration())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(SocketCommunicatorTest, AbortFailsTheOtherRanks) {
  OnRanks(3, absl::Seconds(30), [&](int r, Communicator& comm) {
    auto context = Context::Create(Device::Cpu());
    ASSERT_TRUE(context.ok());
    float value = 1;
    const Tensor tensor = Tensor::Of(&value, DType::kF32, {1}, Device::Cpu());
    if (r == 2) {
      ASSERT_TRUE(comm.Abort("out of data").ok());
    }
    const absl::Status status =
        comm.AllReduce(tensor, tensor, ReduceOp::kSum, **context);
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted)
        << "rank " << r << ": " << status;
    if (r != 2) {
      EXPECT_NE(status.message().find("out of data"), absl::string_view::npos)
          << status;
    }
  });
}

// ---- Several processes ----

struct Process {
  pid_t pid = -1;
  int exit_code = -1;  // -1: killed or still running
};

// The rank program: in the test's runfiles under Bazel, in the staged copy of
// them (<test>.runfiles/), or beside the test binary; "" when it is in none
// (then the process tests skip: nothing is spawned, so nothing can be killed by
// mistake).
std::string RankBinary() {
  std::error_code error;
  const std::string runfiles = "tests/runtime/socket_rank_main";
  if (std::filesystem::is_regular_file(runfiles, error)) return runfiles;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    // tools/stage_gpu.sh copies the test's runfiles to <test>.runfiles/.
    const std::filesystem::path staged =
        std::filesystem::path(self.string() + ".runfiles") / "lossrt" /
        runfiles;
    if (std::filesystem::is_regular_file(staged, error)) return staged;
    for (const char* name : {"socket_rank_main", "runtime_socket_rank_main"}) {
      const std::filesystem::path beside = self.parent_path() / name;
      if (std::filesystem::is_regular_file(beside, error)) return beside;
    }
  }
  return "";
}

#define SKIP_WITHOUT_RANK_BINARY()                                        \
  if (RankBinary().empty()) {                                             \
    GTEST_SKIP() << "tests/runtime/socket_rank_main is neither in the "   \
                    "runfiles nor beside the test binary: process tests " \
                    "skipped";                                            \
  }

Process Spawn(int rank, int world, int port, int timeout_ms,
              const std::string& mode) {
  const std::string binary = RankBinary();
  std::vector<std::string> args = {binary,
                                   absl::StrCat(rank),
                                   absl::StrCat(world),
                                   absl::StrCat(port),
                                   absl::StrCat(timeout_ms),
                                   mode};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  Process process;
  const int spawned = posix_spawn(&process.pid, binary.c_str(), nullptr,
                                  nullptr, argv.data(), environ);
  EXPECT_EQ(spawned, 0) << "spawning " << binary;
  if (spawned != 0) process.pid = -1;
  return process;
}

// Waits for every process but `keep` (-1: none) to exit, at most `limit`;
// kills the rest. Returns the seconds the wait took.
double WaitAll(std::vector<Process>& processes, int keep, double limit) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  for (size_t r = 0; r < processes.size(); ++r) {
    if (static_cast<int>(r) == keep) continue;
    if (processes[r].pid <= 0)
      continue;  // never spawned (waitpid(-1) waits
                 // for any child)
    for (;;) {
      int status = 0;
      const pid_t done = waitpid(processes[r].pid, &status, WNOHANG);
      if (done == processes[r].pid) {
        processes[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      if (seconds() > limit) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const double took = seconds();
  for (Process& process : processes) {
    // Never a pid <= 0: kill(0 or -1) would signal the whole process group
    // or every process of the user.
    if (process.exit_code == -1 && process.pid > 0) {
      kill(process.pid, SIGKILL);
      waitpid(process.pid, nullptr, 0);
    }
  }
  return took;
}

constexpr int kTimeoutMs = 2000;
constexpr int kUnavailable =
    10 + static_cast<int>(absl::StatusCode::kUnavailable);
constexpr int kDeadline =
    10 + static_cast<int>(absl::StatusCode::kDeadlineExceeded);

TEST(SocketCommunicatorProcessTest, FourProcessesAllReduce) {
  SKIP_WITHOUT_RANK_BINARY();
  std::vector<Process> processes;
  const int port = FreePort();
  for (int r = 0; r < 4; ++r) {
    processes.push_back(Spawn(r, 4, port, 20000, "normal"));
  }
  WaitAll(processes, -1, 60);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(processes[r].exit_code, 0) << r;
}

// A rank whose process exits (as a crash would) between collectives: the
// others see its connection close, at once.
TEST(SocketCommunicatorProcessTest, ARankThatDiesFailsTheOthersAtOnce) {
  SKIP_WITHOUT_RANK_BINARY();
  for (int dead : {0, 2}) {
    SCOPED_TRACE(testing::Message() << "rank " << dead << " dies");
    std::vector<Process> processes;
    const int port = FreePort();
    for (int r = 0; r < 3; ++r) {
      processes.push_back(
          Spawn(r, 3, port, 60000, r == dead ? "die" : "normal"));
    }
    const double took = WaitAll(processes, -1, 30);
    EXPECT_LT(took, 30);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(processes[r].exit_code, r == dead ? 0 : kUnavailable) << r;
    }
  }
}

// A rank that is alive but never arrives at a collective (or never joins):
// the others fail with DeadlineExceeded within the timeout (plus the
// answer's grace), never hang.
TEST(SocketCommunicatorProcessTest, ARankThatNeverArrivesTimesTheOthersOut) {
  SKIP_WITHOUT_RANK_BINARY();
  for (const char* mode : {"hang", "absent"}) {
    for (int late : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "rank " << late << ": " << mode);
      std::vector<Process> processes;
      const int port = FreePort();
      for (int r = 0; r < 3; ++r) {
        processes.push_back(
            Spawn(r, 3, port, kTimeoutMs, r == late ? mode : "normal"));
      }
      const double took = WaitAll(processes, late, 20);
      EXPECT_LT(took, kTimeoutMs / 1000.0 + 5);
      // Rank 0 (the hub) and a rank that waits on the late one time out;
      // another rank may instead see the hub close its connection when the
      // hub gives up first (Unavailable). Either way: an error in time.
      for (int r = 0; r < 3; ++r) {
        if (r == late) continue;
        if (r == 0 || late == 0) {
          EXPECT_EQ(processes[r].exit_code, kDeadline) << r;
        } else {
          EXPECT_TRUE(processes[r].exit_code == kDeadline ||
                      processes[r].exit_code == kUnavailable)
              << r << ": exit code " << processes[r].exit_code;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lossrt
