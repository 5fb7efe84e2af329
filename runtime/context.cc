// Context: lazily created CUDA stream, cuBLAS/cuBLASLt handles and workspaces,
// and other libraries' per-context resources.
#include "runtime/context.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "runtime/cuda_context.h"
#include "runtime/cuda_gemm.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace {

absl::Status RequireCuda(const Device& device, const char* what) {
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " needs a CUDA context, this one is on ", device.ToString()));
  }
#ifndef LOSSRT_WITH_CUDA
  return absl::UnavailableError(absl::StrCat(what, ": built without CUDA"));
#endif
  return absl::OkStatus();
}

}  // namespace

Context::Context(Device device) : device_(device), allocator_(device) {}

absl::StatusOr<std::unique_ptr<Context>> Context::Create(Device device) {
  if (device.is_cuda()) {
    if (!BuiltWithCuda())
      return absl::UnavailableError(
          "CUDA device requested, but built without CUDA");
    const int count = CudaDeviceCount();
    if (device.ordinal < 0 || device.ordinal >= count) {
      return absl::UnavailableError(absl::StrCat(
          "no CUDA device ", device.ToString(), " (", count, " present)"));
    }
  }
  return std::unique_ptr<Context>(new Context(device));
}

absl::StatusOr<std::unique_ptr<Context>> Context::CreateWithStream(
    Device device, void* cuda_stream) {
  if (!device.is_cuda())
    return InvalidArgument("CreateWithStream needs a CUDA device, got ",
                           device.ToString());
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Create(device));
  context->stream_ = cuda_stream;
  context->owns_stream_ = false;
  RETURN_IF_ERROR(context->CreateDeferredErrorCount());
  return context;
}

Context::~Context() {
  DestroyResources();
  gemm_runner_.reset();
  runners_.clear();
  gemm_tuning_.reset();
  workspace_.Reset();
  cublaslt_workspace_.Reset();
#ifdef LOSSRT_WITH_CUDA
  if (device_.is_cuda()) {
    auto scoped = ScopedDevice::Enter(device_.ordinal);
    if (stream_ != nullptr)
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    if (side_stream_ != nullptr) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(side_stream_));
      cudaStreamDestroy(static_cast<cudaStream_t>(side_stream_));
    }
    for (void* event : events_)
      cudaEventDestroy(static_cast<cudaEvent_t>(event));
    if (deferred_errors_ != nullptr) cudaFreeHost(deferred_errors_);
    if (cublaslt_ != nullptr)
      cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
    if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
    if (owns_stream_ && stream_ != nullptr)
      cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
#endif
}

ContextResource* Context::FindResource(std::type_index type) const {
  for (const auto& [stored, resource] : resources_) {
    if (stored == type) return resource.get();
  }
  return nullptr;
}

void Context::AddResource(std::type_index type,
                          std::unique_ptr<ContextResource> resource) {
  resources_.emplace_back(type, std::move(resource));
}

void Context::DestroyResources() {
#ifdef LOSSRT_WITH_CUDA
  if (device_.is_cuda() && !resources_.empty()) {
    // A resource may hold objects that queued work still uses (a cuDNN
    // handle's buffers): wait for the stream, and destroy on the device.
    auto scoped = ScopedDevice::Enter(device_.ordinal);
    if (stream_ != nullptr)
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    while (!resources_.empty()) resources_.pop_back();
    return;
  }
#endif
  while (!resources_.empty()) resources_.pop_back();
}

absl::StatusOr<void*> Context::stream() {
  RETURN_IF_ERROR(RequireCuda(device_, "stream()"));
#ifdef LOSSRT_WITH_CUDA
  if (stream_ == nullptr) {
    ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
    cudaStream_t stream;
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_ = stream;
    owns_stream_ = true;
  }
  // With the stream, so that it exists before any capture of the stream.
  if (deferred_errors_ == nullptr) RETURN_IF_ERROR(CreateDeferredErrorCount());
#endif
  return stream_;
}

absl::StatusOr<void*> Context::cublas_handle() {
  RETURN_IF_ERROR(RequireCuda(device_, "cublas_handle()"));
#ifdef LOSSRT_WITH_CUDA
  if (cublas_ == nullptr) {
    ASSIGN_OR_RETURN(void* stream, this->stream());
    ASSIGN_OR_RETURN(void* workspace, cublaslt_workspace());
    ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
    cublasHandle_t handle;
    CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
    cublas_ = handle;
    CUBLAS_RETURN_IF_ERROR(
        cublasSetStream(handle, static_cast<cudaStream_t>(stream)));
    CUBLAS_RETURN_IF_ERROR(
        cublasSetWorkspace(handle, workspace, kCublasLtWorkspaceBytes));
  }
#endif
  return cublas_;
}

absl::StatusOr<void*> Context::cublaslt_handle() {
  RETURN_IF_ERROR(RequireCuda(device_, "cublaslt_handle()"));
#ifdef LOSSRT_WITH_CUDA
  if (cublaslt_ == nullptr) {
    ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
    cublasLtHandle_t handle;
    CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
    cublaslt_ = handle;
  }
#endif
  return cublaslt_;
}

absl::StatusOr<void*> Context::cublaslt_workspace() {
  RETURN_IF_ERROR(RequireCuda(device_, "cublaslt_workspace()"));
  if (cublaslt_workspace_.data() == nullptr) {
    ASSIGN_OR_RETURN(cublaslt_workspace_,
                     allocator_.Allocate(kCublasLtWorkspaceBytes));
  }
  return cublaslt_workspace_.data();
}

absl::Status Context::set_gemm_tuning(bool enabled) {
  RETURN_IF_ERROR(RequireCuda(device_, "set_gemm_tuning()"));
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(GemmTuning * tuning, ContextGemmTuning(*this));
  tuning->set_enabled(enabled);
#else
  (void)enabled;
#endif
  return absl::OkStatus();
}

absl::Status Context::CreateDeferredErrorCount() {
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  void* count = nullptr;
  // Mapped pinned memory: kernels write it through the same pointer (unified
  // addressing) and the host reads it after a wait, with no copy to capture.
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&count, sizeof(int64_t), cudaHostAllocMapped));
  deferred_errors_ = static_cast<int64_t*>(count);
  *deferred_errors_ = 0;
#endif
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Context::TakeDeferredErrorCount() {
  if (device_.is_cpu() || deferred_errors_ == nullptr) return 0;
#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(
      cudaStreamIsCapturing(static_cast<cudaStream_t>(stream_), &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(
        "TakeDeferredErrorCount: the context's stream is being captured "
        "into a CUDA graph; read the count after running the graph");
  }
  RETURN_IF_ERROR(Synchronize());
  volatile int64_t* count = deferred_errors_;
  const int64_t value = *count;
  *count = 0;
  return value;
#else
  return 0;
#endif
}

absl::StatusOr<void*> Context::Workspace(int64_t bytes) {
  if (bytes < 0) return InvalidArgument("Workspace: negative size ", bytes);
  if (bytes > workspace_.bytes()) {
#ifdef LOSSRT_WITH_CUDA
    // Work queued earlier may still use the old block; it goes back to the
    // cache only after. That wait is impossible in a capture (and the
    // captured work would keep using the old block at every replay).
    if (device_.is_cuda() && stream_ != nullptr) {
      ASSIGN_OR_RETURN(ScopedDevice scoped,
                       ScopedDevice::Enter(device_.ordinal));
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      CUDA_RETURN_IF_ERROR(
          cudaStreamIsCapturing(static_cast<cudaStream_t>(stream_), &capture));
      if (capture != cudaStreamCaptureStatusNone) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Workspace: growing the workspace from ", workspace_.bytes(),
            " to ", bytes,
            " bytes inside a CUDA graph capture; reserve it before capturing "
            "(Context::ReserveWorkspace)"));
      }
      RETURN_IF_ERROR(Synchronize());
    }
#endif
    workspace_.Reset();
    ASSIGN_OR_RETURN(workspace_, allocator_.Allocate(bytes));
  }
  return workspace_.data();
}

absl::Status Context::Synchronize() {
  if (device_.is_cpu()) return absl::OkStatus();
#ifdef LOSSRT_WITH_CUDA
  if (stream_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_.ordinal));
  CUDA_RETURN_IF_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
  return absl::OkStatus();
}

#ifdef LOSSRT_WITH_CUDA
absl::StatusOr<GemmTuning*> ContextGemmTuning(Context& context) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "ContextGemmTuning"));
  if (context.gemm_tuning_ == nullptr) {
    context.gemm_tuning_ = std::unique_ptr<GemmTuning, void (*)(GemmTuning*)>(
        new GemmTuning, [](GemmTuning* tuning) { delete tuning; });
    // LOSSRT_GEMM_TUNING=0 makes a context start with tuning off, for runs
    // under compute-sanitizer's racecheck (tools/run_gpu_tests.sh), where
    // every timed cuBLASLt launch is instrumented and costs seconds; the
    // untuned GEMMs write the same bits.
    const char* tuning_env = std::getenv("LOSSRT_GEMM_TUNING");
    if (tuning_env != nullptr && std::strcmp(tuning_env, "0") == 0) {
      context.gemm_tuning_->set_enabled(false);
    }
  }
  return context.gemm_tuning_.get();
}

absl::StatusOr<GemmRunner*> ContextGemmRunner(Context& context) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "ContextGemmRunner"));
  if (context.gemm_runner_ == nullptr) {
    ASSIGN_OR_RETURN(void* handle, context.cublaslt_handle());
    ASSIGN_OR_RETURN(void* workspace, context.cublaslt_workspace());
    ASSIGN_OR_RETURN(GemmTuning * tuning, ContextGemmTuning(context));
    context.gemm_runner_ = std::unique_ptr<GemmRunner, void (*)(GemmRunner*)>(
        new GemmRunner(static_cast<cublasLtHandle_t>(handle), workspace,
                       Context::kCublasLtWorkspaceBytes, CUBLAS_COMPUTE_32F,
                       tuning),
        [](GemmRunner* runner) { delete runner; });
  }
  return context.gemm_runner_.get();
}

absl::StatusOr<GemmRunner*> ContextGemmRunnerFor(Context& context,
                                                 int compute_type,
                                                 int64_t workspace_bytes) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "ContextGemmRunnerFor"));
  if (workspace_bytes < 0 ||
      workspace_bytes > Context::kCublasLtWorkspaceBytes) {
    return InvalidArgument("ContextGemmRunnerFor: workspace_bytes ",
                           workspace_bytes, " is outside [0, ",
                           Context::kCublasLtWorkspaceBytes, "]");
  }
  for (Context::RunnerSlot& slot : context.runners_) {
    if (slot.compute_type == compute_type &&
        slot.workspace_bytes == workspace_bytes) {
      return slot.runner.get();
    }
  }
  ASSIGN_OR_RETURN(void* handle, context.cublaslt_handle());
  ASSIGN_OR_RETURN(void* workspace, context.cublaslt_workspace());
  ASSIGN_OR_RETURN(GemmTuning * tuning, ContextGemmTuning(context));
  context.runners_.push_back(Context::RunnerSlot{
      compute_type, workspace_bytes,
      std::unique_ptr<GemmRunner, void (*)(GemmRunner*)>(
          new GemmRunner(
              static_cast<cublasLtHandle_t>(handle), workspace, workspace_bytes,
              static_cast<cublasComputeType_t>(compute_type), tuning),
          [](GemmRunner* runner) { delete runner; })});
  return context.runners_.back().runner.get();
}

absl::StatusOr<void*> ContextSideStreamHandle(Context& context) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "ContextSideStream"));
  if (context.side_stream_ == nullptr) {
    ASSIGN_OR_RETURN(ScopedDevice scoped,
                     ScopedDevice::Enter(context.device_.ordinal));
    int least = 0;
    int greatest = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t stream = nullptr;
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    context.side_stream_ = stream;
  }
  return context.side_stream_;
}

absl::StatusOr<void* const*> ContextEventHandles(Context& context, int count) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "ContextEvents"));
  constexpr int kMaxEvents = 64;
  if (count < 1 || count > kMaxEvents) {
    return InvalidArgument("ContextEvents: count ", count, " is outside [1, ",
                           kMaxEvents, "]");
  }
  if (static_cast<int>(context.events_.size()) < count) {
    ASSIGN_OR_RETURN(ScopedDevice scoped,
                     ScopedDevice::Enter(context.device_.ordinal));
    while (static_cast<int>(context.events_.size()) < count) {
      cudaEvent_t event = nullptr;
      CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      context.events_.push_back(event);
    }
  }
  return context.events_.data();
}

absl::StatusOr<int64_t*> DeferredErrorCountOf(Context& context) {
  RETURN_IF_ERROR(RequireCuda(context.device_, "DeferredErrorCountOf"));
  if (context.deferred_errors_ == nullptr) {
    RETURN_IF_ERROR(context.CreateDeferredErrorCount());
  }
  return context.deferred_errors_;
}
#endif

}  // namespace lossrt
