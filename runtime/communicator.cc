// The names of reduce ops and collectives, and the argument checks shared by
// the communicator backends.
#include "runtime/communicator.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"
#include "runtime/tensor_checks.h"

namespace lossrt {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

const char* CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "AllReduce";
    case CollectiveKind::kReduceScatter:
      return "ReduceScatter";
    case CollectiveKind::kAllGather:
      return "AllGather";
    case CollectiveKind::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

namespace {

// OK when `part` is `whole` with dim 0 divided by world_size (ranks >= 1).
absl::Status CheckSplitShape(const char* name, const Tensor& whole,
                             const char* whole_name, const Tensor& part,
                             const char* part_name, int world_size) {
  bool ok = whole.rank() >= 1 && whole.rank() == part.rank() &&
            whole.dim(0) == int64_t{world_size} * part.dim(0);
  for (int64_t d = 1; ok && d < whole.rank(); ++d) {
    ok = whole.dim(d) == part.dim(d);
  }
  if (!ok) {
    return InvalidArgument(name, ": ", whole_name, " ", whole.ShapeString(),
                           " must be ", part_name, " ", part.ShapeString(),
                           " with dim 0 times the world size ", world_size,
                           " (both of rank >= 1)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCollectiveArguments(CollectiveKind kind, int world_size,
                                      int root, const Context& context,
                                      const Tensor& in, const Tensor& out,
                                      std::initializer_list<DType> allowed) {
  const char* name = CollectiveName(kind);
  absl::Status placement = CheckPlacement(context, in, "in");
  if (placement.ok()) placement = CheckPlacement(context, out, "out");
  if (!placement.ok()) {
    return InvalidArgument(name, ": ", placement.message());
  }
  if (in.dtype != out.dtype) {
    return InvalidArgument(name, ": in is ", DTypeName(in.dtype), ", out is ",
                           DTypeName(out.dtype));
  }
  bool allowed_dtype = false;
  for (DType dtype : allowed) allowed_dtype |= dtype == in.dtype;
  if (!allowed_dtype) {
    std::string names;
    for (DType dtype : allowed) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", DTypeName(dtype));
    }
    return InvalidArgument(name, ": dtype ", DTypeName(in.dtype),
                           " is not supported (", names, ")");
  }
  const bool same_data = in.data == out.data && in.numel() == out.numel();
  switch (kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      if (in.shape != out.shape) {
        return InvalidArgument(name, ": out ", out.ShapeString(),
                               " must have in's shape ", in.ShapeString());
      }
      if (!same_data && Overlaps(in, out)) {
        return InvalidArgument(name,
                               ": out overlaps in (only in == out is allowed)");
      }
      break;
    case CollectiveKind::kReduceScatter:
      RETURN_IF_ERROR(CheckSplitShape(name, in, "in", out, "out", world_size));
      if (Overlaps(in, out)) return InvalidArgument(name, ": out overlaps in");
      break;
    case CollectiveKind::kAllGather:
      RETURN_IF_ERROR(CheckSplitShape(name, out, "out", in, "in", world_size));
      if (Overlaps(in, out)) return InvalidArgument(name, ": out overlaps in");
      break;
  }
  if (kind == CollectiveKind::kBroadcast && (root < 0 || root >= world_size)) {
    return InvalidArgument(name, ": root ", root, " is not a rank of ",
                           world_size);
  }
  return absl::OkStatus();
}

}  // namespace lossrt
