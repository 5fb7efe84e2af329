#!/usr/bin/env bash
# Runs the compute-sanitizer cells of a plan (default: sanitizer_plan.txt next to this
# script; tools/stage_gpu.sh stages both into gpu_stage/), one at a time, as
# bench/RESULTS.md's coverage table asks: a test binary through run_gpu_tests.sh
# --sanitize=<tool> with the line's gtest filter, a program (a path with a slash, e.g.
# bench/train_step) under compute-sanitizer with the line's arguments. Prints one line a
# cell and a last line `N clean, M not`; exits 1 when any cell is not clean.
#
#   gpu_stage/run_sanitizer_plan.sh                    # every cell
#   gpu_stage/run_sanitizer_plan.sh --only=initcheck   # cells whose line matches a regex
#   gpu_stage/run_sanitizer_plan.sh --dry-run          # the commands, not run
#
# Plan lines: `<tool> <binary> <filter, or - for run_gpu_tests.sh's default>` or
# `<tool> <dir/program> <arguments...>`; '#' starts a comment. Logs go to
# GPU_TEST_LOGS (default logs/ next to this script), one folder a cell. Environment as for
# run_gpu_tests.sh (GPU_TEST_TIMEOUT, COMPUTE_SANITIZER, LOSSRT_TEST_SEED).
set -uo pipefail

readonly HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
plan="${HERE}/sanitizer_plan.txt"
only=""
dry_run=0
for arg in "$@"; do
  case "${arg}" in
    --only=*) only=${arg#--only=} ;;
    --dry-run) dry_run=1 ;;
    --plan=*) plan=${arg#--plan=} ;;
    *)
      echo "run_sanitizer_plan: unknown argument ${arg} (--only=<regex>, --dry-run, --plan=<file>)" >&2
      exit 2
      ;;
  esac
done
if [[ ! -f "${plan}" ]]; then
  echo "run_sanitizer_plan: no plan at ${plan}" >&2
  exit 2
fi
readonly LOGS=${GPU_TEST_LOGS:-${HERE}/logs}
# The NCCL binaries and the programs that link cuDNN: the lib/ folders of the Python
# packages nvidia-nccl and nvidia-cudnn (PyTorch's) first on LD_LIBRARY_PATH, when installed.
for package in nccl cudnn; do
  dir=$(python3 -c "import nvidia.${package}, os; print(os.path.join(list(nvidia.${package}.__path__)[0], 'lib'))" 2>/dev/null) || dir=""
  [[ -n "${dir}" && -d "${dir}" ]] && export LD_LIBRARY_PATH="${dir}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
done
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

clean=0
not_clean=0
cell=0
while read -r tool target rest; do
  [[ -z "${tool}" || "${tool}" == \#* ]] && continue
  [[ -n "${only}" && ! "${tool} ${target} ${rest}" =~ ${only} ]] && continue
  case "${tool}" in
    memcheck | racecheck | initcheck | synccheck) ;;
    *)
      echo "run_sanitizer_plan: ${plan}: bad tool '${tool}'" >&2
      exit 2
      ;;
  esac
  cell=$((cell + 1))
  logs="${LOGS}/cell$(printf '%02d' "${cell}")_${tool}_$(basename "${target}")"
  if [[ "${target}" == */* ]]; then
    # A program: the tool on it directly; its own exit status and the tool's count.
    read -r -a args <<<"${rest}"
    tool_options=(--tool "${tool}" --error-exitcode 1)
    # As run_gpu_tests.sh does (its VENDOR_KERNELS): synccheck leaves the vendor kernels,
    # whose mbarrier synchronization it does not follow, uninstrumented.
    if [[ "${tool}" == synccheck && "${GPU_SANITIZE_VENDOR:-0}" != 1 ]]; then
      for vendor in nvjet cudnn xmma cutlass; do
        tool_options+=(--kernel-name-exclude "kns=${vendor}")
      done
    fi
    command=("${sanitizer}" "${tool_options[@]}" "${HERE}/${target}" "${args[@]}")
    if ((dry_run)); then
      echo "cell ${cell}: ${command[*]}"
      continue
    fi
    mkdir -p "${logs}"
    start=$(date +%s)
    (cd "${HERE}" && LOSSRT_GEMM_TUNING=0 timeout -k 30 "${GPU_TEST_TIMEOUT:-3600}" \
      "${command[@]}") >"${logs}/run.log" 2>&1 </dev/null
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY' "${logs}/run.log" | tail -n 1)
    result="rc ${rc}, ${summary:-no ERROR SUMMARY}, $(($(date +%s) - start)) s"
  else
    filter=${rest}
    [[ "${filter}" == - ]] && filter=""
    if ((dry_run)); then
      echo "cell ${cell}: GPU_SANITIZE_FILTER_${target}='${filter}' ${HERE}/run_gpu_tests.sh --sanitize=${tool} ${target}"
      continue
    fi
    mkdir -p "${logs}"
    env "GPU_SANITIZE_FILTER_${target}=${filter}" GPU_TEST_LOGS="${logs}" \
      "${HERE}/run_gpu_tests.sh" "--sanitize=${tool}" "${target}" >"${logs}/table.txt" 2>&1
    rc=$?
    result="rc ${rc}, $(grep -E "^${target} " "${logs}/table.txt" | tail -n 1 | tr -s ' ')"
  fi
  if ((rc == 0)); then clean=$((clean + 1)); else not_clean=$((not_clean + 1)); fi
  echo "cell ${cell}: ${tool} ${target} ${rest}: ${result}"
done <"${plan}"
((dry_run)) && exit 0
echo "${clean} clean, ${not_clean} not"
((not_clean == 0))
