// Batches of token windows for language-model training: the train/validation
// split (TokenDataset), random training batches that are a pure function of
// (seed, batch index) so that a resumed run continues exactly (Batcher), and a
// fixed set of validation batches (EvalBatcher).
//
//   ASSIGN_OR_RETURN(lossrt::data::TokenDataset dataset,
//                    lossrt::data::TokenDataset::Create(std::move(tokens),
//                                                       /*val_fraction=*/0.05,
//                                                       /*seq=*/256));
//   ASSIGN_OR_RETURN(lossrt::data::Batcher train,
//                    lossrt::data::Batcher::Create(dataset.train, 16, 256,
//                                                  seed));
//   RETURN_IF_ERROR(train.set_position(resumed_step));   // when resuming
//   std::vector<int32_t> inputs(16 * 256), targets(16 * 256);  // [batch*seq]
//   RETURN_IF_ERROR(train.Next(absl::MakeSpan(inputs),
//                              absl::MakeSpan(targets)));
//
// A window is seq + 1 consecutive tokens starting at s: inputs get tokens
// [s, s + seq) and targets [s + 1, s + seq + 1), so targets[i] is the token
// after inputs[i]. Row b of a batch is window b, row-major: element (b, t) is
// at b * seq + t.
//
// Training window b of batch k starts at
//   s = floor(h * S / 2^64),  h = M(M(M(seed) ^ k) ^ b),
// with M the SplitMix64 finalizer (Steele et al.) of x + 0x9E3779B97F4A7C15
// and S = tokens - seq the number of possible starts. This formula is part of
// the contract: the same (tokens, batch, seq, seed, k) give the same batch in
// every version.
//
// The batchers hold a view of the tokens: the tokens must outlive them.
#ifndef LOSSRT_DATA_BATCHER_H_
#define LOSSRT_DATA_BATCHER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lossrt {
namespace data {

// The SplitMix64 finalizer of x + 0x9E3779B97F4A7C15 (one SplitMix64 step).
uint64_t SplitMix64(uint64_t x);

// A token stream split into training tokens and validation tokens (the last
// part of the stream).
struct TokenDataset {
  // Validation gets the last max(ceil(val_fraction * n), seq + 1) tokens
  // (at least one window) when val_fraction > 0, none when it is 0; training
  // gets the rest, which must hold at least one window of seq + 1 tokens.
  // InvalidArgument when val_fraction is outside [0, 1), seq < 1, or the
  // data is too small.
  static absl::StatusOr<TokenDataset> Create(std::vector<int32_t> tokens,
                                             double val_fraction, int seq);

  std::vector<int32_t> train;
  std::vector<int32_t> val;
};

// Inputs and targets of one batch, each [batch * seq].
struct Batch {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Random training batches: batch k is a deterministic function of
// (tokens, batch, seq, seed, k); see the formula above.
class Batcher {
 public:
  // InvalidArgument when batch < 1, seq < 1, batch * seq > INT32_MAX, or
  // `tokens` holds fewer than seq + 1 tokens.
  static absl::StatusOr<Batcher> Create(absl::Span<const int32_t> tokens,
                                        int batch, int seq, uint64_t seed);

  int batch() const { return batch_; }
  int seq() const { return seq_; }
  uint64_t seed() const { return seed_; }

  // The index of the batch Next returns next (0 after Create).
  int64_t position() const { return position_; }
  // Resumes at batch `position` (>= 0; InvalidArgument otherwise).
  absl::Status set_position(int64_t position);

  // Writes batch position() and advances the position by one. `inputs` and
  // `targets` must each hold batch * seq elements.
  absl::Status Next(absl::Span<int32_t> inputs, absl::Span<int32_t> targets);

  // Writes batch `k` (>= 0) without touching the position.
  absl::Status Fill(int64_t k, absl::Span<int32_t> inputs,
                    absl::Span<int32_t> targets) const;

  // Batch `k` in new vectors (for tests and tools; Fill does not allocate).
  absl::StatusOr<Batch> Get(int64_t k) const;

  // The start of window `b` of batch `k` in the tokens.
  int64_t WindowStart(int64_t k, int b) const;

 private:
  Batcher(absl::Span<const int32_t> tokens, int batch, int seq, uint64_t seed)
      : tokens_(tokens), batch_(batch), seq_(seq), seed_(seed) {}

  absl::Span<const int32_t> tokens_;
  int batch_;
  int seq_;
  uint64_t seed_;
  int64_t position_ = 0;
};

// A fixed set of validation batches, so that validation losses are comparable
// across evaluations: num_batches() * batch windows spread evenly over the
// tokens (window j starts at floor(j * (n - seq - 1) / (W - 1)) for W windows;
// they do not overlap when the tokens hold W windows or more).
class EvalBatcher {
 public:
  // num_batches() = min(max_batches, max(1, (n - 1) / seq / batch)): as many
  // batches of non-overlapping windows as fit, at least one. InvalidArgument
  // when batch < 1, seq < 1, max_batches < 1, batch * seq > INT32_MAX or
  // `tokens` holds fewer than seq + 1 tokens.
  static absl::StatusOr<EvalBatcher> Create(absl::Span<const int32_t> tokens,
                                            int batch, int seq,
                                            int64_t max_batches);

  int batch() const { return batch_; }
  int seq() const { return seq_; }
  int64_t num_batches() const { return num_batches_; }

  // Writes batch `k` in [0, num_batches()).
  absl::Status Fill(int64_t k, absl::Span<int32_t> inputs,
                    absl::Span<int32_t> targets) const;
  absl::StatusOr<Batch> Get(int64_t k) const;

  // The start of window `b` of batch `k`.
  int64_t WindowStart(int64_t k, int b) const;

 private:
  EvalBatcher(absl::Span<const int32_t> tokens, int batch, int seq,
              int64_t num_batches)
      : tokens_(tokens), batch_(batch), seq_(seq), num_batches_(num_batches) {}

  absl::Span<const int32_t> tokens_;
  int batch_;
  int seq_;
  int64_t num_batches_;
};

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_BATCHER_H_
