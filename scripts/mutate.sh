#!/usr/bin/env bash
# Measures how strong the test suite is: plants the bugs listed in
# tests/mutants.ini one at a time in a scratch copy, rebuilds incrementally and
# reports which ones the suite caught. See --help. Not part of scripts/test.sh:
# a full run rebuilds once per mutant (hours on 2 cores; see --resume).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

usage() {
  cat <<EOF
Usage: scripts/mutate.sh [--torch debian|wheel] [--only REGEX] [--list FILE]
                         [--work DIR] [--jobs N] [--no-baseline] [--resume]

Plants each bug of the mutant list in a scratch copy of the repository (its
git-tracked files, with your uncommitted changes), one at a time, rebuilds and
runs the tests (first the ones the mutant names, then, if they pass, the whole
suite but the tests labelled consumer, mutants and format: the package
consumers, and two that fail on any planted mutant without testing behaviour).
Prints one line per mutant and the score; exits 1 when a mutant survives or a
ctest call fails without naming a failed test (the verdict "error"), 2 on a
usage or set-up error.

  --torch debian|wheel  the LibTorch to build against (default debian)
  --only REGEX          only the mutants whose names match
  --list FILE           the mutant list (default tests/mutants.ini)
  --work DIR            scratch folder (default build/mutate-<torch>); kept
                        between runs so that later runs build incrementally;
                        per-mutant logs in DIR/logs, the table in DIR/report.txt
  --jobs N              parallel compile jobs (default $(lamp_nproc))
  --no-baseline         skip the check that the suite passes unmutated
  --resume              go on with an earlier run: reuse the "caught" verdicts
                        recorded in DIR/results.tsv (same mutant text, same
                        LibTorch) and plant only the others (survivors and
                        failed builds again); without it a run of the whole
                        list starts the record afresh, and an --only run
                        adds to it
  -h, --help            this help
EOF
}

torch=debian
only=""
list="$LAMP_ROOT/tests/mutants.ini"
work=""
jobs="$(lamp_nproc)"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) [ $# -ge 2 ] || lamp_die "--torch needs a value"; torch="$2"; shift 2 ;;
    --only) [ $# -ge 2 ] || lamp_die "--only needs a value"; only="$2"; shift 2 ;;
    --list) [ $# -ge 2 ] || lamp_die "--list needs a value"; list="$2"; shift 2 ;;
    --work) [ $# -ge 2 ] || lamp_die "--work needs a value"; work="$2"; shift 2 ;;
    --jobs|-j) [ $# -ge 2 ] || lamp_die "--jobs needs a value"; jobs="$2"; shift 2 ;;
    --no-baseline) extra+=(--no-baseline); shift ;;
    --resume) extra+=(--resume); shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; lamp_die "unknown argument: $1" ;;
  esac
done
case "$torch" in
  debian|wheel) ;;
  *) lamp_die "--torch must be debian or wheel, got '$torch'" ;;
esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || lamp_die "--jobs must be a positive integer, got '$jobs'"
[ -f "$list" ] || lamp_die "no mutant list at $list"
work="${work:-build/mutate-$torch}"

lamp_ensure_packages "${LAMP_BUILD_PACKAGES[@]}" python3 git mold ccache
# The Python interop tests run on scripts/test.sh's torch wheel environment
# (tests/CMakeLists.txt finds it); without one they are not registered, and
# a mutant that only they catch goes on to the whole suite and survives.
if ! compgen -G "$HOME/.cache/lamp/torch-*/bin/python" > /dev/null; then
  lamp_log "note: no torch wheel environment in ~/.cache/lamp: the Python" \
    "interop tests are left out, so mutants that only they catch survive;" \
    "scripts/test.sh --torch wheel makes one"
fi
# One mutant recompiles one file, relinks every program that uses it and, at
# the next mutant, recompiles the restored file. Measured on 2 cores with the
# torch 2.15.0 wheel: relinking the 18 programs after a change in src/ takes
# 49 s with GNU ld and 5 s with mold; ccache serves the restored file's
# second compile from its cache (src/training/schedule.cpp: 1.5 s instead of
# about 18 s). ccache caches nothing compiled with a precompiled header (lamp
# has one, <torch/torch.h>) unless told these sloppinesses; it still hashes
# the header's contents. Only the scratch build uses mold and ccache; the
# build scripts/test.sh makes does not.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
cmake_args=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=mold
            -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=mold
            -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=mold)
if [ "$torch" = wheel ]; then
  lamp_ensure_torch_wheel
  lamp_ensure_nvcc
  cmake_args+=("-DCMAKE_PREFIX_PATH=$LAMP_TORCH_WHEEL_ROOT;$LAMP_TORCH_WHEEL_ROOT/share/cmake")
  torch_version="$LAMP_TORCH_WHEEL_VERSION"
else
  torch_version="$(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '')"
fi

exec python3 "$LAMP_ROOT/scripts/mutate.py" --root "$LAMP_ROOT" --work "$work" \
  --list "$list" --only "$only" --jobs "$jobs" --torch-version "$torch_version" \
  "${extra[@]}" -- "${cmake_args[@]}"
