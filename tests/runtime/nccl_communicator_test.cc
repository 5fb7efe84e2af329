// Tests of runtime/nccl_communicator.h on GPUs, checked against the CPU
// backend (runtime/cpu_communicator.h) on the same inputs: with one GPU, world
// size 1 (every collective on f32 and bf16, in place and out of place, and bad
// arguments rejected with InvalidArgument writing nothing); with N >= 2 GPUs
// visible, one thread and one Context per GPU sharing one unique id. Every case
// skips, saying why, without a GPU or without NCCL in the build.
//
// How to run it on the GPU machine: its PyTorch ships libnccl.so.2 (in the
// lib/ folder of the nvidia.nccl package), which the binary staged by
// tools/stage_gpu.sh needs on LD_LIBRARY_PATH:
//
// clang-format off
//   NCCL_DIR="$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")"
//   LD_LIBRARY_PATH="${NCCL_DIR}/lib:${LD_LIBRARY_PATH}" gpu_stage/runtime_nccl_communicator_test
// clang-format on
#include "runtime/nccl_communicator.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/cpu_communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"
#include "tests/tensor_image.h"

namespace lossrt {
namespace {

using test::Bytes;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};

// Ends the test as skipped where the NCCL backend cannot run.
#define SKIP_WITHOUT_NCCL()                                            \
  do {                                                                 \
    SKIP_WITHOUT_GPU();                                                \
    if (!NcclCommunicator::Available()) {                              \
      GTEST_SKIP() << "no NCCL: lossrt was built without the NCCL "    \
                      "backend (NcclCommunicator::Available() false)"; \
    }                                                                  \
  } while (false)

// One collective call of the cases below.
struct Case {
  CollectiveKind kind;
  ReduceOp op;  // AllReduce and ReduceScatter only
  int root;     // Broadcast only
  bool in_place;
};

std::string CaseName(const Case& c, DType dtype) {
  return absl::StrCat(
      CollectiveName(c.kind), "(",
      c.kind == CollectiveKind::kAllReduce ||
              c.kind == CollectiveKind::kReduceScatter
          ? ReduceOpName(c.op)
          : "",
      c.kind == CollectiveKind::kBroadcast ? absl::StrCat("root ", c.root) : "",
      ") ", DTypeName(dtype), c.in_place ? " in place" : " out of place");
}

// Every collective, in place where allowed; Broadcast from `root`.
std::vector<Case> AllCases(int root) {
  return {
      {CollectiveKind::kAllReduce, ReduceOp::kSum, 0, false},
      {CollectiveKind::kAllReduce, ReduceOp::kSum, 0, true},
      {CollectiveKind::kAllReduce, ReduceOp::kMax, 0, false},
      {CollectiveKind::kAllReduce, ReduceOp::kMax, 0, true},
      {CollectiveKind::kReduceScatter, ReduceOp::kSum, 0, false},
      {CollectiveKind::kReduceScatter, ReduceOp::kMax, 0, false},
      {CollectiveKind::kAllGather, ReduceOp::kSum, 0, false},
      {CollectiveKind::kBroadcast, ReduceOp::kSum, root, false},
      {CollectiveKind::kBroadcast, ReduceOp::kSum, root, true},
  };
}

// Rows of in and out per rank for a collective of [rows, cols] per rank.
int64_t InRows(const Case& c, int world, int64_t rows) {
  return c.kind == CollectiveKind::kReduceScatter ? world * rows : rows;
}
int64_t OutRows(const Case& c, int world, int64_t rows) {
  return c.kind == CollectiveKind::kAllGather ? world * rows : rows;
}

// Random integer-valued floats in [-8, 8]: every sum of up to 8 of them (and
// every partial sum, in any order) is an integer of magnitude <= 64, exact in
// f32 and bf16, so NCCL's reduction order cannot change a bit.
Bytes RandomImage(DType dtype, int64_t elements, std::mt19937_64& rng) {
  Bytes image(static_cast<size_t>(elements * DTypeSize(dtype)));
  std::uniform_int_distribution<int> value(-8, 8);
  for (int64_t i = 0; i < elements; ++i) {
    test::Store(dtype, image, i, value(rng));
  }
  return image;
}

Bytes PoisonImage(DType dtype, int64_t elements) {
  Bytes image(static_cast<size_t>(elements * DTypeSize(dtype)));
  test::Poison(dtype, image);
  return image;
}

// The CPU backend's outputs (per rank) for `ins` (per rank).
std::vector<Bytes> CpuResults(const Case& c, DType dtype, int64_t rows,
                              int64_t cols, const std::vector<Bytes>& ins) {
  const int world = static_cast<int>(ins.size());
  auto group = CpuCommunicatorGroup::Create(world, absl::Seconds(20));
  EXPECT_TRUE(group.ok()) << group.status();
  if (!group.ok()) return {};
  std::vector<Bytes> outs(world);
  std::vector<absl::Status> statuses(world);
  std::vector<Bytes> in_copies = ins;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto context = Context::Create(Device::Cpu());
      if (!context.ok()) {
        statuses[r] = context.status();
        return;
      }
      Tensor in = Tensor::Of(in_copies[r].data(), dtype,
                             {InRows(c, world, rows), cols}, Device::Cpu());
      outs[r] = c.in_place ? in_copies[r]
                           : PoisonImage(dtype, OutRows(c, world, rows) * cols);
      Tensor out = Tensor::Of(outs[r].data(), dtype,
                              {OutRows(c, world, rows), cols}, Device::Cpu());
      if (c.in_place) in = out;
      Communicator& comm = *(*group)[r];
      switch (c.kind) {
        case CollectiveKind::kAllReduce:
          statuses[r] = comm.AllReduce(in, out, c.op, **context);
          break;
        case CollectiveKind::kReduceScatter:
          statuses[r] = comm.ReduceScatter(in, out, c.op, **context);
          break;
        case CollectiveKind::kAllGather:
          statuses[r] = comm.AllGather(in, out, **context);
          break;
        case CollectiveKind::kBroadcast:
          statuses[r] = comm.Broadcast(in, out, c.root, **context);
          break;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "CPU rank " << r << ": " << statuses[r];
  }
  return outs;
}

// Copies `image` to a new [rows, cols] tensor on the context's device.
absl::StatusOr<OwnedTensor> Upload(Context& context, DType dtype, int64_t rows,
                                   int64_t cols, Bytes image) {
  ASSIGN_OR_RETURN(OwnedTensor tensor,
                   EmptyTensor(context.allocator(), dtype, {rows, cols}));
  RETURN_IF_ERROR(
      CopyTensor(Tensor::Of(image.data(), dtype, {rows, cols}, Device::Cpu()),
                 tensor.view, context));
  RETURN_IF_ERROR(context.Synchronize());
  return tensor;
}

// The host image of a device tensor (waits for the stream).
absl::StatusOr<Bytes> Download(const Tensor& tensor, Context& context) {
  int64_t elements = 1;
  for (int64_t size : tensor.shape) elements *= size;
  Bytes image(static_cast<size_t>(elements * DTypeSize(tensor.dtype)));
  RETURN_IF_ERROR(CopyTensor(
      tensor,
      Tensor::Of(image.data(), tensor.dtype, tensor.shape, Device::Cpu()),
      context));
  return image;
}

// Runs `c` on the GPU rank `comm` with this rank's input `in_image`; the host
// image of its output.
absl::StatusOr<Bytes> RunOnGpu(const Case& c, DType dtype, int64_t rows,
                               int64_t cols, const Bytes& in_image,
                               Communicator& comm, Context& context) {
  const int world = comm.world_size();
  const int64_t in_rows = InRows(c, world, rows);
  const int64_t out_rows = OutRows(c, world, rows);
  ASSIGN_OR_RETURN(OwnedTensor in,
                   Upload(context, dtype, in_rows, cols, in_image));
  OwnedTensor out_storage;
  Tensor out = in.view;
  if (!c.in_place) {
    ASSIGN_OR_RETURN(out_storage, Upload(context, dtype, out_rows, cols,
                                         PoisonImage(dtype, out_rows * cols)));
    out = out_storage.view;
  }
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      RETURN_IF_ERROR(comm.AllReduce(in.view, out, c.op, context));
      break;
    case CollectiveKind::kReduceScatter:
      RETURN_IF_ERROR(comm.ReduceScatter(in.view, out, c.op, context));
      break;
    case CollectiveKind::kAllGather:
      RETURN_IF_ERROR(comm.AllGather(in.view, out, context));
      break;
    case CollectiveKind::kBroadcast:
      RETURN_IF_ERROR(comm.Broadcast(in.view, out, c.root, context));
      break;
  }
  return Download(out, context);
}

// Checks every element of every rank's GPU result against the CPU backend's
// (bitwise: the integer-valued inputs make the sums exact in any order) and
// every rank against rank 0.
void ExpectMatchesCpu(const Case& c, DType dtype, int64_t rows, int64_t cols,
                      const std::vector<Bytes>& ins,
                      const std::vector<Bytes>& gpu) {
  const std::vector<Bytes> cpu = CpuResults(c, dtype, rows, cols, ins);
  ASSERT_EQ(cpu.size(), gpu.size());
  const int world = static_cast<int>(ins.size());
  const int64_t elements = OutRows(c, world, rows) * cols;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(gpu[r].size(), cpu[r].size()) << CaseName(c, dtype);
    for (int64_t i = 0; i < elements; ++i) {
      EXPECT_EQ(test::Load(dtype, gpu[r], i), test::Load(dtype, cpu[r], i))
          << CaseName(c, dtype) << " rank " << r << " element " << i;
    }
    if (c.kind != CollectiveKind::kReduceScatter) {
      EXPECT_TRUE(gpu[r] == gpu[0])
          << CaseName(c, dtype) << ": rank " << r << " differs from rank 0";
    }
  }
}

std::unique_ptr<Context> GpuContext(int ordinal) {
  auto context = Context::Create(Device::Cuda(ordinal));
  EXPECT_TRUE(context.ok()) << context.status();
  return context.ok() ? *std::move(context) : nullptr;
}

TEST(NcclCommunicatorTest, SingleGpuMatchesCpu) {
  SKIP_WITHOUT_NCCL();
  std::mt19937_64 rng(test::TestSeed());
  std::unique_ptr<Context> context = GpuContext(0);
  ASSERT_NE(context, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string id, NcclCommunicator::NewUniqueId());
  EXPECT_EQ(id.size(), NcclCommunicator::kUniqueIdBytes);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<NcclCommunicator> comm,
      NcclCommunicator::Create(id, 0, 1, *context, absl::Seconds(60)));
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  for (DType dtype : kDTypes) {
    for (const Case& c : AllCases(0)) {
      const int64_t rows = std::uniform_int_distribution<int64_t>(1, 9)(rng);
      const int64_t cols = std::uniform_int_distribution<int64_t>(1, 40)(rng);
      const std::vector<Bytes> ins = {RandomImage(dtype, rows * cols, rng)};
      ASSERT_OK_AND_ASSIGN(
          Bytes got, RunOnGpu(c, dtype, rows, cols, ins[0], *comm, *context));
      ExpectMatchesCpu(c, dtype, rows, cols, ins, {got});
    }
  }
}

TEST(NcclCommunicatorTest, CreateRejectsBadArguments) {
  SKIP_WITHOUT_NCCL();
  std::unique_ptr<Context> gpu = GpuContext(0);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> cpu,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(std::string id, NcclCommunicator::NewUniqueId());
  EXPECT_EQ(NcclCommunicator::Create(id, 0, 1, *cpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(id, 1, 1, *gpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(id, -1, 1, *gpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Create(id.substr(1), 0, 1, *gpu).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommunicatorTest, BadArgumentsWriteNothing) {
  SKIP_WITHOUT_NCCL();
  std::mt19937_64 rng(test::TestSeed());
  std::unique_ptr<Context> context = GpuContext(0);
  ASSERT_NE(context, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string id, NcclCommunicator::NewUniqueId());
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<NcclCommunicator> comm,
      NcclCommunicator::Create(id, 0, 1, *context, absl::Seconds(60)));
  const DType dtype = DType::kF32;
  const int64_t rows = 4, cols = 8;
  ASSERT_OK_AND_ASSIGN(OwnedTensor in,
                       Upload(*context, dtype, rows, cols,
                              RandomImage(dtype, rows * cols, rng)));
  // [rows + 1, cols] of poison: the bad calls' outputs are views into it.
  ASSERT_OK_AND_ASSIGN(OwnedTensor out,
                       Upload(*context, dtype, rows + 1, cols,
                              PoisonImage(dtype, (rows + 1) * cols)));
  ASSERT_OK_AND_ASSIGN(OwnedTensor out_bf16,
                       Upload(*context, DType::kBF16, rows, cols,
                              PoisonImage(DType::kBF16, rows * cols)));
  const Tensor out_rows =
      Tensor::Of(out.view.data, dtype, {rows, cols}, out.view.device);
  // out shifted by one row: partly overlaps out_rows.
  const Tensor shifted =
      Tensor::Of(static_cast<uint8_t*>(out.view.data) + cols * DTypeSize(dtype),
                 dtype, {rows, cols}, out.view.device);
  Bytes host_poison = PoisonImage(dtype, rows * cols);
  const Tensor host_out =
      Tensor::Of(host_poison.data(), dtype, {rows, cols}, Device::Cpu());

  struct Bad {
    const char* what;
    std::function<absl::Status()> call;
  };
  const std::vector<Bad> bad = {
      {"AllReduce out of another shape",
       [&] {
         return comm->AllReduce(in.view, out.view, ReduceOp::kSum, *context);
       }},
      {"AllReduce out of another dtype",
       [&] {
         return comm->AllReduce(in.view, out_bf16.view, ReduceOp::kSum,
                                *context);
       }},
      {"AllReduce out on the host",
       [&] {
         return comm->AllReduce(in.view, host_out, ReduceOp::kMax, *context);
       }},
      {"AllReduce partly overlapping",
       [&] {
         return comm->AllReduce(out_rows, shifted, ReduceOp::kSum, *context);
       }},
      {"ReduceScatter in place",
       [&] {
         return comm->ReduceScatter(out_rows, out_rows, ReduceOp::kSum,
                                    *context);
       }},
      {"ReduceScatter out of another shape",
       [&] {
         return comm->ReduceScatter(in.view, out.view, ReduceOp::kSum,
                                    *context);
       }},
      {"AllGather out of another shape",
       [&] { return comm->AllGather(in.view, out.view, *context); }},
      {"AllGather in place",
       [&] { return comm->AllGather(out_rows, out_rows, *context); }},
      {"Broadcast root 1 of 1",
       [&] { return comm->Broadcast(in.view, out_rows, 1, *context); }},
      {"Broadcast root -1",
       [&] { return comm->Broadcast(in.view, out_rows, -1, *context); }},
  };
  for (const Bad& b : bad) {
    const absl::Status status = b.call();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << b.what << ": " << status;
  }
  ASSERT_OK(context->Synchronize());
  ASSERT_OK_AND_ASSIGN(Bytes got, Download(out.view, *context));
  for (int64_t i = 0; i < (rows + 1) * cols; ++i) {
    EXPECT_TRUE(test::IsPoison(dtype, got, i)) << "out element " << i;
  }
  ASSERT_OK_AND_ASSIGN(Bytes got_bf16, Download(out_bf16.view, *context));
  for (int64_t i = 0; i < rows * cols; ++i) {
    EXPECT_TRUE(test::IsPoison(DType::kBF16, got_bf16, i))
        << "bf16 out element " << i;
    EXPECT_TRUE(test::IsPoison(dtype, host_poison, i))
        << "host out element " << i;
  }
  // The communicator is still usable after the rejected calls.
  ASSERT_OK(comm->AllReduce(in.view, out_rows, ReduceOp::kSum, *context));
  ASSERT_OK(context->Synchronize());
}

TEST(NcclCommunicatorTest, SeveralGpusMatchCpu) {
  SKIP_WITHOUT_NCCL();
  const int world = CudaDeviceCount();
  if (world < 2) {
    GTEST_SKIP() << "needs 2 or more GPUs; " << world << " visible";
  }
  std::mt19937_64 rng(test::TestSeed());
  const int root = std::uniform_int_distribution<int>(0, world - 1)(rng);
  const std::vector<Case> cases = AllCases(root);
  struct Run {
    Case c;
    DType dtype;
    int64_t rows, cols;
    std::vector<Bytes> ins;  // per rank
    std::vector<Bytes> gpu;  // per rank
  };
  std::vector<Run> runs;
  for (DType dtype : kDTypes) {
    for (const Case& c : cases) {
      Run run{c,
              dtype,
              std::uniform_int_distribution<int64_t>(1, 9)(rng),
              std::uniform_int_distribution<int64_t>(1, 40)(rng),
              {},
              {}};
      for (int r = 0; r < world; ++r) {
        run.ins.push_back(
            RandomImage(dtype, InRows(c, world, run.rows) * run.cols, rng));
      }
      run.gpu.resize(world);
      runs.push_back(std::move(run));
    }
  }
  ASSERT_OK_AND_ASSIGN(std::string id, NcclCommunicator::NewUniqueId());
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                         Context::Create(Device::Cuda(r)));
        ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                         NcclCommunicator::Create(id, r, world, *context,
                                                  absl::Seconds(60)));
        for (Run& run : runs) {
          absl::StatusOr<Bytes> got =
              RunOnGpu(run.c, run.dtype, run.rows, run.cols, run.ins[r], *comm,
                       *context);
          if (!got.ok()) {
            // Tell the other ranks' NCCL before giving up.
            comm->Abort(got.status().message()).IgnoreError();
            return got.status();
          }
          run.gpu[r] = *std::move(got);
        }
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
  for (const Run& run : runs) {
    ExpectMatchesCpu(run.c, run.dtype, run.rows, run.cols, run.ins, run.gpu);
  }
}

}  // namespace
}  // namespace lossrt
