// Tests of runtime/status.h: RETURN_IF_ERROR and ASSIGN_OR_RETURN on Status and
// StatusOr, and InvalidArgument's message.
#include "runtime/status.h"

#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

namespace lossrt {
namespace {

// Counts how often the macro argument is evaluated and records how far the
// caller got.
struct Probe {
  int evaluations = 0;
  bool reached_end = false;
};

absl::Status StatusFrom(Probe& probe, absl::Status status) {
  ++probe.evaluations;
  return status;
}

template <typename T>
absl::StatusOr<T> StatusOrFrom(Probe& probe, absl::StatusOr<T> value) {
  ++probe.evaluations;
  return value;
}

absl::Status ReturnIfErrorOnStatus(Probe& probe, absl::Status status) {
  RETURN_IF_ERROR(StatusFrom(probe, std::move(status)));
  probe.reached_end = true;
  return absl::OkStatus();
}

absl::Status ReturnIfErrorOnStatusOr(Probe& probe, absl::StatusOr<int> value) {
  RETURN_IF_ERROR(StatusOrFrom(probe, std::move(value)));
  probe.reached_end = true;
  return absl::OkStatus();
}

// RETURN_IF_ERROR inside a function that returns a StatusOr.
absl::StatusOr<int> ReturnIfErrorInStatusOrFunction(Probe& probe,
                                                    absl::Status status,
                                                    int result) {
  RETURN_IF_ERROR(StatusFrom(probe, std::move(status)));
  probe.reached_end = true;
  return result;
}

absl::StatusOr<int> AddBoth(Probe& probe, absl::StatusOr<int> a,
                            absl::StatusOr<int> b) {
  ASSIGN_OR_RETURN(const int x, StatusOrFrom(probe, std::move(a)));
  ASSIGN_OR_RETURN(int y, StatusOrFrom(probe, std::move(b)));
  probe.reached_end = true;
  return x + y;
}

absl::Status AssignToExisting(Probe& probe, absl::StatusOr<std::string> value,
                              std::string* out) {
  std::string target = "unchanged";
  ASSIGN_OR_RETURN(target, StatusOrFrom(probe, std::move(value)));
  probe.reached_end = true;
  *out = target;
  return absl::OkStatus();
}

absl::StatusOr<int> MoveOnly(Probe& probe,
                             absl::StatusOr<std::unique_ptr<int>> value) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> pointer,
                   StatusOrFrom(probe, std::move(value)));
  probe.reached_end = true;
  return *pointer;
}

class StatusMacrosTest : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(test::TestSeed()); }
  int RandomInt() {
    return std::uniform_int_distribution<int>(-1000000, 1000000)(rng_);
  }
  std::string RandomMessage() {
    return "error #" + std::to_string(RandomInt());
  }

  std::mt19937_64 rng_;
};

TEST_F(StatusMacrosTest, ReturnIfErrorPassesOkStatusThrough) {
  Probe probe;
  EXPECT_TRUE(ReturnIfErrorOnStatus(probe, absl::OkStatus()).ok());
  EXPECT_EQ(probe.evaluations, 1);
  EXPECT_TRUE(probe.reached_end);
}

TEST_F(StatusMacrosTest, ReturnIfErrorReturnsTheErrorUnchanged) {
  const std::string message = RandomMessage();
  for (const absl::Status& error :
       {absl::InvalidArgumentError(message), absl::UnavailableError(message),
        absl::ResourceExhaustedError(message), absl::InternalError(message)}) {
    Probe probe;
    const absl::Status status = ReturnIfErrorOnStatus(probe, error);
    EXPECT_EQ(status, error);
    EXPECT_EQ(probe.evaluations, 1);
    EXPECT_FALSE(probe.reached_end);
  }
}

TEST_F(StatusMacrosTest, ReturnIfErrorAcceptsStatusOr) {
  Probe ok_probe;
  EXPECT_TRUE(ReturnIfErrorOnStatusOr(ok_probe, RandomInt()).ok());
  EXPECT_EQ(ok_probe.evaluations, 1);
  EXPECT_TRUE(ok_probe.reached_end);

  const absl::Status error = absl::NotFoundError(RandomMessage());
  Probe error_probe;
  EXPECT_EQ(ReturnIfErrorOnStatusOr(error_probe, error), error);
  EXPECT_EQ(error_probe.evaluations, 1);
  EXPECT_FALSE(error_probe.reached_end);
}

TEST_F(StatusMacrosTest, ReturnIfErrorWorksInStatusOrFunctions) {
  const int value = RandomInt();
  Probe ok_probe;
  absl::StatusOr<int> ok =
      ReturnIfErrorInStatusOrFunction(ok_probe, absl::OkStatus(), value);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, value);

  const absl::Status error = absl::FailedPreconditionError(RandomMessage());
  Probe error_probe;
  absl::StatusOr<int> failed =
      ReturnIfErrorInStatusOrFunction(error_probe, error, value);
  EXPECT_EQ(failed.status(), error);
  EXPECT_FALSE(error_probe.reached_end);
}

TEST_F(StatusMacrosTest, AssignOrReturnDeclaresTheValues) {
  const int a = RandomInt(), b = RandomInt();
  Probe probe;
  absl::StatusOr<int> sum = AddBoth(probe, a, b);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, a + b);
  EXPECT_EQ(probe.evaluations, 2);
  EXPECT_TRUE(probe.reached_end);
}

TEST_F(StatusMacrosTest, AssignOrReturnStopsAtTheFirstError) {
  const absl::Status first = absl::InvalidArgumentError(RandomMessage());
  const absl::Status second = absl::OutOfRangeError(RandomMessage());
  Probe probe;
  EXPECT_EQ(AddBoth(probe, first, second).status(), first);
  EXPECT_EQ(probe.evaluations, 1);  // the second expression never ran
  EXPECT_FALSE(probe.reached_end);

  Probe second_probe;
  EXPECT_EQ(AddBoth(second_probe, RandomInt(), second).status(), second);
  EXPECT_EQ(second_probe.evaluations, 2);
  EXPECT_FALSE(second_probe.reached_end);
}

TEST_F(StatusMacrosTest, AssignOrReturnAssignsToAnExistingVariable) {
  const std::string value = RandomMessage();
  std::string out;
  Probe probe;
  ASSERT_TRUE(AssignToExisting(probe, value, &out).ok());
  EXPECT_EQ(out, value);

  out = "untouched";
  Probe error_probe;
  const absl::Status error = absl::AbortedError(value);
  EXPECT_EQ(AssignToExisting(error_probe, error, &out), error);
  EXPECT_EQ(out, "untouched");
  EXPECT_FALSE(error_probe.reached_end);
}

TEST_F(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  const int value = RandomInt();
  Probe probe;
  absl::StatusOr<int> result = MoveOnly(probe, std::make_unique<int>(value));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, value);

  const absl::Status error = absl::DataLossError(RandomMessage());
  Probe error_probe;
  EXPECT_EQ(MoveOnly(error_probe, error).status(), error);
  EXPECT_FALSE(error_probe.reached_end);
}

TEST_F(StatusMacrosTest, InvalidArgumentConcatenatesItsPieces) {
  const int value = RandomInt();
  const absl::Status status =
      InvalidArgument("size ", value, " is not ", 2.5, "; ", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "size " + std::to_string(value) + " is not 2.5; x");
}

}  // namespace
}  // namespace lossrt
