// The GPT model: configuration checks, the graph of one batch shape, and
// initialization.
#include "graph/gpt.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/ops/elementwise.h"
#include "runtime/random.h"
#include "runtime/status.h"

namespace lossrt {
namespace graph {

int64_t GptConfig::mlp_width() const {
  if (mlp_hidden > 0) return mlp_hidden;
  if (mlp == MlpKind::kGelu) return 4 * width;
  const int64_t swiglu = (8 * width + 2) / 3;
  return (swiglu + 63) / 64 * 64;
}

absl::Status ValidateGptConfig(const GptConfig& c) {
  if (c.layers <= 0 || c.heads <= 0 || c.width <= 0 || c.context <= 0 ||
      c.vocab <= 0) {
    return InvalidArgument(
        "GPT config: layers, heads, width, context and vocab must be "
        "positive, got ",
        DescribeGptConfig(c));
  }
  if (c.width % c.heads != 0) {
    return InvalidArgument("GPT config: ", c.heads,
                           " heads do not divide the width ", c.width);
  }
  if (c.mlp_hidden < 0) {
    return InvalidArgument("GPT config: negative MLP width ", c.mlp_hidden);
  }
  if (!(c.norm_eps > 0)) {
    return InvalidArgument("GPT config: norm eps must be positive");
  }
  if (c.vocab >= (int64_t{1} << 31) || c.context >= (int64_t{1} << 31)) {
    return InvalidArgument("GPT config: vocab and context must fit in int32");
  }
  return absl::OkStatus();
}

std::string DescribeGptConfig(const GptConfig& c) {
  return absl::StrCat(c.layers, " layers, ", c.heads, " heads, width ", c.width,
                      ", context ", c.context, ", vocab ", c.vocab, ", ",
                      c.norm == NormKind::kLayerNorm ? "LayerNorm" : "RMSNorm",
                      ", ", c.mlp == MlpKind::kGelu ? "GELU" : "SwiGLU",
                      " MLP ", c.mlp_width(),
                      c.tied_head ? ", tied head" : ", untied head",
                      c.bias ? "" : ", no biases");
}

Gpt::Gpt(const GptConfig& config, BatchShape shape, DType activation_dtype)
    : config_(config),
      shape_(shape),
      graph_(std::make_unique<Graph>(activation_dtype)) {}

Value Gpt::Param(const std::string& name, Shape shape, bool decay) {
  const Value value = graph_->Parameter(name, std::move(shape), decay);
  parameters_.push_back({name, value});
  return value;
}

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(
    Context& context, const GptConfig& config, BatchShape shape,
    DType activation_dtype, GptHead head,
    const LinearCrossEntropyOptions& head_options,
    const ops::CausalAttentionOptions& attention_options) {
  RETURN_IF_ERROR(ValidateGptConfig(config));
  if (shape.batch <= 0 || shape.seq <= 0) {
    return InvalidArgument("GPT: batch ", shape.batch, " and seq ", shape.seq,
                           " must be positive");
  }
  if (shape.seq > config.context) {
    return InvalidArgument("GPT: sequence length ", shape.seq,
                           " exceeds the model's context ", config.context);
  }
  std::unique_ptr<Gpt> model(new Gpt(config, shape, activation_dtype));
  Graph& g = *model->graph_;
  const int64_t rows = shape.rows();
  const int64_t width = config.width;
  const bool bias = config.bias;
  const int64_t ignore = head_options.cross_entropy.ignore_index;

  model->ids_ = g.Input("ids", {rows}, DType::kI32, config.vocab);
  if (head != GptHead::kLogits) {
    model->targets_ = g.Input("targets", {rows}, DType::kI32, config.vocab,
                              /*allow_ignore=*/true, ignore);
  }
  const Value wte =
      model->Param("transformer.wte.weight", {config.vocab, width}, false);
  const Value wpe =
      model->Param("transformer.wpe.weight", {config.context, width}, false);
  auto norm = [&](Value x, const std::string& name) {
    const Value gamma = model->Param(name + ".weight", {width}, false);
    if (config.norm == NormKind::kRmsNorm) {
      return g.RmsNorm(x, gamma, config.norm_eps);
    }
    std::optional<Value> beta;
    if (bias) beta = model->Param(name + ".bias", {width}, false);
    return g.LayerNorm(x, gamma, beta, config.norm_eps);
  };
  // residual: a value added to the output in the GEMM's epilogue.
  auto linear = [&](Value x, const std::string& name, int64_t out, int64_t in,
                    std::optional<Value> residual = std::nullopt) {
    const Value weight = model->Param(name + ".weight", {out, in}, true);
    std::optional<Value> b;
    if (bias) b = model->Param(name + ".bias", {out}, false);
    return g.Linear(x, weight, b, residual);
  };

  Value x = g.Embedding(model->ids_, wte, wpe, shape.seq);
  const int64_t hidden = config.mlp_width();
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const std::string p = absl::StrCat("transformer.h.", layer, ".");
    const Value qkv =
        linear(norm(x, p + "ln_1"), p + "attn.c_attn", 3 * width, width);
    const Value attended = g.CausalAttention(qkv, shape.batch, shape.seq,
                                             config.heads, attention_options);
    // The residual connections are added by the projections' GEMMs.
    x = linear(attended, p + "attn.c_proj", width, width, x);
    const Value normed = norm(x, p + "ln_2");
    if (config.mlp == MlpKind::kGelu) {
      // One node, the GELU in the GEMMs' epilogues; the parameters in the
      // order (and with the names) of the separate layers.
      const Value w1 =
          model->Param(p + "mlp.c_fc.weight", {hidden, width}, true);
      std::optional<Value> b1, b2;
      if (bias) b1 = model->Param(p + "mlp.c_fc.bias", {hidden}, false);
      const Value w2 =
          model->Param(p + "mlp.c_proj.weight", {width, hidden}, true);
      if (bias) b2 = model->Param(p + "mlp.c_proj.bias", {width}, false);
      x = g.GeluMlp(normed, w1, b1, w2, b2, x);
    } else {
      const Value inner =
          g.SwiGlu(linear(normed, p + "mlp.c_fc", 2 * hidden, width));
      x = linear(inner, p + "mlp.c_proj", width, hidden, x);
    }
  }
  const Value final_hidden = norm(x, "transformer.ln_f");
  const Value head_weight =
      config.tied_head
          ? wte
          : model->Param("lm_head.weight", {config.vocab, width}, true);
  switch (head) {
    case GptHead::kFusedLoss:
      model->output_ =
          g.LinearCrossEntropy(final_hidden, head_weight, std::nullopt,
                               model->targets_, head_options);
      break;
    case GptHead::kUnfusedLoss:
      model->output_ =
          g.CrossEntropy(g.Linear(final_hidden, head_weight, std::nullopt),
                         model->targets_, head_options.cross_entropy);
      break;
    case GptHead::kLogits:
      model->output_ = g.Linear(final_hidden, head_weight, std::nullopt);
      break;
  }
  if (head != GptHead::kLogits)
    model->accuracy_ = g.HeadAccuracy(model->output_);
  RETURN_IF_ERROR(g.Compile(context));
  return model;
}

namespace {

// A tensor of ones, written from the host (only small gain vectors).
absl::Status FillOnes(const Tensor& tensor, Context& context) {
  if (tensor.dtype == DType::kF64) {
    std::vector<double> ones(tensor.numel(), 1.0);
    return CopyTensor(
        Tensor::Of(ones.data(), tensor.dtype, tensor.shape, Device::Cpu()),
        tensor, context);
  }
  std::vector<float> ones(tensor.numel(), 1.0f);
  RETURN_IF_ERROR(CopyTensor(
      Tensor::Of(ones.data(), DType::kF32, tensor.shape, Device::Cpu()), tensor,
      context));
  // `ones` lives on this frame: the copy must be done before it goes.
  return context.Synchronize();
}

}  // namespace

absl::Status Gpt::Initialize(uint64_t seed) {
  Context& context = graph_->context();
  const float residual_std =
      0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const GptParameter& parameter = parameters_[i];
    const Tensor master = graph_->master(parameter.value);
    // Each parameter draws from its own stream of the counter-based RNG.
    const uint64_t stream = seed * 0x9E3779B97F4A7C15ull + (i + 1);
    if (absl::EndsWith(parameter.name, ".bias")) {
      RETURN_IF_ERROR(ops::Zero(context, master));
    } else if (absl::StrContains(parameter.name, "ln_")) {
      // Norm gains start at one.
      RETURN_IF_ERROR(FillOnes(master, context));
    } else {
      const bool residual = absl::EndsWith(parameter.name, "c_proj.weight");
      RETURN_IF_ERROR(FillNormal(master, stream, 0.0f,
                                 residual ? residual_std : 0.02f, context));
    }
  }
  return graph_->SyncComputeCopy();
}

absl::Status Gpt::CopyParametersFrom(Gpt& other) {
  const ParameterBuffers& from = other.graph_->parameter_buffers();
  const ParameterBuffers& to = graph_->parameter_buffers();
  if (from.count != to.count || from.master.dtype != to.master.dtype ||
      other.parameters_.size() != parameters_.size()) {
    return InvalidArgument(
        "CopyParametersFrom: the models' parameters differ (", from.count, " ",
        DTypeName(from.master.dtype), " vs ", to.count, " ",
        DTypeName(to.master.dtype), ")");
  }
  RETURN_IF_ERROR(other.graph_->context().Synchronize());
  // A copy that touches a GPU runs on that GPU's context.
  Context& copier =
      to.master.device.is_cuda() ? graph_->context() : other.graph_->context();
  RETURN_IF_ERROR(CopyTensor(from.master, to.master, copier));
  return graph_->SyncComputeCopy();
}

int64_t Gpt::parameter_count() const {
  int64_t count = 0;
  for (const GptParameter& parameter : parameters_) {
    count += graph_->info(parameter.value).numel();
  }
  return count;
}

double Gpt::TrainingFlopsPerStep() const {
  // nanoGPT's estimate: 6 N per token for the parameters (the position table
  // excluded: it is a lookup) plus 6 L C T for the causal attention.
  const double n =
      static_cast<double>(parameter_count() - config_.context * config_.width);
  const double attention = 6.0 * config_.layers * config_.width * shape_.seq;
  return (6.0 * n + attention) * static_cast<double>(shape_.rows());
}

}  // namespace graph
}  // namespace lossrt
