#!/usr/bin/env bash
# Builds the GPU default corpus of examples/train_lm from the English text a Debian machine
# carries, for a GPU run of a minute or two whose validation loss keeps falling (Debian's
# fortunes alone, 2.8 MB, are memorized by a GPU-sized model in seconds):
#
#   tools/make_gpu_corpus.sh OUT_DIR
#
#   OUT_DIR/fortunes/   the files of /usr/share/games/fortunes (fortune-mod's format, kept)
#   OUT_DIR/docs/       /usr/share/doc's README, NEWS, FAQ, .txt, .md and .rst files,
#                       decompressed (changelogs, copyright files, HTML and symbol lists left out)
#   OUT_DIR/man/        the English manual pages of sections 1-9 rendered to plain text by
#                       man(1) at 80 columns (the Google Cloud SDK's 16K generated pages left out)
#
# Every file is checked to be UTF-8 without NUL bytes (data/corpus.h's rule) and named *.txt,
# so examples/train_lm reads the folder as one corpus. What each machine holds differs with its
# packages: the script prints the sizes. tools/stage_gpu.sh runs it into
# gpu_stage/data/gpu_corpus once and reuses it after. Rendering takes a few minutes on 2 cores.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
readonly OUT=$1
readonly JOBS=$(nproc 2>/dev/null || echo 2)

say() { echo "make_gpu_corpus: $*" >&2; }

mkdir -p "${OUT}/fortunes" "${OUT}/docs" "${OUT}/man"

# The text of $1 (gzip'ed or not) into $2 when it is UTF-8 without NUL bytes, else nothing.
keep_text() {
  local source=$1 dest=$2
  if zcat -f -- "${source}" >"${dest}.part" 2>/dev/null &&
    ! grep -qaP '\x00' "${dest}.part" &&
    iconv -f utf-8 -t utf-8 "${dest}.part" >/dev/null 2>&1 && [[ -s "${dest}.part" ]]; then
    mv "${dest}.part" "${dest}"
  else
    rm -f "${dest}.part"
  fi
}
export -f keep_text

# Fortunes: copied as they are (the reader recognizes them by their .dat indexes).
if [[ -d /usr/share/games/fortunes ]]; then
  (cd /usr/share/games/fortunes && find . -type f -print0 | xargs -0 -r cp --parents -t "$(cd "${OUT}/fortunes" && pwd)")
else
  say "note: /usr/share/games/fortunes is not installed (apt-get install fortunes-min)"
fi

# Package documentation: one file each, named after its path.
(cd /usr/share/doc && find . -type f \( -iname 'README*' -o -iname 'NEWS*' -o -iname 'FAQ*' \
  -o -name '*.txt*' -o -name '*.md*' -o -name '*.rst*' \) ! -ipath '*changelog*' \
  ! -name copyright ! -name '*.html*' ! -iname '*symbols*' -print0) |
  while IFS= read -r -d '' path; do
    name=$(echo "${path#./}" | tr '/' '_')
    name=${name%.gz}
    [[ "${name}" == *.txt ]] || name="${name}.txt"
    keep_text "/usr/share/doc/${path#./}" "${OUT}/docs/${name}"
  done

# Manual pages, rendered (the slow part: man(1) per page, on every core).
render_page() {
  local page=$1 dest_dir=$2 name
  name=$(basename "${page}" .gz)
  MANWIDTH=80 man -l "${page}" 2>/dev/null | col -bx >"${dest_dir}/${name}.txt.raw" || true
  keep_text "${dest_dir}/${name}.txt.raw" "${dest_dir}/${name}.txt"
  rm -f "${dest_dir}/${name}.txt.raw"
}
export -f render_page
if command -v man >/dev/null && command -v col >/dev/null; then
  find /usr/share/man/man[1-9]* -type f -name '*.gz' ! -name 'gcloud*' -print0 |
    xargs -0 -r -P "${JOBS}" -I{} bash -c 'render_page "$1" "$2"' _ {} "${OUT}/man"
else
  say "note: man(1) or col(1) missing: no manual pages in the corpus"
fi

for part in fortunes docs man; do
  say "${OUT}/${part}: $(find "${OUT}/${part}" -type f | wc -l) files, $(du -sh "${OUT}/${part}" | cut -f1)"
done
