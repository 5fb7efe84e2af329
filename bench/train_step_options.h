// The host side of //bench:train_step, apart from any GPU so that it is tested
// on the CPU: its settings (one struct filled from the flags), their checks
// (each error an InvalidArgument naming the flag, its value and what it
// takes), what they imply for data parallelism (whether a communicator is
// built, the trainer's bucket size), and the arithmetic of the report (median
// step time, tokens/s per GPU and in all, the scaling against one GPU).
//
//   TrainStepOptions options = ...;  // from the flags
//   RETURN_IF_ERROR(CheckTrainStepOptions(options, CudaDeviceCount()));
//   ASSIGN_OR_RETURN(double ms, MedianMs(step_times));
//   const Throughput t = MeasureThroughput(options.gpus, tokens, ms, baseline);
#ifndef LOSSRT_BENCH_TRAIN_STEP_OPTIONS_H_
#define LOSSRT_BENCH_TRAIN_STEP_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lossrt {
namespace bench {

// What --bucket_mib holds when the flag is not given: 25 MiB buckets on
// several GPUs, and no communicator on one GPU unless another flag asks.
inline constexpr double kBucketMibUnset = -1;
inline constexpr double kDefaultBucketMib = 25;
inline constexpr int kMaxGpus = 1024;

struct TrainStepOptions {
  // The model and the batch (per GPU).
  int64_t batch = 16, seq = 1024, layers = 12, heads = 12, width = 768;
  int64_t vocab = 50304;
  std::string lm_heads = "fused,unfused";
  int64_t warmup = 5, steps = 20;
  double peak_tflops = 989.0;
  int64_t lce_workspace_mb = 1024;
  // The fused head's LinearCrossEntropyOptions::operand_dtype_logits.
  bool lce_operand_dtype_logits = false;
  // Data parallel.
  int64_t gpus = 1;
  double bucket_mib = kBucketMibUnset;  // 0: one all-reduce after the backward
  bool zero1 = false;
  bool force_communicator = false;
  bool baseline = true;
};

// OK, or an InvalidArgument naming the first bad flag: every size in its
// range (heads dividing width), --lm_heads a non-empty list of distinct heads
// among fused and unfused, --bucket_mib unset (-1) or a finite number in [0,
// 2^20], --gpus in [1, kMaxGpus] and at most `visible_gpus` (a clear error
// that says how many GPUs this process sees).
absl::Status CheckTrainStepOptions(const TrainStepOptions& options,
                                   int visible_gpus);

// The heads of --lm_heads in order (the options must have been checked).
std::vector<std::string> LmHeads(const TrainStepOptions& options);

// Whether the trainers get a communicator: on several GPUs, and on one GPU
// when --force_communicator, --zero1 or --bucket_mib asks for the data-
// parallel code paths (a 1-rank NCCL group).
bool UsesCommunicator(const TrainStepOptions& options);

// TrainerOptions::bucket_bytes for --bucket_mib: the default 25 MiB when
// unset, the whole gradient in one bucket for 0 (INT64_MAX: one all-reduce
// once the backward is done), else the MiB in bytes rounded to whole 4-byte
// f32 elements, at least one.
int64_t BucketBytes(double bucket_mib);

// The median of `ms` (the upper of the two middle values for an even count);
// InvalidArgument when empty.
absl::StatusOr<double> MedianMs(std::vector<double> ms);

struct Throughput {
  double tokens_per_s_per_gpu = 0;
  double tokens_per_s_total = 0;
  // Scaling: tokens_per_s_total / the one-GPU baseline's tokens/s, and
  // efficiency: scaling / gpus; absent without a baseline.
  std::optional<double> scaling, efficiency;
};

// The throughput of `gpus` GPUs that each train `tokens_per_gpu` tokens a step
// in `step_ms` (the slowest rank's median), against `baseline_tokens_per_s`
// (one GPU with the same per-GPU batch) when given. Requires gpus >= 1 and
// step_ms > 0; a baseline <= 0 gives no scaling.
Throughput MeasureThroughput(int64_t gpus, int64_t tokens_per_gpu,
                             double step_ms,
                             std::optional<double> baseline_tokens_per_s);

}  // namespace bench
}  // namespace lossrt

#endif  // LOSSRT_BENCH_TRAIN_STEP_OPTIONS_H_
