#!/usr/bin/env bash
# Fuzzes lamp's readers of users' files (the pickle reader, the MNIST-format
# reader) and its text escaping with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer. See --help.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

usage() {
  cat <<EOF2
Usage: scripts/fuzz.sh [--target pickle|idx|text] [--seconds N] [--dir DIR]

Builds one of the libFuzzer targets in tests/fuzz/ with clang, AddressSanitizer
and UndefinedBehaviorSanitizer against Debian's LibTorch, and runs it for N
seconds (default 300) on the inputs in DIR/corpus (default
build/fuzz-TARGET/corpus; it keeps what it finds there for the next run). A
crash leaves its input in DIR as crash-*, and the script exits non-zero.

  --target pickle  the pickle reader (src/platform/plain_pickle.cpp; the
                   default), seeded with the pickles of the torch.save files
                   under tests/python
  --target idx     lamp::data::read_idx (src/data/mnist_idx.cpp): IDX headers
                   and gzip streams, seeded with small IDX files, plain and
                   gzip-compressed
  --target text    lamp::data::escape_text (src/data/text.cpp): the escaped
                   text must be safe UTF-8 that reads back to the input
EOF2
}

target="pickle"
seconds=300
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) [ $# -ge 2 ] || lamp_die "--target needs a value"; target="$2"; shift 2 ;;
    --seconds) [ $# -ge 2 ] || lamp_die "--seconds needs a value"; seconds="$2"; shift 2 ;;
    --dir) [ $# -ge 2 ] || lamp_die "--dir needs a value"; dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; lamp_die "unknown argument: $1" ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || lamp_die "--seconds must be a positive integer, got '$seconds'"
# What the data readers link: their file helpers and the memory checks.
data_support=(src/data/files.cpp src/platform/paths.cpp src/platform/out_of_memory.cpp
              src/platform/number_text.cpp src/platform/device_cpu_only.cpp)
case "$target" in
  pickle) sources=(tests/fuzz/plain_pickle_fuzz.cpp src/platform/plain_pickle.cpp) ;;
  idx) sources=(tests/fuzz/idx_fuzz.cpp src/data/mnist_idx.cpp "${data_support[@]}") ;;
  text) sources=(tests/fuzz/text_fuzz.cpp src/data/text.cpp "${data_support[@]}") ;;
  *) lamp_die "--target must be pickle, idx or text, got '$target'" ;;
esac
[ -n "$dir" ] || dir="build/fuzz-$target"

lamp_ensure_packages clang libtorch-dev zlib1g-dev
mkdir -p "$dir/corpus"
python3 - "$target" "$dir/corpus" tests/python/*/*.pt <<'PY'
import gzip, os, struct, sys, zipfile
target, corpus, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
def seed(name, data):
    with open(os.path.join(corpus, "seed-" + name), "wb") as out:
        out.write(data)
if target == "pickle":
    for path in paths:
        if not zipfile.is_zipfile(path):
            continue  # the legacy format: a bare pickle, not a zip
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if name.endswith("/data.pkl"):
                    seed(os.path.basename(path) + ".pkl", archive.read(name))
elif target == "idx":
    # Labels ([n]) and images ([n, rows, cols]) as MNIST stores them.
    for sizes in ([5], [3, 4, 4], [2, 7, 3], [0, 28, 28]):
        count = 1
        for s in sizes:
            count *= s
        data = (bytes([0, 0, 0x08, len(sizes)]) + b"".join(struct.pack(">I", s) for s in sizes)
                + bytes(i % 251 for i in range(count)))
        name = "x".join(map(str, sizes))
        seed(name + ".idx", data)
        seed(name + ".idx.gz", gzip.compress(data, mtime=0))
    seed("two-members.idx.gz", gzip.compress(data[:9], mtime=0) + gzip.compress(data[9:], mtime=0))
else:
    for i, text in enumerate(["hello, world\n", "caf\u00e9 \u2603 \U0001F600\t", "back\\slash \\x41"]):
        seed("%d.txt" % i, text.encode("utf-8"))
    seed("bytes.bin", bytes(range(256)))
PY
binary="$dir/${target}_fuzz"
lamp_log "Building $binary"
clang++ -std=c++17 -O1 -g -DNDEBUG \
  -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined \
  -Iinclude -Isrc -I/usr/include/torch/csrc/api/include \
  "${sources[@]}" -o "$binary" -ltorch -ltorch_cpu -lc10 -lz
lamp_log "Fuzzing $target for $seconds s"
ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0" \
  "$binary" -max_total_time="$seconds" -max_len=4096 -artifact_prefix="$dir/" "$dir/corpus"
