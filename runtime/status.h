// Status helpers: RETURN_IF_ERROR and ASSIGN_OR_RETURN (Debian's Abseil
// 20220623 has neither), and a constructor for InvalidArgument errors built
// from string pieces.
#ifndef LOSSRT_RUNTIME_STATUS_H_
#define LOSSRT_RUNTIME_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace lossrt {

// InvalidArgument whose message is the concatenation of `pieces`.
template <typename... Pieces>
absl::Status InvalidArgument(const Pieces&... pieces) {
  return absl::InvalidArgumentError(absl::StrCat(pieces...));
}

namespace status_internal {
inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
}  // namespace status_internal

}  // namespace lossrt

#define LOSSRT_CONCAT_INNER(a, b) a##b
#define LOSSRT_CONCAT(a, b) LOSSRT_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status or StatusOr) is not
// OK.
#define RETURN_IF_ERROR(expr)                                        \
  do {                                                               \
    const auto& lossrt_status_or = (expr);                           \
    if (!lossrt_status_or.ok()) {                                    \
      return ::lossrt::status_internal::GetStatus(lossrt_status_or); \
    }                                                                \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, or
// returns its error.
#define ASSIGN_OR_RETURN(lhs, expr)                                        \
  LOSSRT_ASSIGN_OR_RETURN_IMPL(LOSSRT_CONCAT(lossrt_status_or_, __LINE__), \
                               lhs, expr)

#define LOSSRT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#endif  // LOSSRT_RUNTIME_STATUS_H_
