// The trainer: micro-batch accumulation, AdamW steps and checkpoints.
#include "graph/trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "graph/ops/elementwise.h"
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
  std::unique_ptr<Trainer> trainer(new Trainer(model, options));
  Graph& graph = model.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  ASSIGN_OR_RETURN(
      trainer->m_,
      EmptyTensor(context.allocator(), params.master.dtype, {params.count}));
  ASSIGN_OR_RETURN(
      trainer->v_,
      EmptyTensor(context.allocator(), params.master.dtype, {params.count}));
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
  return trainer;
}

absl::Status Trainer::RunMicroBatch(absl::Span<const int32_t> ids,
                                    absl::Span<const int32_t> targets,
                                    int64_t index) {
  Graph& graph = model_.graph();
  RETURN_IF_ERROR(graph.SetInput(model_.ids(), ids));
  RETURN_IF_ERROR(graph.SetInput(model_.targets(), targets));
  // The first step runs eagerly: it creates the cuBLASLt plans and fills the
  // allocator's cache that the captured graph then reuses.
  const bool use_graph =
      options_.cuda_graph && !cuda_graph_failed_ && step_ >= 1;
  absl::Status status = graph.ForwardBackward(use_graph);
  if (!status.ok() && use_graph && !graph.has_cuda_graph()) {
    std::fprintf(stderr,
                 "trainer: capturing a CUDA graph failed (%s); running the "
                 "nodes one by one\n",
                 status.ToString().c_str());
    cuda_graph_failed_ = true;
    status = graph.ForwardBackward(false);
  }
  RETURN_IF_ERROR(status);
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
  for (int64_t k = 0; k < micro; ++k) {
    RETURN_IF_ERROR(RunMicroBatch(ids.subspan(k * rows, rows),
                                  targets.subspan(k * rows, rows), k));
  }
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  Communicator* const comm = options_.communicator;
  const int world_size = comm != nullptr ? comm->world_size() : 1;
  if (comm != nullptr) {
    // The first step of data parallelism: one all-reduce over the whole flat
    // gradient buffer once the backward pass is done. Buckets that start
    // all-reducing while the backward pass goes on are left for later. The
    // gradients are already scaled by 1 / world_size (the loss scale), so the
    // sum is the global-batch mean's gradient, the same bits on every rank;
    // clipping and AdamW then see the global gradient.
    RETURN_IF_ERROR(
        comm->AllReduce(params.grad, params.grad, ReduceOp::kSum, context));
    // [micro_batches]: each rank's mean losses, summed over the ranks.
    RETURN_IF_ERROR(
        comm->AllReduce(losses_.view, losses_.view, ReduceOp::kSum, context));
  }
  const int64_t step = step_ + 1;
  stats.lr = optim::LearningRate(options_.schedule, step);
  optim::AdamWState state;
  state.params = params.master;
  state.grads = params.grad;
  state.m = m_.view;
  state.v = v_.view;
  if (params.compute.data != params.master.data) {
    state.compute_copy = params.compute;
  }
  state.decay_count = params.decay_count;
  RETURN_IF_ERROR(optim::AdamWStep(graph.context(), state, options_.adamw,
                                   stats.lr, step, norm_.view));
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
  Graph& graph = model_.graph();
  RETURN_IF_ERROR(graph.SetInput(model_.ids(), ids));
  RETURN_IF_ERROR(graph.SetInput(model_.targets(), targets));
  RETURN_IF_ERROR(graph.Forward(/*training=*/false));
  return graph.ReadScalar(model_.loss());
}

absl::StatusOr<std::string> Trainer::Save(
    const std::string& dir, const std::map<std::string, std::string>& extra) {
  Graph& graph = model_.graph();
  Context& context = graph.context();
  const ParameterBuffers& params = graph.parameter_buffers();
  ASSIGN_OR_RETURN(std::vector<uint8_t> master,
                   ToHostBytes(params.master, context));
  ASSIGN_OR_RETURN(std::vector<uint8_t> m, ToHostBytes(m_.view, context));
  ASSIGN_OR_RETURN(std::vector<uint8_t> v, ToHostBytes(v_.view, context));
  const int64_t element = DTypeSize(params.master.dtype);

  const std::string name = CheckpointName(step_);
  const fs::path root(dir);
  const fs::path final_path = root / name;
  const fs::path temp_path = root / (name + kTempSuffix);
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
  RETURN_IF_ERROR(FromHostBytes(moments[0], m_.view, context));
  RETURN_IF_ERROR(FromHostBytes(moments[1], v_.view, context));
  RETURN_IF_ERROR(graph.SyncComputeCopy());
  step_ = step;
  extra.erase(kStepKey);
  return extra;
}

}  // namespace graph
}  // namespace lossrt
