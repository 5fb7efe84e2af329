#!/usr/bin/env bash
# Runs the compute-sanitizer cells of a plan (default: sanitizer_plan.txt next to this
# script; tools/stage_gpu.sh stages both into gpu_stage/), as bench/RESULTS.md's coverage
# table records them: a test binary through run_gpu_tests.sh --sanitize=<tool> with the
# line's gtest filter, split into gtest shards (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX) when
# the line asks; a program (a path with a slash, e.g. bench/train_step) under
# compute-sanitizer with the line's arguments. Prints one line a shard as it ends, one line a
# cell, and a last line `N clean, M not`; exits 1 when any cell is not clean.
#
#   gpu_stage/run_sanitizer_plan.sh                    # every cell, one process at a time
#   gpu_stage/run_sanitizer_plan.sh --jobs=14          # up to 14 processes at once
#   gpu_stage/run_sanitizer_plan.sh --only=initcheck   # cells whose line matches a regex
#   gpu_stage/run_sanitizer_plan.sh --dry-run          # the commands, not run
#
# Plan lines: `<tool>[/<shards>] <binary> <filter, or - for run_gpu_tests.sh's default>` or
# `<tool> <dir/program> <arguments...>`; '#' starts a comment. Logs go to GPU_TEST_LOGS
# (default logs/ next to this script), one folder a shard. Environment as for
# run_gpu_tests.sh (GPU_TEST_TIMEOUT, COMPUTE_SANITIZER, LOSSRT_TEST_SEED).
#
# --jobs: the shards of memcheck, racecheck and synccheck ran clean 14 at once on the H200.
# initcheck in several processes at once reports, now and then, reads of bytes that a copy
# or kernel earlier on the same stream wrote (each time in another case and place; the same
# shard and seed alone is clean): rerun a shard that reports so alone, with the
# LOSSRT_TEST_SEED its log names, before reading its reports as ours.
set -uo pipefail

readonly HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
plan="${HERE}/sanitizer_plan.txt"
only=""
dry_run=0
jobs=1
for arg in "$@"; do
  case "${arg}" in
    --only=*) only=${arg#--only=} ;;
    --dry-run) dry_run=1 ;;
    --plan=*) plan=${arg#--plan=} ;;
    --jobs=*) jobs=${arg#--jobs=} ;;
    *)
      echo "run_sanitizer_plan: unknown argument ${arg} (--only=<regex>, --jobs=<n>, --dry-run, --plan=<file>)" >&2
      exit 2
      ;;
  esac
done
if [[ ! -f "${plan}" ]]; then
  echo "run_sanitizer_plan: no plan at ${plan}" >&2
  exit 2
fi
if [[ ! "${jobs}" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_sanitizer_plan: --jobs=${jobs}: expected a positive count" >&2
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

# One shard: runs it, writes "<rc>|<result>" to <logs>/result.
run_shard() {  # <tool> <target> <shards> <index> <logs> <rest>
  local tool=$1 target=$2 shards=$3 index=$4 logs=$5 rest=$6 rc result start
  mkdir -p "${logs}"
  start=$(date +%s)
  if [[ "${target}" == */* ]]; then
    # A program: the tool on it directly; its own exit status and the tool's count.
    local args tool_options=(--tool "${tool}" --error-exitcode 1)
    read -r -a args <<<"${rest}"
    # As run_gpu_tests.sh does (its VENDOR_KERNELS): synccheck leaves the vendor kernels,
    # whose mbarrier synchronization it does not follow, uninstrumented.
    if [[ "${tool}" == synccheck && "${GPU_SANITIZE_VENDOR:-0}" != 1 ]]; then
      for vendor in nvjet cudnn xmma cutlass; do
        tool_options+=(--kernel-name-exclude "kns=${vendor}")
      done
    fi
    (cd "${HERE}" && LOSSRT_GEMM_TUNING=0 timeout -k 30 "${GPU_TEST_TIMEOUT:-3600}" \
      "${sanitizer}" "${tool_options[@]}" "${HERE}/${target}" "${args[@]}") \
      >"${logs}/run.log" 2>&1 </dev/null
    rc=$?
    local summary
    summary=$(grep -E 'ERROR SUMMARY' "${logs}/run.log" | tail -n 1)
    result="rc ${rc}, ${summary:-no ERROR SUMMARY}, $(($(date +%s) - start)) s"
  else
    local filter=${rest}
    [[ "${filter}" == - ]] && filter=""
    env "GPU_SANITIZE_FILTER_${target}=${filter}" GPU_TEST_LOGS="${logs}" \
      GTEST_TOTAL_SHARDS="${shards}" GTEST_SHARD_INDEX="${index}" \
      "${HERE}/run_gpu_tests.sh" "--sanitize=${tool}" "${target}" >"${logs}/table.txt" 2>&1
    rc=$?
    result=$(grep -E "^${target} " "${logs}/table.txt" | tail -n 1 | tr -s ' ')
  fi
  echo "${rc}|${result}" >"${logs}/result"
  echo "  shard $((index + 1))/${shards} of ${tool} ${target}: rc ${rc}, ${result}"
}

# The plan's cells, expanded into shards.
cells=()  # "<tool> <target> <shards> <rest>"
while read -r spec target rest; do
  [[ -z "${spec}" || "${spec}" == \#* ]] && continue
  [[ -n "${only}" && ! "${spec} ${target} ${rest}" =~ ${only} ]] && continue
  tool=${spec%%/*}
  shards=1
  [[ "${spec}" == */* ]] && shards=${spec#*/}
  case "${tool}" in
    memcheck | racecheck | initcheck | synccheck) ;;
    *)
      echo "run_sanitizer_plan: ${plan}: bad tool '${tool}'" >&2
      exit 2
      ;;
  esac
  if [[ ! "${shards}" =~ ^[1-9][0-9]*$ || ("${target}" == */* && "${shards}" != 1) ]]; then
    echo "run_sanitizer_plan: ${plan}: bad shard count in '${spec}' (programs take none)" >&2
    exit 2
  fi
  cells+=("${tool} ${target} ${shards} ${rest}")
done <"${plan}"

cell_logs() {  # <cell number> <tool> <target> <index>
  printf '%s/cell%02d_%s_%s_shard%02d' "${LOGS}" "$1" "$2" "$(basename "$3")" "$4"
}

running=0
for c in "${!cells[@]}"; do
  read -r tool target shards rest <<<"${cells[c]}"
  for ((index = 0; index < shards; index++)); do
    if ((dry_run)); then
      if [[ "${target}" == */* ]]; then
        echo "cell $((c + 1)): ${sanitizer} --tool ${tool} ${HERE}/${target} ${rest}"
      else
        echo "cell $((c + 1)) shard $((index + 1))/${shards}: GTEST_TOTAL_SHARDS=${shards} GTEST_SHARD_INDEX=${index} GPU_SANITIZE_FILTER_${target}='${rest}' ${HERE}/run_gpu_tests.sh --sanitize=${tool} ${target}"
      fi
      continue
    fi
    if ((running >= jobs)); then
      wait -n
      running=$((running - 1))
    fi
    run_shard "${tool}" "${target}" "${shards}" "${index}" \
      "$(cell_logs $((c + 1)) "${tool}" "${target}" "${index}")" "${rest}" &
    running=$((running + 1))
  done
done
((dry_run)) && exit 0
wait

clean=0
not_clean=0
for c in "${!cells[@]}"; do
  read -r tool target shards rest <<<"${cells[c]}"
  bad=""
  for ((index = 0; index < shards; index++)); do
    line=$(cat "$(cell_logs $((c + 1)) "${tool}" "${target}" "${index}")/result" 2>/dev/null ||
      echo "1|no result")
    ((${line%%|*} != 0)) && bad+="${bad:+; }shard $((index + 1)): ${line#*|}"
  done
  if [[ -z "${bad}" ]]; then
    clean=$((clean + 1))
    echo "cell $((c + 1)): ${tool} ${target} ${rest}: clean (${shards} shard(s))"
  else
    not_clean=$((not_clean + 1))
    echo "cell $((c + 1)): ${tool} ${target} ${rest}: NOT clean (${bad})"
  fi
done
echo "${clean} clean, ${not_clean} not"
((not_clean == 0))
