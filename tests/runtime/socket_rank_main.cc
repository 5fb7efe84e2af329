// One rank of a multi-process SocketCommunicator test
// (socket_communicator_test spawns world_size of these on loopback):
//   socket_rank_main RANK WORLD PORT TIMEOUT_MS MODE
// joins the group, then runs 3 all-reduces of [64] f32 (rank r's element i =
// r + i / 64) and checks every element of each sum. MODE: "normal"; "die":
// this rank exits after the first all-reduce, as a crashed process would;
// "hang": this rank sleeps after the first all-reduce (a rank that never
// arrives); "absent": this rank never joins (sleeps at once). Exit code: 0
// when every call succeeded, 10 + the absl status code of the first failure
// otherwise, 2 for bad arguments or a wrong sum; the failure is printed.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "runtime/context.h"
#include "runtime/coordinator.h"
#include "runtime/socket_communicator.h"
#include "runtime/tensor.h"

namespace {

int Fail(const absl::Status& status, int rank) {
  std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
  return 10 + static_cast<int>(status.code());
}

void SleepForever() {
  for (;;) sleep(1000);
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 0, port = 0, timeout_ms = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[1], &rank) ||
      !absl::SimpleAtoi(argv[2], &world) || !absl::SimpleAtoi(argv[3], &port) ||
      !absl::SimpleAtoi(argv[4], &timeout_ms)) {
    std::fprintf(stderr, "usage: %s RANK WORLD PORT TIMEOUT_MS MODE\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[5];
  if (mode == "absent") SleepForever();
  lossrt::CoordinatorAddress address;
  address.host = "127.0.0.1";
  address.port = port;
  absl::StatusOr<std::unique_ptr<lossrt::SocketCommunicator>> comm =
      lossrt::SocketCommunicator::Create(address, rank, world,
                                         absl::Milliseconds(timeout_ms));
  if (!comm.ok()) return Fail(comm.status(), rank);
  absl::StatusOr<std::unique_ptr<lossrt::Context>> context =
      lossrt::Context::Create(lossrt::Device::Cpu());
  if (!context.ok()) return Fail(context.status(), rank);
  constexpr int kElements = 64;
  std::vector<float> values(kElements);
  for (int round = 0; round < 3; ++round) {
    if (round == 1 && mode == "die") _exit(0);
    if (round == 1 && mode == "hang") SleepForever();
    for (int i = 0; i < kElements; ++i) values[i] = rank + i / 64.0f;
    const lossrt::Tensor tensor = lossrt::Tensor::Of(
        values.data(), lossrt::DType::kF32, {kElements}, lossrt::Device::Cpu());
    const absl::Status status =
        (*comm)->AllReduce(tensor, tensor, lossrt::ReduceOp::kSum, **context);
    if (!status.ok()) return Fail(status, rank);
    for (int i = 0; i < kElements; ++i) {
      float expected = 0 + i / 64.0f;
      for (int r = 1; r < world; ++r) expected += r + i / 64.0f;
      if (values[i] != expected) {
        std::fprintf(stderr, "rank %d: element %d is %g, not %g\n", rank, i,
                     values[i], expected);
        return 2;
      }
    }
  }
  return 0;
}
