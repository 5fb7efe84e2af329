// Tests of the loss ops inside a CUDA graph capture (the "CUDA graphs"
// paragraphs of loss/cross_entropy.h and loss/linear_cross_entropy.h): a call
// captured by itself on the context's stream succeeds with its checks on
// (validate_targets, class weights, overlap_streams), its replay writes the
// bytes of the same call run eagerly on one stream, and the bad values the
// capture could not reject are counted in the context's deferred error count,
// with NaN losses. What a capture cannot do fails cleanly: growing the
// context's workspace, the f16 mean's backward of the linear cross-entropy.
// The GPU cases (suites *CudaGraphTest, so that run_gpu_tests.sh --sanitize
// picks them) skip without a GPU; the host-side decisions are checked on the
// CPU: a capturing linear cross-entropy plans one stream, and a CPU context's
// deferred count stays 0.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy.h"
#include "loss/linear_cross_entropy.h"
#include "loss/linear_cross_entropy_internal.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"

#ifdef LOSSRT_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_context.h"
#endif

namespace lossrt {
namespace {

int64_t Pick(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// ---------------------------------------------------------------------------
// Host side (CPU).

// The problem of a fused call of the given sizes (views without data: only
// their shapes and dtypes matter to the plan).
struct PlanProblem {
  Tensor hidden, weight, targets, loss, d_hidden, d_weight;
  LinearCrossEntropyInputs inputs;
  LinearCrossEntropyOptions options;
  LinearCrossEntropyGradients gradients;
  lce::Problem problem;

  PlanProblem(int64_t n, int64_t h, int64_t v) {
    const Device gpu = Device::Cuda(0);
    inputs.hidden = Tensor::Of(nullptr, DType::kBF16, {n, h}, gpu);
    inputs.weight = Tensor::Of(nullptr, DType::kBF16, {v, h}, gpu);
    inputs.targets = Tensor::Of(nullptr, DType::kI64, {n}, gpu);
    loss = Tensor::Of(nullptr, DType::kF32, {}, gpu);
    gradients.d_hidden = Tensor::Of(nullptr, DType::kBF16, {n, h}, gpu);
    gradients.d_weight = Tensor::Of(nullptr, DType::kF32, {v, h}, gpu);
    problem.pass = lce::Pass::kForwardBackward;
    problem.tokens = n;
    problem.hidden = h;
    problem.vocab = v;
    problem.inputs = &inputs;
    problem.options = &options;
    problem.loss = &loss;
    problem.gradients = &gradients;
  }
};

// A shape whose eager plan runs the cross-entropy on a second stream (bf16 at
// H >= 4096 in at most two token chunks) plans the same chunks on one stream
// when the call is being captured.
TEST(CaptureHostTest, CapturingLinearCrossEntropyPlansOneStream) {
  std::mt19937_64 rng(test::TestSeed());
  for (int trial = 0; trial < 20; ++trial) {
    PlanProblem p(Pick(rng, 256, 4096), Pick(rng, 4096, 8192),
                  Pick(rng, 1000, 50000));
    SCOPED_TRACE(testing::Message()
                 << "N=" << p.problem.tokens << " H=" << p.problem.hidden
                 << " V=" << p.problem.vocab);
    const absl::StatusOr<lce::Plan> eager =
        lce::MakePlan(lce::PlanInputOf(p.problem, DeviceKind::kCuda));
    ASSERT_OK(eager.status());
    ASSERT_TRUE(eager->overlap_streams) << eager->ToString();

    p.problem.capturing = true;
    const lce::PlanInput input = lce::PlanInputOf(p.problem, DeviceKind::kCuda);
    EXPECT_FALSE(input.overlap_streams);
    const absl::StatusOr<lce::Plan> captured = lce::MakePlan(input);
    ASSERT_OK(captured.status());
    EXPECT_FALSE(captured->overlap_streams) << captured->ToString();
    EXPECT_EQ(captured->schedule, eager->schedule);
    EXPECT_EQ(captured->chunk_rows, eager->chunk_rows);
    EXPECT_EQ(captured->num_chunks, eager->num_chunks);
    EXPECT_EQ(captured->block_bytes, eager->block_bytes);
  }
}

// The CPU checks before returning: a bad target is an InvalidArgument, and an
// unvalidated one is a NaN loss; neither is ever deferred.
TEST(CaptureHostTest, CpuContextsDeferNothing) {
  std::mt19937_64 rng(test::TestSeed());
  absl::StatusOr<std::unique_ptr<Context>> created =
      Context::Create(Device::Cpu());
  ASSERT_OK(created.status());
  Context& context = **created;
  EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);

  const int64_t tokens = Pick(rng, 2, 40), vocab = Pick(rng, 2, 300);
  std::vector<float> logits(tokens * vocab);  // [tokens, vocab]
  std::normal_distribution<float> normal;
  for (float& x : logits) x = normal(rng);
  std::vector<int64_t> targets(tokens);  // [tokens]
  for (int64_t& t : targets) t = Pick(rng, 0, vocab - 1);
  targets[Pick(rng, 0, tokens - 1)] = vocab + Pick(rng, 0, 5);
  float loss = 0.0f;
  const Device cpu = Device::Cpu();
  const Tensor logits_view =
      Tensor::Of(logits.data(), DType::kF32, {tokens, vocab}, cpu);
  const Tensor targets_view =
      Tensor::Of(targets.data(), DType::kI64, {tokens}, cpu);
  const Tensor loss_view = Tensor::Of(&loss, DType::kF32, {}, cpu);
  CrossEntropyOptions options;
  EXPECT_EQ(CrossEntropyForward(context, logits_view, targets_view, options,
                                loss_view)
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.validate_targets = false;
  ASSERT_OK(CrossEntropyForward(context, logits_view, targets_view, options,
                                loss_view));
  EXPECT_TRUE(std::isnan(loss));
  EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);
}

// ---------------------------------------------------------------------------
// GPU.

#ifdef LOSSRT_WITH_CUDA

// An executable graph captured from one call sequence on a stream, in the
// relaxed mode that Graph::ForwardBackward uses.
class CapturedGraph {
 public:
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }

  // Runs `calls` under a capture of `stream` and returns their status; the
  // capture is ended either way, and the graph kept when everything worked.
  absl::Status Capture(cudaStream_t stream,
                       const std::function<absl::Status()>& calls) {
    CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    const absl::Status status = calls();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!status.ok() || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      if (!status.ok()) return status;
      return absl::InternalError(
          absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorString(ended)));
    }
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(made);
    return absl::OkStatus();
  }

  absl::Status Replay(cudaStream_t stream) {
    if (exec_ == nullptr) return absl::FailedPreconditionError("no graph");
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// A device tensor and its host image (raw bytes).
struct Array {
  OwnedTensor owned;
  std::vector<uint8_t> host;
  const Tensor& view() const { return owned.view; }
};

absl::StatusOr<Array> MakeArray(Context& context, DType dtype, Shape shape) {
  Array array;
  ASSIGN_OR_RETURN(array.owned,
                   EmptyTensor(context.allocator(), dtype, std::move(shape)));
  array.host.assign(array.owned.view.numel() * DTypeSize(dtype), 0);
  return array;
}

Tensor HostView(Array& array) {
  const Tensor& view = array.view();
  return Tensor::Of(array.host.data(), view.dtype, view.shape, Device::Cpu());
}

absl::Status Upload(Context& context, Array& array) {
  RETURN_IF_ERROR(CopyTensor(HostView(array), array.view(), context));
  return context.Synchronize();
}

absl::Status Download(Context& context, Array& array) {
  RETURN_IF_ERROR(CopyTensor(array.view(), HostView(array), context));
  return context.Synchronize();
}

// Fills the device tensor with NaN bytes (0xff...): an output the replay
// leaves unwritten cannot match the eager bytes.
absl::Status Poison(Context& context, Array& array) {
  std::memset(array.host.data(), 0xff, array.host.size());
  return Upload(context, array);
}

template <typename T>
T* Elements(Array& array) {
  return reinterpret_cast<T*>(array.host.data());
}

absl::StatusOr<std::unique_ptr<Context>> GpuContext() {
  ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                   Context::Create(Device::Cuda(0)));
  RETURN_IF_ERROR(context->stream().status());  // before any capture
  return context;
}

// The cross-entropy problem of the GPU cases: f32 logits, class weights,
// label smoothing, some ignored tokens.
struct CeProblem {
  std::unique_ptr<Context> context;
  cudaStream_t stream = nullptr;
  int64_t tokens = 0, vocab = 0;
  Array logits, targets, weights, loss, lse, grad, grad_loss;
  CrossEntropyOptions options;

  absl::Status Init(std::mt19937_64& rng) {
    ASSIGN_OR_RETURN(context, GpuContext());
    ASSIGN_OR_RETURN(stream, CudaStreamOf(*context));
    tokens = Pick(rng, 64, 300);
    vocab = Pick(rng, 500, 5000);
    Context& c = *context;
    ASSIGN_OR_RETURN(logits, MakeArray(c, DType::kF32, {tokens, vocab}));
    ASSIGN_OR_RETURN(targets, MakeArray(c, DType::kI64, {tokens}));
    ASSIGN_OR_RETURN(weights, MakeArray(c, DType::kF32, {vocab}));
    ASSIGN_OR_RETURN(loss, MakeArray(c, DType::kF32, {}));
    ASSIGN_OR_RETURN(lse, MakeArray(c, DType::kF32, {tokens}));
    ASSIGN_OR_RETURN(grad, MakeArray(c, DType::kF32, {tokens, vocab}));
    ASSIGN_OR_RETURN(grad_loss, MakeArray(c, DType::kF32, {}));
    RETURN_IF_ERROR(FillNormal(logits.view(), rng(), 0.0f, 2.0f, c));
    for (int64_t i = 0; i < tokens; ++i) {
      Elements<int64_t>(targets)[i] =
          Pick(rng, 0, 9) == 0 ? -100 : Pick(rng, 0, vocab - 1);
    }
    std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
    for (int64_t j = 0; j < vocab; ++j)
      Elements<float>(weights)[j] = uniform(rng);
    Elements<float>(grad_loss)[0] = 1.0f;
    RETURN_IF_ERROR(Upload(c, targets));
    RETURN_IF_ERROR(Upload(c, weights));
    RETURN_IF_ERROR(Upload(c, grad_loss));
    options.class_weights = weights.view();
    options.label_smoothing = 0.1f;
    return absl::OkStatus();
  }

  std::vector<Array*> Outputs() { return {&loss, &lse, &grad}; }
  absl::Status PoisonOutputs() {
    for (Array* array : Outputs()) RETURN_IF_ERROR(Poison(*context, *array));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::vector<uint8_t>>> DownloadOutputs() {
    std::vector<std::vector<uint8_t>> bytes;
    for (Array* array : Outputs()) {
      RETURN_IF_ERROR(Download(*context, *array));
      bytes.push_back(array->host);
    }
    return bytes;
  }
};

// The fused call, and the split forward then backward, each captured by
// itself with the checks on: OK, the eager bytes at every replay, and bad
// targets and weights counted (NaN loss) instead of rejected.
TEST(CrossEntropyCudaGraphTest, ReplaysTheEagerBytesAndCountsBadValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(test::TestSeed());
  CeProblem p;
  ASSERT_OK(p.Init(rng));
  Context& context = *p.context;
  const std::function<absl::Status()> sequences[] = {
      [&] {
        return CrossEntropyForwardBackward(
            context, p.logits.view(), p.targets.view(), p.options,
            p.loss.view(), &p.lse.view(), p.grad.view());
      },
      [&]() -> absl::Status {
        RETURN_IF_ERROR(CrossEntropyForward(context, p.logits.view(),
                                            p.targets.view(), p.options,
                                            p.loss.view(), &p.lse.view()));
        return CrossEntropyBackward(context, p.logits.view(), p.targets.view(),
                                    p.lse.view(), p.grad_loss.view(), p.options,
                                    p.grad.view());
      }};
  for (int sequence = 0; sequence < 2; ++sequence) {
    SCOPED_TRACE(sequence == 0 ? "ForwardBackward" : "Forward, Backward");
    const std::function<absl::Status()>& calls = sequences[sequence];
    // Eagerly (this also grows the workspace, which a capture cannot).
    ASSERT_OK(p.PoisonOutputs());
    ASSERT_OK(calls());
    absl::StatusOr<std::vector<std::vector<uint8_t>>> eager =
        p.DownloadOutputs();
    ASSERT_OK(eager.status());
    EXPECT_TRUE(std::isfinite(Elements<float>(p.loss)[0]));

    CapturedGraph graph;
    ASSERT_OK(graph.Capture(p.stream, [&]() -> absl::Status {
      RETURN_IF_ERROR(calls());
      // The count is read after the graph, never during the capture.
      EXPECT_EQ(context.TakeDeferredErrorCount().status().code(),
                absl::StatusCode::kFailedPrecondition);
      return absl::OkStatus();
    }));
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_OK(p.PoisonOutputs());
      ASSERT_OK(graph.Replay(p.stream));
      absl::StatusOr<std::vector<std::vector<uint8_t>>> replayed =
          p.DownloadOutputs();
      ASSERT_OK(replayed.status());
      EXPECT_TRUE(*replayed == *eager) << "replay " << replay;
      EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);
    }

    // A target past the vocabulary: counted (once per scan), NaN loss.
    const int64_t bad = Pick(rng, 0, p.tokens - 1);
    const int64_t saved_target = Elements<int64_t>(p.targets)[bad];
    Elements<int64_t>(p.targets)[bad] = p.vocab + Pick(rng, 0, 100);
    ASSERT_OK(Upload(context, p.targets));
    ASSERT_OK(graph.Replay(p.stream));
    ASSERT_OK(Download(context, p.loss));
    EXPECT_TRUE(std::isnan(Elements<float>(p.loss)[0]));
    EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1),
              sequence == 0 ? 1 : 2);
    EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);
    // Eagerly the same call is rejected.
    EXPECT_EQ(calls().code(), absl::StatusCode::kInvalidArgument);
    Elements<int64_t>(p.targets)[bad] = saved_target;
    ASSERT_OK(Upload(context, p.targets));

    // A negative class weight: counted.
    const int64_t j = Pick(rng, 0, p.vocab - 1);
    const float saved_weight = Elements<float>(p.weights)[j];
    Elements<float>(p.weights)[j] = -1.0f;
    ASSERT_OK(Upload(context, p.weights));
    ASSERT_OK(graph.Replay(p.stream));
    EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1),
              sequence == 0 ? 1 : 2);
    EXPECT_EQ(calls().code(), absl::StatusCode::kInvalidArgument);
    Elements<float>(p.weights)[j] = saved_weight;
    ASSERT_OK(Upload(context, p.weights));
  }
}

// Growing the workspace needs a wait for the stream: inside a capture the
// call fails before launching anything, and the capture ends cleanly. Once
// the workspace is reserved the same capture works.
TEST(CrossEntropyCudaGraphTest, GrowingTheWorkspaceInACaptureFails) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(test::TestSeed());
  CeProblem p;
  ASSERT_OK(p.Init(rng));
  Context& context = *p.context;
  auto call = [&] {
    return CrossEntropyForward(context, p.logits.view(), p.targets.view(),
                               p.options, p.loss.view(), &p.lse.view());
  };
  {
    CapturedGraph graph;
    EXPECT_EQ(graph.Capture(p.stream, call).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_OK(
      context.ReserveWorkspace(CrossEntropyWorkspaceBytes(p.tokens, p.vocab)));
  CapturedGraph graph;
  ASSERT_OK(graph.Capture(p.stream, call));
  ASSERT_OK(graph.Replay(p.stream));
  ASSERT_OK(Download(context, p.loss));
  EXPECT_TRUE(std::isfinite(Elements<float>(p.loss)[0]));
}

// The linear cross-entropy at a shape whose eager plan overlaps streams
// (bf16, H = 4096, one token chunk), captured with the default options: one
// stream, the bytes of the eager call with overlap_streams off, and bad
// targets counted.
TEST(LinearCrossEntropyCudaGraphTest,
     ReplaysTheOneStreamBytesAndCountsBadTargets) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(test::TestSeed());
  absl::StatusOr<std::unique_ptr<Context>> created = GpuContext();
  ASSERT_OK(created.status());
  Context& context = **created;
  absl::StatusOr<cudaStream_t> stream = CudaStreamOf(context);
  ASSERT_OK(stream.status());
  const int64_t n = Pick(rng, 256, 512), h = 4096, v = Pick(rng, 500, 1500);
  absl::StatusOr<Array> hidden = MakeArray(context, DType::kBF16, {n, h});
  absl::StatusOr<Array> weight = MakeArray(context, DType::kBF16, {v, h});
  absl::StatusOr<Array> targets = MakeArray(context, DType::kI64, {n});
  absl::StatusOr<Array> loss = MakeArray(context, DType::kF32, {});
  absl::StatusOr<Array> d_hidden = MakeArray(context, DType::kBF16, {n, h});
  absl::StatusOr<Array> d_weight = MakeArray(context, DType::kF32, {v, h});
  for (auto* made : {&hidden, &weight, &targets, &loss, &d_hidden, &d_weight})
    ASSERT_OK(made->status());
  ASSERT_OK(FillNormal(hidden->view(), rng(), 0.0f, 1.0f, context));
  ASSERT_OK(FillNormal(weight->view(), rng(), 0.0f, 1.0f / 64, context));
  for (int64_t i = 0; i < n; ++i)
    Elements<int64_t>(*targets)[i] = Pick(rng, 0, v - 1);
  ASSERT_OK(Upload(context, *targets));
  const LinearCrossEntropyInputs inputs{hidden->view(), weight->view(),
                                        std::nullopt, targets->view()};
  const LinearCrossEntropyGradients gradients{d_hidden->view(),
                                              d_weight->view(), std::nullopt};
  LinearCrossEntropyOptions options;  // validate_targets, overlap_streams
  LinearCrossEntropyOptions one_stream = options;
  one_stream.overlap_streams = false;

  // The eager plan uses two streams.
  lce::Problem problem;
  problem.pass = lce::Pass::kForwardBackward;
  problem.tokens = n;
  problem.hidden = h;
  problem.vocab = v;
  problem.inputs = &inputs;
  problem.options = &options;
  problem.loss = &loss->view();
  problem.gradients = &gradients;
  const absl::StatusOr<lce::Plan> plan =
      lce::MakePlan(lce::PlanInputOf(problem, DeviceKind::kCuda));
  ASSERT_OK(plan.status());
  EXPECT_TRUE(plan->overlap_streams) << plan->ToString();

  std::vector<Array*> outputs = {&*loss, &*d_hidden, &*d_weight};
  auto download = [&]() -> std::vector<std::vector<uint8_t>> {
    std::vector<std::vector<uint8_t>> bytes;
    for (Array* array : outputs) {
      EXPECT_TRUE(Download(context, *array).ok());
      bytes.push_back(array->host);
    }
    return bytes;
  };
  auto call = [&](const LinearCrossEntropyOptions& o) {
    return LinearCrossEntropyForwardBackward(context, inputs, o, loss->view(),
                                             nullptr, gradients);
  };
  // Eagerly, with two streams (plans, tuning and the allocator's cache), then
  // on one stream: the bytes the replay must write.
  ASSERT_OK(call(options));
  for (Array* array : outputs) ASSERT_OK(Poison(context, *array));
  ASSERT_OK(call(one_stream));
  const std::vector<std::vector<uint8_t>> eager = download();
  EXPECT_TRUE(std::isfinite(Elements<float>(*loss)[0]));

  CapturedGraph graph;
  ASSERT_OK(graph.Capture(*stream, [&] { return call(options); }));
  for (Array* array : outputs) ASSERT_OK(Poison(context, *array));
  ASSERT_OK(graph.Replay(*stream));
  EXPECT_TRUE(download() == eager);
  EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);

  Elements<int64_t>(*targets)[Pick(rng, 0, n - 1)] = v + Pick(rng, 0, 100);
  ASSERT_OK(Upload(context, *targets));
  ASSERT_OK(graph.Replay(*stream));
  ASSERT_OK(Download(context, *loss));
  EXPECT_TRUE(std::isnan(Elements<float>(*loss)[0]));
  EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 1);
  EXPECT_EQ(call(options).code(), absl::StatusCode::kInvalidArgument);
}

// f16 operands: the mean's backward needs a host scale and fails inside a
// capture before launching anything (the capture ends cleanly); the sum's
// works.
TEST(LinearCrossEntropyCudaGraphTest, F16MeanBackwardIsRefusedInACapture) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(test::TestSeed());
  absl::StatusOr<std::unique_ptr<Context>> created = GpuContext();
  ASSERT_OK(created.status());
  Context& context = **created;
  absl::StatusOr<cudaStream_t> stream = CudaStreamOf(context);
  ASSERT_OK(stream.status());
  // (Rows of whole 16-byte units, as cuBLASLt's f16 kernels want.)
  const int64_t n = Pick(rng, 16, 200), h = 8 * Pick(rng, 1, 12),
                v = Pick(rng, 10, 400);
  absl::StatusOr<Array> hidden = MakeArray(context, DType::kF16, {n, h});
  absl::StatusOr<Array> weight = MakeArray(context, DType::kF16, {v, h});
  absl::StatusOr<Array> targets = MakeArray(context, DType::kI32, {n});
  absl::StatusOr<Array> loss = MakeArray(context, DType::kF32, {});
  absl::StatusOr<Array> d_hidden = MakeArray(context, DType::kF16, {n, h});
  absl::StatusOr<Array> d_weight = MakeArray(context, DType::kF32, {v, h});
  for (auto* made : {&hidden, &weight, &targets, &loss, &d_hidden, &d_weight})
    ASSERT_OK(made->status());
  ASSERT_OK(FillNormal(hidden->view(), rng(), 0.0f, 1.0f, context));
  ASSERT_OK(FillNormal(weight->view(), rng(), 0.0f, 0.1f, context));
  ASSERT_OK(FillRandomInt(targets->view(), rng(), 0, v, context));
  const LinearCrossEntropyInputs inputs{hidden->view(), weight->view(),
                                        std::nullopt, targets->view()};
  const LinearCrossEntropyGradients gradients{d_hidden->view(),
                                              d_weight->view(), std::nullopt};
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    SCOPED_TRACE(reduction == Reduction::kMean ? "mean" : "sum");
    LinearCrossEntropyOptions options;
    options.cross_entropy.reduction = reduction;
    auto call = [&] {
      return LinearCrossEntropyForwardBackward(
          context, inputs, options, loss->view(), nullptr, gradients);
    };
    ASSERT_OK(call());  // eagerly both work
    CapturedGraph graph;
    const absl::Status captured = graph.Capture(*stream, call);
    if (reduction == Reduction::kMean) {
      EXPECT_EQ(captured.code(), absl::StatusCode::kFailedPrecondition)
          << captured;
    } else {
      ASSERT_OK(captured);
      ASSERT_OK(graph.Replay(*stream));
      EXPECT_EQ(context.TakeDeferredErrorCount().value_or(-1), 0);
    }
  }
}

#else  // !LOSSRT_WITH_CUDA

TEST(CrossEntropyCudaGraphTest, ReplaysTheEagerBytesAndCountsBadValues) {
  SKIP_WITHOUT_GPU();
}

#endif  // LOSSRT_WITH_CUDA

}  // namespace
}  // namespace lossrt
