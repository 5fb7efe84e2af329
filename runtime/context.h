// Context: everything an op needs to run on a device, owned by the caller. On a
// GPU it holds a CUDA stream, cuBLAS and cuBLASLt handles with their workspace,
// an Allocator and a scratch workspace that grows on demand; all are created on
// first use. Several contexts may live side by side (one per stream or thread);
// nothing is process-wide.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<lossrt::Context> context,
//                    lossrt::Context::Create(lossrt::DefaultDevice()));
//   RETURN_IF_ERROR(SomeOp(*context, ...));
//   RETURN_IF_ERROR(context->Synchronize());
//
// The header is CUDA-free: streams and handles cross it as opaque pointers;
// code built with CUDA reaches them typed through runtime/cuda_context.h.
// Libraries that runtime/ does not link (cuDNN) keep their per-context state in
// the context's resources (ContextResource, Context::GetOrCreateResource).
#ifndef LOSSRT_RUNTIME_CONTEXT_H_
#define LOSSRT_RUNTIME_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/device.h"

namespace lossrt {

class GemmRunner;  // runtime/cuda_gemm.h
class GemmTuning;

// State that another library keeps per context (the cuDNN attention backend's
// handle and built graphs), owned by the context: see
// Context::GetOrCreateResource. The context destroys its resources first,
// newest first, after the work queued on its stream has finished and with its
// device current, so a destructor may free device objects bound to the stream.
class ContextResource {
 public:
  virtual ~ContextResource() = default;
};

class Context {
 public:
  // A context on `device` that creates and owns its stream.
  static absl::StatusOr<std::unique_ptr<Context>> Create(
      Device device = DefaultDevice());
  // A context that runs its work on the caller's `cudaStream_t` (not owned).
  static absl::StatusOr<std::unique_ptr<Context>> CreateWithStream(
      Device device, void* cuda_stream);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Device& device() const { return device_; }
  Allocator& allocator() { return allocator_; }

  // The context's cudaStream_t (created on first use).
  absl::StatusOr<void*> stream();
  // cublasHandle_t and cublasLtHandle_t bound to the stream (created on first
  // use).
  absl::StatusOr<void*> cublas_handle();
  absl::StatusOr<void*> cublaslt_handle();
  // The cuBLASLt workspace (created on first use) and its size.
  absl::StatusOr<void*> cublaslt_workspace();
  static constexpr int64_t kCublasLtWorkspaceBytes = 32 << 20;
  // Whether the context's GEMMs choose their algorithms by timing cuBLASLt's
  // candidates on a shape's first call. On by default; off, shapes not yet
  // seen take the heuristic's first choice untimed. Either way the results are
  // bitwise the same: tuning keeps only candidates that write the first
  // choice's bits. The environment variable LOSSRT_GEMM_TUNING=0 makes it
  // start off (for runs under compute-sanitizer, tools/run_gpu_tests.sh).
  absl::Status set_gemm_tuning(bool enabled);

  // Scratch memory of at least `bytes` for ops; grows (allocates) only when a
  // call needs more than any call before; ReserveWorkspace does that growth
  // ahead of the hot path. Contents are undefined; valid until the next call on
  // this context. Growing it needs a wait for the stream, so inside a CUDA
  // graph capture a call that would grow it fails (FailedPrecondition):
  // reserve the workspace before capturing.
  absl::StatusOr<void*> Workspace(int64_t bytes);
  absl::Status ReserveWorkspace(int64_t bytes) {
    return Workspace(bytes).status();
  }
  int64_t workspace_bytes() const { return workspace_.bytes(); }

  // Checks deferred to the device. An op that checks its inputs' values on the
  // device and reads the verdict back (the cross-entropy's targets and class
  // weights) cannot wait for the stream inside a CUDA graph capture. There it
  // returns OK without that check, and the captured work adds the number of
  // bad values it finds to this count (host memory that the device writes in
  // stream order); results computed from bad values are the ops' documented
  // unchecked results (NaN losses for out-of-range targets). Read the count
  // after running the graph: TakeDeferredErrorCount waits for the stream,
  // returns the count and resets it to 0. Always 0 on the CPU, where every
  // check runs before the call returns. FailedPrecondition while the stream is
  // being captured.
  absl::StatusOr<int64_t> TakeDeferredErrorCount();

  // Waits until all work queued on the context's stream is done.
  absl::Status Synchronize();

  // The context's resource of type T (a ContextResource), one per type: made by
  // `make()`, which returns absl::StatusOr<std::unique_ptr<T>>, on the first
  // call, and the same object on every later call (`make` is then not called).
  // A failed make() stores nothing, so a later call tries again.
  //
  //   ASSIGN_OR_RETURN(CudnnState * state,
  //                    context.GetOrCreateResource<CudnnState>(
  //                        [&] { return CudnnState::Create(context); }));
  template <typename T, typename Make>
  absl::StatusOr<T*> GetOrCreateResource(Make&& make);

 private:
  // Typed access to the CUDA internals below, for code built with the CUDA
  // toolkit (declared and documented in runtime/cuda_context.h).
  friend absl::StatusOr<GemmRunner*> ContextGemmRunner(Context& context);
  friend absl::StatusOr<GemmRunner*> ContextGemmRunnerFor(
      Context& context, int compute_type, int64_t workspace_bytes);
  friend absl::StatusOr<GemmTuning*> ContextGemmTuning(Context& context);
  friend absl::StatusOr<int64_t*> DeferredErrorCountOf(Context& context);
  friend absl::StatusOr<void*> ContextSideStreamHandle(Context& context);
  friend absl::StatusOr<void* const*> ContextEventHandles(Context& context,
                                                          int count);

  explicit Context(Device device);
  absl::Status CreateDeferredErrorCount();
  // The resource stored under `type`, or nullptr.
  ContextResource* FindResource(std::type_index type) const;
  void AddResource(std::type_index type,
                   std::unique_ptr<ContextResource> resource);
  // Destroys the resources (newest first) after the stream's work.
  void DestroyResources();

  Device device_;
  Allocator allocator_;
  void* stream_ = nullptr;
  bool owns_stream_ = false;
  void* cublas_ = nullptr;
  void* cublaslt_ = nullptr;
  Buffer cublaslt_workspace_;
  // Both created on first use; deleters defined where the types are complete.
  std::unique_ptr<GemmTuning, void (*)(GemmTuning*)> gemm_tuning_{nullptr,
                                                                  nullptr};
  std::unique_ptr<GemmRunner, void (*)(GemmRunner*)> gemm_runner_{nullptr,
                                                                  nullptr};
  // Runners of other compute types and workspace shares (ContextGemmRunnerFor),
  // kept across calls so that an op's GEMM plans are made once.
  struct RunnerSlot {
    int compute_type;
    int64_t workspace_bytes;
    std::unique_ptr<GemmRunner, void (*)(GemmRunner*)> runner;
  };
  std::vector<RunnerSlot> runners_;
  // A second stream and a pool of events for ops that overlap work on two
  // streams (created on first use; cudaStream_t, cudaEvent_t).
  void* side_stream_ = nullptr;
  std::vector<void*> events_;
  // Pinned host memory, written by the device (created with the stream).
  int64_t* deferred_errors_ = nullptr;
  Buffer workspace_;
  // Other libraries' state (GetOrCreateResource), in order of creation.
  std::vector<std::pair<std::type_index, std::unique_ptr<ContextResource>>>
      resources_;
};

template <typename T, typename Make>
absl::StatusOr<T*> Context::GetOrCreateResource(Make&& make) {
  static_assert(std::is_base_of<ContextResource, T>::value,
                "a context resource derives from ContextResource");
  const std::type_index type(typeid(T));
  if (ContextResource* found = FindResource(type)) {
    return static_cast<T*>(found);
  }
  absl::StatusOr<std::unique_ptr<T>> made = std::forward<Make>(make)();
  if (!made.ok()) return made.status();
  if (*made == nullptr) {
    return absl::InternalError(
        "Context::GetOrCreateResource: make() returned no resource");
  }
  T* resource = made->get();
  AddResource(type, std::move(*made));
  return resource;
}

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_CONTEXT_H_
