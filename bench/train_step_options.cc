// The checks and the report arithmetic of //bench:train_step (see
// train_step_options.h).
#include "bench/train_step_options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/status.h"

namespace lossrt {
namespace bench {
namespace {

constexpr int64_t kMaxBucketMib = int64_t{1} << 20;

absl::Status BadFlag(absl::string_view name, absl::string_view value,
                     absl::string_view allowed) {
  return InvalidArgument("--", name, "=", value, " is invalid: want ", allowed);
}

absl::Status CheckInt(absl::string_view name, int64_t value, int64_t lo,
                      int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return BadFlag(name, absl::StrCat(value),
                 absl::StrCat("an integer in [", lo, ", ", hi, "]"));
}

}  // namespace

absl::Status CheckTrainStepOptions(const TrainStepOptions& options,
                                   int visible_gpus) {
  RETURN_IF_ERROR(CheckInt("batch", options.batch, 1, 65536));
  RETURN_IF_ERROR(CheckInt("seq", options.seq, 1, 1 << 20));
  RETURN_IF_ERROR(CheckInt("layers", options.layers, 1, 1024));
  RETURN_IF_ERROR(CheckInt("width", options.width, 1, 65536));
  RETURN_IF_ERROR(CheckInt("heads", options.heads, 1, 1024));
  if (options.width % options.heads != 0) {
    return BadFlag("heads", absl::StrCat(options.heads),
                   absl::StrCat("a divisor of --width=", options.width));
  }
  RETURN_IF_ERROR(
      CheckInt("vocab", options.vocab, 1, std::numeric_limits<int32_t>::max()));
  RETURN_IF_ERROR(CheckInt("warmup", options.warmup, 0, 1 << 20));
  RETURN_IF_ERROR(CheckInt("steps", options.steps, 1, 1 << 20));
  RETURN_IF_ERROR(
      CheckInt("lce_workspace_mb", options.lce_workspace_mb, 0, 1 << 24));
  // NaN fails the comparison.
  if (!(options.peak_tflops > 0 && std::isfinite(options.peak_tflops))) {
    return BadFlag("peak_tflops", absl::StrCat(options.peak_tflops),
                   "a finite number > 0");
  }
  std::vector<std::string> heads;
  for (absl::string_view head : absl::StrSplit(options.lm_heads, ',')) {
    if (head != "fused" && head != "unfused") {
      return BadFlag("lm_heads", absl::StrCat("'", options.lm_heads, "'"),
                     absl::StrCat("a comma-separated list of fused and/or "
                                  "unfused ('",
                                  head, "' is neither)"));
    }
    if (std::find(heads.begin(), heads.end(), head) != heads.end()) {
      return BadFlag("lm_heads", absl::StrCat("'", options.lm_heads, "'"),
                     absl::StrCat("each head once ('", head, "' twice)"));
    }
    heads.emplace_back(head);
  }
  if (options.bucket_mib != kBucketMibUnset &&
      !(options.bucket_mib >= 0 && options.bucket_mib <= kMaxBucketMib)) {
    return BadFlag("bucket_mib", absl::StrCat(options.bucket_mib),
                   absl::StrCat("0 (one all-reduce after the backward) or a "
                                "finite number of MiB in (0, ",
                                kMaxBucketMib, "]"));
  }
  RETURN_IF_ERROR(CheckInt("gpus", options.gpus, 1, kMaxGpus));
  if (options.gpus > visible_gpus) {
    return BadFlag(
        "gpus", absl::StrCat(options.gpus),
        visible_gpus == 0
            ? std::string("at most the visible GPUs, and this process sees "
                          "none (no GPU or driver, or CUDA_VISIBLE_DEVICES "
                          "hides them)")
            : absl::StrCat("at most the ", visible_gpus, " visible GPU",
                           visible_gpus == 1 ? "" : "s"));
  }
  return absl::OkStatus();
}

std::vector<std::string> LmHeads(const TrainStepOptions& options) {
  return absl::StrSplit(options.lm_heads, ',');
}

bool UsesCommunicator(const TrainStepOptions& options) {
  return options.gpus > 1 || options.force_communicator || options.zero1 ||
         options.bucket_mib != kBucketMibUnset;
}

int64_t BucketBytes(double bucket_mib) {
  if (bucket_mib == kBucketMibUnset) bucket_mib = kDefaultBucketMib;
  if (bucket_mib == 0) return std::numeric_limits<int64_t>::max();
  const double elements = std::round(bucket_mib * (1 << 20) / 4);
  return 4 * std::max<int64_t>(1, static_cast<int64_t>(elements));
}

absl::StatusOr<double> MedianMs(std::vector<double> ms) {
  if (ms.empty()) return InvalidArgument("MedianMs: no times");
  const auto middle = ms.begin() + ms.size() / 2;
  std::nth_element(ms.begin(), middle, ms.end());
  return *middle;
}

Throughput MeasureThroughput(int64_t gpus, int64_t tokens_per_gpu,
                             double step_ms,
                             std::optional<double> baseline_tokens_per_s) {
  Throughput t;
  t.tokens_per_s_per_gpu = tokens_per_gpu / (step_ms * 1e-3);
  t.tokens_per_s_total = gpus * t.tokens_per_s_per_gpu;
  if (baseline_tokens_per_s.has_value() && *baseline_tokens_per_s > 0) {
    t.scaling = t.tokens_per_s_total / *baseline_tokens_per_s;
    t.efficiency = *t.scaling / gpus;
  }
  return t;
}

}  // namespace bench
}  // namespace lossrt
