#!/usr/bin/env bash
# Stages the GPU binaries for a machine without Bazel or Debian's libraries: builds every
# test under //tests and every binary under //bench and //examples with -c opt, and copies
# them, with tools/run_gpu_tests.sh, into gpu_stage/ (git-ignored):
#
#   gpu_stage/<pkg>_<name>            tests, named after their targets: //tests/runtime:random_test
#                                     is runtime_random_test
#   gpu_stage/bench/<name>            benchmarks (//bench:cross_entropy is bench/cross_entropy)
#   gpu_stage/examples/<name>         examples
#   gpu_stage/data/fortunes/          the default corpus of examples/train_lm (the files of
#                                     Debian's /usr/share/games/fortunes, which the GPU machine
#                                     lacks; train_lm looks for data/fortunes above its binary)
#   gpu_stage/data/gpu_corpus/        train_lm's GPU default corpus, from tools/make_gpu_corpus.sh
#                                     (fortunes, package docs and manual pages, about 55 MB),
#                                     built once into GPU_CORPUS_CACHE (default
#                                     ~/.cache/lossrt/gpu_corpus) and copied from there
#   gpu_stage/run_gpu_tests.sh        runs every test next to it: gpu_stage/run_gpu_tests.sh
#   gpu_stage/bench_ab.sh             same-run A/B of two staged builds' loss benchmarks
#   gpu_stage/MANIFEST                label, file, libraries and glibc version of each binary
#
# Each binary is checked with ldd: only libc, libm, libdl, libpthread, librt, libcublas*,
# libnccl (the NCCL binaries only), libcudnn* (binaries with the attention op, when cuDNN was
# found at build time) and the dynamic loader may be linked (Abseil, GoogleTest and libstdc++ are static, cudart
# is static, cuBLAS comes from the CUDA install). Anything else is reported and the script
# exits 1 after staging. Extra arguments go to `bazel build`, e.g.
#
#   tools/stage_gpu.sh --//tools:cuda_archs=sm_90a
#
# GPU_STAGE_DIR=out/my_stage stages elsewhere (gpu_stage/ is shared by everyone in this
# checkout). Note that -c opt builds with other flags write the same bazel-out/k8-opt files,
# so two people staging at once in one checkout can copy each other's binaries.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
readonly STAGE=${GPU_STAGE_DIR:-gpu_stage}  # relative to the repository root
readonly BAZEL=${BAZEL:-./bazelw}
# -lineinfo: compute-sanitizer and ncu run on the staged binaries and report source lines.
readonly BUILD_FLAGS=(-c opt --//tools:cuda_lineinfo=true "$@")
# Libraries a staged binary may load: the C library family, the loader, cuBLAS, NCCL and cuDNN.
# libnccl (only binaries that use //runtime:nccl_communicator, e.g. runtime_nccl_communicator_test):
# the GPU machine's PyTorch ships libnccl.so.2, and the test needs LD_LIBRARY_PATH pointing at
# it there: the lib/ folder of
#   python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
# libcudnn.so.9 (every binary with //graph/ops:attention, i.e. the graph, its tests, the
# benchmarks and examples, when cuDNN and its frontend were found at build time; it loads its
# engine libraries, libcudnn_*.so.9, from its own folder when first used): the GPU machine's
# PyTorch ships cuDNN 9, found through LD_LIBRARY_PATH there (run_gpu_tests.sh sets it up):
#   python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))"
readonly ALLOWED_LIBS='^(linux-vdso\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcublas(Lt)?\.so|libnccl\.so|libcudnn(_[a-z_]+)?\.so|ld-linux[-a-z0-9_]*\.so)'

say() { echo "stage_gpu: $*" >&2; }

# Copies the default corpus of train_lm into ${STAGE}/data/fortunes: the regular files only
# (Debian's <name>.u8 are symlinks, which the corpus reader skips anyway; the <name>.dat
# indexes come along, as they mark the fortune files). Not installed here: a note, no error.
stage_corpus() {
  local source=/usr/share/games/fortunes dest="${STAGE}/data/fortunes" dest_abs
  if [[ ! -d "${source}" ]]; then
    say "note: ${source} is not installed (apt-get install fortunes-min): train_lm there needs --data"
    return 0
  fi
  if ! mkdir -p "${dest}" || ! dest_abs=$(cd "${dest}" && pwd) ||
    ! (cd "${source}" && find . -type f -print0 | xargs -0 -r cp --parents -t "${dest_abs}"); then
    say "copying ${source} to ${dest} failed"
    return 1
  fi
  say "staged train_lm's default corpus, ${source}, in ${dest}/ ($(du -sh "${dest}" | cut -f1))"
}

# Copies the GPU default corpus of train_lm into ${STAGE}/data/gpu_corpus, building it into
# the cache first when the cache is empty (a few minutes). A failure is a note: train_lm on
# the GPU then falls back to the fortunes and says so.
stage_gpu_corpus() {
  local cache=${GPU_CORPUS_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/lossrt/gpu_corpus}
  if [[ ! -f "${cache}/.complete" ]]; then
    say "building the GPU corpus into ${cache} (once; tools/make_gpu_corpus.sh)"
    rm -rf "${cache}"
    if ! tools/make_gpu_corpus.sh "${cache}" || ! touch "${cache}/.complete"; then
      say "note: building the GPU corpus failed: train_lm on the GPU will use the fortunes"
      return 0
    fi
  fi
  mkdir -p "${STAGE}/data" && cp -r "${cache}" "${STAGE}/data/gpu_corpus" &&
    rm -f "${STAGE}/data/gpu_corpus/.complete" ||
    { say "copying ${cache} to ${STAGE}/data/gpu_corpus failed"; return 1; }
  say "staged train_lm's GPU corpus in ${STAGE}/data/gpu_corpus/ ($(du -sh "${STAGE}/data/gpu_corpus" | cut -f1))"
}

# Labels of one kind under some patterns; a pattern with no packages yields nothing.
query_labels() {
  local kind=$1 pattern
  shift
  for pattern in "$@"; do
    "${BAZEL}" query --keep_going "kind(${kind}, ${pattern})" 2>/dev/null | grep '^//' || true
  done
}

# gpu_stage/ path of a label: //tests/runtime:random_test -> runtime_random_test,
# //bench:cross_entropy -> bench/cross_entropy.
stage_name() {
  local label=${1#//} package name
  package=${label%%:*}
  name=${label#*:}
  case "${package}" in
    tests) echo "${name}" ;;
    tests/*) echo "${package#tests/}_${name}" | tr '/' '_' ;;
    bench | examples) echo "${package}/${name}" ;;
    bench/* | examples/*) echo "${package%%/*}/$(echo "${package#*/}" | tr '/' '_')_${name}" ;;
    *) echo "${package}_${name}" | tr '/' '_' ;;
  esac
}

# Prints the problems of a staged binary's libraries; nothing when it is clean.
check_libraries() {
  local binary=$1 needed lib
  needed=$(readelf -d "${binary}" 2>/dev/null | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
  for lib in ${needed}; do
    [[ "${lib}" =~ ${ALLOWED_LIBS} ]] || echo "links ${lib}"
  done
  # ldd shows the whole closure; what only cuBLAS brings (libgcc_s) comes with CUDA.
  while read -r lib _; do
    [[ -z "${lib}" || "${lib}" =~ ${ALLOWED_LIBS} || "${lib}" == /* ]] && continue
    if grep -qxF "${lib}" <<<"${needed}"; then continue; fi
    echo "note: ${lib} (through cuBLAS, part of the CUDA install)"
  done < <(ldd "${binary}" 2>/dev/null | sed -nE 's/^\s*(\S+)( =>.*)?$/\1/p')
  ldd "${binary}" 2>/dev/null | grep -q 'not found' && echo "unresolved: $(ldd "${binary}" | grep 'not found' | tr -s ' \t' ' ')"
  return 0
}

main() {
  local -a tests binaries labels
  mapfile -t tests < <(query_labels cc_test //tests/...)
  mapfile -t binaries < <(query_labels cc_binary //bench/... //examples/...)
  labels=("${tests[@]}" "${binaries[@]}")
  say "${#tests[@]} tests, ${#binaries[@]} benchmark/example binaries"

  rm -rf "${STAGE}"
  mkdir -p "${STAGE}"
  cp tools/run_gpu_tests.sh "${STAGE}/run_gpu_tests.sh"
  chmod 755 "${STAGE}/run_gpu_tests.sh"
  cp tools/run_sanitizer_plan.sh tools/sanitizer_plan.txt tools/bench_ab.sh "${STAGE}/"
  chmod 755 "${STAGE}/run_sanitizer_plan.sh" "${STAGE}/bench_ab.sh"
  local corpus_rc=0
  stage_corpus || corpus_rc=1
  stage_gpu_corpus || corpus_rc=1
  {
    echo "# Staged by tools/stage_gpu.sh at $(date -u +%FT%TZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "# bazel build ${BUILD_FLAGS[*]}"
    echo "# file | label | max GLIBC | libraries"
  } >"${STAGE}/MANIFEST"
  if ((${#labels[@]} == 0)); then
    say "nothing to stage; ${STAGE}/ holds only run_gpu_tests.sh"
    return 0
  fi

  local build_rc=0
  "${BAZEL}" build --keep_going "${BUILD_FLAGS[@]}" -- "${labels[@]}" || build_rc=$?
  local bin_dir
  bin_dir=$("${BAZEL}" info "${BUILD_FLAGS[@]}" bazel-bin 2>/dev/null) || {
    say "bazel info bazel-bin failed"
    return 1
  }

  local -i staged=0 missing=0 bad=0
  local label name package target source problems glibc runfiles extra notes=""
  for label in "${labels[@]}"; do
    name=$(stage_name "${label}")
    package=${label#//}
    package=${package%%:*}
    target=${label#*:}
    source="${bin_dir}/${package}/${target}"
    if [[ ! -x "${source}" ]]; then
      say "MISSING ${label}: not built (${source})"
      missing+=1
      continue
    fi
    mkdir -p "$(dirname "${STAGE}/${name}")"
    cp -f "${source}" "${STAGE}/${name}"
    chmod 755 "${STAGE}/${name}"
    # Files the target reads at run time (data = [...]) besides the binary itself.
    runfiles="${source}.runfiles"
    extra=$(sed -E 's/ .*//' "${runfiles}/MANIFEST" 2>/dev/null | grep -vxF "lossrt/${package}/${target}" | grep -v '^$' || true)
    if [[ -n "${extra}" ]]; then
      mkdir -p "${STAGE}/${name}.runfiles"
      cp -rL "${runfiles}/." "${STAGE}/${name}.runfiles/" 2>/dev/null
      say "${label}: staged its runfiles (data) in ${name}.runfiles/"
    fi
    problems=$(check_libraries "${STAGE}/${name}")
    glibc=$(objdump -T "${STAGE}/${name}" 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -Vu | tail -n 1)
    echo "${name} | ${label} | ${glibc:-?} | $(readelf -d "${STAGE}/${name}" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')" >>"${STAGE}/MANIFEST"
    # Any line but a note (an empty result is one empty line, not a problem).
    if grep -v '^note:' <<<"${problems}" | grep -q .; then
      say "BAD ${label}:"
      grep -v '^note:' <<<"${problems}" | sed 's/^/    /' >&2
      bad+=1
    fi
    notes+=$(grep '^note:' <<<"${problems}")$'\n'
    staged+=1
  done
  grep '^note:' <<<"${notes}" | sort -u | sed 's/^note: /stage_gpu: every binary also loads /' >&2

  say "staged ${staged} binaries in ${STAGE}/ ($(du -sh "${STAGE}" | cut -f1)); ${missing} not built; ${bad} with unexpected libraries"
  say "run there: ${STAGE}/run_gpu_tests.sh"
  ((build_rc == 0 && missing == 0 && bad == 0 && corpus_rc == 0))
}

main
