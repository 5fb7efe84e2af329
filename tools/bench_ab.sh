#!/usr/bin/env bash
# Same-run A/B of the loss benchmarks on the GPU machine: two staged builds' bench/
# binaries (e.g. gpu_stage/bench of an old commit and of the new one, each folder holding
# cross_entropy and linear_cross_entropy) run alternately on the idle GPU, A then B, then
# B then A, so that a drift of the machine shows as a difference between the rounds. Writes
# every table to the output file, each run headed by "=== <dir> <binary> <flags> (<time>)"
# (and followed by "=== rc N" where it failed).
#
#   tools/bench_ab.sh A_DIR B_DIR OUT_FILE            # the default rounds below
#   AB_ROUNDS=1 tools/bench_ab.sh A_DIR B_DIR OUT     # one round (A then B) of each
#
# Rounds: the plain cross-entropy at vocab 8192, 32768, 50257 (rows not 16-byte aligned in
# 16-bit) and 131072, f32 and bf16; the same at 32768, 50257 and 131072 with all four extras
# and with label smoothing; the linear cross-entropy at two shapes and budgets. Compare
# figures within one round only.
set -u
if (($# != 3)); then
  echo "usage: tools/bench_ab.sh A_DIR B_DIR OUT_FILE" >&2
  exit 2
fi
readonly A=$1 B=$2 OUT_FILE=$3
readonly ROUNDS=${AB_ROUNDS:-2}
for dir in "${A}" "${B}"; do
  for bin in cross_entropy linear_cross_entropy; do
    [[ -x "${dir}/${bin}" ]] || { echo "bench_ab: ${dir}/${bin} is missing" >&2; exit 2; }
  done
done
: >"${OUT_FILE}"
{ nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv || true; } >>"${OUT_FILE}" 2>&1

run() {  # run <dir> <binary> <flags...>
  local dir=$1 bin=$2
  shift 2
  echo "=== ${dir} ${bin} $* ($(date +%T))" >>"${OUT_FILE}"
  "${dir}/${bin}" "$@" >>"${OUT_FILE}" 2>&1 || echo "=== rc $?" >>"${OUT_FILE}"
}
both() {  # both <round> <binary> <flags...>: A then B in odd rounds, B then A in even
  local round=$1
  shift
  if ((round % 2 == 1)); then run "${A}" "$@"; run "${B}" "$@"; else run "${B}" "$@"; run "${A}" "$@"; fi
}

readonly CE_COMMON=(--tokens=16384 --dtypes=f32,bf16 --repeats=20)
for ((round = 1; round <= ROUNDS; ++round)); do
  both "${round}" cross_entropy "${CE_COMMON[@]}" --vocabs=8192,32768,50257,131072
  both "${round}" cross_entropy "${CE_COMMON[@]}" --vocabs=32768,50257,131072 \
    --extras=predicted,accuracy,entropy,logprob
  both "${round}" cross_entropy "${CE_COMMON[@]}" --vocabs=32768,50257,131072 --label_smoothing=0.1
  both "${round}" linear_cross_entropy --shapes=16384x768x50304,4096x4096x128256 --budgets_mib=256,1024
done
echo "=== end $(date +%T)" >>"${OUT_FILE}"
