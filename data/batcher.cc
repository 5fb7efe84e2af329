// Train/validation split, counter-based random training batches and the fixed
// validation batches.
#include "data/batcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/status.h"

namespace lossrt {
namespace data {
namespace {

absl::Status CheckShape(absl::Span<const int32_t> tokens, int batch, int seq,
                        absl::string_view who) {
  if (batch < 1 || seq < 1) {
    return InvalidArgument(who, ": batch and seq must be >= 1, got batch ",
                           batch, ", seq ", seq);
  }
  if (int64_t{batch} * seq > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(who, ": batch * seq = ", int64_t{batch} * seq,
                           " exceeds 2^31 - 1");
  }
  if (static_cast<int64_t>(tokens.size()) < int64_t{seq} + 1) {
    return InvalidArgument(who, ": ", tokens.size(),
                           " tokens are too few for one window of seq + 1 = ",
                           int64_t{seq} + 1, " tokens");
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(int batch, int seq, absl::Span<int32_t> inputs,
                          absl::Span<int32_t> targets) {
  const size_t want = static_cast<size_t>(batch) * seq;
  if (inputs.size() != want || targets.size() != want) {
    return InvalidArgument("inputs and targets must hold batch * seq = ", want,
                           " elements, got ", inputs.size(), " and ",
                           targets.size());
  }
  return absl::OkStatus();
}

// Copies the window starting at `start` into row `row` of inputs and targets.
void CopyWindow(absl::Span<const int32_t> tokens, int64_t start, int row,
                int seq, absl::Span<int32_t> inputs,
                absl::Span<int32_t> targets) {
  const size_t offset = static_cast<size_t>(row) * seq;
  std::memcpy(inputs.data() + offset, tokens.data() + start,
              sizeof(int32_t) * seq);
  std::memcpy(targets.data() + offset, tokens.data() + start + 1,
              sizeof(int32_t) * seq);
}

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

absl::StatusOr<TokenDataset> TokenDataset::Create(std::vector<int32_t> tokens,
                                                  double val_fraction,
                                                  int seq) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return InvalidArgument("val_fraction must be in [0, 1), got ",
                           val_fraction);
  }
  if (seq < 1) return InvalidArgument("seq must be >= 1, got ", seq);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t window = int64_t{seq} + 1;
  int64_t val = 0;
  if (val_fraction > 0.0) {
    val = std::max<int64_t>(
        static_cast<int64_t>(std::ceil(val_fraction * static_cast<double>(n))),
        window);
  }
  if (n - val < window) {
    return InvalidArgument(n,
                           " tokens are too few: training needs one window "
                           "of seq + 1 = ",
                           window, " tokens after the ", val,
                           " validation tokens");
  }
  TokenDataset dataset;
  dataset.val.assign(tokens.end() - val, tokens.end());
  tokens.resize(n - val);
  dataset.train = std::move(tokens);
  return dataset;
}

absl::StatusOr<Batcher> Batcher::Create(absl::Span<const int32_t> tokens,
                                        int batch, int seq, uint64_t seed) {
  RETURN_IF_ERROR(CheckShape(tokens, batch, seq, "Batcher"));
  return Batcher(tokens, batch, seq, seed);
}

absl::Status Batcher::set_position(int64_t position) {
  if (position < 0) {
    return InvalidArgument("batch position must be >= 0, got ", position);
  }
  position_ = position;
  return absl::OkStatus();
}

int64_t Batcher::WindowStart(int64_t k, int b) const {
  const uint64_t starts = tokens_.size() - static_cast<uint64_t>(seq_);
  const uint64_t h =
      SplitMix64(SplitMix64(SplitMix64(seed_) ^ static_cast<uint64_t>(k)) ^
                 static_cast<uint64_t>(b));
  // floor(h * starts / 2^64): uniform over [0, starts) up to 2^-64 bias.
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * starts) >>
                              64);
}

absl::Status Batcher::Fill(int64_t k, absl::Span<int32_t> inputs,
                           absl::Span<int32_t> targets) const {
  if (k < 0) return InvalidArgument("batch index must be >= 0, got ", k);
  RETURN_IF_ERROR(CheckOutputs(batch_, seq_, inputs, targets));
  for (int b = 0; b < batch_; ++b) {
    CopyWindow(tokens_, WindowStart(k, b), b, seq_, inputs, targets);
  }
  return absl::OkStatus();
}

absl::Status Batcher::Next(absl::Span<int32_t> inputs,
                           absl::Span<int32_t> targets) {
  RETURN_IF_ERROR(Fill(position_, inputs, targets));
  ++position_;
  return absl::OkStatus();
}

absl::StatusOr<Batch> Batcher::Get(int64_t k) const {
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch_) * seq_);
  out.targets.resize(out.inputs.size());
  RETURN_IF_ERROR(
      Fill(k, absl::MakeSpan(out.inputs), absl::MakeSpan(out.targets)));
  return out;
}

absl::StatusOr<EvalBatcher> EvalBatcher::Create(
    absl::Span<const int32_t> tokens, int batch, int seq, int64_t max_batches) {
  RETURN_IF_ERROR(CheckShape(tokens, batch, seq, "EvalBatcher"));
  if (max_batches < 1) {
    return InvalidArgument("EvalBatcher: max_batches must be >= 1, got ",
                           max_batches);
  }
  const int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / seq;
  const int64_t num_batches =
      std::min(max_batches, std::max<int64_t>(1, windows / batch));
  return EvalBatcher(tokens, batch, seq, num_batches);
}

int64_t EvalBatcher::WindowStart(int64_t k, int b) const {
  const int64_t windows = num_batches_ * batch_;
  const int64_t j = k * batch_ + b;
  const int64_t last_start = static_cast<int64_t>(tokens_.size()) - seq_ - 1;
  if (windows <= 1) return 0;
  return static_cast<int64_t>(
      (static_cast<unsigned __int128>(j) * static_cast<uint64_t>(last_start)) /
      static_cast<uint64_t>(windows - 1));
}

absl::Status EvalBatcher::Fill(int64_t k, absl::Span<int32_t> inputs,
                               absl::Span<int32_t> targets) const {
  if (k < 0 || k >= num_batches_) {
    return InvalidArgument("validation batch ", k, " is outside [0, ",
                           num_batches_, ")");
  }
  RETURN_IF_ERROR(CheckOutputs(batch_, seq_, inputs, targets));
  for (int b = 0; b < batch_; ++b) {
    CopyWindow(tokens_, WindowStart(k, b), b, seq_, inputs, targets);
  }
  return absl::OkStatus();
}

absl::StatusOr<Batch> EvalBatcher::Get(int64_t k) const {
  Batch out;
  out.inputs.resize(static_cast<size_t>(batch_) * seq_);
  out.targets.resize(out.inputs.size());
  RETURN_IF_ERROR(
      Fill(k, absl::MakeSpan(out.inputs), absl::MakeSpan(out.targets)));
  return out;
}

}  // namespace data
}  // namespace lossrt
