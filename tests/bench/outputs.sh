#!/usr/bin/env bash
# lamp_bench's outputs under faults (ctest bench.lamp_bench.outputs):
#   outputs.sh LAMP_BENCH LIBLAMP_FAIL_IO WORK_DIR
# A closed stdout pipe, a results file on /dev/full or a full disk, --json
# and --profile naming one file, and two precisions that resolve to one
# mode; an earlier trace kept by a run that fails, an absurd --min-seconds;
# the command lines of lamp_zero_step and lamp_sharded_step (built beside
# lamp_bench). Prints one line per case; exits 1 if any failed.
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

# 6. A run that fails after the checks (--cuda-graph on a CPU fails at its
#    first step) leaves an earlier trace as it was: the trace is written
#    beside it and renamed over it at the end, never emptied up front.
echo '{"previous": true}' > "$work/kept.json"
"$bench" "${quick[@]}" --precision fp32 --cuda-graph --profile "$work/kept.json" \
    > "$work/kept.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q '"previous": true' "$work/kept.json" &&
   ! ls "$work"/kept.json.tmp-* > /dev/null 2>&1; then
  pass "a failed run: the earlier trace kept, no temporary file left"
else
  fail "a failed run's trace: exit $rc"; ls "$work"; tail -3 "$work/kept.log"
fi

# 7. --min-seconds beyond an hour is refused before anything runs (1e300
#    once overflowed the step count it asked for).
timeout 120 "$bench" "${quick[@]}" --precision fp32 --min-seconds 1e300 > "$work/min.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q -- "--min-seconds: 1e300 is out of range" "$work/min.log"; then
  pass "--min-seconds 1e300: refused"
else
  fail "--min-seconds 1e300: exit $rc"; tail -3 "$work/min.log"
fi

# 7b. An empty --json or --profile path is refused before anything runs
#     (an empty --json once meant no results file, without a word).
for flag in --json --profile; do
  timeout 120 "$bench" "${quick[@]}" --precision fp32 "$flag" '' > "$work/empty.log" 2>&1
  rc=$?
  if [ "$rc" -eq 2 ] && grep -q -- "$flag: the path is empty; give the" "$work/empty.log"; then
    pass "$flag '': refused"
  else
    fail "$flag '': exit $rc"; tail -3 "$work/empty.log"
  fi
done

# 8. lamp_zero_step and lamp_sharded_step read their arguments strictly:
#    a word, a number with a tail, 0 steps, an unknown weights type and one
#    argument too many are usage errors (exit 2) before any group forms.
bin="$(dirname "$bench")"
check_usage() { # PROGRAM EXPECTED-TEXT ARGS...
  local program="$1" expected="$2"
  shift 2
  if [ ! -x "$bin/$program" ]; then
    fail "$program: not built beside lamp_bench ($bin)"
    return
  fi
  "$bin/$program" "$@" > "$work/usage.log" 2>&1
  local status=$?
  if [ "$status" -eq 2 ] && grep -q -- "$expected" "$work/usage.log"; then
    pass "$program $*: refused"
  else
    fail "$program $*: exit $status"; tail -3 "$work/usage.log"
  fi
}
check_usage lamp_zero_step "argument 6 (steps) is 0; give an integer in 1..1000000" 1 4 256 128 8 0
check_usage lamp_zero_step "argument 6 (steps) is '12abc', not an integer" 1 4 256 128 8 12abc
check_usage lamp_zero_step "argument 1 (stage) is 'abc', not an integer" abc
check_usage lamp_zero_step "argument 1 (stage) is 3; give an integer in 0..2" 3
check_usage lamp_zero_step "too many arguments (7)" 1 4 256 128 8 10 1
check_usage lamp_sharded_step "argument 6 (steps) is 0; give an integer in 1..1000000" bf16 4 256 128 8 0
check_usage lamp_sharded_step "argument 1 (the weights) is 'fp16', not bf16 or fp32" fp16
check_usage lamp_sharded_step "argument 7 (rounds) is 'x', not an integer" fp32 4 256 128 8 10 x
exit $failed
