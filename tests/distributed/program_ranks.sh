#!/usr/bin/env bash
# train_mnist as two ranks (Gloo, the variables torchrun sets) started the
# way a wrapper script or a cluster starts them, with the faults they bring:
# ranks with different flags, a rank that never comes, a rank that stops.
# Every case checks the exit codes and that the message names the problem.
#   program_ranks.sh TRAIN_MNIST MAKE_TEST_DATA WORK_DIR
set -uo pipefail
# shellcheck source=tests/distributed/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

train="$1" make_data="$2" work="$3"
rm -rf "$work" && mkdir -p "$work" || exit 1
"$make_data" "$work/data" > /dev/null || { echo "cannot make test data"; exit 1; }

passed=0 failed=0
pass() { echo "ok    $1"; passed=$((passed + 1)); }
fail() { echo "FAIL  $1"; failed=$((failed + 1)); }

# 200 training images: 100 per rank, batches of 50. A rank that fails at
# once leaves the other waiting: 20 s, not 10 minutes.
common=(--no-progress)
# with_defaults FLAGS...: FLAGS, and the defaults of the cases for the flags
# they do not give, into the array `args`.
with_defaults() {
  args=("$@")
  local flag value
  for flag in --data="$work/data/mnist" --precision=fp32 --batch-size=50 \
      --eval-batch-size=100 --dist-timeout=20; do
    value="${flag#*=}" flag="${flag%%=*}"
    [[ " $* " == *" $flag "* ]] || args+=("$flag" "$value")
  done
}

# ranks NAME "RANK0 FLAGS" "RANK1 FLAGS": starts both, with the common flags
# and theirs; their outputs go to $work/NAME.rank{0,1}.log and their exit
# codes to $rc0 and $rc1.
ranks() {
  local name="$1" port=$(free_port) pids=() r
  shift
  for r in 0 1; do
    local -a extra
    if [ "$r" = 0 ]; then read -r -a extra <<< "$1"; else read -r -a extra <<< "$2"; fi
    with_defaults "${extra[@]}"
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE=2 RANK="$r" \
      LOCAL_RANK="$r" LOCAL_WORLD_SIZE=2 timeout 120 \
      "$train" "${common[@]}" "${args[@]}" > "$work/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"; rc0=$?
  wait "${pids[1]}"; rc1=$?
}

# in_background NAME PORT [WRAPPER...]: starts both ranks, with the common
# flags and "${args[@]}", in the background and bare (no `timeout` in
# between, so that a signal sent to $pid0 or $pid1 reaches the program), rank
# 0 under WRAPPER when given; their outputs go to $work/NAME.rank{0,1}.log.
# A script's background job inherits SIGINT ignored, and the programs keep a
# signal they inherit ignored (as `nohup` relies on for SIGHUP): `env
# --default-signal=INT` starts them as a node's launcher would, where SIGINT
# stops them.
in_background() {
  local name="$1" port="$2" r
  shift 2
  for r in 0 1; do
    local -a wrapper=()
    [ "$r" = 0 ] && wrapper=("$@")
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE=2 RANK="$r" LOCAL_RANK="$r" \
      env --default-signal=INT "${wrapper[@]}" "$train" "${common[@]}" "${args[@]}" \
      > "$work/$name.rank$r.log" 2>&1 &
    eval "pid$r=$!"
  done
}

# both_refuse NAME PATTERN "RANK0 FLAGS" "RANK1 FLAGS": both ranks exit 1
# before training, each printing PATTERN.
both_refuse() {
  local name="$1" pattern="$2" r
  ranks "$name" "$3" "$4"
  for r in 0 1; do
    local rc_var="rc$r" log="$work/$name.rank$r.log"
    if [ "${!rc_var}" -ne 1 ]; then
      fail "$name: rank $r exited ${!rc_var}, expected 1"; tail -3 "$log" | sed 's/^/      /'; return
    fi
    if ! grep -qE -- "$pattern" "$log"; then
      fail "$name: rank $r's output lacks '$pattern'"; tail -3 "$log" | sed 's/^/      /'; return
    fi
    if grep -q "^epoch " "$log"; then
      fail "$name: rank $r trained before refusing"; return
    fi
  done
  pass "$name"
}

# The same flags: both train and exit 0.
ranks same "--epochs 1" "--epochs 1"
if [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && grep -q "^epoch 1/1" "$work/same.rank0.log"; then
  pass same_flags_train
else
  fail "same_flags_train: exits $rc0/$rc1"; tail -3 "$work/same.rank0.log" "$work/same.rank1.log"
fi

# Flags that differ, as a wrapper script or a stale configuration gives them:
# named with each rank's value. (Some of these aborted inside Gloo, others
# trained on and exited 0 with wrong results.)
# The flags are compared first, so the message names them as flags.
both_refuse different_lr "differ in their command-line flags: --lr is 0.1 on rank 0 and 0.2 on rank 1" \
  "--epochs 1 --lr 0.1" "--epochs 1 --lr 0.2"
both_refuse different_batch_size "--batch-size is 50 on rank 0 and 25 on rank 1" \
  "--epochs 1 --batch-size 50" "--epochs 1 --batch-size 25"
both_refuse different_precision "--precision is fp32 on rank 0 and amp-bf16 on rank 1" \
  "--epochs 1 --precision fp32" "--epochs 1 --precision amp-bf16"
both_refuse different_seed "--seed is 0 on rank 0 and 7 on rank 1" \
  "--epochs 1" "--epochs 1 --seed 7"
both_refuse different_eval_batch_size "--eval-batch-size is 100 on rank 0 and 10 on rank 1" \
  "--epochs 1 --eval-batch-size 100" "--epochs 1 --eval-batch-size 10"
both_refuse different_accumulation "--accumulation-steps is 1 on rank 0 and 2 on rank 1" \
  "--epochs 1" "--epochs 1 --accumulation-steps 2"
# Flags that only the programs know of (the library never sees them).
both_refuse export_on_one_rank "differ in their command-line flags: --export-state-dict is not given on rank 0 and given on rank 1" \
  "--epochs 1" "--epochs 1 --export-state-dict $work/rank1-export.pt"
both_refuse different_memory_format "differ in their command-line flags: --channels-last is not given on rank 0 and given on rank 1" \
  "--epochs 1" "--epochs 1 --channels-last"
both_refuse checkpoint_on_one_rank "--checkpoint is not given on rank 0 and given on rank 1" \
  "--epochs 1" "--epochs 1 --checkpoint $work/rank1.pt"
both_refuse init_from_on_one_rank "--init-from is not given on rank 0 and given on rank 1" \
  "--epochs 1" "--epochs 1 --init-from $work/rank1-weights.pt"
# Data of the same size but other contents (another node's files at the
# same path), found by the trainer's fingerprints of the data.
both_refuse different_data "the ranks differ in the trainer's settings: training data is 200 images 1x28x28, labels crc32 [0-9a-f]+, images crc32 [0-9a-f]+ on rank 0 and 200 images 1x28x28, labels crc32 [0-9a-f]+, images crc32 [0-9a-f]+ on rank 1" \
  "--epochs 1 --data $work/data/mnist" "--epochs 1 --data $work/data/mnist-other"
# one_fails NAME BAD PATTERN "RANK0 FLAGS" "RANK1 FLAGS": rank BAD cannot
# read a file of its own (a node without the data, a damaged copy of the
# checkpoint); both ranks exit 1 at once, not after --dist-timeout (60 s
# here: a loaded machine takes seconds to start a rank), BAD printing
# PATTERN and the other naming rank BAD with it.
one_fails() {
  local name="$1" bad="$2" pattern="$3" start took r
  start=$(date +%s)
  ranks "$name" "$4 --dist-timeout 60" "$5 --dist-timeout 60"
  took=$(($(date +%s) - start))
  for r in 0 1; do
    local rc_var="rc$r" log="$work/$name.rank$r.log" want="$pattern"
    [ "$r" = "$bad" ] || want="lamp: rank $bad failed in preparing the run: .*$pattern.* \(rank $r stops too\)\.$"
    if [ "${!rc_var}" -ne 1 ]; then
      fail "$name: rank $r exited ${!rc_var}, expected 1"; tail -3 "$log" | sed 's/^/      /'; return
    fi
    if ! grep -qE -- "$want" "$log"; then
      fail "$name: rank $r's output lacks '$want'"; tail -3 "$log" | sed 's/^/      /'; return
    fi
  done
  if [ "$took" -ge 45 ]; then
    fail "$name: the ranks took $took s to stop"; return
  fi
  pass "$name ($took s)"
}
one_fails data_missing_on_one_rank 1 "train data not found in '$work/data/absent'" \
  "--epochs 1" "--epochs 1 --data $work/data/absent"
one_fails data_missing_on_rank_0 0 "train data not found in '$work/data/absent'" \
  "--epochs 1 --data $work/data/absent" "--epochs 1"
# An output only rank 0 writes, into a folder its node lacks: refused before
# training on both ranks, not after it on rank 0 alone.
one_fails export_folder_missing_on_rank_0 0 "--export-state-dict $work/absent/weights.pt: the folder $work/absent does not exist" \
  "--epochs 1 --export-state-dict $work/absent/weights.pt" "--epochs 1 --export-state-dict $work/weights.pt"
# Numbers are compared by value, not by spelling.
ranks spelling "--epochs 1 --lr 0.05" "--epochs 1 --lr 5e-2"
if [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]; then pass same_value_other_spelling
else fail "same_value_other_spelling: exits $rc0/$rc1"; fi

# A rank that never comes: the other says whom it waits for, then gives up
# after --dist-timeout naming it.
start=$(date +%s)
with_defaults --epochs 1 --dist-timeout 7
MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) WORLD_SIZE=2 RANK=0 \
  LOCAL_RANK=0 timeout 120 "$train" "${common[@]}" "${args[@]}" > "$work/lonely.log" 2>&1
rc=$? took=$(($(date +%s) - start))
if [ "$rc" -eq 1 ] && grep -q "waiting for 1 of 2 ranks at 127.0.0.1:" "$work/lonely.log" &&
    grep -q "but rank 1 never came" "$work/lonely.log" && [ "$took" -lt 30 ]; then
  pass "lonely_rank (${took} s)"
else
  fail "lonely_rank: exit $rc after ${took} s"; tail -3 "$work/lonely.log" | sed 's/^/      /'
fi

# A rank stopped with SIGSTOP during training: the other says each second
# (a quarter of --dist-timeout) that it waits, where and for whom, then stops
# with the collective's message once --dist-timeout has passed.
port=$(free_port)
with_defaults --epochs 100000 --dist-timeout 4
# Rank 0 under `timeout`: one that waited its default 10 minutes fails in
# 60 s. Rank 1 bare, to be stopped itself.
in_background stopped "$port" timeout -s KILL 60
for _ in $(seq 200); do grep -q "^epoch 2/" "$work/stopped.rank0.log" && break; sleep 0.1; done
kill -STOP "$pid1"
start=$(date +%s)
wait "$pid0"; rc=$?
took=$(($(date +%s) - start))
kill -9 "$pid1" 2> /dev/null; wait "$pid1" 2> /dev/null
if [ "$rc" -eq 1 ] && grep -q "failed on rank 0 of 2 (gloo)" "$work/stopped.rank0.log" &&
    grep -q "stopped answering (the timeout is 4 s" "$work/stopped.rank0.log" &&
    grep -q "^lamp::distributed: rank 0 of 2 has waited 3 s in " "$work/stopped.rank0.log" &&
    grep -Eq "^lamp::distributed: rank 0 of 2 has waited 1 s in .+ \(collective [0-9]+\) for rank 1, which has not reached it; giving up after 4 s \(--dist-timeout" \
      "$work/stopped.rank0.log" && [ "$took" -lt 20 ]; then
  pass "stopped_rank (${took} s)"
else
  fail "stopped_rank: exit $rc after ${took} s"; tail -3 "$work/stopped.rank0.log" | sed 's/^/      /'
fi

# A second job started on a running job's MASTER_PORT: its rank 1 says at
# once that the rendezvous is taken (the same WORLD_SIZE: rank 1 is already
# there) or another job's (another WORLD_SIZE), instead of joining it.
port=$(free_port)
with_defaults --epochs 100000
in_background busy "$port"
for _ in $(seq 300); do grep -q "^epoch 1/" "$work/busy.rank0.log" && break; sleep 0.1; done
for case in "2 already joined the rendezvous at 127.0.0.1:$port as rank 1" \
            "3 belongs to another job (world_size=2; this rank's is world_size=3)"; do
  world="${case%% *}" pattern="${case#* }"
  start=$(date +%s)
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE="$world" RANK=1 LOCAL_RANK=1 \
    timeout 60 "$train" "${common[@]}" "${args[@]}" > "$work/intruder$world.log" 2>&1
  rc=$? took=$(($(date +%s) - start))
  if [ "$rc" -eq 1 ] && grep -qF -- "$pattern" "$work/intruder$world.log" && [ "$took" -lt 15 ]; then
    pass "second_job_on_the_port_world_$world (${took} s)"
  else
    fail "second_job_on_the_port_world_$world: exit $rc after ${took} s"
    tail -3 "$work/intruder$world.log" | sed 's/^/      /'
  fi
done
kill -9 "$pid0" "$pid1" 2> /dev/null; wait "$pid0" "$pid1" 2> /dev/null

# A checkpoint of 2 ranks resumed by 1: the message says how many ranks to
# start and how, not a library option.
ranks two_rank_checkpoint "--epochs 1 --schedule constant --checkpoint $work/two.pt" \
  "--epochs 1 --schedule constant --checkpoint $work/two.pt"
"$train" "${common[@]}" --data "$work/data/mnist" --precision fp32 --batch-size 50 \
  --eval-batch-size 100 --epochs 2 --schedule constant --resume "$work/two.pt" \
  > "$work/one_rank_resume.log" 2>&1
rc=$?
if [ "$rc0" -eq 0 ] && [ "$rc" -eq 1 ] &&
   grep -q "resume with 2 ranks (torchrun --nproc_per_node 2)" "$work/one_rank_resume.log"; then
  pass one_rank_resumes_two_rank_checkpoint
else
  fail "one_rank_resumes_two_rank_checkpoint: exits $rc0/$rc"; tail -3 "$work/one_rank_resume.log" | sed 's/^/      /'
fi

# One rank's copy of the checkpoint damaged (cut short): every rank stops
# at once, before the rendezvous's timeout, and nothing is trained.
head -c 3000 "$work/two.pt" > "$work/two-damaged.pt"
one_fails damaged_checkpoint_on_one_rank 1 "$work/two-damaged.pt is damaged or not a checkpoint written by lamp" \
  "--epochs 2 --schedule constant --resume $work/two.pt" \
  "--epochs 2 --schedule constant --resume $work/two-damaged.pt"

# SIGINT to rank 1 alone (its node preempted, a signal to its process):
# both ranks stop at one step and write it; rank 1 exits 130, rank 0 (not
# signalled) exits 1 naming rank 1; both resume from the checkpoint.
port=$(free_port)
with_defaults --epochs 100000 --checkpoint "$work/asked.pt" --log-json "$work/asked.jsonl"
in_background asked "$port"
for _ in $(seq 300); do grep -q "^epoch 2/" "$work/asked.rank0.log" && break; sleep 0.1; done
kill -INT "$pid1"
# Ranks that go on training fail the case in 60 s rather than hold the whole
# script until ctest's timeout, which would lose its output.
for _ in $(seq 600); do
  kill -0 "$pid0" 2> /dev/null || kill -0 "$pid1" 2> /dev/null || break; sleep 0.1
done
for pid in "$pid0" "$pid1"; do
  kill -0 "$pid" 2> /dev/null && kill -9 "$pid"
done
wait "$pid0"; stop0=$?
wait "$pid1"; stop1=$?
step=$(grep -o '"asked_by_rank":1,.*"global_step":[0-9]*' "$work/asked.jsonl" | grep -o '[0-9]*$')
ranks asked_resumed "--epochs 100000 --max-steps $((${step:-0} + 2)) --resume $work/asked.pt" \
  "--epochs 100000 --max-steps $((${step:-0} + 2)) --resume $work/asked.pt"
if [ "$stop0" -eq 1 ] && [ "$stop1" -eq 130 ] && [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] &&
    [ -n "$step" ] &&
    grep -q "stopped with rank 1, which was asked to stop, .*holds step $step: nothing trained is lost" \
      "$work/asked.rank0.log" &&
    grep -q '"signal":null,"asked_by_rank":1' "$work/asked.jsonl" &&
    grep -q "resuming at epoch " "$work/asked_resumed.rank0.log" &&
    ! grep -q "error" "$work/asked.rank0.log" "$work/asked.rank1.log" \
      "$work/asked_resumed.rank0.log" "$work/asked_resumed.rank1.log"; then
  pass "one_rank_asked_to_stop (step $step)"
else
  fail "one_rank_asked_to_stop: exits $stop0/$stop1, resumed $rc0/$rc1, step '$step'"
  tail -n 2 "$work/asked.rank0.log" "$work/asked.rank1.log" "$work/asked_resumed.rank0.log" | sed 's/^/      /'
fi

echo "program ranks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
