#!/usr/bin/env bash
# Fuzzes lamp's pickle reader with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer. See --help.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

usage() {
  cat <<EOF2
Usage: scripts/fuzz.sh [--seconds N] [--dir DIR]

Builds tests/fuzz/plain_pickle_fuzz.cpp with clang's libFuzzer, AddressSanitizer
and UndefinedBehaviorSanitizer against Debian's LibTorch, and runs it for N
seconds (default 300) on the pickles in DIR/corpus (default
build/fuzz/corpus; it keeps what it finds there for the next run), seeded
with the pickles of the torch.save files under tests/python. A crash leaves
its input in DIR as crash-*, and the script exits non-zero.
EOF2
}

seconds=300
dir="build/fuzz"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) [ $# -ge 2 ] || lamp_die "--seconds needs a value"; seconds="$2"; shift 2 ;;
    --dir) [ $# -ge 2 ] || lamp_die "--dir needs a value"; dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; lamp_die "unknown argument: $1" ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || lamp_die "--seconds must be a positive integer, got '$seconds'"

lamp_ensure_packages clang libtorch-dev
mkdir -p "$dir/corpus"
# The seeds: the data.pkl inside each torch.save zip that Python wrote.
python3 - "$dir/corpus" tests/python/*/*.pt <<'PY'
import os, sys, zipfile
for path in sys.argv[2:]:
    if not zipfile.is_zipfile(path):
        continue  # the legacy format: a bare pickle, not a zip
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith("/data.pkl"):
                seed = os.path.join(sys.argv[1], "seed-" + os.path.basename(path) + ".pkl")
                with open(seed, "wb") as out:
                    out.write(archive.read(name))
PY
binary="$dir/plain_pickle_fuzz"
lamp_log "Building $binary"
clang++ -std=c++17 -O1 -g -DNDEBUG \
  -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined \
  -Iinclude -Isrc -I/usr/include/torch/csrc/api/include \
  tests/fuzz/plain_pickle_fuzz.cpp src/platform/plain_pickle.cpp \
  -o "$binary" -ltorch -ltorch_cpu -lc10
lamp_log "Fuzzing for $seconds s"
ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0" \
  "$binary" -max_total_time="$seconds" -max_len=4096 -artifact_prefix="$dir/" "$dir/corpus"
