// HostStagedCommunicator: a Communicator for CUDA contexts over a host one
// (the in-process CPU communicator, runtime/cpu_communicator.h, which takes
// host tensors only), so that several ranks, each with its own CUDA context,
// run the distributed ops on one GPU in the tests. Each collective waits for
// the context's stream, copies its input to the host, runs the host
// collective and copies the result back. Test-only: it syncs on every call.
//
//   ASSIGN_OR_RETURN(auto staged,
//                    HostStagedCommunicator::Create(std::move(comms[r])));
#ifndef LOSSRT_TESTS_LOSS_HOST_STAGED_COMMUNICATOR_H_
#define LOSSRT_TESTS_LOSS_HOST_STAGED_COMMUNICATOR_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace lossrt {

class HostStagedCommunicator : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<HostStagedCommunicator>> Create(
      std::unique_ptr<Communicator> host) {
    ASSIGN_OR_RETURN(std::unique_ptr<Context> cpu,
                     Context::Create(Device::Cpu()));
    return std::unique_ptr<HostStagedCommunicator>(
        new HostStagedCommunicator(std::move(host), std::move(cpu)));
  }
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op,
                         Context& context) override {
    return Staged(in, out, context,
                  [&](const Tensor& i, const Tensor& o, Context& c) {
                    return host_->AllReduce(i, o, op, c);
                  });
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op,
                             Context& context) override {
    return Staged(in, out, context,
                  [&](const Tensor& i, const Tensor& o, Context& c) {
                    return host_->ReduceScatter(i, o, op, c);
                  });
  }
  absl::Status AllGather(const Tensor& in, const Tensor& out,
                         Context& context) override {
    return Staged(in, out, context,
                  [&](const Tensor& i, const Tensor& o, Context& c) {
                    return host_->AllGather(i, o, c);
                  });
  }
  absl::Status Broadcast(const Tensor& in, const Tensor& out, int root,
                         Context& context) override {
    return Staged(in, out, context,
                  [&](const Tensor& i, const Tensor& o, Context& c) {
                    return host_->Broadcast(i, o, root, c);
                  });
  }
  absl::Status Abort(absl::string_view reason) override {
    return host_->Abort(reason);
  }

 private:
  HostStagedCommunicator(std::unique_ptr<Communicator> host,
                         std::unique_ptr<Context> cpu)
      : host_(std::move(host)), cpu_(std::move(cpu)) {}

  using HostCall =
      std::function<absl::Status(const Tensor&, const Tensor&, Context&)>;
  absl::Status Staged(const Tensor& in, const Tensor& out, Context& context,
                      const HostCall& call) {
    std::vector<uint8_t> in_bytes(std::max<int64_t>(in.span_bytes(), 1));
    std::vector<uint8_t> out_bytes(std::max<int64_t>(out.span_bytes(), 1));
    Tensor host_in = in;
    host_in.data = in_bytes.data();
    host_in.device = Device::Cpu();
    Tensor host_out = out;
    host_out.data = out_bytes.data();
    host_out.device = Device::Cpu();
    // A failed copy still meets the other ranks, with an error of its own.
    absl::Status copied =
        in.numel() > 0 ? CopyTensor(in, host_in, context) : absl::OkStatus();
    if (!copied.ok()) {
      absl::Status aborted = host_->Abort(copied.message());
      (void)aborted;
      return copied;
    }
    RETURN_IF_ERROR(call(host_in, host_out, *cpu_));
    if (out.numel() > 0) RETURN_IF_ERROR(CopyTensor(host_out, out, context));
    // The host bytes go away on return.
    return context.Synchronize();
  }

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Context> cpu_;
};

}  // namespace lossrt

#endif  // LOSSRT_TESTS_LOSS_HOST_STAGED_COMMUNICATOR_H_
