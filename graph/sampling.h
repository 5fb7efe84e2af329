// Text generation from a Gpt built with GptHead::kLogits: temperature and
// top-k sampling, one token at a time.
//
//   ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
//                    lossrt::graph::Sample(*sampler, prompt, /*length=*/200,
//                                          {.temperature = 0.8f, .top_k =
//                                          40}));
#ifndef LOSSRT_GRAPH_SAMPLING_H_
#define LOSSRT_GRAPH_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/gpt.h"

namespace lossrt {
namespace graph {

struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  int64_t top_k = 0;         // 0 = the whole vocabulary
  uint64_t seed = 0;
};

// `length` new tokens after `prompt` (at least one token). The model must have
// GptHead::kLogits and batch 1; each token runs the model over the last
// shape().seq tokens (the causal mask makes the padding after them
// irrelevant).
absl::StatusOr<std::vector<int32_t>> Sample(Gpt& model,
                                            absl::Span<const int32_t> prompt,
                                            int64_t length,
                                            const SamplingOptions& options);

}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_SAMPLING_H_
