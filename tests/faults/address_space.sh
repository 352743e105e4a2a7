#!/usr/bin/env bash
# train_mnist under an address-space limit (ulimit -v) that leaves too little
# room: refused before training with the limit and the fix named, where
# OpenBLAS would hang and oneDNN could crash; a limit with room trains.
#   address_space.sh TRAIN_MNIST MAKE_TEST_DATA VM_SIZE WORK_DIR
# VM_SIZE prints what a program linked as train_mnist maps at main().
set -uo pipefail
train="$1" make_data="$2" vm_size="$3" work="$4"
rm -rf "$work" && mkdir -p "$work" || exit 1
"$make_data" "$work/data" > /dev/null || { echo "cannot make test data"; exit 1; }
base=$("$vm_size") || { echo "cannot measure the address space"; exit 1; }

passed=0 failed=0
pass() { echo "ok    $1"; passed=$((passed + 1)); }
fail() { echo "FAIL  $1"; failed=$((failed + 1)); sed 's/^/      /' "$2" | tail -4; }
args=(--data "$work/data/mnist" --no-progress --precision fp32 --epochs 1 --batch-size 50)

# Two compute threads: the second takes an OpenBLAS work buffer of its own
# (the one that hangs when it cannot). 200 MiB above what main() maps:
# enough to start, not for the second thread.
export OMP_NUM_THREADS=2
limit=$((base + 200 * 1024))
(ulimit -v "$limit" && exec timeout -k 5 30 "$train" "${args[@]}") > "$work/tight.log" 2>&1
rc=$?
if [ "$rc" -eq 1 ] &&
   grep -q "the address-space limit (ulimit -v) is $limit KiB" "$work/tight.log" &&
   grep -Eq "raise the limit to at least [0-9]+ KiB \(ulimit -v [0-9]+\) or remove it \(ulimit -v unlimited\)" "$work/tight.log" &&
   ! grep -q "^epoch 1/" "$work/tight.log"; then
  pass "tight limit refused before training"
else
  fail "tight limit: exit $rc" "$work/tight.log"
fi

# Many threads under the same limit: at::set_num_threads() would wait
# forever for a pool thread it could not start; refused before it.
(ulimit -v "$limit" && exec timeout -k 5 30 "$train" "${args[@]}" --threads 64) > "$work/threads.log" 2>&1
rc=$?
if [ "$rc" -eq 1 ] &&
   grep -q "the address-space limit (ulimit -v) is $limit KiB" "$work/threads.log" &&
   grep -q "so a pool of 64 compute threads (--threads) is not started" "$work/threads.log"; then
  pass "64 threads under a tight limit refused, not hung"
else
  fail "64 threads under a tight limit: exit $rc" "$work/threads.log"
fi

# The limit the refusal asks for (and a little more for the program's own
# growth beyond the estimate) trains.
enough=$(grep -Eo "ulimit -v [0-9]+\)" "$work/tight.log" | grep -Eo "[0-9]+")
if [ -n "$enough" ]; then
  (ulimit -v "$((enough + 64 * 1024))" && exec timeout -k 5 120 "$train" "${args[@]}") > "$work/enough.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q "^epoch 1/1" "$work/enough.log"; then
    pass "the limit the message asks for trains"
  else
    fail "limit $enough KiB: exit $rc" "$work/enough.log"
  fi
else
  fail "no limit in the refusal" "$work/tight.log"
fi

echo "address space: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
