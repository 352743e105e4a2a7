#!/usr/bin/env bash
# train_mnist as two ranks with the optimizer state sharded (--zero 1):
# it trains as the replicated run does, its per-rank checkpoint resumes
# exactly (and the replicated run's too), and a missing, mixed-up or other-stage checkpoint is refused on
# both ranks, naming the rank and the file; --reshard moves a checkpoint
# from 2 ranks to 1 and on to 3, but not one written inside an epoch; a run
# resumed into another checkpoint leaves the first one's shard files; a
# bf16 run's masters are read from its shard files by --init-from; a
# checkpoint name too long for its shards' names is refused before training,
# a killed run's shard temporaries are removed by the next run, and a run
# started afresh over a sharded checkpoint removes the earlier run's shards.
#   zero_program.sh TRAIN_MNIST MAKE_TEST_DATA WORK_DIR
set -uo pipefail
# shellcheck source=tests/distributed/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

train="$1" make_data="$2" work="$3"
rm -rf "$work" && mkdir -p "$work" || exit 1
"$make_data" "$work/data" > /dev/null || { echo "cannot make test data"; exit 1; }

passed=0 failed=0
pass() { echo "ok    $1"; passed=$((passed + 1)); }
fail() { echo "FAIL  $1"; failed=$((failed + 1)); }

# 200 training images: 100 per rank, batches of 50: 2 steps per epoch;
# AdamW at lr 0.003 unless the case gives --lr.
# ranks NAME FLAGS...: both ranks with the same flags; outputs in
# $work/NAME.rank{0,1}.log, exit codes in $rc0 and $rc1.
# nranks N NAME FLAGS...: the same with N ranks (1: a plain process);
# exit codes in ${rcs[@]}.
nranks() {
  local n="$1" name="$2" port=$(free_port) pids=() r lr=(--lr 0.003)
  shift 2
  [[ " $* " == *" --lr "* ]] && lr=()
  rcs=()
  for ((r = 0; r < n; r++)); do
    local env=(MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE="$n"
      RANK="$r" LOCAL_RANK="$r" LOCAL_WORLD_SIZE="$n")
    [ "$n" -eq 1 ] && env=()
    env "${env[@]}" timeout 120 \
      "$train" --no-progress --data "$work/data/mnist" --batch-size 50 \
      --eval-batch-size 100 --dist-timeout 20 --optimizer adamw "${lr[@]}" \
      "$@" > "$work/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do wait "${pids[$r]}"; rcs+=($?); done
}
ranks() { nranks 2 "$@"; rc0=${rcs[0]} rc1=${rcs[1]}; }

# all_ok NAME: every rank of the last nranks exited 0.
all_ok() {
  local r
  for r in "${!rcs[@]}"; do
    if [ "${rcs[$r]}" -ne 0 ]; then
      fail "$1: rank $r exited ${rcs[$r]}"; tail -3 "$work/$1.rank$r.log" | sed 's/^/      /'
      return 1
    fi
  done
}

both_ok() { # NAME
  if [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]; then return 0; fi
  fail "$1: exits $rc0/$rc1"
  tail -3 "$work/$1.rank0.log" "$work/$1.rank1.log" | sed 's/^/      /'
  return 1
}

# both_refuse NAME PATTERN0 PATTERN1 FLAGS...: both ranks exit 1 before
# training, rank r printing PATTERNr.
both_refuse() {
  local name="$1" patterns=("$2" "$3") r
  shift 3
  ranks "$name" "$@"
  for r in 0 1; do
    local rc_var="rc$r" log="$work/$name.rank$r.log"
    if [ "${!rc_var}" -ne 1 ]; then
      fail "$name: rank $r exited ${!rc_var}, expected 1"; tail -3 "$log" | sed 's/^/      /'; return
    fi
    if ! grep -qF -- "${patterns[$r]}" "$log"; then
      fail "$name: rank $r's output lacks '${patterns[$r]}'"; tail -3 "$log" | sed 's/^/      /'; return
    fi
    if grep -q "^epoch " "$log"; then
      fail "$name: rank $r trained before refusing"; return
    fi
  done
  pass "$name"
}

# The test loss of the last epoch line ("test loss 0.1234").
test_loss() { grep -oE 'test loss [0-9.]+' "$1" | tail -1 | awk '{print $3}'; }

# 1. Sharded and replicated AdamW from the same seed: the same curve. The
# reductions differ only in order, FP32: the printed losses agree to 1e-3.
ranks sharded --epochs 2 --zero 1 --checkpoint "$work/a.pt" \
  --export-state-dict "$work/a_weights.pt"
ranks replicated --epochs 2 --zero 0 --export-state-dict "$work/r_weights.pt"
if both_ok sharded && both_ok replicated; then
  a=$(test_loss "$work/sharded.rank0.log") b=$(test_loss "$work/replicated.rank0.log")
  if [ -n "$a" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }'; then
    pass "sharded_matches_replicated ($a vs $b)"
  else
    fail "sharded_matches_replicated: test loss '$a' vs '$b'"
  fi
  # Stage 2 (gradients reduce-scattered into the shards): the same curve.
  ranks stage2 --epochs 2 --zero 2 --checkpoint "$work/s2.pt"
  if both_ok stage2; then
    c=$(test_loss "$work/stage2.rank0.log")
    if [ -n "$c" ] && awk -v a="$c" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }'; then
      pass "stage2_matches_replicated ($c vs $b)"
    else
      fail "stage2_matches_replicated: test loss '$c' vs '$b'"
    fi
  fi
  # The manifest and rank 1's file of the last checkpoint (step 4), not the
  # first's (step 2): replaced when the manifest moved on.
  if [ -f "$work/a.pt" ] && [ -f "$work/a.pt.rank1-of-2.step4" ] &&
      [ ! -e "$work/a.pt.rank1-of-2.step2" ] && [ -s "$work/a_weights.pt" ]; then
    pass shard_files_replaced
  else
    fail "shard_files_replaced: $(cd "$work" && ls a.pt*)"
  fi
fi

# 2. One epoch, then a resume to two: the exported weights equal the
# straight run's, byte for byte.
ranks first --epochs 2 --max-steps 2 --zero 1 --checkpoint "$work/b.pt"
if both_ok first; then
  cp "$work/b.pt" "$work/b.pt.rank1-of-2.step2" "$work/data/"
  ranks resumed --epochs 2 --zero 1 --resume "$work/b.pt" --checkpoint "$work/b.pt" \
    --export-state-dict "$work/b_weights.pt"
  if both_ok resumed; then
    if cmp -s "$work/a_weights.pt" "$work/b_weights.pt"; then
      pass resume_is_exact
    else
      fail "resume_is_exact: the resumed run's weights differ from the straight run's"
    fi
  fi
  # The epoch-1 checkpoint again, for the refusals.
  cp "$work/data/b.pt" "$work/data/b.pt.rank1-of-2.step2" "$work/"
fi

# The same without sharding (a resumed data-parallel run once trained on
# zero gradients).
ranks whole_first --epochs 2 --max-steps 2 --zero 0 --checkpoint "$work/w.pt"
if both_ok whole_first; then
  ranks whole_resumed --epochs 2 --zero 0 --resume "$work/w.pt" \
    --export-state-dict "$work/w_weights.pt"
  if both_ok whole_resumed; then
    if cmp -s "$work/r_weights.pt" "$work/w_weights.pt"; then
      pass whole_resume_is_exact
    else
      fail "whole_resume_is_exact: the resumed run's weights differ from the straight run's"
    fi
  fi
fi

# 3. Refusals, on both ranks, before training.
mv "$work/b.pt.rank1-of-2.step2" "$work/saved_shard"
both_refuse missing_shard \
  "rank 1 failed in reading the checkpoint's shards" \
  "needs rank 1's shard of the optimizer state in $work/b.pt.rank1-of-2.step2, which is missing" \
  --epochs 2 --zero 1 --resume "$work/b.pt"
cp "$work/a.pt.rank1-of-2.step4" "$work/b.pt.rank1-of-2.step2"
both_refuse mixed_up_shard \
  "rank 1 failed in reading the checkpoint's shards: lamp: $work/b.pt was written with rank 1's shard of CRC-32" \
  ", the shard of rank 1 of 2 at step 4)" \
  --epochs 2 --zero 1 --resume "$work/b.pt"
head -c 1000 "$work/saved_shard" > "$work/b.pt.rank1-of-2.step2"
both_refuse damaged_shard \
  "rank 1 failed in reading the checkpoint's shards" \
  "b.pt.rank1-of-2.step2" \
  --epochs 2 --zero 1 --resume "$work/b.pt"
mv "$work/saved_shard" "$work/b.pt.rank1-of-2.step2"
# Copies: one that carries its shard files under its own name resumes from
# them; one without them refuses the original's shard file once another run
# has written it (here: another checkpoint's shard in its place).
cp "$work/b.pt" "$work/c.pt"
cp "$work/b.pt.rank1-of-2.step2" "$work/c.pt.rank1-of-2.step2"
cp "$work/b.pt" "$work/d.pt"
cp "$work/b.pt.rank1-of-2.step2" "$work/saved_shard"
cp "$work/a.pt.rank1-of-2.step4" "$work/b.pt.rank1-of-2.step2"
both_refuse copy_without_its_shards \
  "rank 1 failed in reading the checkpoint's shards: lamp: $work/d.pt was written with rank 1's shard of CRC-32" \
  "Another run, or a later checkpoint, has written them since" \
  --epochs 2 --zero 1 --resume "$work/d.pt"
ranks copy_with_its_shards --epochs 2 --zero 1 --resume "$work/c.pt" \
  --export-state-dict "$work/c_weights.pt"
if both_ok copy_with_its_shards; then
  if cmp -s "$work/a_weights.pt" "$work/c_weights.pt"; then
    pass copy_with_its_shards
  else
    fail "copy_with_its_shards: the resumed copy's weights differ from the straight run's"
  fi
fi
mv "$work/saved_shard" "$work/b.pt.rank1-of-2.step2"
both_refuse whole_resume_of_shards "resume with --zero 1" "resume with --zero 1" \
  --epochs 2 --zero 0 --resume "$work/b.pt"

# 4. A fine-tuning start from the sharded checkpoint's weights: the shards
# take them (not the initial weights). At lr 1e-9 the test loss stays the
# checkpoint's.
ranks init --epochs 1 --zero 1 --init-from "$work/a.pt" --lr 1e-9
if both_ok init; then
  a=$(test_loss "$work/sharded.rank0.log") b=$(test_loss "$work/init.rank0.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    pass "init_from_loads_the_shards ($b)"
  else
    fail "init_from_loads_the_shards: test loss $b, the checkpoint's $a"
  fi
fi

# 5. BF16 parameters: the export gathers the FP32 masters from both ranks.
# The masters start as the BF16 weights and take 2 AdamW steps in FP32, so
# nearly every value of the largest tensor (a weight) is finer than BF16:
# its low 16 bits are not zero, as they are in BF16 weights widened to FP32
# (what an export of the model's own weights would hold).
ranks bf16 --epochs 1 --precision bf16 --zero 1 --export-state-dict "$work/bf16.pt" \
  --checkpoint "$work/bf16_run.pt"
if both_ok bf16; then
  # Its checkpoint's masters are in the shard files: a start from its
  # weights reads them there, without a word; with a shard file gone, it
  # takes the BF16 copy and says why.
  nranks 1 bf16_init --epochs 1 --max-steps 1 --precision bf16 --init-from "$work/bf16_run.pt"
  if all_ok bf16_init; then
    if grep -qF "could not be read" "$work/bf16_init.rank0.log"; then
      fail "bf16_init_from_shards_reads_the_masters: it warned"
      grep -F "could not be read" "$work/bf16_init.rank0.log" | sed 's/^/      /'
    else
      pass bf16_init_from_shards_reads_the_masters
    fi
  fi
  shard=$(ls "$work"/bf16_run.pt.rank1-of-2.step* 2> /dev/null | head -1)
  if [ -n "$shard" ] && mv "$shard" "$work/away"; then
    nranks 1 bf16_init_gone --epochs 1 --max-steps 1 --precision bf16 \
      --init-from "$work/bf16_run.pt"
    mv "$work/away" "$shard"
    if all_ok bf16_init_gone; then
      if grep -q "could not be read.*$(basename "$shard")" "$work/bf16_init_gone.rank0.log"; then
        pass bf16_init_from_shards_without_one_says_it_takes_the_copy
      else
        fail "bf16_init_from_shards_without_one_says_it_takes_the_copy: no warning naming the file"
        tail -3 "$work/bf16_init_gone.rank0.log" | sed 's/^/      /'
      fi
    fi
  else
    fail "bf16_init_from_shards_without_one: no shard file of rank 1"
  fi
  finer=$(python3 - "$work/bf16.pt" <<'PY'
import array, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = max((i for i in z.infolist() if "/data/" in i.filename),
               key=lambda i: i.file_size)
    words = array.array("I", z.read(data))  # FP32, little-endian as this CPU
print(f"{sum(1 for w in words if w & 0xFFFF) / len(words):.3f}")
PY
  )
  if [ -n "$finer" ] && awk -v f="$finer" 'BEGIN { exit !(f > 0.5) }'; then
    pass "bf16_export ($finer of the largest tensor finer than BF16)"
  else
    fail "bf16_export: ${finer:-no readable file}: of the largest tensor finer than BF16 (FP32 masters: nearly all)"
  fi
fi

# 6. Another number of ranks (--reshard): 2 -> 1 -> 3, one checkpoint path.
# Three epochs: one on 2 ranks (2 steps), one alone (4 steps), one on 3;
# each resume re-shards every saved rank's optimizer state and goes on.
nranks 2 two --epochs 3 --max-steps 2 --zero 1 --checkpoint "$work/e.pt"
if all_ok two; then
  nranks 3 three_refused --epochs 3 --zero 1 --resume "$work/e.pt"
  refused=1
  for r in 0 1 2; do
    if [ "${rcs[$r]}" -ne 1 ] || grep -q "^epoch " "$work/three_refused.rank$r.log"; then refused=0; fi
  done
  log="$work/three_refused.rank0.log"
  if [ "$refused" -eq 1 ] && grep -qF "was trained on 2 ranks (data shards) but this run has 3" "$log" &&
      grep -qF -- "with --reshard" "$log"; then
    pass other_ranks_refused_without_reshard
  else
    fail "other_ranks_refused_without_reshard: exits ${rcs[*]}"; tail -3 "$log" | sed 's/^/      /'
  fi
  nranks 1 one --epochs 3 --max-steps 8 --zero 1 --resume "$work/e.pt" --reshard \
    --checkpoint "$work/e.pt"
  if all_ok one; then
    log="$work/one.rank0.log"
    if grep -qF "resuming at epoch 2 on 1 rank (the checkpoint's run had 2" "$log" &&
        [ -n "$(test_loss "$log")" ] && [ ! -e "$work/e.pt.rank1-of-2.step2" ]; then
      pass "reshard_2_to_1 (test loss $(test_loss "$log"))"
    else
      fail "reshard_2_to_1: $(cd "$work" && ls e.pt*)"; tail -3 "$log" | sed 's/^/      /'
    fi
  fi
  nranks 3 three --epochs 3 --zero 1 --resume "$work/e.pt" --reshard \
    --checkpoint "$work/e.pt"
  if all_ok three; then
    log="$work/three.rank0.log"
    if grep -qF "resuming at epoch 3 on 3 ranks (the checkpoint's run had 1" "$log" &&
        [ -n "$(test_loss "$log")" ] && compgen -G "$work/e.pt.rank2-of-3.step*" > /dev/null; then
      pass "reshard_1_to_3 (test loss $(test_loss "$log"))"
    else
      fail "reshard_1_to_3: $(cd "$work" && ls e.pt*)"; tail -3 "$log" | sed 's/^/      /'
    fi
  fi
fi
nranks 1 reshard_alone --epochs 1 --reshard
if [ "${rcs[0]}" -ne 0 ] && grep -qF -- "--resume" "$work/reshard_alone.rank0.log"; then
  pass reshard_needs_resume
else
  fail "reshard_needs_resume: exit ${rcs[0]}"; tail -3 "$work/reshard_alone.rank0.log" | sed 's/^/      /'
fi

# 7. A branch of a run: resumed from f.pt but writing g.pt, it leaves
# f.pt's shard files alone (only g.pt's own are replaced), so f.pt still
# resumes, and both continuations end on the straight run's weights.
ranks branch_first --epochs 2 --max-steps 2 --zero 1 --checkpoint "$work/f.pt"
if both_ok branch_first; then
  ranks branch --epochs 2 --zero 1 --resume "$work/f.pt" --checkpoint "$work/g.pt" \
    --export-state-dict "$work/g_weights.pt"
  if both_ok branch; then
    if [ -f "$work/f.pt.rank1-of-2.step2" ] && [ -f "$work/g.pt.rank1-of-2.step4" ]; then
      pass branch_keeps_the_source_shards
    else
      fail "branch_keeps_the_source_shards: $(cd "$work" && ls f.pt* g.pt*)"
    fi
    ranks branch_source_again --epochs 2 --zero 1 --resume "$work/f.pt" \
      --export-state-dict "$work/f_weights.pt"
    if both_ok branch_source_again; then
      if cmp -s "$work/a_weights.pt" "$work/g_weights.pt" &&
          cmp -s "$work/a_weights.pt" "$work/f_weights.pt"; then
        pass branch_and_source_resume_exactly
      else
        fail "branch_and_source_resume_exactly: the resumed runs' weights differ from the straight run's"
      fi
    fi
  fi
fi

# 8. A checkpoint written inside an epoch (step 1 of 2) is not resharded:
# the data would be split anew from the epoch's start, training some
# examples twice and others never. Refused before training.
nranks 2 inside_first --epochs 2 --max-steps 1 --zero 1 --checkpoint "$work/h.pt"
if all_ok inside_first; then
  nranks 1 inside_resharded --epochs 2 --zero 1 --resume "$work/h.pt" --reshard
  log="$work/inside_resharded.rank0.log"
  if [ "${rcs[0]}" -eq 1 ] && ! grep -q "^epoch " "$log" &&
      grep -qF "was written 1 steps into epoch 1, and a resume on another number of ranks splits the data anew" "$log"; then
    pass reshard_inside_an_epoch_refused
  else
    fail "reshard_inside_an_epoch_refused: exit ${rcs[0]}"; tail -3 "$log" | sed 's/^/      /'
  fi
fi

# 9. The ranks' shard files take longer names than the checkpoint: a name
# whose own temporaries fit NAME_MAX (255) but whose shards' do not is
# refused before training, on every rank. And a killed run's shard
# temporaries are removed by the next run on the checkpoint, its shard
# files kept.
long="$work/$(printf 'c%.0s' $(seq 212)).pt"
# The checkpoint's own name is named (215 characters), not the shard's at
# its first write (232), which is where the refusal used to come.
pattern="its file name is 215 characters, and the temporary file written beside it (${long##*/}.rank1-of-2.step2.tmp-<pid>-<n>) can take"
both_refuse shard_name_too_long "$pattern" "$pattern" --epochs 1 --zero 1 --checkpoint "$long"
touch "$work/s.pt.rank1-of-2.step2.tmp-99999-1"
ranks stale --epochs 1 --zero 1 --checkpoint "$work/s.pt"
if both_ok stale; then
  if [ -e "$work/s.pt.rank1-of-2.step2.tmp-99999-1" ]; then
    fail "stale_shard_temporaries_removed: the killed run's temporary is still there"
  elif [ ! -e "$work/s.pt.rank1-of-2.step2" ]; then
    fail "stale_shard_temporaries_removed: the run's own shard file is missing"
  else
    pass stale_shard_temporaries_removed
  fi
fi

# 10. A run started afresh (--overwrite-checkpoint) over e.pt, whose last
# manifest (case 6) was written by 3 ranks: the 3 ranks' shard files go
# with it at its first checkpoint, its own stay.
if compgen -G "$work/e.pt.rank2-of-3.step*" > /dev/null; then
  ranks afresh --epochs 1 --zero 1 --checkpoint "$work/e.pt" --overwrite-checkpoint
  if both_ok afresh; then
    if compgen -G "$work/e.pt.rank*-of-3.step*" > /dev/null ||
        [ ! -e "$work/e.pt.rank1-of-2.step2" ]; then
      fail "afresh_run_removes_the_earlier_shards: $(cd "$work" && ls e.pt*)"
    else
      pass afresh_run_removes_the_earlier_shards
    fi
  fi
else
  fail "afresh_run_removes_the_earlier_shards: case 6 left no 3-rank shard files"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
