// Helpers shared by the vocabulary-parallel loss tests
// (tests/loss/vocab_parallel_cross_entropy_test.cc and
// tests/loss/vocab_parallel_linear_cross_entropy_test.cc): host arrays of any
// dtype with a row stride (filled, poisoned, viewed, compared byte for byte),
// the scenario fields and random loss inputs (targets, class weights,
// grad_loss) both tests share, random splits of the vocabulary, device
// staging of host views, and the ranks' communicators and threads.
#ifndef LOSSRT_TESTS_LOSS_VOCAB_PARALLEL_TEST_UTIL_H_
#define LOSSRT_TESTS_LOSS_VOCAB_PARALLEL_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "loss/cross_entropy.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace test {

constexpr int64_t kIgnore = -100;

// ---------------------------------------------------------------------------
// Host arrays.

// A host array [rows, cols] of f32, bf16 or f16 with a row stride, a vector
// [cols] (rows = 1) or a scalar; targets (i32, i64) are stored in `bytes`
// only (Get and Set read and write floats).
struct Array {
  DType dtype = DType::kF32;
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t stride = 0;  // elements between rows; 0 = cols
  bool matrix = true;  // else a vector [cols] (rows = 1) or a scalar
  bool scalar = false;
  std::vector<uint8_t> bytes;

  int64_t ld() const { return stride != 0 ? stride : cols; }
  int64_t span() const { return rows == 0 ? 0 : (rows - 1) * ld() + cols; }
  int64_t Index(int64_t i, int64_t j) const { return i * ld() + j; }
  void* at(int64_t i) { return bytes.data() + Index(i, 0) * DTypeSize(dtype); }
  double Get(int64_t i, int64_t j) const;
  void Set(int64_t i, int64_t j, double value);
  // All bytes NaN (0xFF..: a NaN in every float dtype).
  void Poison();
  // Whether every byte is still the poison (nothing was written).
  bool Poisoned() const;
  // A view of rows [begin, begin + count) (the whole array by default).
  Tensor View(int64_t begin = 0, int64_t count = -1);
  // Columns [begin, begin + count) of a matrix (row stride ld()), or elements
  // of a vector.
  Tensor Columns(int64_t begin, int64_t count);
};

// A poisoned [rows, cols] array; `pad` elements after each row.
Array MakeArray(DType dtype, int64_t rows, int64_t cols, int64_t pad = 0);
// A poisoned vector [n].
Array MakeVector(DType dtype, int64_t n);
// A poisoned f32 scalar.
Array MakeScalar();

bool SameBytes(const Array& a, const Array& b);

// ---------------------------------------------------------------------------
// Scenarios and their random inputs.

// The fields every vocabulary-parallel scenario has; each test derives its
// own Scenario from it.
struct LossScenario {
  std::string name;
  int64_t n = 37;
  int64_t v = 203;
  Reduction reduction = Reduction::kMean;
  double ignore_fraction = 0.0;
  float smoothing = 0.0f;
  float z_loss = 0.0f;
  float softcap = 0.0f;
  float entropy_weight = 0.0f;
  bool class_weights = false;
  bool targets_i32 = false;
  int64_t pad = 0;
};

// The cross-entropy options of `s` (ignore_index kIgnore).
CrossEntropyOptions LossOptions(const LossScenario& s,
                                std::optional<Tensor> class_weights);

// The inputs of the loss itself, besides the logits or their operands.
struct LossInputs {
  Array targets;                       // [N] i64 or i32 (stored in `bytes`)
  std::optional<Array> class_weights;  // [V] f32
  Array grad_loss;                     // [] or [N]
};

// Random targets (a fraction `ignore_fraction` of them kIgnore), class
// weights in [0.5, 2) where `s` has them, and grad_loss, in that order from
// `rng`. `normal` is the caller's: it keeps a drawn value between calls, so
// a fresh one would change the data a seed gives.
LossInputs MakeLossInputs(const LossScenario& s,
                          std::normal_distribution<double>& normal,
                          std::mt19937_64& rng);

// A random split of [0, V) into `world` contiguous slices of >= 1 element.
std::vector<int64_t> RandomCuts(int64_t v, int world, std::mt19937_64& rng);

// Bad-input helpers: an i64 target set in place; a rank's own copy of the
// targets (thread_local) with the first one changed.
void SetI64Target(Array& targets, int64_t i, int64_t value);
void ChangeFirstTarget(Tensor& targets);

// ---------------------------------------------------------------------------
// Devices and ranks.

// Device copies of a call's host views for a context on a GPU; the views
// themselves on the CPU. Out() copies are brought back by Download(), element
// by element of the view only (ranks share host arrays and write their own
// slices).
class Staging {
 public:
  explicit Staging(Context& context) : context_(context) {}

  absl::StatusOr<Tensor> In(const Tensor& host);
  absl::StatusOr<Tensor> Out(const Tensor& host);
  absl::Status Download();

 private:
  Context& context_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<Tensor, Tensor>> outs_;  // device, host
};

// `world` in-process communicators (20 s timeout), host-staged for a GPU
// `device`.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
InProcessCommunicators(const Device& device, int world);

// One rank's work on its own context; `comm` is null where `comms` is empty.
using RankBody =
    std::function<absl::Status(Context& context, Communicator* comm, int rank)>;

// `body` for ranks 0..world-1, one thread and one context on `device` each;
// a rank without a context aborts its communicator (the others would hang).
std::vector<absl::Status> RunOnRanks(
    const Device& device, int world,
    const std::vector<std::unique_ptr<Communicator>>& comms,
    const RankBody& body);

// "cpu" or "cuda": the name of a case parameterized by device.
std::string DeviceName(const testing::TestParamInfo<Device>& info);

}  // namespace test
}  // namespace lossrt

#endif  // LOSSRT_TESTS_LOSS_VOCAB_PARALLEL_TEST_UTIL_H_
