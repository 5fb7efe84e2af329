#!/usr/bin/env bash
# Runs the test binaries staged next to this script by tools/stage_gpu.sh (named after
# their targets, e.g. runtime_random_test), each under a timeout, on a machine without
# Bazel. Prints a table of the results, the tail of each failing log, and a last line
# `N passed, M failed`; exits 1 when any test binary fails, times out or crashes.
#
#   gpu_stage/run_gpu_tests.sh                       # every test binary
#   gpu_stage/run_gpu_tests.sh runtime_random_test   # some of them
#
# Environment: GPU_TEST_TIMEOUT (seconds per binary, default 600), LOSSRT_TEST_SEED (replays
# a run's seeds), GPU_TEST_LOGS (where the logs go, default logs/ next to this script).
set -uo pipefail

readonly HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly TIMEOUT=${GPU_TEST_TIMEOUT:-600}
readonly LOGS=${GPU_TEST_LOGS:-${HERE}/logs}
mkdir -p "${LOGS}"

# The test binaries: executables in this folder (benchmarks and examples live in
# subfolders), or the names given.
tests=()
if (($# > 0)); then
  for name in "$@"; do tests+=("${HERE}/${name}"); done
else
  for path in "${HERE}"/*; do
    [[ -f "${path}" && -x "${path}" && "${path}" != *.sh ]] && tests+=("${path}")
  done
fi
if ((${#tests[@]} == 0)); then
  echo "run_gpu_tests: no test binaries in ${HERE}"
  echo "0 passed, 0 failed"
  exit 1
fi

# "N" from GoogleTest's closing lines such as "[  PASSED  ] 12 tests.".
gtest_count() {
  sed -nE "s/^\[ *$1 *\] ([0-9]+) tests?[.,].*/\1/p" "$2" | tail -n 1
}

passed=0
failed=0
rows=()
failures=()
for path in "${tests[@]}"; do
  name=$(basename "${path}")
  log="${LOGS}/${name}.log"
  if [[ ! -x "${path}" ]]; then
    rows+=("$(printf '%-44s %-9s %8s  %s' "${name}" MISSING - "no such binary")")
    failed=$((failed + 1))
    continue
  fi
  # Like Bazel: run from the test's runfiles tree when it has one (data files).
  workdir="${HERE}"
  [[ -d "${path}.runfiles/lossrt" ]] && workdir="${path}.runfiles/lossrt"
  start=$(date +%s.%N)
  (cd "${workdir}" && TEST_SRCDIR="${path}.runfiles" \
    timeout -k 30 "${TIMEOUT}" "${path}" --gtest_color=no) >"${log}" 2>&1 </dev/null
  rc=$?
  seconds=$(awk -v s="${start}" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  cases_passed=$(gtest_count PASSED "${log}")
  cases_skipped=$(gtest_count SKIPPED "${log}")
  cases_failed=$(gtest_count FAILED "${log}")
  cases="${cases_passed:-0} passed, ${cases_skipped:-0} skipped, ${cases_failed:-0} failed"
  if ((rc == 0)); then
    status=PASSED
  elif ((rc == 124 || rc == 137)); then
    status=TIMEOUT
    cases="${cases} (killed after ${TIMEOUT}s)"
  elif ((rc > 128)); then
    status=CRASHED
    cases="${cases} (signal $((rc - 128)))"
  else
    status=FAILED
  fi
  rows+=("$(printf '%-44s %-9s %7ss  %s' "${name}" "${status}" "${seconds}" "${cases}")")
  if [[ "${status}" == PASSED ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("${name}")
  fi
done

for name in "${failures[@]}"; do
  log="${LOGS}/${name}.log"
  echo "===== ${name} (log: ${log})"
  if grep -qE '^\[  FAILED  \] [0-9]+ tests?, listed below' "${log}"; then
    # The failed cases, without GoogleTest's dump of their parameters.
    sed -nE '/^\[  FAILED  \] [0-9]+ tests?, listed below/,$ s/^\[  FAILED  \] ([^ ,]+).*/  \1/p' \
      "${log}" | grep -v '^  [0-9]' | head -n 40
  else
    tail -n 30 "${log}"  # crashed or timed out: where it stopped
  fi
done
echo
printf '%-44s %-9s %8s  %s\n' "test binary" status time "test cases"
printf '%s\n' "${rows[@]}"
echo
echo "${passed} passed, ${failed} failed"
((failed == 0))
