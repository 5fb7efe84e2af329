// Helpers shared by the files that implement graph/graph.h (graph.cc,
// graph_builder.cc, memory_plan.cc, cuda_graph_runner.cc). Private to
// //graph:graph.
#ifndef LOSSRT_GRAPH_GRAPH_INTERNAL_H_
#define LOSSRT_GRAPH_GRAPH_INTERNAL_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/tensor.h"

namespace lossrt {
namespace graph {
namespace internal {

// "[rows, cols]": a shape in error messages.
inline std::string ShapeText(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace internal
}  // namespace graph
}  // namespace lossrt

#endif  // LOSSRT_GRAPH_GRAPH_INTERNAL_H_
