#!/usr/bin/env bash
# Builds lamp and runs its tests against one or both LibTorch builds,
# installing what is missing first. See --help.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

usage() {
  cat <<EOF
Usage: scripts/test.sh [--torch debian|wheel|both] [--torch-version V] [--gloo auto|on|off] [--fast-build] [--build-dir DIR] [--jobs N]

Builds lamp (Release) and runs its tests with ctest.

  --torch debian   Debian's libtorch-dev (LibTorch 1.13, CPU only); the default
  --torch wheel    the LibTorch inside PyPI's torch wheel (CUDA-built), installed
                   into a virtual environment on first use
  --torch both     debian, then wheel (by default $LAMP_BOTH_TORCH_VERSION, the GPU
                   machines' LibTorch), both with --fast-build; fails if
                   either fails
  --torch-version V  the torch wheel's version (default $LAMP_DEFAULT_TORCH_VERSION, the
                   newest tested, or $LAMP_BOTH_TORCH_VERSION with --torch both); any
                   2.x with a CUDA 13 wheel on PyPI
  --gloo MODE      lamp's Gloo backend (CMake's LAMP_WITH_GLOO): auto (the
                   default: where its headers are found), on, or off (the
                   build a torch wheel gets on a machine without libgloo-dev)
  --fast-build     compile at -O1 instead of Release's -O3, as a unity build
                   (CMAKE_UNITY_BUILD: several sources per compile), and leave
                   out the public headers' own compiles (tests/packaging), for
                   a shorter build; --torch both (CI) builds this way
  --build-dir DIR  build folder (default build/test-<torch>; with both, DIR-debian
                   and DIR-wheel)
  --jobs N         parallel compile jobs (default: all cores, $(lamp_nproc));
                   ctest runs at most 2 tests at once
  -h, --help       this help

Environment:
  LAMP_TORCH          same as --torch
  LAMP_GLOO           same as --gloo
  LAMP_TORCH_VERSION  same as --torch-version
  LAMP_TORCH_VENV     its virtual environment (default ~/.cache/lamp/torch-<version>)
  LAMP_PYTHON         interpreter that creates the environment (default python3)
  LAMP_FAST_BUILD     non-empty: same as --fast-build
  LAMP_SKIP_SOURCE_CHECKS  non-empty: ctest leaves out the checks of the sources
                      alone (label sources); --torch both sets it for the wheel

Missing Debian packages are installed with apt-get (root only).
EOF
}

torch="${LAMP_TORCH:-debian}"
gloo="${LAMP_GLOO:-auto}"
build_dir=""
fast_build="${LAMP_FAST_BUILD:-}"
jobs="$(lamp_nproc)"
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) [ $# -ge 2 ] || lamp_die "--torch needs a value"; torch="$2"; shift 2 ;;
    --torch=*) torch="${1#*=}"; shift ;;
    --torch-version) [ $# -ge 2 ] || lamp_die "--torch-version needs a value"; export LAMP_TORCH_VERSION="$2"; shift 2 ;;
    --torch-version=*) export LAMP_TORCH_VERSION="${1#*=}"; shift ;;
    --gloo) [ $# -ge 2 ] || lamp_die "--gloo needs a value"; gloo="$2"; shift 2 ;;
    --gloo=*) gloo="${1#*=}"; shift ;;
    --build-dir) [ $# -ge 2 ] || lamp_die "--build-dir needs a value"; build_dir="$2"; shift 2 ;;
    --build-dir=*) build_dir="${1#*=}"; shift ;;
    --fast-build) fast_build=1; shift ;;
    --jobs|-j) [ $# -ge 2 ] || lamp_die "--jobs needs a value"; jobs="$2"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; lamp_die "unknown argument: $1" ;;
  esac
done
case "$torch" in
  debian|wheel|both) ;;
  *) lamp_die "--torch must be debian, wheel or both, got '$torch'" ;;
esac
case "$gloo" in
  auto|on|off) ;;
  *) lamp_die "--gloo must be auto, on or off, got '$gloo'" ;;
esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || lamp_die "--jobs must be a positive integer, got '$jobs'"

if [ "$torch" = both ]; then
  # Each LibTorch runs in its own process, so one failing does not stop the
  # other and `set -e` keeps working inside each.
  summary="$(mktemp)"
  trap 'rm -f "$summary"' EXIT
  export LAMP_TORCH_VERSION="${LAMP_TORCH_VERSION:-$LAMP_BOTH_TORCH_VERSION}"
  # The wheel's environment first: its Python (torch) runs the Python interop
  # tests of both builds.
  lamp_ensure_packages python3-venv
  lamp_ensure_torch_wheel
  status=0
  # Stopped by a signal: the running build says so, the next one does not start.
  stopped=""
  trap 'stopped=1' TERM INT
  for t in debian wheel; do
    # --fast-build: CI's 90 minutes on 2 cores hold two builds only so
    # (measured on a 2-core AMD EPYC on 2026-12-01: Debian's build 2148 s at
    # -O3, 470 s of it the headers' own compiles, 712 s as a fast unity
    # build; the 2.11 wheel's 1676 s at -O1, 833 s as a unity build).
    # scripts/test.sh alone builds as users do: Release, every check.
    args=(--torch "$t" --gloo "$gloo" --jobs "$jobs" --fast-build)
    [ -z "$build_dir" ] || args+=(--build-dir "$build_dir-$t")
    # The checks of the sources alone (ctest label sources) give the same
    # result with every LibTorch: the first build runs them.
    skip_sources=""
    [ "$t" = debian ] || skip_sources=1
    LAMP_SUMMARY_FILE="$summary" LAMP_SKIP_SOURCE_CHECKS="$skip_sources" \
      bash "$LAMP_ROOT/scripts/test.sh" "${args[@]}" || status=1
    # A signal to this process alone (the running build may go on to pass)
    # still fails the run: the next build did not run.
    [ -z "$stopped" ] || { status=1; break; }
  done
  echo
  cat "$summary"
  exit "$status"
fi

build="${build_dir:-build/test-$torch}"
ctest_jobs=$(( jobs < 2 ? jobs : 2 ))
start="$(lamp_now)"
step="installing dependencies"
libtorch="LibTorch ($torch)"

# The tests ctest's last run failed, by name, comma-separated (at most 12),
# and what a rerun of them found: the summary line names them, so that the
# last lines of a long log say what failed.
failed_tests=""
stopped_by=""
summarize() {
  local rc=$? line
  if [ -n "$stopped_by" ]; then
    line="STOPPED $libtorch: $step stopped by $stopped_by after $(( $(lamp_now) - start )) s"
  elif [ "$rc" -eq 0 ]; then
    line="PASSED  $libtorch: built and tested in $build in $(( $(lamp_now) - start )) s"
  else
    line="FAILED  $libtorch: $step failed after $(( $(lamp_now) - start )) s (exit $rc)"
    [ -z "$failed_tests" ] || line="$line: $failed_tests"
  fi
  echo "$line"
  [ -z "${LAMP_SUMMARY_FILE:-}" ] || echo "$line" >>"$LAMP_SUMMARY_FILE"
}
trap summarize EXIT
# A run stopped by a signal (a CI time limit, Ctrl-C) says so: without these
# the EXIT trap saw the interrupted command's status, and a run killed in
# its build could print PASSED.
trap 'stopped_by=SIGTERM; exit 143' TERM
trap 'stopped_by=SIGINT; exit 130' INT

lamp_ensure_packages "${LAMP_BUILD_PACKAGES[@]}" python3-venv python3-matplotlib clang-format

cmake_args=("-DLAMP_WITH_GLOO=${gloo^^}")
if [ -n "$fast_build" ]; then
  cmake_args+=("-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON
               -DLAMP_TEST_SELF_CONTAINED_HEADERS=OFF)
else
  # A folder a fast build configured gets Release's flags back, one compile
  # per source, and the headers' own compiles their default
  # (tests/packaging/CMakeLists.txt).
  cmake_args+=(-UCMAKE_CXX_FLAGS_RELEASE -UCMAKE_UNITY_BUILD
               -ULAMP_TEST_SELF_CONTAINED_HEADERS)
fi
if [ "$torch" = wheel ]; then
  lamp_ensure_torch_wheel
  lamp_ensure_nvcc
  libtorch="LibTorch $LAMP_TORCH_WHEEL_VERSION (torch wheel)"
  # The LibTorch's own folder first: TorchConfig's find_library would otherwise
  # pick Debian's libc10 from the system paths.
  cmake_args+=("-DCMAKE_PREFIX_PATH=$LAMP_TORCH_WHEEL_ROOT;$LAMP_TORCH_WHEEL_ROOT/share/cmake")
else
  libtorch="LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?') (Debian)"
fi
# Debian's build keeps lamp's own code free of warnings: -Werror on lamp's
# targets (its Release and unity builds have none). The wheel's -O1 build
# gets a -Wmaybe-uninitialized from GCC inside LibTorch 2.11's DataLoader
# headers, which lamp cannot change, so there warnings stay warnings.
if [ "$torch" = wheel ]; then
  cmake_args+=(-DLAMP_WARNINGS_AS_ERRORS=OFF)
else
  cmake_args+=(-DLAMP_WARNINGS_AS_ERRORS=ON)
fi

[ "$gloo" = auto ] || libtorch="$libtorch, Gloo $gloo"
[ -z "$fast_build" ] || libtorch="$libtorch, fast build (-O1, unity)"

# The Python interop tests need a Python with torch: the torch wheel's
# environment, for both LibTorch builds, when it exists.
venv_python="${LAMP_TORCH_VENV:-$HOME/.cache/lamp/torch-${LAMP_TORCH_VERSION:-$LAMP_DEFAULT_TORCH_VERSION}}/bin/python"
if [ -x "$venv_python" ]; then
  cmake_args+=("-DLAMP_PYTHON_TORCH=$venv_python")
fi

step="configure/build"
lamp_configure_and_build "$build" "$jobs" "${cmake_args[@]}"

step="ctest"
# The programs run as many threads as the machine has cores; with two tests
# at a time that oversubscribes the cores. One each, unless the caller says
# otherwise (the threads tests set their own).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
lamp_log "Running the tests ($ctest_jobs at a time)"
ctest_args=()
if [ -n "${LAMP_SKIP_SOURCE_CHECKS:-}" ]; then
  lamp_log "Leaving out the checks of the sources alone (label sources): the other LibTorch's run has them"
  ctest_args+=(-LE sources)
fi
ctest_rc=0
ctest --test-dir "$build" --output-on-failure -j"$ctest_jobs" "${ctest_args[@]}" || ctest_rc=$?
if [ "$ctest_rc" -ne 0 ]; then
  failed_log="$build/Testing/Temporary/LastTestsFailed.log"
  if [ -s "$failed_log" ]; then
    # The first 12 names of the log (lines "N:name"), comma-separated.
    failed_names() { cut -d: -f2- "$failed_log" | head -n 12 | paste -sd, - | sed 's/,/, /g'; }
    count=$(wc -l <"$failed_log")
    failed_tests="$(failed_names)"
    [ "$count" -le 12 ] || failed_tests="$failed_tests and $(( count - 12 )) more"
    # What failed inside them, from their output: a googletest case's
    # "[  FAILED  ]" line, a script's "FAIL  case: why" line (the first 3,
    # 160 characters each), before the rerun replaces the log.
    failed_cases="$(grep -E '^(FAIL  |\[  FAILED  \] [^ ]+\.)' \
        "$build/Testing/Temporary/LastTest.log" 2>/dev/null |
      sed 's/ ([0-9]* ms)$//' | awk '!seen[$0]++' | head -n 3 | cut -c1-160 |
      awk '{ printf "%s%s", (NR > 1 ? "; " : ""), $0 }')" || true
    # Once more, one at a time: a test that passes now failed by timing or
    # load, one that fails again is broken. Either way the run has failed.
    lamp_log "Running the $count failed test(s) again, one at a time"
    if ctest --test-dir "$build" --output-on-failure --rerun-failed -j1; then
      failed_tests="$failed_tests (all passed on a rerun: load- or timing-dependent)"
    else
      failed_tests="$failed_tests (failed again on a rerun: $(failed_names))"
    fi
    [ -z "$failed_cases" ] || failed_tests="$failed_tests; the first run's failures: $failed_cases"
  fi
  exit "$ctest_rc"
fi
