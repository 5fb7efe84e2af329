// Gpt: a GPT-style decoder (token + learned position embeddings, pre-norm
// blocks of causal self-attention and an MLP, a final norm and a language-model
// head) recorded into a Graph for one batch shape.
//
//   lossrt::graph::GptConfig config;  // GPT-2 small by default
//   ASSIGN_OR_RETURN(std::unique_ptr<Gpt> model,
//                    Gpt::Create(*context, config, {batch, seq},
//                                DType::kBF16, GptHead::kFusedLoss));
//   RETURN_IF_ERROR(model->Initialize(/*seed=*/1234));
//   RETURN_IF_ERROR(model->graph().SetInput(model->ids(), ids));
//
// Parameter names follow nanoGPT ("transformer.h.0.attn.c_attn.weight", with
// nn.Linear's [out, in] layout), so checkpoints load in PyTorch. The heads:
//   kFusedLoss   the loss through the fused linear cross-entropy (the logits
//                never exist in full);
//   kUnfusedLoss full logits [rows, vocab] then the cross-entropy op (for
//                comparison);
//   kLogits      logits only (sampling).
#ifndef LOSSRT_GRAPH_GPT_H_
#define LOSSRT_GRAPH_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "runtime/context.h"

namespace lossrt {
namespace graph {

enum class NormKind { kLayerNorm, kRmsNorm };
enum class MlpKind { kGelu, kSwiGlu };
enum class GptHead { kFusedLoss, kUnfusedLoss, kLogits };

struct GptConfig {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t width = 768;
  int64_t context = 1024;  // the longest sequence the model takes
  int64_t vocab = 50304;
  NormKind norm = NormKind::kLayerNorm;
  MlpKind mlp = MlpKind::kGelu;
  bool tied_head = true;  // the head reuses the token embedding
  bool bias = true;       // biases in the linear layers and LayerNorms
  // The MLP's hidden width; 0 picks 4 * width (GELU) or 8/3 * width rounded up
  // to a multiple of 64 (SwiGLU).
  int64_t mlp_hidden = 0;
  float norm_eps = 1e-5f;

  int64_t head_dim() const { return heads > 0 ? width / heads : 0; }
  int64_t mlp_width() const;
};

// InvalidArgument for configurations no model can have (heads not dividing the
// width, zero sizes, ...).
absl::Status ValidateGptConfig(const GptConfig& config);

// "12 layers, 12 heads, width 768, context 1024, vocab 50304, LayerNorm, GELU,
// tied"
std::string DescribeGptConfig(const GptConfig& config);

// The shape one graph runs: batch sequences of seq tokens (seq <= context).
struct BatchShape {
  int64_t batch = 1;
  int64_t seq = 1;
  int64_t rows() const { return batch * seq; }
};

struct GptParameter {
  std::string name;
  Value value;
};

class Gpt {
 public:
  // Records and compiles the model's graph on the context's device.
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(
      Context& context, const GptConfig& config, BatchShape shape,
      DType activation_dtype, GptHead head,
      const LinearCrossEntropyOptions& head_options = {},
      const ops::CausalAttentionOptions& attention_options = {});

  // GPT-2's initialization from a seed (the same values on every device):
  // weights N(0, 0.02), the projections into the residual stream N(0, 0.02 /
  // sqrt(2 layers)), biases 0, norm gains 1.
  absl::Status Initialize(uint64_t seed);

  // Copies every parameter's master values from `other` (same config; any
  // device), e.g. into a sampling graph.
  absl::Status CopyParametersFrom(Gpt& other);

  Graph& graph() { return *graph_; }
  const GptConfig& config() const { return config_; }
  BatchShape shape() const { return shape_; }
  Value ids() const { return ids_; }
  Value targets() const { return targets_; }  // invalid for kLogits
  Value loss() const { return output_; }      // kFusedLoss, kUnfusedLoss
  Value logits() const { return output_; }    // kLogits
  // The head's next-token accuracy [] f32, written by an evaluation forward
  // (Graph::HeadAccuracy); invalid for kLogits.
  Value accuracy() const { return accuracy_; }
  const std::vector<GptParameter>& named_parameters() const {
    return parameters_;
  }
  // Parameters of the model (without the flat buffers' alignment padding).
  int64_t parameter_count() const;
  // Model FLOPs of one training step (forward + backward) on one batch:
  // 6 N per token plus attention, as in the PaLM appendix.
  double TrainingFlopsPerStep() const;

 private:
  Gpt(const GptConfig& config, BatchShape shape, DType activation_dtype);
  Value Param(const std::string& name, Shape shape, bool decay);

  GptConfig config_;
  BatchShape shape_;
  std::unique_ptr<Graph> graph_;
  Value ids_, targets_, output_, accuracy_;
  std::vector<GptParameter> parameters_;
};

}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_GPT_H_
