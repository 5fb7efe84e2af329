// The CPU communicator group: a rendezvous shared by the ranks' communicators,
// where the last rank to arrive checks that the calls match and computes the
// collective's result into a scratch buffer that every rank copies its output
// from.
#include "runtime/cpu_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/rank_order_reduce.h"
#include "runtime/status.h"

namespace lossrt {
namespace {

// What one rank asked for in a collective.
struct Call {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int64_t in_elements = 0;
  int64_t out_elements = 0;
  const void* in = nullptr;
  // The rank's own argument check: a rank with bad arguments still arrives,
  // so that the others fail at once instead of waiting for it.
  absl::Status local;
};

std::string Describe(const Call& call) {
  std::string text = CollectiveName(call.kind);
  if (call.kind == CollectiveKind::kAllReduce ||
      call.kind == CollectiveKind::kReduceScatter) {
    absl::StrAppend(&text, "(", ReduceOpName(call.op), ")");
  } else if (call.kind == CollectiveKind::kBroadcast) {
    absl::StrAppend(&text, "(root ", call.root, ")");
  }
  absl::StrAppend(&text, " of ", call.in_elements, " ", DTypeName(call.dtype),
                  " elements");
  return text;
}

// The state shared by the communicators of one group.
class Rendezvous {
 public:
  Rendezvous(int world_size, absl::Duration timeout)
      : world_size_(world_size),
        timeout_(absl::ToChronoNanoseconds(timeout)),
        timeout_text_(absl::FormatDuration(timeout)),
        calls_(world_size),
        present_(world_size, false),
        ins_(world_size, nullptr),
        results_(world_size) {}

  // Takes part in the next collective as `rank`; on success copies
  // out_bytes of the result (from rank's offset for ReduceScatter) to out.
  absl::Status Run(int rank, const Call& call, void* out, int64_t out_bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    calls_[rank] = call;
    present_[rank] = true;
    ++arrived_;
    const uint64_t generation = generation_;
    if (arrived_ == world_size_) {
      Complete();
      cv_.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      const bool woke = cv_.wait_until(lock, deadline, [&] {
        return generation_ != generation || !broken_.ok();
      });
      if (!woke) {
        std::vector<int> missing;
        for (int r = 0; r < world_size_; ++r) {
          if (!present_[r]) missing.push_back(r);
        }
        broken_ = absl::DeadlineExceededError(absl::StrCat(
            "CPU communicator: rank ", rank, " waited ", timeout_text_,
            " in collective #", generation, " (", Describe(call),
            ") for rank(s) ", absl::StrJoin(missing, ", "),
            ", which never arrived; the group is broken"));
        cv_.notify_all();
        return broken_;
      }
      // Broken while this rank waited (and the round did not complete).
      if (generation_ == generation) return broken_;
    }
    if (!results_[rank].ok()) return results_[rank];
    const unsigned char* source =
        scratch_.data() +
        (call.kind == CollectiveKind::kReduceScatter ? rank * out_bytes : 0);
    lock.unlock();
    // Outside the lock: the scratch is written again only once every rank,
    // this one included, has arrived at the next collective.
    if (out_bytes > 0) std::memcpy(out, source, out_bytes);
    return absl::OkStatus();
  }

  absl::Status Abort(int rank, absl::string_view reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) {
      broken_ = absl::AbortedError(absl::StrCat(
          "CPU communicator: rank ", rank, " aborted the group: ", reason));
      cv_.notify_all();
    }
    return absl::OkStatus();
  }

  int world_size() const { return world_size_; }

 private:
  // Runs with every rank present and mu_ held: checks the calls against each
  // other, computes the result and opens the next round.
  void Complete() {
    const Call& first = calls_[0];
    absl::Status shared;
    for (int r = 0; r < world_size_ && shared.ok(); ++r) {
      if (!calls_[r].local.ok()) {
        shared = InvalidArgument(
            CollectiveName(calls_[r].kind), ": rank ", r,
            "'s arguments were rejected: ", calls_[r].local.message());
      }
    }
    for (int r = 1; r < world_size_ && shared.ok(); ++r) {
      const Call& call = calls_[r];
      const bool reduces = first.kind == CollectiveKind::kAllReduce ||
                           first.kind == CollectiveKind::kReduceScatter;
      if (call.kind != first.kind || call.dtype != first.dtype ||
          call.in_elements != first.in_elements ||
          call.out_elements != first.out_elements ||
          (reduces && call.op != first.op) ||
          (first.kind == CollectiveKind::kBroadcast &&
           call.root != first.root)) {
        shared =
            InvalidArgument("collective #", generation_, ": rank 0 called ",
                            Describe(first), ", rank ", r, " ", Describe(call));
      }
    }
    for (int r = 0; r < world_size_; ++r) {
      results_[r] = calls_[r].local.ok() ? shared : calls_[r].local;
    }
    if (shared.ok()) Compute();
    for (int r = 0; r < world_size_; ++r) {
      present_[r] = false;
      calls_[r].in = nullptr;
    }
    arrived_ = 0;
    ++generation_;
  }

  void Compute() {
    const Call& first = calls_[0];
    const int64_t size = DTypeSize(first.dtype);
    // The scratch holds the whole result: in_elements for the reductions
    // and Broadcast, every rank's in for AllGather. It only grows.
    const int64_t elements = first.kind == CollectiveKind::kAllGather
                                 ? first.out_elements
                                 : first.in_elements;
    if (static_cast<int64_t>(scratch_.size()) < elements * size) {
      scratch_.resize(elements * size);
    }
    switch (first.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduceScatter:
        for (int r = 0; r < world_size_; ++r) ins_[r] = calls_[r].in;
        ReduceInRankOrder(first.dtype, first.op, ins_.data(), world_size_,
                          first.in_elements, scratch_.data());
        break;
      case CollectiveKind::kAllGather:
        for (int r = 0; r < world_size_; ++r) {
          if (first.in_elements > 0) {
            std::memcpy(scratch_.data() + r * first.in_elements * size,
                        calls_[r].in, first.in_elements * size);
          }
        }
        break;
      case CollectiveKind::kBroadcast:
        if (first.in_elements > 0) {
          std::memcpy(scratch_.data(), calls_[first.root].in,
                      first.in_elements * size);
        }
        break;
    }
  }

  const int world_size_;
  const std::chrono::nanoseconds timeout_;
  const std::string timeout_text_;
  std::mutex mu_;
  std::condition_variable cv_;
  // The current round: each rank's call and whether it has arrived.
  std::vector<Call> calls_;
  std::vector<bool> present_;
  std::vector<const void*> ins_;  // the calls' inputs, for the reduction
  int arrived_ = 0;
  // Rounds completed so far.
  uint64_t generation_ = 0;
  // Each rank's result of the last completed round.
  std::vector<absl::Status> results_;
  // Non-OK once a rank timed out or aborted: every later call fails with it.
  absl::Status broken_;
  std::vector<unsigned char> scratch_;
};

class CpuCommunicator : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Rendezvous> rendezvous, int rank)
      : rendezvous_(std::move(rendezvous)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return rendezvous_->world_size(); }

  absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op,
                         Context& context) override {
    return Run(CollectiveKind::kAllReduce, in, out, op, 0, context);
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                             Context& context) override {
    return Run(CollectiveKind::kReduceScatter, in, out, op, 0, context);
  }
  absl::Status AllGather(const Tensor& in, const Tensor& out,
                         Context& context) override {
    return Run(CollectiveKind::kAllGather, in, out, ReduceOp::kSum, 0, context);
  }
  absl::Status Broadcast(const Tensor& in, const Tensor& out, int root,
                         Context& context) override {
    return Run(CollectiveKind::kBroadcast, in, out, ReduceOp::kSum, root,
               context);
  }
  absl::Status Abort(absl::string_view reason) override {
    return rendezvous_->Abort(rank_, reason);
  }

 private:
  absl::Status Run(CollectiveKind kind, const Tensor& in, const Tensor& out,
                   ReduceOp op, int root, Context& context) {
    Call call;
    call.kind = kind;
    call.dtype = in.dtype;
    call.op = op;
    call.root = root;
    call.in = in.data;
    call.local = context.device().is_cpu()
                     ? CheckCollectiveArguments(
                           kind, world_size(), root, context, in, out,
                           {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                            DType::kI32, DType::kI64})
                     : InvalidArgument(CollectiveName(kind),
                                       ": the CPU communicator needs a CPU "
                                       "context, not ",
                                       context.device().ToString());
    if (call.local.ok()) {
      call.in_elements = in.numel();
      call.out_elements = out.numel();
    }
    return rendezvous_->Run(rank_, call, out.data,
                            call.local.ok() ? out.span_bytes() : 0);
  }

  std::shared_ptr<Rendezvous> rendezvous_;
  const int rank_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
CpuCommunicatorGroup::Create(int world_size, absl::Duration timeout) {
  constexpr int kMaxWorldSize = 1 << 16;
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return InvalidArgument("CpuCommunicatorGroup: world_size ", world_size,
                           " is not in [1, ", kMaxWorldSize, "]");
  }
  if (timeout <= absl::ZeroDuration()) {
    return InvalidArgument("CpuCommunicatorGroup: timeout ",
                           absl::FormatDuration(timeout), " is not positive");
  }
  auto rendezvous = std::make_shared<Rendezvous>(world_size, timeout);
  std::vector<std::unique_ptr<Communicator>> communicators;
  communicators.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    communicators.push_back(std::make_unique<CpuCommunicator>(rendezvous, r));
  }
  return communicators;
}

}  // namespace lossrt
