#!/usr/bin/env bash
# lamp_bench's outputs under faults (ctest bench.lamp_bench.outputs):
#   outputs.sh LAMP_BENCH LIBLAMP_FAIL_IO WORK_DIR
# A closed stdout pipe, a results file on /dev/full or a full disk, --json
# and --profile naming one file, and two precisions that resolve to one
# mode. Prints one line per case; exits 1 if any failed.
set -uo pipefail

bench="$1" shim="$2" work="$3"
rm -rf "$work" && mkdir -p "$work" || exit 1
quick=(--model cnn --batch-size 4 --device cpu --warmup 1 --steps 1)
failed=0
pass() { echo "ok    $1"; }
fail() { echo "FAIL  $1"; failed=1; }
valid_json() { python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" 2> /dev/null; }

# 1. Piped into `head -1`: the reader goes after the first line, the run
#    goes on and --json is written whole.
"$bench" "${quick[@]}" --precision fp32,bf16 --json "$work/piped.json" \
    2> "$work/piped.err" | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ] && valid_json "$work/piped.json" &&
   [ "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["results"]))' "$work/piped.json")" = 2 ]; then
  pass "a closed stdout pipe: exit 0, both results in --json"
else
  fail "a closed stdout pipe: exit $rc"; cat "$work/piped.err"
fi
# Without --json the results are lost: say so, exit 1.
"$bench" "${quick[@]}" --precision fp32 2> "$work/piped2.err" | true
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 1 ] && grep -q "give --json FILE to keep them" "$work/piped2.err"; then
  pass "a closed stdout pipe without --json: exit 1, says so"
else
  fail "a closed stdout pipe without --json: exit $rc"; cat "$work/piped2.err"
fi

# 2. --json on /dev/full: refused before anything runs.
"$bench" "${quick[@]}" --precision fp32 --json /dev/full > "$work/full.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q -- "--json.*/dev/full" "$work/full.log" &&
   ! grep -q "img/s" "$work/full.log"; then
  pass "--json /dev/full: refused before the run"
else
  fail "--json /dev/full: exit $rc"; tail -3 "$work/full.log"
fi

# 3. A disk that fills while the results are written: an error naming the
#    file, and the previous results file kept. The start's check writes
#    4096 bytes, which pass; the results (with two profiles, over 5 KiB) do
#    not.
echo '{"previous": true}' > "$work/disk.json"
LD_PRELOAD="$shim" LAMP_FAULT_PATH="disk.json.tmp" LAMP_FAULT_WRITE_AFTER=4200 \
    "$bench" "${quick[@]}" --precision fp32,bf16 --profile "$work/disk-trace.json" \
    --profile-steps 1 --json "$work/disk.json" > "$work/disk.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q "No space left on device" "$work/disk.log" &&
   grep -q "img/s" "$work/disk.log" && grep -q '"previous": true' "$work/disk.json"; then
  pass "a full disk at the results: exit $rc, names it, the old file kept"
else
  fail "a full disk at the results: exit $rc"; tail -3 "$work/disk.log"
fi

# 4. --profile and --json naming one file: refused before anything runs,
#    however the path is spelt.
"$bench" "${quick[@]}" --precision fp32 --json "$work/same.json" \
    --profile "$work/./same.json" > "$work/same.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q -- "--profile and --json name the same file" "$work/same.log"; then
  pass "--profile and --json on one file: refused"
else
  fail "--profile and --json on one file: exit $rc"; tail -3 "$work/same.log"
fi

# 5. auto and the mode it resolves to: two traces, one per name given.
"$bench" "${quick[@]}" --precision auto,fp32,bf16 --profile "$work/trace.json" \
    --profile-steps 1 > "$work/two.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && valid_json "$work/trace-auto.json" && valid_json "$work/trace-fp32.json" &&
   valid_json "$work/trace-bf16.json"; then
  pass "auto beside the modes: one trace per name"
else
  fail "auto beside the modes: exit $rc"; ls "$work"; tail -3 "$work/two.log"
fi
# A mode named twice is refused.
"$bench" "${quick[@]}" --precision fp32,fp32 > "$work/twice.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && grep -q -- "--precision names fp32 twice" "$work/twice.log"; then
  pass "a mode named twice: refused"
else
  fail "a mode named twice: exit $rc"; tail -3 "$work/twice.log"
fi
exit $failed
