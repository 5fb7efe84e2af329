// Communicator: the abstract interface of collectives over the ranks of a
// group (one rank per thread, process or GPU), and the argument checks that
// every backend shares. Backends: runtime/cpu_communicator.h (in-process,
// threads) and runtime/nccl_communicator.h (NCCL, GPUs). The caller owns each
// communicator; nothing is process-wide.
//
// Collectives are stream-ordered on the given Context: on a GPU they are
// queued on its stream, on the CPU they run to completion before returning.
// Every rank of the group must call the same collectives in the same order
// with matching dtypes and element counts.
//
//   // [n] per rank in, [n] out: every rank gets the sum over the ranks.
//   RETURN_IF_ERROR(comm.AllReduce(grad, grad, lossrt::ReduceOp::kSum, ctx));
#ifndef LOSSRT_RUNTIME_COMMUNICATOR_H_
#define LOSSRT_RUNTIME_COMMUNICATOR_H_

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/context.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {

enum class ReduceOp { kSum, kMax };

const char* ReduceOpName(ReduceOp op);  // "sum", "max"

enum class CollectiveKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast
};

const char* CollectiveName(CollectiveKind kind);  // "AllReduce", ...

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether the collectives may be recorded into a CUDA graph (stream
  // capture): they only enqueue device work on the context's stream, with no
  // host wait on it. Backends that stage through the host cannot.
  virtual bool capturable() const { return false; }

  // out = op over the ranks of in, on every rank. in and out: the same shape
  // and dtype; in may be out (in place), but may not overlap it otherwise.
  virtual absl::Status AllReduce(const Tensor& in, const Tensor& out,
                                 ReduceOp op, Context& context) = 0;
  // in: [world_size * n, ...], out: [n, ...]. Rank r's out = op over the ranks
  // of rows [r * n, (r + 1) * n) of in. in and out may not overlap.
  virtual absl::Status ReduceScatter(const Tensor& in, const Tensor& out,
                                     ReduceOp op, Context& context) = 0;
  // in: [n, ...], out: [world_size * n, ...]. Rows [r * n, (r + 1) * n) of
  // out = rank r's in, on every rank. in and out may not overlap.
  virtual absl::Status AllGather(const Tensor& in, const Tensor& out,
                                 Context& context) = 0;
  // out = rank root's in, on every rank (other ranks' in is not read but must
  // have out's shape and dtype). in may be out.
  virtual absl::Status Broadcast(const Tensor& in, const Tensor& out, int root,
                                 Context& context) = 0;

  // Reports a failure of this rank to the group and gives the communicator
  // up: the other ranks' pending and later collectives fail (how depends on
  // the backend) and so do this rank's. Idempotent.
  virtual absl::Status Abort(absl::string_view reason) = 0;
};

// The checks every backend makes before communicating: in and out on the
// context's device, contiguous, with data; one dtype, one of `allowed`; the
// shapes of `kind` (see Communicator) for `world_size` ranks; no partial
// overlap (exact in-place only for AllReduce and Broadcast); 0 <= root <
// world_size for Broadcast. OK or an InvalidArgument naming the collective and
// the bad argument.
absl::Status CheckCollectiveArguments(CollectiveKind kind, int world_size,
                                      int root, const Context& context,
                                      const Tensor& in, const Tensor& out,
                                      std::initializer_list<DType> allowed);

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_COMMUNICATOR_H_
