// The cross-entropy op: argument checks, then dispatch to the CPU backend or
// the CUDA kernels. Every check runs before anything is written, including the
// target range check, which on the GPU is a one-block scan whose result is read
// back once -- except inside a CUDA graph capture, where the scan's verdict is
// added to the context's deferred error count instead (cross_entropy.h).
#include "loss/cross_entropy.h"

#include "absl/strings/str_cat.h"
#include "loss/cross_entropy_cpu.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/kernel_args.h"
#include "loss/loss_checks.h"
#include "runtime/int_math.h"
#include "runtime/status.h"

#ifdef LOSSRT_WITH_CUDA
#include "loss/cross_entropy_cuda.h"
#include "runtime/cuda_context.h"
#include "runtime/cuda_status.h"
#include "runtime/scoped_device.h"
#endif

namespace lossrt {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t bytes) { return RoundUp(bytes, kAlign); }

struct Problem {
  int64_t tokens = 0;
  int64_t vocab = 0;
};

absl::StatusOr<Problem> CheckInputs(const Context& context,
                                    const Tensor& logits, const Tensor& targets,
                                    const CrossEntropyOptions& options) {
  RETURN_IF_ERROR(
      CheckDType(logits, {DType::kF32, DType::kBF16, DType::kF16}, "logits"));
  if (logits.rank() != 2)
    return InvalidArgument("logits: expected [tokens, vocab], got ",
                           logits.ShapeString());
  Problem problem{logits.dim(0), logits.dim(1)};
  if (problem.tokens < 1) {
    return InvalidArgument("logits: tokens must be >= 1, got ",
                           logits.ShapeString());
  }
  RETURN_IF_ERROR(ce::CheckVocab(problem.vocab, "logits"));
  RETURN_IF_ERROR(ce::CheckOnContext(logits, context, "logits"));
  RETURN_IF_ERROR(CheckDType(targets, {DType::kI64, DType::kI32}, "targets"));
  RETURN_IF_ERROR(CheckShape(targets, {problem.tokens}, "targets"));
  RETURN_IF_ERROR(ce::CheckOnContext(targets, context, "targets"));
  RETURN_IF_ERROR(
      ce::CheckCrossEntropyOptions(options, problem.vocab, context));
  return problem;
}

absl::Status CheckGradLogits(const Context& context, const Tensor& grad,
                             const Tensor& logits, const Problem& problem) {
  if (grad.dtype != logits.dtype) {
    return InvalidArgument("grad_logits: dtype must match the logits (",
                           DTypeName(logits.dtype), "), got ",
                           DTypeName(grad.dtype));
  }
  RETURN_IF_ERROR(
      CheckShape(grad, {problem.tokens, problem.vocab}, "grad_logits"));
  RETURN_IF_ERROR(ce::CheckOnContext(grad, context, "grad_logits"));
  if (Overlaps(grad, logits) &&
      (grad.data != logits.data ||
       grad.effective_row_stride() != logits.effective_row_stride())) {
    return InvalidArgument(
        "grad_logits overlaps the logits without being the same tensor; pass "
        "the logits themselves for the in-place mode");
  }
  return absl::OkStatus();
}

absl::Status CheckNoOverlap(const Tensor& output, const char* name,
                            std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* input : inputs) {
    if (input != nullptr && Overlaps(output, *input))
      return InvalidArgument(name, " overlaps an input");
  }
  return absl::OkStatus();
}

// Which pieces a call computes.
struct Request {
  const Tensor* loss = nullptr;  // forward outputs
  const Tensor* lse = nullptr;   // output (forward) or input (backward)
  const Tensor* grad_logits = nullptr;
  const Tensor* grad_loss = nullptr;           // incoming gradient
  const CrossEntropyExtras* extras = nullptr;  // forward outputs
  // The backward's saved entropy (f32 [tokens]); read only with
  // entropy_weight != 0.
  const Tensor* saved_entropy = nullptr;
  bool backward_only = false;
};

// The workspace: the target scan's stats, then three [tokens] f32 arrays: the
// per-token losses of a reduced call, the accuracy's per-token terms, and the
// entropy that a backward with entropy_weight != 0 and no saved entropy
// recomputes.
struct WorkspaceLayout {
  int64_t row_loss = 0;
  int64_t row_hit = 0;
  int64_t entropy = 0;
  int64_t bytes = 0;
};

WorkspaceLayout LayoutWorkspace(int64_t tokens) {
  const int64_t row_bytes =
      AlignUp(tokens * static_cast<int64_t>(sizeof(float)));
  WorkspaceLayout layout;
  layout.row_loss = AlignUp(sizeof(ce::TargetStats));
  layout.row_hit = layout.row_loss + row_bytes;
  layout.entropy = layout.row_hit + row_bytes;
  layout.bytes = layout.entropy + row_bytes;
  return layout;
}

float* WorkspaceArray(void* workspace, int64_t offset) {
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + offset);
}

// Points args at the requested extras (row_hit at the workspace's array).
void SetExtras(const CrossEntropyExtras* extras, float* row_hit,
               ce::RowArgs& args) {
  if (extras == nullptr) return;
  if (extras->predicted.has_value()) {
    args.predicted = extras->predicted->data;
    args.predicted_i64 = extras->predicted->dtype == DType::kI64;
  }
  if (extras->accuracy.has_value()) args.row_hit = row_hit;
  if (extras->entropy.has_value())
    args.entropy = extras->entropy->data_as<float>();
  if (extras->target_logprob.has_value())
    args.target_logprob = extras->target_logprob->data_as<float>();
}

absl::Status Run(Context& context, const Tensor& logits, const Tensor& targets,
                 const CrossEntropyOptions& options, const Request& request) {
  ASSIGN_OR_RETURN(Problem problem,
                   CheckInputs(context, logits, targets, options));
  const Tensor* weights =
      options.class_weights.has_value() ? &*options.class_weights : nullptr;
  if (request.loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*request.loss, options.reduction,
                                        problem.tokens, context, "loss"));
    RETURN_IF_ERROR(
        CheckNoOverlap(*request.loss, "loss",
                       {&logits, &targets, weights, request.grad_logits}));
  }
  if (request.lse != nullptr) {
    RETURN_IF_ERROR(ce::CheckLseTensor(*request.lse, problem.tokens, context));
    if (!request.backward_only) {
      RETURN_IF_ERROR(CheckNoOverlap(
          *request.lse, "lse",
          {&logits, &targets, weights, request.loss, request.grad_logits}));
    }
  }
  if (request.grad_loss != nullptr) {
    RETURN_IF_ERROR(ce::CheckLossTensor(*request.grad_loss, options.reduction,
                                        problem.tokens, context, "grad_loss"));
  }
  if (request.extras != nullptr) {
    RETURN_IF_ERROR(ce::CheckExtras(*request.extras, problem.tokens, context,
                                    {{&logits, "the logits"},
                                     {&targets, "the targets"},
                                     {weights, "class_weights"},
                                     {request.loss, "loss"},
                                     {request.lse, "lse"},
                                     {request.grad_logits, "grad_logits"},
                                     {request.grad_loss, "grad_loss"}}));
  }
  if (request.grad_logits != nullptr) {
    RETURN_IF_ERROR(
        CheckGradLogits(context, *request.grad_logits, logits, problem));
    RETURN_IF_ERROR(CheckNoOverlap(*request.grad_logits, "grad_logits",
                                   {&targets, weights, request.grad_loss}));
    if (request.backward_only)
      RETURN_IF_ERROR(
          CheckNoOverlap(*request.grad_logits, "grad_logits", {request.lse}));
  }
  // The saved entropy is checked whether or not entropy_weight reads it, so
  // that a wrong one fails the same way in every call.
  if (request.saved_entropy != nullptr) {
    RETURN_IF_ERROR(ce::CheckLseTensor(*request.saved_entropy, problem.tokens,
                                       context, "saved_entropy"));
    RETURN_IF_ERROR(CheckNoOverlap(*request.grad_logits, "grad_logits",
                                   {request.saved_entropy}));
  }
  const bool use_saved_entropy =
      request.saved_entropy != nullptr && options.entropy_weight != 0.0f;

  ce::RowArgs args = ce::MakeRowArgs(
      logits.data, logits.dtype, logits.effective_row_stride(), problem.tokens,
      problem.vocab, targets.data, targets.dtype == DType::kI64, options);
  if (request.grad_loss != nullptr) {
    args.grad_loss = request.grad_loss->data_as<const float>();
    args.grad_loss_per_row = options.reduction == Reduction::kNone;
  }
  if (request.grad_logits != nullptr) {
    args.grad = request.grad_logits->data;
    args.grad_type = request.grad_logits->dtype;
    args.grad_stride = request.grad_logits->effective_row_stride();
  }
  args.lse = request.lse != nullptr ? request.lse->data_as<float>() : nullptr;
  const bool reduce =
      !request.backward_only && options.reduction != Reduction::kNone;
  const WorkspaceLayout layout = LayoutWorkspace(problem.tokens);
  const bool accuracy =
      request.extras != nullptr && request.extras->accuracy.has_value();
  const bool needs_workspace =
      reduce || accuracy ||
      (request.backward_only && options.entropy_weight != 0.0f &&
       !use_saved_entropy);
  if (use_saved_entropy) {
    // An input of the backward's kernels (RowArgs::entropy).
    args.entropy = const_cast<float*>(request.saved_entropy->data_as<float>());
  }

  if (context.device().is_cpu()) {
    const ce::TargetStats stats =
        ce::ScanTargetsCpu(args.targets, args.targets_i64, args.rows,
                           args.vocab, args.ignore_index, args.class_weights);
    RETURN_IF_ERROR(
        ce::CheckTargetStats(stats, options, problem.tokens, problem.vocab));
    args.stats = &stats;
    if (request.backward_only) {
      ce::BackwardCpu(args);  // without a saved entropy, from the rows
      return absl::OkStatus();
    }
    // Per-token losses of a reduced call and the accuracy's terms go to the
    // context's workspace (no allocation once it has grown), as on the GPU.
    void* workspace = nullptr;
    if (needs_workspace) {
      ASSIGN_OR_RETURN(workspace, context.Workspace(CrossEntropyWorkspaceBytes(
                                      problem.tokens, problem.vocab)));
    }
    float* row_loss = reduce ? WorkspaceArray(workspace, layout.row_loss)
                             : request.loss->data_as<float>();
    SetExtras(request.extras,
              accuracy ? WorkspaceArray(workspace, layout.row_hit) : nullptr,
              args);
    args.row_loss = row_loss;
    ce::RowsCpu(args);
    if (reduce)
      request.loss->data_as<float>()[0] =
          static_cast<float>(ce::SumRowsCpu(row_loss, problem.tokens));
    if (accuracy) {
      request.extras->accuracy->data_as<float>()[0] =
          static_cast<float>(ce::SumRowsCpu(args.row_hit, problem.tokens));
    }
    return absl::OkStatus();
  }

#ifdef LOSSRT_WITH_CUDA
  ASSIGN_OR_RETURN(ScopedDevice scoped,
                   ScopedDevice::Enter(context.device().ordinal));
  ASSIGN_OR_RETURN(cudaStream_t stream, CudaStreamOf(context));
  // Inside a CUDA graph capture nothing may wait for the stream: the scan's
  // verdict goes to the context's deferred error count (after the kernels,
  // so that the row kernel still follows the scan).
  ASSIGN_OR_RETURN(const bool capturing, StreamIsCapturing(context));
  ASSIGN_OR_RETURN(void* workspace,
                   context.Workspace(CrossEntropyWorkspaceBytes(
                       problem.tokens, problem.vocab)));
  auto* stats = static_cast<ce::TargetStats*>(workspace);
  float* row_loss = WorkspaceArray(workspace, layout.row_loss);
  CUDA_RETURN_IF_ERROR(ce::LaunchTargetStats(
      args.targets, args.targets_i64, args.rows, args.vocab, args.ignore_index,
      args.class_weights, stats, stream));
  const bool read_back = ce::ChecksTargetStats(options) && !capturing;
  args.follows_scan = !read_back;
  if (read_back) {
    ce::TargetStats host_stats;
    RETURN_IF_ERROR(ce::ReadBackTargetStats(
        stats, stream, options, problem.tokens, problem.vocab, &host_stats));
  }
  args.stats = stats;
  int num_sms = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &num_sms, cudaDevAttrMultiProcessorCount, context.device().ordinal));
  if (request.backward_only) {
    if (options.entropy_weight != 0.0f && !use_saved_entropy) {
      // The rows' entropy first, from a forward statistics pass (one more
      // read of the logits): the saved lse does not give it.
      ce::RowArgs stats_args = args;
      stats_args.grad = nullptr;
      stats_args.grad_loss = nullptr;
      stats_args.lse = nullptr;
      stats_args.row_loss = row_loss;
      stats_args.entropy = WorkspaceArray(workspace, layout.entropy);
      CUDA_RETURN_IF_ERROR(ce::LaunchRows(stats_args, num_sms, stream));
      args.entropy = stats_args.entropy;
      args.follows_scan = false;
    }
    CUDA_RETURN_IF_ERROR(ce::LaunchBackward(args, num_sms, stream));
  } else {
    args.row_loss = reduce ? row_loss : request.loss->data_as<float>();
    SetExtras(request.extras,
              accuracy ? WorkspaceArray(workspace, layout.row_hit) : nullptr,
              args);
    CUDA_RETURN_IF_ERROR(ce::LaunchRows(args, num_sms, stream));
    if (reduce)
      CUDA_RETURN_IF_ERROR(ce::LaunchSumRows(row_loss, problem.tokens,
                                             request.loss->data_as<float>(),
                                             stream, /*follows_rows=*/true));
    if (accuracy) {
      CUDA_RETURN_IF_ERROR(
          ce::LaunchSumRows(args.row_hit, problem.tokens,
                            request.extras->accuracy->data_as<float>(), stream,
                            /*follows_rows=*/!reduce));
    }
  }
  if (capturing)
    RETURN_IF_ERROR(ce::DeferTargetStatsCheck(context, stats, options, stream));
  return absl::OkStatus();
#else
  return absl::UnavailableError(
      "cross-entropy on a CUDA device: built without CUDA");
#endif
}

}  // namespace

int64_t CrossEntropyWorkspaceBytes(int64_t tokens, int64_t vocab) {
  (void)vocab;
  return LayoutWorkspace(tokens).bytes;
}

absl::Status CrossEntropyForward(Context& context, const Tensor& logits,
                                 const Tensor& targets,
                                 const CrossEntropyOptions& options,
                                 const Tensor& loss, const Tensor* lse,
                                 const CrossEntropyExtras* extras) {
  Request request;
  request.loss = &loss;
  request.lse = lse;
  request.extras = extras;
  return Run(context, logits, targets, options, request);
}

absl::Status CrossEntropyBackward(Context& context, const Tensor& logits,
                                  const Tensor& targets, const Tensor& lse,
                                  const Tensor& grad_loss,
                                  const CrossEntropyOptions& options,
                                  const Tensor& grad_logits,
                                  const Tensor* saved_entropy) {
  Request request;
  request.lse = &lse;
  request.grad_loss = &grad_loss;
  request.grad_logits = &grad_logits;
  request.saved_entropy = saved_entropy;
  request.backward_only = true;
  return Run(context, logits, targets, options, request);
}

absl::Status CrossEntropyForwardBackward(Context& context, const Tensor& logits,
                                         const Tensor& targets,
                                         const CrossEntropyOptions& options,
                                         const Tensor& loss, const Tensor* lse,
                                         const Tensor& grad_logits,
                                         const Tensor* grad_loss,
                                         const CrossEntropyExtras* extras) {
  Request request;
  request.extras = extras;
  request.loss = &loss;
  request.lse = lse;
  request.grad_logits = &grad_logits;
  request.grad_loss = grad_loss;
  return Run(context, logits, targets, options, request);
}

}  // namespace lossrt
