#!/usr/bin/env bash
# Runs the test binaries staged next to this script by tools/stage_gpu.sh (named after
# their targets, e.g. runtime_random_test), each under a timeout, on a machine without
# Bazel. Prints a table of the results, the tail of each failing log, and a last line
# `N passed, M failed`; exits 1 when any test binary fails, times out or crashes.
#
#   gpu_stage/run_gpu_tests.sh                       # every test binary
#   gpu_stage/run_gpu_tests.sh runtime_random_test   # some of them
#   gpu_stage/run_gpu_tests.sh --sanitize=memcheck   # each under compute-sanitizer
#
# --sanitize=memcheck|racecheck|initcheck|synccheck runs each binary under
# `compute-sanitizer --tool <tool> --error-exitcode 1`: a binary whose cases pass but in
# which the tool reports an error fails (status SANITIZER, with the tool's error count).
# memcheck runs every case; the slower racecheck, initcheck and synccheck only the cases
# that use the GPU (the host cases run the same code as without the tool): by default the
# gtest filter in GPU_CASES below (suites and parameters named cuda/Cuda/Gpu/..., and the
# few suites whose GPU cases are not named so). GPU_SANITIZE_FILTER=<gtest filter> replaces
# the default filter for every binary and GPU_SANITIZE_FILTER_<binary>=<filter> for one
# (e.g. GPU_SANITIZE_FILTER_loss_cross_entropy_test='*cuda_bf16*'); '*' runs every case.
#
# cuDNN: the binaries with the attention op link libcudnn.so.9 (tools/stage_gpu.sh). The
# lib/ folder of the Python package nvidia-cudnn (PyTorch's, the cuDNN the tests were checked
# with) goes first on LD_LIBRARY_PATH when it is installed,
#   python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))"
# else the loader's own cuDNN is used; CUDNN_LIBRARY_PATH=<folder> picks another one.
#
# Vendor kernels: racecheck and synccheck report hazards and barrier errors inside cuBLASLt's
# (nvjet_*) and cuDNN's (cudnn_generated_*) warp-specialized Hopper kernels, whose TMA and
# mbarrier synchronization the tools do not follow; our own mbarrier kernels check clean.
# Under synccheck the kernels named below are left uninstrumented (--kernel-name-exclude;
# they still run). racecheck cannot leave them out: with them uninstrumented it fails on
# the H200 ("The Sanitizer failed to handle a hardware exception", then an illegal address),
# so it instruments everything (printing every report: --print-limit) and the table counts
# the reports that name vendor kernels apart: a binary whose every reported hazard is in them
# passes, its row says how many. Under memcheck the API errors raised inside NCCL, cuBLAS or
# cuDNN (NCCL's start-up probes kernel images built for other GPUs) are counted apart the
# same way (every report printed: --print-limit).
# GPU_SANITIZE_VENDOR=1 instruments and counts them as any other. Under racecheck and initcheck
# the contexts start with GEMM tuning off (LOSSRT_GEMM_TUNING=0: each instrumented cuBLASLt
# launch takes seconds, and tuning times eight candidates a shape, for every context, which
# kept the multi-rank tests from finishing; the bits are the same), except in
# runtime_cuda_gemm_test, which tests the tuning. initcheck does not see the
# stores of cuBLASLt's TMA kernels, so every read of a GEMM's output would be reported: under
# initcheck LOSSRT_INITCHECK_GEMM_OUTPUTS=1 makes our GEMM runner zero each output before
# cuBLASLt writes it (runtime/cuda_gemm.h), which keeps reads past the output checked; the
# cuDNN attention graphs' outputs and workspace are zeroed the same way, as cuDNN's stores
# are just as invisible to the tool (graph/ops/attention_cudnn.cc), and so are the outputs
# of the attention's cuBLAS path (graph/ops/attention.cc). Under initcheck the vendor
# kernels stay instrumented: left out, their stores are not tracked at all (cuBLASLt's
# split-K reduction, which is not left out, then reads "uninitialized" workspace) and the
# tool runs about ten times slower.
# One binary at a time, as here: initcheck in several processes at once on one GPU reported
# reads of bytes that a kernel earlier on the same stream had written, and the multi-rank
# tests met illegal addresses, where the same cases alone, without the tool under the same
# load, and under memcheck under that load, were clean (bench/RESULTS.md, GPU test runs).
#
# Environment: GPU_TEST_TIMEOUT (seconds per binary, default 600, 3600 under --sanitize),
# LOSSRT_TEST_SEED (replays a run's seeds), LOSSRT_TEST_ATTENTION_KERNELS (e.g. flash: the
# attention test's GPU cases run only those kernels' configurations, so that initcheck can
# take each kernel's cases in a process of its own), GPU_TEST_LOGS (where the logs go, default logs/
# next to this script), COMPUTE_SANITIZER (the tool's path; default: compute-sanitizer on
# PATH, else /usr/local/cuda/bin/compute-sanitizer).
set -uo pipefail

readonly HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly LOGS=${GPU_TEST_LOGS:-${HERE}/logs}

# The GPU cases, for the sanitizer tools that skip the host ones: names that say so, and
# the suites whose GPU cases do not (they loop over the devices, or need a GPU throughout).
readonly GPU_CASES='*cuda*:*Cuda*:*CUDA*:*gpu*:*Gpu*:*GPU*:GemmTuningTest.*:CopyTensorTest.HostDeviceRoundTrip:CopyTensorTest.DeviceTensorOnAnotherDeviceIsRejected:LinearResidualTest.*:LinearGeluTest.*:AddTest.*:AccumulateIntoTest.*:ZeroTest.*:GraphResidualTest.FusedResidualsMatchExplicitAdds:GraphLossHeadTest.*:AdamWTest.DecayMaskBoundaryIsExact:GradientNormTest.MatchesDoubleSum:CrossEntropyExtrasTest.*:LinearCrossEntropyExtrasTest.*:NcclCommunicatorTest.*:ContextResourcesTest.*'

# Name substrings of the vendor kernels (see above; run_sanitizer_plan.sh repeats them).
readonly VENDOR_KERNELS=(nvjet cudnn xmma cutlass)

sanitize=""
names=()
for arg in "$@"; do
  case "${arg}" in
    --sanitize=memcheck | --sanitize=racecheck | --sanitize=initcheck | --sanitize=synccheck)
      sanitize=${arg#--sanitize=}
      ;;
    --sanitize=* | --sanitize)
      echo "run_gpu_tests: ${arg}: expected --sanitize=memcheck|racecheck|initcheck|synccheck" >&2
      exit 2
      ;;
    -*)
      echo "run_gpu_tests: unknown option ${arg}" >&2
      exit 2
      ;;
    *) names+=("${arg}") ;;
  esac
done

sanitizer=""
if [[ -n "${sanitize}" ]]; then
  sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  if [[ ! -x "${sanitizer}" ]]; then
    echo "run_gpu_tests: --sanitize=${sanitize}: no compute-sanitizer at ${sanitizer} (set COMPUTE_SANITIZER)" >&2
    exit 2
  fi
  readonly TIMEOUT=${GPU_TEST_TIMEOUT:-3600}
  [[ "${sanitize}" == initcheck ]] && export LOSSRT_INITCHECK_GEMM_OUTPUTS=1
else
  readonly TIMEOUT=${GPU_TEST_TIMEOUT:-600}
fi
mkdir -p "${LOGS}"

# Puts the folder of libcudnn.so.9 (see the header) first on LD_LIBRARY_PATH.
setup_cudnn_path() {
  local dir=${CUDNN_LIBRARY_PATH:-}
  if [[ -z "${dir}" ]]; then
    dir=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null) || dir=""
  fi
  if [[ -n "${dir}" && -e "${dir}/libcudnn.so.9" ]]; then
    export LD_LIBRARY_PATH="${dir}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    echo "run_gpu_tests: cuDNN from ${dir} (LD_LIBRARY_PATH)" >&2
  elif ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then
    echo "run_gpu_tests: cuDNN from the loader's path ($(ldconfig -p | sed -nE 's/.*libcudnn\.so\.9 .*=> //p' | head -n 1))" >&2
  else
    echo "run_gpu_tests: note: no libcudnn.so.9 found (set CUDNN_LIBRARY_PATH): binaries that link" \
      "it will not start" >&2
  fi
}
setup_cudnn_path

# The gtest filter of a binary under the sanitizer ("" = every case).
sanitize_filter() {
  local name=$1 override="GPU_SANITIZE_FILTER_$1"
  if [[ -n "${!override:-}" ]]; then
    echo "${!override}"
  elif [[ -n "${GPU_SANITIZE_FILTER:-}" ]]; then
    echo "${GPU_SANITIZE_FILTER}"
  elif [[ "${sanitize}" == memcheck ]]; then
    echo ""
  else
    echo "${GPU_CASES}"
  fi
}

# The errors compute-sanitizer reported in a log ("ERROR SUMMARY: N errors", racecheck's
# "RACECHECK SUMMARY: ... (N errors, M warnings)"), summed; empty when it printed none.
sanitizer_errors() {
  local counts
  # Not "N errors were not printed", which follows the count when some were left out.
  counts=$(sed -nE 's/^========= ERROR SUMMARY: ([0-9]+) errors?$/\1/p' "$1")
  [[ -z "${counts}" ]] &&
    counts=$(sed -nE 's/^========= RACECHECK SUMMARY: .*\(([0-9]+) errors?.*/\1/p' "$1")
  awk '{ sum += $1; found = 1 } END { if (found) print sum }' <<<"${counts}"
}

# racecheck's reports ("Race reported between ... at <kernel>+0x..") split by whose kernel they
# name: "<ours> <vendor>" (a report naming a vendor kernel anywhere counts as the vendor's).
racecheck_hazards_by_owner() {
  local pattern
  pattern=$(IFS='|'; echo "${VENDOR_KERNELS[*]}")
  awk -v vendor="${pattern}" '
    /Race reported between/ { if ($0 ~ vendor) v++; else o++ }
    END { printf "%d %d\n", o, v }' "$1"
}

# memcheck's reports split by whose code they come from: "<ours> <vendor>", vendor being an
# API error ("Program hit cudaError...") whose host backtrace runs through NCCL, cuBLAS or
# cuDNN (NCCL probes its kernel images with cudaFuncGetAttributes at init, and reports
# cudaErrorNoKernelImageForDevice for those built for other GPUs); every other report is ours.
memcheck_reports_by_owner() {
  awk '
    function close_block() { if (in_block) { if (vendor) v++; else o++ } in_block = 0; vendor = 0 }
    /^========= Program hit / { close_block(); in_block = 1; next }
    /^========= [A-Z]/ { close_block(); if ($0 !~ /COMPUTE-SANITIZER|ERROR SUMMARY/) o++; next }
    in_block && /Host Frame:/ && /libnccl\.so|libcublas(Lt)?\.so|libcudnn/ { vendor = 1 }
    END { close_block(); printf "%d %d\n", o, v }' "$1"
}

# The test binaries: executables in this folder (benchmarks and examples live in
# subfolders), or the names given.
tests=()
if ((${#names[@]} > 0)); then
  for name in "${names[@]}"; do tests+=("${HERE}/${name}"); done
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
  log="${LOGS}/${name}${sanitize:+.${sanitize}}.log"
  if [[ ! -x "${path}" ]]; then
    rows+=("$(printf '%-44s %-9s %8s  %s' "${name}" MISSING - "no such binary")")
    failed=$((failed + 1))
    continue
  fi
  # Like Bazel: run from the test's runfiles tree when it has one (data files).
  workdir="${HERE}"
  [[ -d "${path}.runfiles/lossrt" ]] && workdir="${path}.runfiles/lossrt"
  command=("${path}" --gtest_color=no)
  if [[ -n "${sanitize}" ]]; then
    filter=$(sanitize_filter "${name}")
    tool_options=(--tool "${sanitize}" --error-exitcode 1)
    # Every racecheck and memcheck report printed, so that each can be classified (the
    # default prints 100).
    [[ "${sanitize}" =~ ^(racecheck|memcheck)$ ]] && tool_options+=(--print-limit 1000000)
    if [[ "${sanitize}" == synccheck && "${GPU_SANITIZE_VENDOR:-0}" != 1 ]]; then
      for vendor in "${VENDOR_KERNELS[@]}"; do
        tool_options+=(--kernel-name-exclude "kns=${vendor}")
      done
    fi
    command=("${sanitizer}" "${tool_options[@]}" "${command[@]}")
    [[ -n "${filter}" ]] && command+=("--gtest_filter=${filter}")
  fi
  gemm_tuning=${LOSSRT_GEMM_TUNING:-}
  [[ "${sanitize}" =~ ^(racecheck|initcheck)$ && "${name}" != runtime_cuda_gemm_test ]] &&
    gemm_tuning=0
  start=$(date +%s.%N)
  (cd "${workdir}" && TEST_SRCDIR="${path}.runfiles" LOSSRT_GEMM_TUNING="${gemm_tuning}" \
    timeout -k 30 "${TIMEOUT}" "${command[@]}") >"${log}" 2>&1 </dev/null
  rc=$?
  seconds=$(awk -v s="${start}" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  cases_passed=$(gtest_count PASSED "${log}")
  cases_skipped=$(gtest_count SKIPPED "${log}")
  cases_failed=$(gtest_count FAILED "${log}")
  cases="${cases_passed:-0} passed, ${cases_skipped:-0} skipped, ${cases_failed:-0} failed"
  errors=""
  vendor_only=0
  if [[ -n "${sanitize}" ]]; then
    errors=$(sanitizer_errors "${log}")
    cases="${cases}, ${errors:-?} ${sanitize} errors"
    if [[ "${sanitize}" == racecheck && "${GPU_SANITIZE_VENDOR:-0}" != 1 &&
      "${errors:-0}" != 0 ]]; then
      read -r ours vendor < <(racecheck_hazards_by_owner "${log}")
      # Only when the classified reports are all the errors the tool counted.
      if ((ours == 0 && vendor > 0 && vendor == errors)); then
        vendor_only=1
        cases="${cases} (all ${vendor} reports in vendor kernels)"
      fi
    elif [[ "${sanitize}" == memcheck && "${GPU_SANITIZE_VENDOR:-0}" != 1 &&
      "${errors:-0}" != 0 ]]; then
      read -r ours vendor < <(memcheck_reports_by_owner "${log}")
      if ((ours == 0 && vendor > 0 && vendor == errors)); then
        vendor_only=1
        cases="${cases} (all ${vendor} reports API errors inside NCCL, cuBLAS or cuDNN)"
      fi
    fi
  fi
  if ((rc != 0)) && [[ -n "${sanitize}" && -z "${cases_failed}" ]] &&
    grep -q 'Target application terminated before first instrumented API call' "${log}" &&
    grep -q '^\[  PASSED  \]' "${log}"; then
    # A host-only binary: its cases passed and it made no CUDA call, so the tool had
    # nothing to check (compute-sanitizer exits non-zero for that).
    rc=0
    cases="${cases} (no CUDA calls)"
  fi
  if ((rc == 0)) || { ((rc == 1 && vendor_only == 1)) &&
    [[ -z "${cases_failed}" ]] && grep -q '^\[  PASSED  \]' "${log}"; }; then
    status=PASSED
  elif [[ -n "${sanitize}" && "${errors:-0}" != 0 && -z "${cases_failed}" ]] &&
    ((rc == 1)); then
    status=SANITIZER
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
  # Each result as it comes, so that a run cut short still shows what finished.
  echo "run_gpu_tests: ${rows[-1]}" >&2
  if [[ "${status}" == PASSED ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("${name}")
  fi
done

for name in "${failures[@]}"; do
  log="${LOGS}/${name}${sanitize:+.${sanitize}}.log"
  echo "===== ${name} (log: ${log})"
  reported=0
  if [[ -n "${sanitize}" && "$(sanitizer_errors "${log}")" =~ ^[1-9] ]]; then
    # The tool's first reports (each starts with "========= <kind> ..."), then its summary.
    grep '^=========' "${log}" | grep -v 'ERROR SUMMARY\|RACECHECK SUMMARY' | head -n 40
    grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "${log}" | tail -n 2
    reported=1
  fi
  if grep -qE '^\[  FAILED  \] [0-9]+ tests?, listed below' "${log}"; then
    # The failed cases, without GoogleTest's dump of their parameters.
    sed -nE '/^\[  FAILED  \] [0-9]+ tests?, listed below/,$ s/^\[  FAILED  \] ([^ ,]+).*/  \1/p' \
      "${log}" | grep -v '^  [0-9]' | head -n 40
  elif ((reported == 0)); then
    tail -n 30 "${log}"  # crashed or timed out: where it stopped
  fi
done
echo
printf '%-44s %-9s %8s  %s\n' "test binary" status time "test cases"
printf '%s\n' "${rows[@]}"
echo
echo "${passed} passed, ${failed} failed"
((failed == 0))
