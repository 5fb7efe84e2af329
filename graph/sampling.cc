// Temperature and top-k sampling from a logits model.
#include "graph/sampling.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "runtime/status.h"

namespace lossrt {
namespace graph {

absl::StatusOr<std::vector<int32_t>> Sample(Gpt& model,
                                            absl::Span<const int32_t> prompt,
                                            int64_t length,
                                            const SamplingOptions& options) {
  const int64_t seq = model.shape().seq;
  const int64_t vocab = model.config().vocab;
  if (model.shape().batch != 1 || model.targets().valid()) {
    return InvalidArgument("Sample needs a logits model of batch 1");
  }
  if (prompt.empty()) return InvalidArgument("Sample: empty prompt");
  if (length < 0 || !(options.temperature >= 0) || options.top_k < 0) {
    return InvalidArgument("Sample: bad length, temperature or top_k");
  }
  Graph& graph = model.graph();
  Context& context = graph.context();
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> window(seq, 0);
  std::vector<double> logits(vocab);
  std::vector<uint8_t> row_bytes(vocab * DTypeSize(graph.activation_dtype()));
  std::mt19937_64 engine(options.seed);
  for (int64_t step = 0; step < length; ++step) {
    const int64_t used = std::min<int64_t>(seq, tokens.size());
    std::fill(window.begin(), window.end(), 0);
    std::copy(tokens.end() - used, tokens.end(), window.begin());
    RETURN_IF_ERROR(graph.SetInput(model.ids(), window));
    RETURN_IF_ERROR(graph.Forward(/*training=*/false));
    const Tensor all = graph.tensor(model.logits());  // [seq, vocab]
    const Tensor row = Tensor::Of(static_cast<char*>(all.data) +
                                      (used - 1) * vocab * DTypeSize(all.dtype),
                                  all.dtype, {vocab}, all.device);
    RETURN_IF_ERROR(CopyTensor(
        row, Tensor::Of(row_bytes.data(), all.dtype, {vocab}, Device::Cpu()),
        context));
    RETURN_IF_ERROR(context.Synchronize());
    for (int64_t v = 0; v < vocab; ++v) {
      if (all.dtype == DType::kF32) {
        logits[v] = reinterpret_cast<const float*>(row_bytes.data())[v];
      } else if (all.dtype == DType::kF64) {
        logits[v] = reinterpret_cast<const double*>(row_bytes.data())[v];
      } else {
        logits[v] = Bf16BitsToFloat(
            reinterpret_cast<const uint16_t*>(row_bytes.data())[v]);
      }
    }
    int32_t next = 0;
    if (options.temperature == 0) {
      next = static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      // Keep the k largest logits, then sample from their softmax.
      std::vector<int32_t> order(vocab);
      for (int64_t v = 0; v < vocab; ++v) order[v] = static_cast<int32_t>(v);
      const int64_t k =
          options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) {
                          return logits[a] > logits[b] ||
                                 (logits[a] == logits[b] && a < b);
                        });
      std::vector<double> weights(k);
      const double top = logits[order[0]];
      for (int64_t i = 0; i < k; ++i) {
        weights[i] = std::exp((logits[order[i]] - top) / options.temperature);
      }
      std::discrete_distribution<int64_t> pick(weights.begin(), weights.end());
      next = order[pick(engine)];
    }
    tokens.push_back(next);
  }
  return std::vector<int32_t>(tokens.begin() + prompt.size(), tokens.end());
}

}  // namespace graph
}  // namespace lossrt
