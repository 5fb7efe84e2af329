// Helpers shared by the vocabulary-parallel loss tests: host arrays, random
// loss inputs and splits, staging, and the ranks' communicators and threads
// (tests/loss/vocab_parallel_test_util.h).
#include "tests/loss/vocab_parallel_test_util.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/time/time.h"
#include "runtime/cpu_communicator.h"
#include "runtime/status.h"
#include "tests/loss/host_staged_communicator.h"

namespace lossrt {
namespace test {

double Array::Get(int64_t i, int64_t j) const {
  const int64_t k = Index(i, j);
  uint16_t bits;
  switch (dtype) {
    case DType::kBF16:
      std::memcpy(&bits, bytes.data() + 2 * k, 2);
      return Bf16BitsToFloat(bits);
    case DType::kF16:
      std::memcpy(&bits, bytes.data() + 2 * k, 2);
      return F16BitsToFloat(bits);
    default: {
      float value;
      std::memcpy(&value, bytes.data() + 4 * k, 4);
      return value;
    }
  }
}

void Array::Set(int64_t i, int64_t j, double value) {
  const int64_t k = Index(i, j);
  const float f = static_cast<float>(value);
  uint16_t bits;
  switch (dtype) {
    case DType::kBF16:
      bits = FloatToBf16Bits(f);
      std::memcpy(bytes.data() + 2 * k, &bits, 2);
      break;
    case DType::kF16:
      bits = FloatToF16Bits(f);
      std::memcpy(bytes.data() + 2 * k, &bits, 2);
      break;
    default:
      std::memcpy(bytes.data() + 4 * k, &f, 4);
  }
}

void Array::Poison() { std::fill(bytes.begin(), bytes.end(), uint8_t{0xFF}); }

bool Array::Poisoned() const {
  return std::all_of(bytes.begin(), bytes.end(),
                     [](uint8_t b) { return b == 0xFF; });
}

Tensor Array::View(int64_t begin, int64_t count) {
  if (count < 0) count = rows - begin;
  void* data = bytes.empty() ? nullptr : at(begin);
  if (scalar) return Tensor::Of(data, dtype, {}, Device::Cpu());
  if (!matrix) {
    return Tensor::Of(static_cast<char*>(data), dtype, {count == 0 ? 0 : cols},
                      Device::Cpu());
  }
  return Tensor::Of(data, dtype, {count, cols}, Device::Cpu(), stride);
}

Tensor Array::Columns(int64_t begin, int64_t count) {
  char* data = reinterpret_cast<char*>(bytes.data()) + begin * DTypeSize(dtype);
  if (!matrix) return Tensor::Of(data, dtype, {count}, Device::Cpu());
  return Tensor::Of(data, dtype, {rows, count}, Device::Cpu(), ld());
}

Array MakeArray(DType dtype, int64_t rows, int64_t cols, int64_t pad) {
  Array a;
  a.dtype = dtype;
  a.rows = rows;
  a.cols = cols;
  a.stride = pad == 0 ? 0 : cols + pad;
  a.bytes.assign(std::max<int64_t>(a.span(), 1) * DTypeSize(dtype), 0);
  a.Poison();
  return a;
}

Array MakeVector(DType dtype, int64_t n) {
  Array a = MakeArray(dtype, 1, n);
  a.matrix = false;
  return a;
}

Array MakeScalar() {
  Array a = MakeArray(DType::kF32, 1, 1);
  a.matrix = false;
  a.scalar = true;
  return a;
}

bool SameBytes(const Array& a, const Array& b) { return a.bytes == b.bytes; }

CrossEntropyOptions LossOptions(const LossScenario& s,
                                std::optional<Tensor> class_weights) {
  CrossEntropyOptions options;
  options.ignore_index = kIgnore;
  options.reduction = s.reduction;
  options.label_smoothing = s.smoothing;
  options.z_loss = s.z_loss;
  options.softcap = s.softcap;
  options.entropy_weight = s.entropy_weight;
  options.class_weights = class_weights;
  return options;
}

LossInputs MakeLossInputs(const LossScenario& s,
                          std::normal_distribution<double>& normal,
                          std::mt19937_64& rng) {
  // Stateless (unlike `normal`): a fresh one draws as the caller's would.
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  LossInputs in;
  const DType target_type = s.targets_i32 ? DType::kI32 : DType::kI64;
  in.targets.dtype = target_type;
  in.targets.rows = 1;
  in.targets.cols = s.n;
  in.targets.matrix = false;
  in.targets.bytes.assign(std::max<int64_t>(s.n, 1) * DTypeSize(target_type),
                          0);
  std::uniform_int_distribution<int64_t> target(0, s.v - 1);
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t t = uniform(rng) < s.ignore_fraction ? kIgnore : target(rng);
    if (s.targets_i32) {
      const int32_t t32 = static_cast<int32_t>(t);
      std::memcpy(in.targets.bytes.data() + 4 * i, &t32, 4);
    } else {
      std::memcpy(in.targets.bytes.data() + 8 * i, &t, 8);
    }
  }
  if (s.class_weights) {
    in.class_weights = MakeVector(DType::kF32, s.v);
    for (int64_t j = 0; j < s.v; ++j)
      in.class_weights->Set(0, j, 0.5 + 1.5 * uniform(rng));
  }
  if (s.reduction == Reduction::kNone) {
    in.grad_loss = MakeVector(DType::kF32, s.n);
    for (int64_t i = 0; i < s.n; ++i) in.grad_loss.Set(0, i, normal(rng));
  } else {
    in.grad_loss = MakeScalar();
    in.grad_loss.Set(0, 0, 0.5 + uniform(rng));
  }
  return in;
}

std::vector<int64_t> RandomCuts(int64_t v, int world, std::mt19937_64& rng) {
  std::vector<int64_t> candidates;
  for (int64_t j = 1; j < v; ++j) candidates.push_back(j);
  std::shuffle(candidates.begin(), candidates.end(), rng);
  std::vector<int64_t> cuts(candidates.begin(),
                            candidates.begin() + (world - 1));
  cuts.push_back(0);
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(v);
  return cuts;  // [world + 1]: rank r holds [cuts[r], cuts[r + 1])
}

void SetI64Target(Array& targets, int64_t i, int64_t value) {
  std::memcpy(targets.bytes.data() + 8 * i, &value, 8);
}

void ChangeFirstTarget(Tensor& targets) {
  thread_local std::vector<int64_t> copy;
  const int64_t* t = targets.data_as<int64_t>();
  copy.assign(t, t + targets.dim(0));
  copy[0] = copy[0] == 0 ? 1 : 0;
  targets.data = copy.data();
}

absl::StatusOr<Tensor> Staging::In(const Tensor& host) {
  if (context_.device().is_cpu()) return host;
  ASSIGN_OR_RETURN(
      Buffer buffer,
      context_.allocator().Allocate(std::max<int64_t>(host.span_bytes(), 256)));
  Tensor device = host;
  device.data = buffer.data();
  device.device = context_.device();
  buffers_.push_back(std::move(buffer));
  if (host.numel() > 0) RETURN_IF_ERROR(CopyTensor(host, device, context_));
  return device;
}

absl::StatusOr<Tensor> Staging::Out(const Tensor& host) {
  ASSIGN_OR_RETURN(Tensor device, In(host));
  if (!context_.device().is_cpu()) outs_.push_back({device, host});
  return device;
}

absl::Status Staging::Download() {
  for (const auto& [device, host] : outs_) {
    if (host.numel() > 0) RETURN_IF_ERROR(CopyTensor(device, host, context_));
  }
  return context_.Synchronize();
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
InProcessCommunicators(const Device& device, int world) {
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms,
                   CpuCommunicatorGroup::Create(world, absl::Seconds(20)));
  if (!device.is_cpu()) {
    for (std::unique_ptr<Communicator>& comm : comms) {
      ASSIGN_OR_RETURN(comm, HostStagedCommunicator::Create(std::move(comm)));
    }
  }
  return comms;
}

std::vector<absl::Status> RunOnRanks(
    const Device& device, int world,
    const std::vector<std::unique_ptr<Communicator>>& comms,
    const RankBody& body) {
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto context = Context::Create(device);
      if (!context.ok()) {
        results[r] = context.status();
        // Still release the others: a rank without a context would hang them.
        if (!comms.empty()) {
          absl::Status aborted = comms[r]->Abort("no context");
          (void)aborted;
        }
        return;
      }
      results[r] = body(**context, comms.empty() ? nullptr : comms[r].get(), r);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

std::string DeviceName(const testing::TestParamInfo<Device>& info) {
  return std::string(info.param.is_cpu() ? "cpu" : "cuda");
}

}  // namespace test
}  // namespace lossrt
