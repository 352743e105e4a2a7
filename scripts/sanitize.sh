#!/usr/bin/env bash
# Builds lamp and its tests with AddressSanitizer and UndefinedBehaviorSanitizer
# against Debian's LibTorch, and runs the tests under them. See --help.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

usage() {
  cat <<EOF
Usage: scripts/sanitize.sh [--build-dir DIR] [--jobs N] [-R REGEX]

Builds lamp, its programs and its tests with -fsanitize=address,undefined
(GCC, -O1, Debian's LibTorch 1.13) and runs ctest. Any out-of-bounds access,
use after free or undefined behaviour in lamp's code stops the process that
hit it with a report, and so fails its test. LibTorch itself is not
instrumented. A whole run takes about an hour to build and an hour to test on
two cores; it is not part of scripts/test.sh.

  --build-dir DIR  build folder (default build/sanitize-debian)
  --jobs N         parallel compile jobs (default: all cores, $(lamp_nproc))
  -R REGEX         only the ctest tests matching REGEX

Left out: the SentencePiece tests and train_gpt's tokenizer run (lamp opens
its SentencePiece module with dlopen's RTLD_DEEPBIND, which the sanitizers'
runtime refuses), the tests that build other projects against lamp
(packaging.*, lamp_consumer: their programs are not linked with the
sanitizers' runtime), and faults.address_space (its ulimit -v leaves no room
for AddressSanitizer's shadow memory).
EOF
}

build="build/sanitize-debian"
jobs="$(lamp_nproc)"
regex=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || lamp_die "--build-dir needs a value"; build="$2"; shift 2 ;;
    --jobs|-j) [ $# -ge 2 ] || lamp_die "--jobs needs a value"; jobs="$2"; shift 2 ;;
    -R) [ $# -ge 2 ] || lamp_die "-R needs a value"; regex="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; lamp_die "unknown argument: $1" ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || lamp_die "--jobs must be a positive integer, got '$jobs'"

lamp_ensure_packages "${LAMP_BUILD_PACKAGES[@]}" python3-venv ninja-build

# -DNDEBUG as LibTorch was built: its headers give at::RecordFunction a
# member only without NDEBUG, so a build without it reads past the objects
# LibTorch made (lamp's op observers call RecordFunction::inputs()).
# -fno-sanitize=vptr: LibTorch's classes cross the shared-library boundary
# without the type information the check needs.
sanitize="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=all"
lamp_log "Configuring $build"
cmake -S "$LAMP_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="$sanitize -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
  -DCMAKE_MODULE_LINKER_FLAGS="$sanitize"
lamp_log "Building $build with $jobs jobs"
cmake --build "$build" --parallel "$jobs"

# detect_leaks=0: LibTorch keeps its registries until exit.
# detect_container_overflow=0: containers filled on one side of the
# uninstrumented LibTorch and read on the other look overflowed.
# allocator_may_return_null=1: the out-of-memory tests ask for more than
# the sanitizer's largest allocation (1 TiB); LibTorch then reports its own
# out-of-memory error, as without the sanitizer.
# verify_asan_link_order=0: the fault tests preload their own library
# (tests/faults/fail_io.c) ahead of the sanitizer's runtime.
export ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0:allocator_may_return_null=1:verify_asan_link_order=0"
export UBSAN_OPTIONS="print_stacktrace=1"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
args=(--test-dir "$build" --output-on-failure -j"$(( jobs < 2 ? jobs : 2 ))" --timeout 900
      -E '^(SentencePiece(\.|$)|example\.train_gpt\.tokenizer|packaging\.|lamp_consumer|faults\.address_space)')
[ -z "$regex" ] || args+=(-R "$regex")
lamp_log "Running the tests under the sanitizers"
ctest "${args[@]}"
