// The trainer: micro-batch accumulation, AdamW steps and checkpoints.
#include "graph/trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "graph/ops/elementwise.h"
#include "runtime/int_math.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"

namespace lossrt {
namespace graph {
namespace {

namespace fs = std::filesystem;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kLatestFile[] = "latest";
constexpr char kStepKey[] = "lossrt.step";
constexpr char kTempSuffix[] = ".tmp";

// The folder name of the checkpoint at `step`: step-00000042.
std::string CheckpointName(int64_t step) {
  return absl::StrFormat("step-%08d", step);
}

// The step of a name CheckpointName(step) (+ kTempSuffix when `temp`) would
// give, exactly; -1 for any other name.
int64_t ParseCheckpointName(absl::string_view name, bool* temp) {
  *temp = absl::ConsumeSuffix(&name, kTempSuffix);
  if (!absl::ConsumePrefix(&name, "step-") || name.empty() ||
      name.size() > 18 ||
      !std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
    return -1;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step)) return -1;
  // Leading zeros beyond the 8 digits are not ours (step-000000001).
  return CheckpointName(step) == absl::StrCat("step-", name) ? step : -1;
}

// The flat buffer `tensor` (on any device) as host bytes.
absl::StatusOr<std::vector<uint8_t>> ToHostBytes(const Tensor& tensor,
                                                 Context& context) {
  std::vector<uint8_t> bytes(tensor.numel() * DTypeSize(tensor.dtype));
  RETURN_IF_ERROR(CopyTensor(
      tensor,
      Tensor::Of(bytes.data(), tensor.dtype, tensor.shape, Device::Cpu()),
      context));
  return bytes;
}

absl::Status FromHostBytes(const std::vector<uint8_t>& bytes,
                           const Tensor& tensor, Context& context) {
  RETURN_IF_ERROR(
      CopyTensor(Tensor::Of(const_cast<uint8_t*>(bytes.data()), tensor.dtype,
                            tensor.shape, Device::Cpu()),
                 tensor, context));
  return context.Synchronize();
}

// Elements [begin, end) of the flat buffer `flat`, as [end - begin].
Tensor FlatRange(const Tensor& flat, int64_t begin, int64_t end) {
  return Tensor::Of(
      static_cast<char*>(flat.data) + begin * DTypeSize(flat.dtype), flat.dtype,
      {end - begin}, flat.device);
}

absl::Status Fail(const std::string& what, const std::error_code& error) {
  return absl::InternalError(absl::StrCat(what, ": ", error.message()));
}

}  // namespace

std::map<std::string, std::string> GptConfigToMetadata(const GptConfig& c) {
  return {
      {"lossrt.format", "gpt"},
      {"lossrt.layers", absl::StrCat(c.layers)},
      {"lossrt.heads", absl::StrCat(c.heads)},
      {"lossrt.width", absl::StrCat(c.width)},
      {"lossrt.context", absl::StrCat(c.context)},
      {"lossrt.vocab", absl::StrCat(c.vocab)},
      {"lossrt.norm", c.norm == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"},
      {"lossrt.mlp", c.mlp == MlpKind::kGelu ? "gelu" : "swiglu"},
      {"lossrt.tied_head", c.tied_head ? "1" : "0"},
      {"lossrt.bias", c.bias ? "1" : "0"},
      {"lossrt.mlp_hidden", absl::StrCat(c.mlp_hidden)},
      {"lossrt.norm_eps", absl::StrFormat("%.9g", c.norm_eps)},
  };
}

absl::StatusOr<GptConfig> GptConfigFromMetadata(
    const std::map<std::string, std::string>& metadata) {
  auto get = [&](const char* key) -> absl::StatusOr<std::string> {
    auto it = metadata.find(absl::StrCat("lossrt.", key));
    if (it == metadata.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint metadata lacks lossrt.", key));
    }
    return it->second;
  };
  auto get_int = [&](const char* key, int64_t* out) -> absl::Status {
    ASSIGN_OR_RETURN(std::string text, get(key));
    if (!absl::SimpleAtoi(text, out)) {
      return absl::DataLossError(absl::StrCat("checkpoint metadata lossrt.",
                                              key, " = '", text,
                                              "' is not an integer"));
    }
    return absl::OkStatus();
  };
  GptConfig c;
  RETURN_IF_ERROR(get_int("layers", &c.layers));
  RETURN_IF_ERROR(get_int("heads", &c.heads));
  RETURN_IF_ERROR(get_int("width", &c.width));
  RETURN_IF_ERROR(get_int("context", &c.context));
  RETURN_IF_ERROR(get_int("vocab", &c.vocab));
  RETURN_IF_ERROR(get_int("mlp_hidden", &c.mlp_hidden));
  ASSIGN_OR_RETURN(std::string norm, get("norm"));
  ASSIGN_OR_RETURN(std::string mlp, get("mlp"));
  ASSIGN_OR_RETURN(std::string tied, get("tied_head"));
  ASSIGN_OR_RETURN(std::string bias, get("bias"));
  ASSIGN_OR_RETURN(std::string eps, get("norm_eps"));
  c.norm = norm == "rmsnorm" ? NormKind::kRmsNorm : NormKind::kLayerNorm;
  c.mlp = mlp == "swiglu" ? MlpKind::kSwiGlu : MlpKind::kGelu;
  c.tied_head = tied == "1";
  c.bias = bias == "1";
  if (!absl::SimpleAtof(eps, &c.norm_eps)) {
    return absl::DataLossError("checkpoint metadata lossrt.norm_eps is bad");
  }
  RETURN_IF_ERROR(ValidateGptConfig(c));
  return c;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    Gpt& model, const TrainerOptions& options) {
  RETURN_IF_ERROR(optim::ValidateLrSchedule(options.schedule));
  if (options.micro_batches < 1) {
    return InvalidArgument("Trainer: micro_batches must be >= 1, got ",
                           options.micro_batches);
  }
  const int world_size =
      options.communicator != nullptr ? options.communicator->world_size() : 1;
  if (world_size < 1) {
    return InvalidArgument(
        "Trainer: the communicator's world_size must be >= 1, got ",
        world_size);
  }
  if (options.communicator != nullptr &&
      options.bucket_bytes <
          DTypeSize(model.graph().parameter_buffers().grad.dtype)) {
    return InvalidArgument(
        "Trainer: bucket_bytes must hold at least one "
        "gradient element, got ",
        options.bucket_bytes);
  }
  std::unique_ptr<Trainer> trainer(new Trainer(model, options));
  Graph& graph = model.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  const bool sharded =
      options.communicator != nullptr && options.shard_optimizer_state;
  // ZeRO-1: every rank's moments have the padded shard's length; the tail
  // past the parameters (last ranks) stays 0.
  trainer->shard_elements_ =
      sharded ? CeilDiv(params.count, int64_t{world_size}) : params.count;
  ASSIGN_OR_RETURN(trainer->m_,
                   EmptyTensor(context.allocator(), params.master.dtype,
                               {trainer->shard_elements_}));
  ASSIGN_OR_RETURN(trainer->v_,
                   EmptyTensor(context.allocator(), params.master.dtype,
                               {trainer->shard_elements_}));
  ASSIGN_OR_RETURN(trainer->norm_,
                   EmptyTensor(context.allocator(), DType::kF32, {}));
  ASSIGN_OR_RETURN(
      trainer->losses_,
      EmptyTensor(context.allocator(), DType::kF32, {options.micro_batches}));
  RETURN_IF_ERROR(ops::Zero(context, trainer->m_.view));
  RETURN_IF_ERROR(ops::Zero(context, trainer->v_.view));
  RETURN_IF_ERROR(context.ReserveWorkspace(
      std::max(graph.workspace_bytes(),
               optim::AdamWWorkspaceBytes(context.device(), params.count))));
  // Each rank's loss is the mean over its own rows; the global batch's mean is
  // the mean of the ranks' means (equal row counts), so with the 1 / world_size
  // folded into the loss scale the all-reduce's sum of the gradients is the
  // gradient of the global-batch mean loss.
  RETURN_IF_ERROR(graph.SetLossScale(
      1.0f / static_cast<float>(options.micro_batches * world_size)));
  if (options.communicator != nullptr) {
    RETURN_IF_ERROR(trainer->SetUpDataParallel());
  }
  return trainer;
}

Context& Trainer::comm_context() {
  return comm_context_ != nullptr ? *comm_context_ : model_.graph().context();
}

int64_t Trainer::shard_begin() const {
  if (!options_.shard_optimizer_state || options_.communicator == nullptr) {
    return 0;
  }
  const int64_t count = model_.graph().parameter_buffers().count;
  return std::min(count, options_.communicator->rank() * shard_elements_);
}

int64_t Trainer::shard_end() const {
  const int64_t count = model_.graph().parameter_buffers().count;
  if (!options_.shard_optimizer_state || options_.communicator == nullptr) {
    return count;
  }
  return std::min(count, (options_.communicator->rank() + 1) * shard_elements_);
}

absl::Status Trainer::SetUpDataParallel() {
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  const int world_size = options_.communicator->world_size();
  Allocator& allocator = context.allocator();
  if (options_.shard_optimizer_state) {
    // ZeRO-1 runs its collectives on the model's stream: nothing overlaps
    // them (they follow the whole backward), so no second stream is needed.
    const int64_t n = shard_elements_;
    if (params.count % world_size != 0) {
      ASSIGN_OR_RETURN(padded_grads_, EmptyTensor(allocator, params.grad.dtype,
                                                  {world_size * n}));
      RETURN_IF_ERROR(ops::Zero(context, padded_grads_.view));
    }
    ASSIGN_OR_RETURN(grad_shard_,
                     EmptyTensor(allocator, params.grad.dtype, {n}));
    ASSIGN_OR_RETURN(weight_shard_,
                     EmptyTensor(allocator, params.master.dtype, {n}));
    RETURN_IF_ERROR(ops::Zero(context, weight_shard_.view));
    ASSIGN_OR_RETURN(gathered_, EmptyTensor(allocator, params.master.dtype,
                                            {world_size * n}));
    ASSIGN_OR_RETURN(sum_squares_, EmptyTensor(allocator, DType::kF64, {}));
    return context.Synchronize();
  }
  if (context.device().is_cuda()) {
    // The communication stream, created now (Context creates it on first
    // use) so that no step creates anything.
    ASSIGN_OR_RETURN(comm_context_, Context::Create(context.device()));
    RETURN_IF_ERROR(comm_context_->stream().status());
  }
  ASSIGN_OR_RETURN(grads_ready_, StreamEvent::Create(context.device()));
  ASSIGN_OR_RETURN(comm_done_, StreamEvent::Create(context.device()));
  const int64_t bucket_elements = std::max<int64_t>(
      1, options_.bucket_bytes / DTypeSize(params.grad.dtype));
  const int node_count = static_cast<int>(graph.nodes().size());
  for (int64_t begin = 0; begin < params.count; begin += bucket_elements) {
    // No parameter yet: a bucket of padding only could go at once.
    buckets_.push_back(
        {begin, std::min(params.count, begin + bucket_elements), node_count});
  }
  // A parameter's gradient is complete once the backward, which runs the
  // nodes in reverse, has run the first node that uses it.
  for (const Value& parameter : graph.parameters()) {
    const ValueInfo& info = graph.info(parameter);
    const int ready =
        info.consumers.empty()
            ? -1
            : *std::min_element(info.consumers.begin(), info.consumers.end());
    const int64_t begin = info.param_offset;
    const int64_t end = begin + info.numel();
    for (int64_t b = begin / bucket_elements;
         b < static_cast<int64_t>(buckets_.size()) && buckets_[b].begin < end;
         ++b) {
      buckets_[b].ready_node = std::min(buckets_[b].ready_node, ready);
    }
  }
  // The launch order: as the backward finishes them, ties in buffer order.
  // Every rank computes the same order from the same graph, so the ranks'
  // collectives match.
  std::stable_sort(buckets_.begin(), buckets_.end(),
                   [](const Bucket& a, const Bucket& b) {
                     return a.ready_node > b.ready_node;
                   });
  return absl::OkStatus();
}

absl::Status Trainer::LaunchReadyBuckets(int node) {
  const Tensor grad = model_.graph().parameter_buffers().grad;
  Context& comm = comm_context();
  bool ordered = false;
  while (next_bucket_ < buckets_.size() &&
         (node < 0 || buckets_[next_bucket_].ready_node >= node)) {
    if (!ordered) {
      // The communication stream waits for the backward's kernels so far.
      RETURN_IF_ERROR(grads_ready_->Record(model_.graph().context()));
      RETURN_IF_ERROR(grads_ready_->Wait(comm));
      ordered = true;
    }
    const Bucket& bucket = buckets_[next_bucket_];
    const Tensor view = FlatRange(grad, bucket.begin, bucket.end);
    RETURN_IF_ERROR(
        options_.communicator->AllReduce(view, view, ReduceOp::kSum, comm));
    ++next_bucket_;
  }
  return absl::OkStatus();
}

absl::Status Trainer::ReduceGradients() {
  Communicator* const comm = options_.communicator;
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  // The gradients are already scaled by 1 / world_size (the loss scale), so
  // their sum is the global-batch mean's gradient, the same bits on every
  // rank; [micro_batches]: each rank's mean losses, summed over the ranks.
  if (!options_.shard_optimizer_state) {
    // The buckets the backward left (all of them after a CUDA graph that
    // could not hold them), then the losses, written after the backward.
    RETURN_IF_ERROR(grads_ready_->Record(context));
    RETURN_IF_ERROR(grads_ready_->Wait(comm_context()));
    if (!buckets_in_graph_) RETURN_IF_ERROR(LaunchReadyBuckets(-1));
    RETURN_IF_ERROR(comm->AllReduce(losses_.view, losses_.view, ReduceOp::kSum,
                                    comm_context()));
    // The optimizer waits for the communication stream.
    RETURN_IF_ERROR(comm_done_->Record(comm_context()));
    return comm_done_->Wait(context);
  }
  Tensor grads = params.grad;
  if (padded_grads_.view.data != nullptr) {
    // [world_size * n]: the gradients, then zeros.
    RETURN_IF_ERROR(CopyTensor(
        params.grad, FlatRange(padded_grads_.view, 0, params.count), context));
    grads = padded_grads_.view;
  }
  RETURN_IF_ERROR(
      comm->ReduceScatter(grads, grad_shard_.view, ReduceOp::kSum, context));
  RETURN_IF_ERROR(
      comm->AllReduce(losses_.view, losses_.view, ReduceOp::kSum, context));
  // The global norm's square: the sum over the shards of theirs.
  RETURN_IF_ERROR(optim::GradientSumOfSquares(
      context, FlatRange(grad_shard_.view, 0, shard_end() - shard_begin()),
      sum_squares_.view));
  return comm->AllReduce(sum_squares_.view, sum_squares_.view, ReduceOp::kSum,
                         context);
}

absl::Status Trainer::UpdateParameters(float lr, int64_t step) {
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  optim::AdamWState state;
  if (options_.communicator == nullptr || !options_.shard_optimizer_state) {
    state.params = params.master;
    state.grads = params.grad;
    state.m = m_.view;
    state.v = v_.view;
    if (params.compute.data != params.master.data) {
      state.compute_copy = params.compute;
    }
    state.decay_count = params.decay_count;
    return optim::AdamWStep(context, state, options_.adamw, lr, step,
                            norm_.view);
  }
  // ZeRO-1: this rank's shard [begin, end) of the flat parameters.
  const int64_t begin = shard_begin(), end = shard_end();
  const int64_t length = end - begin;
  state.params = FlatRange(params.master, begin, end);
  state.grads = FlatRange(grad_shard_.view, 0, length);
  state.m = FlatRange(m_.view, 0, length);
  state.v = FlatRange(v_.view, 0, length);
  state.decay_count =
      std::clamp<int64_t>(params.decay_count - begin, 0, length);
  RETURN_IF_ERROR(optim::AdamWStepWithSumOfSquares(
      context, state, options_.adamw, lr, step, sum_squares_.view, norm_.view));
  // Every rank's updated shard to every rank; the padding past the
  // parameters stays 0 (weight_shard_'s tail is never written).
  if (length > 0) {
    RETURN_IF_ERROR(CopyTensor(
        state.params, FlatRange(weight_shard_.view, 0, length), context));
  }
  RETURN_IF_ERROR(options_.communicator->AllGather(weight_shard_.view,
                                                   gathered_.view, context));
  RETURN_IF_ERROR(CopyTensor(FlatRange(gathered_.view, 0, params.count),
                             params.master, context));
  return graph.SyncComputeCopy();
}

absl::Status Trainer::RunMicroBatch(absl::Span<const int32_t> ids,
                                    absl::Span<const int32_t> targets,
                                    int64_t index, bool last) {
  Graph& graph = model_.graph();
  RETURN_IF_ERROR(graph.SetInput(model_.ids(), ids));
  RETURN_IF_ERROR(graph.SetInput(model_.targets(), targets));
  // The first step runs eagerly: it creates the cuBLASLt plans and fills the
  // allocator's cache that the captured graph then reuses.
  const bool use_graph =
      options_.cuda_graph && !cuda_graph_failed_ && step_ >= 1;
  // The last micro-batch's backward launches the buckets as it finishes
  // them. A CUDA graph replays without calling the observer, so with one the
  // buckets overlap only when they can be captured into it: a capturable
  // communicator, and one micro-batch (the graph replays for every
  // micro-batch, and only the last may all-reduce).
  const bool capture_buckets = use_graph && options_.micro_batches == 1 &&
                               options_.communicator != nullptr &&
                               options_.communicator->capturable() &&
                               !buckets_.empty();
  if (use_graph && graph.has_cuda_graph()) {
    // A replay: the captured buckets (if any) run inside it.
    buckets_in_graph_ = buckets_captured_;
    RETURN_IF_ERROR(graph.ForwardBackward(true));
  } else {
    const bool overlap =
        last && !buckets_.empty() && (!use_graph || capture_buckets);
    if (overlap) {
      graph.set_node_observer([this](int node, bool backward, bool begin) {
        return backward && !begin ? LaunchReadyBuckets(node) : absl::OkStatus();
      });
    }
    // The buckets left after the backward (parameters no node uses), and the
    // communication stream joined back into the model's: inside the capture,
    // so that the graph forks and joins it.
    const std::function<absl::Status()> finish_buckets =
        [this]() -> absl::Status {
      RETURN_IF_ERROR(LaunchReadyBuckets(-1));
      RETURN_IF_ERROR(comm_done_->Record(comm_context()));
      return comm_done_->Wait(model_.graph().context());
    };
    absl::Status status = graph.ForwardBackward(
        use_graph, capture_buckets ? finish_buckets : nullptr);
    if (overlap) graph.set_node_observer(nullptr);
    if (!status.ok() && use_graph && !graph.has_cuda_graph()) {
      std::fprintf(stderr,
                   "trainer: capturing a CUDA graph failed (%s); running the "
                   "nodes one by one\n",
                   status.ToString().c_str());
      cuda_graph_failed_ = true;
      // Whatever the failed capture "launched" never ran.
      next_bucket_ = 0;
      status = graph.ForwardBackward(false);
    } else if (status.ok() && capture_buckets) {
      buckets_captured_ = true;
      buckets_in_graph_ = true;
    }
    RETURN_IF_ERROR(status);
  }
  // Kept on the device: the step reads all micro-batches' losses at once, so
  // the host does not wait between micro-batches.
  const Tensor loss = graph.tensor(model_.loss());
  return CopyTensor(loss,
                    Tensor::Of(losses_.view.data_as<float>() + index,
                               DType::kF32, {}, loss.device),
                    graph.context());
}

absl::StatusOr<absl::Span<const int32_t>> RankRows(
    absl::Span<const int32_t> global, int64_t seq, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument("RankRows: rank ", rank, " of world_size ",
                           world_size);
  }
  const int64_t size = static_cast<int64_t>(global.size());
  if (seq < 1 || size % (seq * world_size) != 0) {
    return InvalidArgument("RankRows: ", size, " tokens do not split into ",
                           world_size, " equal parts of whole rows of ", seq,
                           " tokens");
  }
  const int64_t part = size / world_size;
  return global.subspan(rank * part, part);
}

absl::StatusOr<Trainer::StepStats> Trainer::Step(
    absl::Span<const int32_t> ids, absl::Span<const int32_t> targets) {
  Communicator* const comm = options_.communicator;
  absl::StatusOr<StepStats> stats = StepLocal(ids, targets);
  // Another rank may be waiting in an all-reduce this rank never reaches, and
  // a rank that failed after it no longer holds the others' weights.
  if (!stats.ok() && comm != nullptr) {
    comm->Abort(stats.status().ToString()).IgnoreError();
  }
  return stats;
}

absl::StatusOr<Trainer::StepStats> Trainer::StepLocal(
    absl::Span<const int32_t> ids, absl::Span<const int32_t> targets) {
  const int64_t rows = model_.shape().rows();
  const int64_t micro = options_.micro_batches;
  if (static_cast<int64_t>(ids.size()) != micro * rows ||
      targets.size() != ids.size()) {
    return InvalidArgument("Trainer::Step: ", ids.size(), " ids and ",
                           targets.size(), " targets for ", micro,
                           " micro-batches of ", rows, " tokens");
  }
  Graph& graph = model_.graph();
  RETURN_IF_ERROR(graph.ZeroGradients());
  StepStats stats;
  next_bucket_ = 0;
  buckets_in_graph_ = false;
  for (int64_t k = 0; k < micro; ++k) {
    RETURN_IF_ERROR(RunMicroBatch(ids.subspan(k * rows, rows),
                                  targets.subspan(k * rows, rows), k,
                                  /*last=*/k + 1 == micro));
  }
  Communicator* const comm = options_.communicator;
  const int world_size = comm != nullptr ? comm->world_size() : 1;
  if (comm != nullptr) RETURN_IF_ERROR(ReduceGradients());
  const int64_t step = step_ + 1;
  stats.lr = optim::LearningRate(options_.schedule, step);
  RETURN_IF_ERROR(UpdateParameters(stats.lr, step));
  // The step's only waits: the losses and the norm, read after the update.
  std::vector<float> losses(micro);
  RETURN_IF_ERROR(
      CopyTensor(losses_.view,
                 Tensor::Of(losses.data(), DType::kF32, {micro}, Device::Cpu()),
                 graph.context()));
  double loss_sum = 0;
  for (float loss : losses) loss_sum += loss;
  stats.loss =
      static_cast<float>(loss_sum / static_cast<double>(micro * world_size));
  float norm = 0;
  RETURN_IF_ERROR(CopyTensor(norm_.view,
                             Tensor::Of(&norm, DType::kF32, {}, Device::Cpu()),
                             graph.context()));
  stats.grad_norm = norm;
  step_ = step;
  return stats;
}

absl::StatusOr<float> Trainer::Evaluate(absl::Span<const int32_t> ids,
                                        absl::Span<const int32_t> targets) {
  ASSIGN_OR_RETURN(const EvalStats stats, EvaluateWithAccuracy(ids, targets));
  return stats.loss;
}

absl::StatusOr<Trainer::EvalStats> Trainer::EvaluateWithAccuracy(
    absl::Span<const int32_t> ids, absl::Span<const int32_t> targets) {
  if (!model_.accuracy().valid()) {
    return absl::FailedPreconditionError(
        "Trainer::Evaluate: the model has no loss head");
  }
  Graph& graph = model_.graph();
  RETURN_IF_ERROR(graph.SetInput(model_.ids(), ids));
  RETURN_IF_ERROR(graph.SetInput(model_.targets(), targets));
  // The head writes the loss and the accuracy in one pass over its logits.
  RETURN_IF_ERROR(graph.Forward(/*training=*/false));
  EvalStats stats;
  ASSIGN_OR_RETURN(stats.loss, graph.ReadScalar(model_.loss()));
  ASSIGN_OR_RETURN(stats.accuracy, graph.ReadScalar(model_.accuracy()));
  // SetInput checked every target: each is in range or the ignore index.
  const ValueInfo& info = graph.info(model_.targets());
  for (const int32_t target : targets) {
    stats.tokens += !(info.allow_ignore && target == info.ignore_index);
  }
  return stats;
}

absl::StatusOr<std::string> Trainer::Save(
    const std::string& dir, const std::map<std::string, std::string>& extra) {
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  Communicator* const comm = options_.communicator;
  const std::string name = CheckpointName(step_);
  const fs::path root(dir);
  const fs::path final_path = root / name;
  const fs::path temp_path = root / (name + kTempSuffix);
  std::vector<uint8_t> m, v;
  if (comm != nullptr && options_.shard_optimizer_state) {
    // Every rank's shard of the moments, gathered (every rank takes part).
    for (std::vector<uint8_t>* moment : {&m, &v}) {
      const Tensor shard = moment == &m ? m_.view : v_.view;
      RETURN_IF_ERROR(comm->AllGather(shard, gathered_.view, context));
      ASSIGN_OR_RETURN(
          *moment,
          ToHostBytes(FlatRange(gathered_.view, 0, params.count), context));
    }
  }
  // Rank 0 alone writes.
  if (comm != nullptr && comm->rank() != 0) return final_path.string();
  if (m.empty()) {
    ASSIGN_OR_RETURN(m, ToHostBytes(m_.view, context));
    ASSIGN_OR_RETURN(v, ToHostBytes(v_.view, context));
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> master,
                   ToHostBytes(params.master, context));
  const int64_t element = DTypeSize(params.master.dtype);
  std::error_code error;
  fs::create_directories(root, error);
  if (error) return Fail(absl::StrCat("creating ", dir), error);
  fs::remove_all(temp_path, error);
  fs::create_directories(temp_path, error);
  if (error) return Fail(absl::StrCat("creating ", temp_path.string()), error);

  std::vector<SafetensorsEntry> weights;
  for (const GptParameter& parameter : model_.named_parameters()) {
    const ValueInfo& info = graph.info(parameter.value);
    weights.push_back({parameter.name, params.master.dtype, info.shape,
                       master.data() + info.param_offset * element});
  }
  RETURN_IF_ERROR(WriteSafetensors((temp_path / kModelFile).string(), weights,
                                   GptConfigToMetadata(model_.config())));
  std::map<std::string, std::string> metadata = extra;
  metadata[kStepKey] = absl::StrCat(step_);
  const std::vector<SafetensorsEntry> moments = {
      {"adamw.m", params.master.dtype, {params.count}, m.data()},
      {"adamw.v", params.master.dtype, {params.count}, v.data()}};
  RETURN_IF_ERROR(WriteSafetensors((temp_path / kOptimizerFile).string(),
                                   moments, metadata));
  fs::remove_all(final_path, error);
  fs::rename(temp_path, final_path, error);
  if (error)
    return Fail(absl::StrCat("renaming to ", final_path.string()), error);
  RETURN_IF_ERROR(
      WriteFileAtomically((root / kLatestFile).string(), name + "\n"));
  return final_path.string();
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / kLatestFile;
  std::ifstream in(latest);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint in ", dir, " (no ", latest.string(), ")"));
  }
  std::string name;
  std::getline(in, name);
  name = std::string(absl::StripAsciiWhitespace(name));
  if (name.empty() || name.find('/') != std::string::npos) {
    return absl::DataLossError(
        absl::StrCat(latest.string(), " does not name a checkpoint"));
  }
  return (fs::path(dir) / name).string();
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& dir, int64_t keep) {
  if (keep < 0) {
    return InvalidArgument("PruneCheckpoints: keep must be >= 0 (0: all), got ",
                           keep);
  }
  // The folder `latest` names stays whatever its step (e.g. when a fresh run
  // wrote fewer steps into a folder that holds an older, longer run).
  std::string latest;
  if (absl::StatusOr<std::string> folder = LatestCheckpoint(dir); folder.ok()) {
    latest = fs::path(*folder).filename().string();
  }
  std::vector<std::pair<int64_t, fs::path>> checkpoints;
  std::vector<fs::path> doomed;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint folder ", dir));
  }
  fs::directory_iterator it(dir, error);
  if (error) return Fail(absl::StrCat("listing ", dir), error);
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) return Fail(absl::StrCat("listing ", dir), error);
    const fs::file_status status = it->symlink_status(error);
    if (error || !fs::is_directory(status)) continue;
    bool temp = false;
    const std::string name = it->path().filename().string();
    const int64_t step = ParseCheckpointName(name, &temp);
    if (step < 0) continue;
    if (temp) {
      doomed.push_back(it->path());
    } else {
      checkpoints.push_back({step, it->path()});
    }
  }
  if (error) return Fail(absl::StrCat("listing ", dir), error);
  if (keep > 0) {
    std::sort(checkpoints.begin(), checkpoints.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = keep; i < checkpoints.size(); ++i) {
      if (checkpoints[i].second.filename() != latest) {
        doomed.push_back(checkpoints[i].second);
      }
    }
  }
  std::vector<std::string> removed;
  for (const fs::path& path : doomed) {
    fs::remove_all(path, error);
    if (error) return Fail(absl::StrCat("removing ", path.string()), error);
    removed.push_back(path.string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

absl::StatusOr<GptConfig> ReadCheckpointConfig(const std::string& folder) {
  ASSIGN_OR_RETURN(
      SafetensorsFile file,
      SafetensorsFile::Read((fs::path(folder) / kModelFile).string()));
  return GptConfigFromMetadata(file.metadata());
}

absl::StatusOr<std::map<std::string, std::string>> Trainer::Load(
    const std::string& path) {
  std::string folder = path;
  if (!fs::exists(fs::path(path) / kModelFile)) {
    ASSIGN_OR_RETURN(folder, LatestCheckpoint(path));
  }
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  const int64_t element = DTypeSize(params.master.dtype);
  ASSIGN_OR_RETURN(
      SafetensorsFile model_file,
      SafetensorsFile::Read((fs::path(folder) / kModelFile).string()));
  ASSIGN_OR_RETURN(GptConfig saved,
                   GptConfigFromMetadata(model_file.metadata()));
  if (GptConfigToMetadata(saved) != GptConfigToMetadata(model_.config())) {
    return InvalidArgument("checkpoint ", folder, " holds a model of ",
                           DescribeGptConfig(saved), ", not ",
                           DescribeGptConfig(model_.config()));
  }
  // Everything is read and checked before anything is written.
  std::vector<uint8_t> master(params.count * element, 0);
  for (const GptParameter& parameter : model_.named_parameters()) {
    const ValueInfo& info = graph.info(parameter.value);
    ASSIGN_OR_RETURN(SafetensorsFile::View view,
                     model_file.Find(parameter.name));
    if (view.dtype != params.master.dtype || view.shape != info.shape) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint tensor ", parameter.name, " is ", DTypeName(view.dtype),
          " of another shape than the model's"));
    }
    std::memcpy(master.data() + info.param_offset * element, view.bytes.data(),
                view.bytes.size());
  }
  ASSIGN_OR_RETURN(
      SafetensorsFile optimizer_file,
      SafetensorsFile::Read((fs::path(folder) / kOptimizerFile).string()));
  std::vector<uint8_t> moments[2];
  const char* names[2] = {"adamw.m", "adamw.v"};
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(SafetensorsFile::View view, optimizer_file.Find(names[i]));
    if (view.dtype != params.master.dtype ||
        view.shape != Shape{params.count}) {
      return absl::DataLossError(absl::StrCat("checkpoint tensor ", names[i],
                                              " does not fit the model"));
    }
    moments[i].assign(view.bytes.begin(), view.bytes.end());
  }
  std::map<std::string, std::string> extra = optimizer_file.metadata();
  int64_t step = 0;
  auto step_it = extra.find(kStepKey);
  if (step_it == extra.end() || !absl::SimpleAtoi(step_it->second, &step) ||
      step < 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", folder, " has no valid step"));
  }
  RETURN_IF_ERROR(FromHostBytes(master, params.master, context));
  // This rank's part of the moments (all of them unless ZeRO-1); a shard's
  // padding stays 0.
  const int64_t begin = shard_begin(), end = shard_end();
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> part(moments[i].begin() + begin * element,
                                    moments[i].begin() + end * element);
    RETURN_IF_ERROR(FromHostBytes(
        part, FlatRange(i == 0 ? m_.view : v_.view, 0, end - begin), context));
  }
  RETURN_IF_ERROR(graph.SyncComputeCopy());
  step_ = step;
  extra.erase(kStepKey);
  return extra;
}

}  // namespace graph
}  // namespace lossrt
