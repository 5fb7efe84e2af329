#!/usr/bin/env bash
# run_fuzzers.sh: builds the fuzz targets of fuzz/ with clang++ and
# -fsanitize=fuzzer,address,undefined (outside Bazel, against Debian's Abseil static archives)
# and runs each one with libFuzzer for a while on a copy of its seed corpus (fuzz/corpus/NAME).
# Fails when any target has a finding (a crash, a sanitizer report, a broken FUZZ_CHECK, a
# timeout or running out of memory); the input that caused it is kept and named at the end.
#
#   tools/run_fuzzers.sh                 # every target, 600 s each, one after the other
#   tools/run_fuzzers.sh 60 safetensors  # one target, 60 s
#   FUZZ_PARALLEL=2 nice -n 19 tools/run_fuzzers.sh 600   # two targets at a time, niced
#
# Targets: safetensors, token_shard, tokenizer_file, bpe_train (fuzz/NAME_fuzzer.cc).
# Environment: FUZZ_PARALLEL (targets run at once, default 1), FUZZ_OUT (the folder for the
# binaries, the grown corpora, the logs and the findings; default a new folder under /tmp),
# CXX (default clang++-14, then clang++).
# Needs clang with libFuzzer: on Debian 12, `apt-get install clang-14 libclang-rt-14-dev`
# (the check below says so when the fuzzer runtime is missing), Abseil (libabsl-dev) and
# pkg-config. A finding reproduces without libFuzzer as well:
#   bazel build //fuzz:NAME_fuzzer && bazel-bin/fuzz/NAME_fuzzer FINDING_FILE
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
readonly SECONDS_PER_TARGET="${1:-600}"
shift || true
readonly ALL_TARGETS=(safetensors token_shard tokenizer_file bpe_train)
TARGETS=("$@")
((${#TARGETS[@]} > 0)) || TARGETS=("${ALL_TARGETS[@]}")
readonly PARALLEL="${FUZZ_PARALLEL:-1}"

say() { echo "run_fuzzers: $*" >&2; }
die() {
  say "$*"
  exit 1
}

[[ "${SECONDS_PER_TARGET}" =~ ^[1-9][0-9]*$ ]] ||
  die "seconds_per_target must be a positive integer, got '${SECONDS_PER_TARGET}'"
[[ "${PARALLEL}" =~ ^[1-9][0-9]*$ ]] || die "FUZZ_PARALLEL must be a positive integer"

# The library sources each target links (besides fuzz/NAME_fuzzer.cc and fuzz/fuzz_util.cc),
# and libFuzzer's largest input for it.
sources_of() {
  case "$1" in
    safetensors) echo runtime/safetensors.cc runtime/json_parser.cc runtime/dtype.cc ;;
    token_shard) echo data/shards.cc data/file_util.cc ;;
    tokenizer_file | bpe_train)
      echo data/tokenizer.cc data/tokenizer_file.cc data/bpe_tokenizer.cc \
        data/pretokenizer.cc data/file_util.cc
      ;;
    *) return 1 ;;
  esac
}
max_len_of() {
  case "$1" in
    token_shard) echo 4096 ;;  # the 1024-byte header and up to 1536 tokens
    bpe_train) echo 4096 ;;    # training is the slow part
    *) echo 8192 ;;
  esac
}

for target in "${TARGETS[@]}"; do
  sources_of "${target}" >/dev/null ||
    die "unknown target '${target}' (known: ${ALL_TARGETS[*]})"
done

# ---- Tools ----

CXX="${CXX:-}"
if [[ -z "${CXX}" ]]; then
  for candidate in clang++-14 clang++; do
    if command -v "${candidate}" >/dev/null 2>&1; then
      CXX="${candidate}"
      break
    fi
  done
fi
[[ -n "${CXX}" ]] || die "no clang++ found: install clang (Debian: apt-get install clang-14" \
  "libclang-rt-14-dev), or set CXX"
command -v pkg-config >/dev/null 2>&1 || die "pkg-config not found (apt-get install pkg-config)"
pkg-config --exists absl_statusor ||
  die "Abseil's pkg-config files not found (apt-get install libabsl-dev)"

OUT="${FUZZ_OUT:-}"
if [[ -z "${OUT}" ]]; then OUT="$(mktemp -d /tmp/lossrt_fuzz.XXXXXX)"; fi
mkdir -p "${OUT}/bin" "${OUT}/corpus" "${OUT}/findings" "${OUT}/logs" "${OUT}/tmp"

# shellcheck disable=SC2054  # the commas belong to one flag
readonly SANITIZE=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
readonly CXXFLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I"${ROOT}")

# libFuzzer ships in libclang-rt-14-dev on Debian; a clang without it fails to link here.
probe="${OUT}/tmp/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' \
  >"${probe}"
if ! "${CXX}" "${SANITIZE[@]}" "${probe}" -o "${OUT}/tmp/probe" 2>"${OUT}/tmp/probe.log"; then
  cat "${OUT}/tmp/probe.log" >&2
  die "${CXX} cannot link -fsanitize=fuzzer,address,undefined: the sanitizer and libFuzzer" \
    "runtimes are missing. On Debian 12: apt-get install libclang-rt-14-dev"
fi

# Abseil from Debian's static archives (-labsl_x becomes -l:libabsl_x.a): the binaries do not
# depend on Abseil's shared libraries.
ABSL_LIBS=()
for flag in $(pkg-config --libs absl_statusor absl_status absl_str_format absl_strings \
  absl_flat_hash_map absl_flat_hash_set absl_hash absl_raw_hash_set); do
  if [[ "${flag}" == -labsl_* ]]; then
    ABSL_LIBS+=("-l:lib${flag#-l}.a")
  else
    ABSL_LIBS+=("${flag}")
  fi
done

# ---- Build ----

build() {
  local target="$1"
  local -a sources
  read -r -a sources <<<"$(sources_of "${target}")"
  say "building ${target} with ${CXX}"
  (cd "${ROOT}" && "${CXX}" "${CXXFLAGS[@]}" "${SANITIZE[@]}" \
    "fuzz/${target}_fuzzer.cc" fuzz/fuzz_util.cc "${sources[@]}" \
    -o "${OUT}/bin/${target}_fuzzer" -Wl,--start-group "${ABSL_LIBS[@]}" -Wl,--end-group \
    -pthread) >"${OUT}/logs/${target}.build.log" 2>&1 || {
    cat "${OUT}/logs/${target}.build.log" >&2
    die "building ${target} failed"
  }
}

for target in "${TARGETS[@]}"; do build "${target}"; done

# ---- Runs ----

# One target's run; its log is ${OUT}/logs/NAME.log, its result ${OUT}/logs/NAME.result
# ("seconds execs result").
run() {
  local target="$1"
  local corpus="${OUT}/corpus/${target}"
  local log="${OUT}/logs/${target}.log"
  mkdir -p "${corpus}" "${OUT}/tmp/${target}"
  cp -n "${ROOT}/fuzz/corpus/${target}/"* "${corpus}/"
  local -a dict=()
  if [[ -f "${ROOT}/fuzz/${target}.dict" ]]; then dict=("-dict=${ROOT}/fuzz/${target}.dict"); fi
  local start status=0
  start=$(date +%s)
  # TMPDIR: the scratch files of the targets that read files (fuzz/fuzz_util.h).
  TMPDIR="${OUT}/tmp/${target}" \
    ASAN_OPTIONS="abort_on_error=0:detect_leaks=1:${ASAN_OPTIONS:-}" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
    "${OUT}/bin/${target}_fuzzer" "${dict[@]}" \
    -max_total_time="${SECONDS_PER_TARGET}" -timeout=60 -rss_limit_mb=2048 \
    -max_len="$(max_len_of "${target}")" -use_value_profile=1 -print_final_stats=1 \
    -artifact_prefix="${OUT}/findings/${target}-" \
    "${corpus}" >"${log}" 2>&1 || status=$?
  local elapsed=$(($(date +%s) - start))
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "${log}" | tail -1)
  local result="ok"
  if ((status != 0)); then result="FINDING(exit ${status})"; fi
  echo "${elapsed} ${execs:-?} ${result}" >"${OUT}/logs/${target}.result"
  say "${target}: ${elapsed} s, ${execs:-?} executions, ${result}"
}

say "running ${TARGETS[*]} for ${SECONDS_PER_TARGET} s each, ${PARALLEL} at a time; out: ${OUT}"
running=0
for target in "${TARGETS[@]}"; do
  if ((running >= PARALLEL)); then
    wait -n || true
    running=$((running - 1))
  fi
  run "${target}" &
  running=$((running + 1))
done
wait

# ---- Summary ----

failed=0
printf '%-16s %8s %12s  %s\n' target seconds execs result
for target in "${TARGETS[@]}"; do
  read -r elapsed execs result <"${OUT}/logs/${target}.result"
  printf '%-16s %8s %12s  %s\n' "${target}" "${elapsed}" "${execs}" "${result}"
  if [[ "${result}" != ok ]]; then
    failed=1
    say "${target}: see ${OUT}/logs/${target}.log"
  fi
done
if compgen -G "${OUT}/findings/*" >/dev/null; then
  say "findings (reproduce with bazel-bin/fuzz/NAME_fuzzer FILE):"
  ls -1 "${OUT}/findings/"* >&2
  failed=1
fi
say "grown corpora in ${OUT}/corpus"
exit "${failed}"
