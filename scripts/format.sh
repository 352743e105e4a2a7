#!/usr/bin/env bash
# Formats lamp's C and C++ sources with .clang-format, or checks them.
#
#   scripts/format.sh           reformat every source in place
#   scripts/format.sh --check   list the files that differ and exit 1
#
# The tree is formatted with clang-format 14 (Debian 12's `clang-format`);
# other versions break lines differently, so --check with another major
# version exits 77 (ctest reports the test as skipped, not passed). CLANG_FORMAT
# names the binary (default: clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly expected_major=14
clang_format="${CLANG_FORMAT:-clang-format}"
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "error: unknown option '$1'; use --check or nothing (see --help)" >&2; exit 2 ;;
esac

if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "error: $clang_format not found; install it with apt-get install clang-format" >&2
  exit 2
fi
version="$("$clang_format" --version)"
major="$(sed -E 's/.*version ([0-9]+).*/\1/' <<<"$version")"
if [[ "$major" != "$expected_major" ]]; then
  echo "format: lamp is formatted with clang-format $expected_major; this is '$version'." >&2
  if (( check )); then
    echo "format: not checked (skipped)." >&2
    exit 77
  fi
fi

mapfile -t files < <(find include src tests examples bench \
  -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) | LC_ALL=C sort)
if (( ${#files[@]} == 0 )); then
  echo "error: no sources found under $(pwd)" >&2
  exit 2
fi
if (( check )); then
  bad=()
  for f in "${files[@]}"; do
    if ! "$clang_format" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
      bad+=("$f")
    fi
  done
  if (( ${#bad[@]} )); then
    printf 'format: %d of %d files differ from .clang-format:\n' "${#bad[@]}" "${#files[@]}" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "format: run scripts/format.sh to reformat them." >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted as .clang-format says ($version)"
else
  "$clang_format" --style=file -i "${files[@]}"
  echo "format: reformatted ${#files[@]} files ($version)"
fi
