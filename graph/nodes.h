// The graph's node types, one per op of graph/ops (internal to //graph): each
// wraps an op's forward and backward, naming its saved tensors.
#ifndef LOSSRT_GRAPH_NODES_H_
#define LOSSRT_GRAPH_NODES_H_

#include <cstdint>
#include <memory>

#include "graph/graph.h"
#include "loss/cross_entropy.h"
#include "loss/linear_cross_entropy.h"

namespace lossrt {
namespace graph {

// ids [rows] into a token table [vocab, width].
std::unique_ptr<Node> MakeEmbeddingNode(int64_t seq, bool with_positions,
                                        int64_t rows, int64_t vocab,
                                        int64_t width);
// x [rows, in] -> [rows, out]; inputs x, weight[, bias][, residual].
std::unique_ptr<Node> MakeLinearNode(bool with_bias, bool with_residual,
                                     int64_t rows, int64_t out);
// aux: [mean,] rstd, [rows] in the accumulator dtype.
std::unique_ptr<Node> MakeLayerNormNode(float eps, bool with_beta, int64_t rows,
                                        int64_t cols);
std::unique_ptr<Node> MakeRmsNormNode(float eps, int64_t rows, int64_t cols);
std::unique_ptr<Node> MakeGeluNode();
std::unique_ptr<Node> MakeSwiGluNode();
// inputs x, w1[, b1], w2[, b2][, residual].
std::unique_ptr<Node> MakeGeluMlpNode(bool with_bias, bool with_residual,
                                      int64_t rows, int64_t hidden,
                                      int64_t out);
std::unique_ptr<Node> MakeAddNode();
// aux: lse [batch, heads, seq].
std::unique_ptr<Node> MakeAttentionNode(
    int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, DType dtype,
    const ops::CausalAttentionOptions& options);
// The two heads: outputs loss [] and accuracy [] f32 (Graph::HeadAccuracy; the
// accuracy written by the evaluation forward only).
// aux: d_hidden [rows, C], d_weight [V, C] (and d_bias [V]) computed by the
// training forward, which Backward() adds to the inputs' gradients. With
// `weight_grads_direct` (the weight, and the bias if any, are parameters with
// f32 gradients) the training forward adds d_weight and d_bias straight into
// the parameters' gradients instead (LinearCrossEntropyGradients::accumulate),
// and the aux holds d_hidden only.
std::unique_ptr<Node> MakeLinearCrossEntropyNode(
    const LinearCrossEntropyOptions& options, bool with_bias,
    bool weight_grads_direct);
// aux: lse [rows].
std::unique_ptr<Node> MakeCrossEntropyNode(const CrossEntropyOptions& options,
                                           int64_t rows, int64_t vocab);

// Whether a node's backward reads its own output (the plan keeps it alive).
bool BackwardReadsOutput(const Node& node);

}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_NODES_H_
