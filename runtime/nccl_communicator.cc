// The NCCL communicator: non-blocking NCCL communicators on a context's GPU,
// collectives queued on its stream, NCCL's return codes as Status. Without
// NCCL (LOSSRT_WITH_NCCL undefined) only stubs that say so.
#include "runtime/nccl_communicator.h"

#include "runtime/status.h"

#ifdef LOSSRT_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {

#ifdef LOSSRT_WITH_NCCL

static_assert(NcclCommunicator::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES,
              "kUniqueIdBytes must be NCCL's");

namespace {

ncclComm_t AsComm(void* comm) { return static_cast<ncclComm_t>(comm); }

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

// Polls the communicator's state until it is no longer in progress or
// `deadline` passes; the state.
absl::StatusOr<ncclResult_t> WaitWhileInProgress(
    ncclComm_t comm, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress ||
        std::chrono::steady_clock::now() > deadline) {
      return state;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

// Runs an NCCL call on the communicator and settles it (see Settle).
#define LOSSRT_NCCL_SETTLE(call) \
  RETURN_IF_ERROR(Settle(static_cast<int>(call), #call, __LINE__))

bool NcclCommunicator::Available() { return true; }

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    absl::string_view unique_id, int rank, int world_size, Context& context,
    absl::Duration timeout) {
  if (!context.device().is_cuda()) {
    return InvalidArgument("NcclCommunicator: the context is on ",
                           context.device().ToString(), ", not a GPU");
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument("NcclCommunicator: rank ", rank,
                           " is not in a world of ", world_size);
  }
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return InvalidArgument("NcclCommunicator: the unique id has ",
                           unique_id.size(), " bytes, not ",
                           NCCL_UNIQUE_ID_BYTES);
  }
  if (timeout <= absl::ZeroDuration()) {
    return InvalidArgument("NcclCommunicator: timeout ",
                           absl::FormatDuration(timeout), " is not positive");
  }
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started =
      ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    NCCL_RETURN_IF_ERROR(started);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  absl::StatusOr<ncclResult_t> state = WaitWhileInProgress(comm, deadline);
  if (!state.ok() || *state != ncclSuccess) {
    ncclCommAbort(comm);
    if (!state.ok()) return state.status();
    if (*state == ncclInProgress) {
      return absl::DeadlineExceededError(absl::StrCat(
          "NcclCommunicator: rank ", rank, " of ", world_size, " waited ",
          absl::FormatDuration(timeout), " for the other ranks to join"));
    }
    return NcclStatus(*state, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, rank, world_size, context.device(), timeout));
}

NcclCommunicator::NcclCommunicator(void* comm, int rank, int world_size,
                                   Device device, absl::Duration timeout)
    : comm_(comm),
      rank_(rank),
      world_size_(world_size),
      device_(device),
      timeout_(timeout) {}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  // Finalize flushes the communicator's work; abort when that fails or does
  // not finish within the timeout (a destructor must not hang).
  absl::StatusOr<ScopedDevice> scoped = ScopedDevice::Enter(device_.ordinal);
  ncclComm_t comm = AsComm(comm_);
  bool clean = false;
  if (scoped.ok()) {
    const ncclResult_t finalized = ncclCommFinalize(comm);
    clean = finalized == ncclSuccess || finalized == ncclInProgress;
  }
  if (clean) {
    absl::StatusOr<ncclResult_t> state =
        WaitWhileInProgress(comm, std::chrono::steady_clock::now() +
                                      absl::ToChronoNanoseconds(timeout_));
    clean = state.ok() && *state == ncclSuccess;
  }
  if (clean) {
    ncclCommDestroy(comm);
  } else {
    ncclCommAbort(comm);
  }
}

absl::Status NcclCommunicator::Prepare(CollectiveKind kind, const Tensor& in,
                                       const Tensor& out, int root,
                                       const Context& context) const {
  if (!aborted_.ok()) return aborted_;
  if (context.device() != device_) {
    return InvalidArgument(CollectiveName(kind), ": the context is on ",
                           context.device().ToString(),
                           ", the NCCL communicator on ", device_.ToString());
  }
  return CheckCollectiveArguments(kind, world_size_, root, context, in, out,
                                  {DType::kF32, DType::kBF16, DType::kF16,
                                   DType::kF64, DType::kI32, DType::kI64});
}

absl::Status NcclCommunicator::Settle(int result, const char* call, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) {
    return NcclStatus(result, call, __FILE__, line);
  }
  ASSIGN_OR_RETURN(ncclResult_t state,
                   WaitWhileInProgress(
                       AsComm(comm_), std::chrono::steady_clock::now() +
                                          absl::ToChronoNanoseconds(timeout_)));
  if (state == ncclInProgress) {
    return absl::DeadlineExceededError(absl::StrCat(
        call, " was still in progress after ", absl::FormatDuration(timeout_),
        " at ", __FILE__, ":", line));
  }
  return state == ncclSuccess ? absl::OkStatus()
                              : NcclStatus(state, call, __FILE__, line);
}

absl::Status NcclCommunicator::AllReduce(const Tensor& in, const Tensor& out,
                                         ReduceOp op, Context& context) {
  RETURN_IF_ERROR(
      Prepare(CollectiveKind::kAllReduce, in, out, /*root=*/0, context));
  if (in.numel() == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  LOSSRT_NCCL_SETTLE(ncclAllReduce(in.data, out.data, in.numel(),
                                   NcclType(in.dtype), NcclOp(op),
                                   AsComm(comm_), stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::ReduceScatter(const Tensor& in,
                                             const Tensor& out, ReduceOp op,
                                             Context& context) {
  RETURN_IF_ERROR(
      Prepare(CollectiveKind::kReduceScatter, in, out, /*root=*/0, context));
  if (out.numel() == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  LOSSRT_NCCL_SETTLE(ncclReduceScatter(in.data, out.data, out.numel(),
                                       NcclType(in.dtype), NcclOp(op),
                                       AsComm(comm_), stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const Tensor& in, const Tensor& out,
                                         Context& context) {
  RETURN_IF_ERROR(
      Prepare(CollectiveKind::kAllGather, in, out, /*root=*/0, context));
  if (in.numel() == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  LOSSRT_NCCL_SETTLE(ncclAllGather(in.data, out.data, in.numel(),
                                   NcclType(in.dtype), AsComm(comm_), stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Broadcast(const Tensor& in, const Tensor& out,
                                         int root, Context& context) {
  RETURN_IF_ERROR(Prepare(CollectiveKind::kBroadcast, in, out, root, context));
  if (in.numel() == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  LOSSRT_NCCL_SETTLE(ncclBroadcast(in.data, out.data, in.numel(),
                                   NcclType(in.dtype), root, AsComm(comm_),
                                   stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Abort(absl::string_view reason) {
  if (comm_ == nullptr) return absl::OkStatus();
  aborted_ = absl::AbortedError(
      absl::StrCat("NcclCommunicator: rank ", rank_, " was aborted: ", reason));
  ncclComm_t comm = AsComm(comm_);
  comm_ = nullptr;
  NCCL_RETURN_IF_ERROR(ncclCommAbort(comm));
  return absl::OkStatus();
}

#undef LOSSRT_NCCL_SETTLE

#else  // !LOSSRT_WITH_NCCL

namespace {
absl::Status NoNccl() {
  return absl::UnimplementedError(
      "NcclCommunicator: this build has no NCCL (it needs a CUDA toolkit "
      "with libnccl and nccl.h)");
}
}  // namespace

bool NcclCommunicator::Available() { return false; }

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() { return NoNccl(); }

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    absl::string_view, int, int, Context&, absl::Duration) {
  return NoNccl();
}

NcclCommunicator::NcclCommunicator(void* comm, int rank, int world_size,
                                   Device device, absl::Duration timeout)
    : comm_(comm),
      rank_(rank),
      world_size_(world_size),
      device_(device),
      timeout_(timeout) {}

NcclCommunicator::~NcclCommunicator() = default;

absl::Status NcclCommunicator::AllReduce(const Tensor&, const Tensor&, ReduceOp,
                                         Context&) {
  return NoNccl();
}
absl::Status NcclCommunicator::ReduceScatter(const Tensor&, const Tensor&,
                                             ReduceOp, Context&) {
  return NoNccl();
}
absl::Status NcclCommunicator::AllGather(const Tensor&, const Tensor&,
                                         Context&) {
  return NoNccl();
}
absl::Status NcclCommunicator::Broadcast(const Tensor&, const Tensor&, int,
                                         Context&) {
  return NoNccl();
}
absl::Status NcclCommunicator::Abort(absl::string_view) { return NoNccl(); }

#endif  // LOSSRT_WITH_NCCL

}  // namespace lossrt
