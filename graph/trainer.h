// Trainer: the optimization loop's state around a Gpt — AdamW moments, the
// learning-rate schedule, gradient accumulation over micro-batches, global
// gradient-norm clipping — and checkpoints that resume exactly.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
//                    Trainer::Create(*model, options));
//   for (...) {
//     // ids and targets hold micro_batches * rows tokens.
//     ASSIGN_OR_RETURN(Trainer::StepStats stats, trainer->Step(ids, targets));
//   }
//   RETURN_IF_ERROR(trainer->Save("ckpt", {{"data_position", "123"}}));
//
// Checkpoints are folders: model.safetensors holds the fp32 master weights
// under nanoGPT's names (loadable by PyTorch's safetensors) with the model
// config in its metadata; optimizer.safetensors holds the AdamW moments and,
// in its metadata, the step and the caller's extra state (e.g. the data
// position). Save writes a new folder <dir>/step-<N> through a temporary
// folder and a rename, then points <dir>/latest at it (written atomically), so
// a crash never leaves a checkpoint half written. PruneCheckpoints removes the
// older step-<N> folders and the temporary folders a crashed Save left behind.
//
// Data parallel (TrainerOptions::communicator): every rank runs its own
// trainer on its rows of each global batch, and the gradients are summed over
// the ranks before the optimizer, so the ranks keep the same weights. The
// flat gradient buffer is all-reduced in buckets of bucket_bytes: during the
// last micro-batch's backward, a bucket goes as soon as the backward has
// passed every node that adds to its gradients, so the all-reduce of late
// layers overlaps the backward of earlier ones. On a GPU the all-reduces run
// on a communication stream that the trainer owns, ordered after the
// backward's kernels and before the optimizer by events (created with the
// trainer, never in a step); on the CPU the same calls run one after another.
// With cuda_graph, the buckets are captured into the graph with the backward
// (forked onto the communication stream and joined back by events inside the
// capture) when the communicator is capturable (NCCL) and there is one
// micro-batch; otherwise a replayed graph runs the backward as one launch and
// the buckets all go after it. The buckets give the same bits as one all-reduce
// of the whole buffer (a sum per element, in rank order). Clipping uses the
// norm of the summed gradient and the reported loss is the global batch's.
//
// With shard_optimizer_state (ZeRO-1) each rank keeps the AdamW moments of
// 1 / world_size of the flat parameters only: the gradients are
// reduce-scattered after the backward (one collective; the buffer padded to a
// multiple of world_size), each rank updates its shard of the master weights
// (clipped with the global norm, from an all-reduce of the shards' sums of
// squares) and the weights are all-gathered. Checkpoints hold the whole
// moments either way, so a run resumes with any number of ranks.
#ifndef LOSSRT_GRAPH_TRAINER_H_
#define LOSSRT_GRAPH_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/gpt.h"
#include "graph/optim/adamw.h"
#include "graph/optim/lr_schedule.h"
#include "runtime/allocator.h"
#include "runtime/communicator.h"
#include "runtime/stream_event.h"

namespace lossrt {
namespace graph {

struct TrainerOptions {
  optim::AdamWOptions adamw;
  optim::LrSchedule schedule;
  int64_t micro_batches = 1;  // gradient accumulation
  // GPU: replay each micro-batch's forward and backward from a CUDA graph
  // captured at the second step (Graph::ForwardBackward). If the capture
  // fails the trainer says so once and runs the nodes one by one.
  bool cuda_graph = false;
  // Data-parallel training over the communicator's ranks (see the top of this
  // file); null trains on one device. Caller-owned: it must outlive the
  // trainer and its collectives must run on the model's context's device.
  Communicator* communicator = nullptr;
  // Data parallel: the bytes of gradient per all-reduce (at least one
  // element; a bucket may split a parameter). The last bucket may be smaller.
  int64_t bucket_bytes = int64_t{25} << 20;
  // Data parallel: shard the AdamW moments over the ranks (ZeRO-1; see the top
  // of this file). Ignored without a communicator.
  bool shard_optimizer_state = false;
};

// Data parallelism's split of one micro-batch: rank `rank` of `world_size`
// gets rows [rank * b, (rank + 1) * b) of the global micro-batch `global`
// ([world_size * b * seq] tokens, row-major), b = rows / world_size, as a view
// of `global`. InvalidArgument unless 0 <= rank < world_size and the global
// batch splits into world_size equal parts of whole rows of `seq` tokens.
absl::StatusOr<absl::Span<const int32_t>> RankRows(
    absl::Span<const int32_t> global, int64_t seq, int rank, int world_size);

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      Gpt& model, const TrainerOptions& options);

  struct StepStats {
    // Mean over the micro-batches (and over the ranks when data-parallel: the
    // loss of the global batch, the same on every rank).
    float loss = 0;
    float grad_norm = 0;  // before clipping
    float lr = 0;
  };
  // One optimizer step: forward and backward over micro_batches batches
  // (`ids` and `targets` hold micro_batches * rows tokens), then AdamW. Data-
  // parallel: every rank calls Step with its rows; a rank whose step fails
  // aborts the communicator, so that the other ranks fail too instead of
  // waiting or going on with other weights (the group is done after that).
  absl::StatusOr<StepStats> Step(absl::Span<const int32_t> ids,
                                 absl::Span<const int32_t> targets);
  // The loss of one batch (rows tokens), without gradients; local to this
  // rank (no collective) when data-parallel.
  absl::StatusOr<float> Evaluate(absl::Span<const int32_t> ids,
                                 absl::Span<const int32_t> targets);

  struct EvalStats {
    float loss = 0;  // the head's loss (the mean over counted tokens)
    // The share of counted tokens whose target is the argmax of the logits
    // (Gpt::accuracy; computed by the head in the loss's pass).
    float accuracy = 0;
    // Counted tokens: targets other than the head's ignore_index. Average
    // accuracies over batches weighted by it.
    int64_t tokens = 0;
  };
  // Evaluate with the next-token accuracy: the same forward (Evaluate runs
  // this one and returns its loss), one more scalar read back.
  absl::StatusOr<EvalStats> EvaluateWithAccuracy(
      absl::Span<const int32_t> ids, absl::Span<const int32_t> targets);

  // Optimizer steps taken (the next Step is step() + 1).
  int64_t step() const { return step_; }
  Gpt& model() { return model_; }
  const TrainerOptions& options() const { return options_; }

  // Writes <dir>/step-<step>/ and updates <dir>/latest; returns the folder.
  // Data parallel: every rank calls Save (with shard_optimizer_state the
  // moments are all-gathered, a collective); rank 0 alone writes, the others
  // return the folder rank 0 writes.
  absl::StatusOr<std::string> Save(
      const std::string& dir, const std::map<std::string, std::string>& extra);
  // Loads a checkpoint folder (or <dir>/latest when `path` is a checkpoint
  // root) into the model and the optimizer; returns the extra state saved with
  // it. The model's config must match the checkpoint's. Data parallel: every
  // rank loads the same checkpoint (written with any number of ranks); with
  // shard_optimizer_state each keeps its shard of the moments.
  absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& path);

 private:
  Trainer(Gpt& model, const TrainerOptions& options)
      : model_(model), options_(options) {}
  // Step without the abort of the communicator on failure.
  absl::StatusOr<StepStats> StepLocal(absl::Span<const int32_t> ids,
                                      absl::Span<const int32_t> targets);
  // Forward and backward of micro-batch `index`; its loss goes to
  // losses_[index]. `last`: data parallel, the buckets all-reduce as the
  // backward finishes them.
  absl::Status RunMicroBatch(absl::Span<const int32_t> ids,
                             absl::Span<const int32_t> targets, int64_t index,
                             bool last);
  // Data parallel: sets up the buckets, the communication context and the
  // events (or the ZeRO-1 shard's buffers).
  absl::Status SetUpDataParallel();
  // Launches every bucket not yet launched whose gradients the backward has
  // finished once node `node` has run backward (node -1: all of them).
  absl::Status LaunchReadyBuckets(int node);
  // The data-parallel part of a step after the backward: the gradients summed
  // (all-reduced or, ZeRO-1, reduce-scattered) and the losses summed.
  absl::Status ReduceGradients();
  // The optimizer step at `step` with learning rate `lr`.
  absl::Status UpdateParameters(float lr, int64_t step);
  // The context the collectives run on: the trainer's own on a GPU (its own
  // stream), the model's on the CPU.
  Context& comm_context();
  // The element range [begin, end) of the flat parameters this rank updates
  // (ZeRO-1; everything otherwise).
  int64_t shard_begin() const;
  int64_t shard_end() const;

  // A contiguous range [begin, end) of the flat gradients all-reduced at once,
  // once the backward has run node `ready_node` (the first node that uses any
  // of its parameters; -1: after the whole backward).
  struct Bucket {
    int64_t begin = 0, end = 0;
    int ready_node = -1;
  };

  Gpt& model_;
  TrainerOptions options_;
  int64_t step_ = 0;
  bool cuda_graph_failed_ = false;
  // [shard_end - shard_begin] moments (all parameters unless ZeRO-1).
  OwnedTensor m_, v_, norm_;
  OwnedTensor losses_;  // [micro_batches] f32 on the device
  // Data parallel: the buckets in launch order and the next to launch.
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  // The CUDA graph holds the buckets' all-reduces (captured with them), and
  // this step's replay ran them.
  bool buckets_captured_ = false;
  bool buckets_in_graph_ = false;
  std::unique_ptr<Context> comm_context_;  // GPU only
  std::unique_ptr<StreamEvent> grads_ready_, comm_done_;
  // ZeRO-1: the shard length n = ceil(count / world_size); padded gradients
  // [world_size * n] (when count % world_size != 0), the reduced gradient
  // shard [n], this rank's updated weights [n] and all ranks' [world_size *
  // n]; the shard's sum of squares [] f64.
  int64_t shard_elements_ = 0;
  OwnedTensor padded_grads_, grad_shard_, weight_shard_, gathered_;
  OwnedTensor sum_squares_;
};

// The checkpoint folder <dir>/latest points at, if any (NotFound otherwise).
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// Keeps the `keep` checkpoints of <dir> with the highest steps (0: keeps all)
// and also the one <dir>/latest names (the same one unless an older run left
// higher steps in <dir>), removes the other checkpoint folders and
// every temporary folder an interrupted Save left behind; returns the paths
// removed, sorted. Only folders (not symlinks) named exactly like Save names
// them, step-<N as 8 or more digits>[.tmp], are touched: other files and
// folders are left alone. One writer per <dir>: a temporary folder that
// another process is writing at the time is removed too. InvalidArgument when
// `keep` < 0 (nothing is removed).
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& dir, int64_t keep);

// The model config saved in a checkpoint folder's model.safetensors.
absl::StatusOr<GptConfig> ReadCheckpointConfig(const std::string& folder);

// The config as "key=value" metadata and back.
std::map<std::string, std::string> GptConfigToMetadata(const GptConfig& config);
absl::StatusOr<GptConfig> GptConfigFromMetadata(
    const std::map<std::string, std::string>& metadata);

}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_TRAINER_H_
