// GoogleTest assertions on absl::Status and absl::StatusOr, for every test
// folder: ASSERT_OK(status) and ASSERT_OK_AND_ASSIGN(lhs, status_or) fail the
// test with the status's message. (Use them in test bodies: they return on
// failure.)
//
//   ASSERT_OK(context->Synchronize());
//   ASSERT_OK_AND_ASSIGN(OwnedTensor t, EmptyTensor(allocator, DType::kF32,
//   {4}));
#ifndef LOSSRT_TESTS_STATUS_ASSERTIONS_H_
#define LOSSRT_TESTS_STATUS_ASSERTIONS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "runtime/status.h"

#define ASSERT_OK(expr)                                         \
  do {                                                          \
    const absl::Status lossrt_test_status = (expr);             \
    ASSERT_TRUE(lossrt_test_status.ok()) << lossrt_test_status; \
  } while (false)

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  LOSSRT_ASSERT_OK_AND_ASSIGN_IMPL(     \
      LOSSRT_CONCAT(lossrt_test_value_, __LINE__), lhs, expr)
#define LOSSRT_ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  ASSERT_TRUE(tmp.ok()) << tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // LOSSRT_TESTS_STATUS_ASSERTIONS_H_
