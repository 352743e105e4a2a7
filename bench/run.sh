#!/usr/bin/env bash
# Times lamp's C++ training step (lamp_bench) and the same step in Python
# PyTorch at its best (bench/peer_pytorch.py: eager, fused optimizer,
# torch.compile, the whole step in one CUDA graph) on the same configurations
# (CNNs with SGD, a GPT with AdamW), on this machine, and writes
# bench/results/<device>-<date>.json and .md (bench/report.py), and a bar
# chart of the rates, .png (scripts/plot.py --bench; skipped without
# matplotlib). See bench/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/run.sh [options]

  --device cpu|cuda  where to run (default: cuda when nvidia-smi lists a GPU)
  --quick            only the MNIST CNN configurations, few steps (smoke test;
                     no GPT)
  --suite NAME       which configurations: default (on CUDA the GPT, then
                     the CNNs, while the call's time allows; on a CPU the
                     CNNs, then the GPT),
                     or float8: fp8 against amp-bf16 where FP8 pays (a GPT
                     of 4096-wide layers: 2 blocks, 32 heads, context 1024,
                     8 sequences, so 8,192 tokens a step; on a CPU a
                     1024-wide one, what the emulation costs); the default
                     run times the small GPT in both modes; or conv-bn
                     (CUDA): each --fused-bn level (off, on, conv) of
                     lamp's CUDA-graph step at ResNet18 b128/b512 and
                     ResNet50 b256/b512 in amp, beside PyTorch's whole-step
                     graph and torch.compile at their best; or gpt (CUDA):
                     lamp's GPT graph step with and without its fused
                     kernels (lamp-graph-fused; lamp-graph-only-*: each
                     alone) at the small shape and GPT-2 124M's, tanh
                     GELU, amp-bf16, beside PyTorch's whole-step graph and
                     torch.compile default and max-autotune (compilation
                     takes minutes)
  --steps N          timed steps for every configuration (default: per config)
  --warmup N         untimed steps for every configuration (default: per config)
  --repeats N        timed runs of every configuration and tool, back to back
                     after one warm-up (default: 5 on CUDA, 1 on CPU); the
                     report shows the median and the spread (max - min) /
                     median, flagged above 5%
  --min-seconds S    time at least S seconds of steps per run (default 0.75
                     on CUDA, 0 on CPU): more steps than --steps when faster
  --out DIR          results folder (default: bench/results); the .json and
                     .md reports, and a .png bar chart of the rates when
                     /usr/bin/python3 has matplotlib (python3-matplotlib)
  -h, --help         this text

Environment:
  LAMP_BENCH         the C++ benchmark (default build/release/bench/lamp_bench)
  LAMP_PYTHON_TORCH  Python with torch for the peer (default /usr/bin/python3);
                     without torch the PyTorch columns read "not run (no torch)"
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

device=""
quick=0
suite=default
steps_override=""
warmup_override=""
repeats=""
min_seconds=""
out_dir="bench/results"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --suite) suite="${2:?--suite needs default, float8, conv-bn or gpt}"; shift 2 ;;
    --steps) steps_override="${2:?--steps needs a number}"; shift 2 ;;
    --warmup) warmup_override="${2:?--warmup needs a number}"; shift 2 ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --min-seconds) min_seconds="${2:?--min-seconds needs a number}"; shift 2 ;;
    --out) out_dir="${2:?--out needs a folder}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    device=cuda
  else
    device=cpu
  fi
fi
case "$device" in
  cpu | cuda) ;;
  *) echo "run.sh: --device must be cpu or cuda, got '$device'" >&2; exit 2 ;;
esac
case "$suite" in
  default | float8 | conv-bn | gpt) ;;
  *) echo "run.sh: --suite must be default, float8, conv-bn or gpt, got '$suite'" >&2; exit 2 ;;
esac
if [ "$suite" = conv-bn ] && [ "$device" != cuda ]; then
  echo "run.sh: --suite conv-bn compares cuDNN's fused graphs: it needs --device cuda" >&2
  exit 2
fi
if [ "$suite" = gpt ] && [ "$device" != cuda ]; then
  echo "run.sh: --suite gpt times CUDA-graph steps and CUDA kernels: it needs --device cuda" >&2
  exit 2
fi
if [ "$suite" != default ] && [ "$quick" = 1 ]; then
  # Each suite's compiled columns would read "not run (--quick)", and its
  # headline would compare against the rest alone.
  echo "run.sh: --quick and --suite $suite do not go together (--quick runs" \
    "only the MNIST CNN)" >&2
  exit 2
fi
if [ "$device" = cuda ]; then
  # 5 runs of at least 0.75 s per cell keep the whole H100 run to about 9.5
  # minutes (bench/README.md, "How long a run takes").
  repeats="${repeats:-5}"
  min_seconds="${min_seconds:-0.75}"
else
  repeats="${repeats:-1}"
  min_seconds="${min_seconds:-0}"
fi
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --repeats must be a positive integer" >&2; exit 2; }

bench="${LAMP_BENCH:-build/release/bench/lamp_bench}"
if [ ! -x "$bench" ]; then
  echo "run.sh: no lamp benchmark at '$bench'; build it (cmake --build" \
    "build/release --target lamp_bench) or set LAMP_BENCH" >&2
  exit 1
fi

python="${LAMP_PYTHON_TORCH:-/usr/bin/python3}"
peer_status=ok
if ! "$python" -c 'import torch' >/dev/null 2>&1; then
  peer_status="not run (no torch)"
elif [ "$device" = cuda ] &&
  ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  peer_status="not run (torch without CUDA)"
fi
compile_status="$peer_status"
if [ "$peer_status" = ok ] &&
  ! "$python" -c 'import sys, torch; sys.exit(0 if hasattr(torch, "compile") else 1)' >/dev/null 2>&1; then
  compile_status="not run (torch < 2, no torch.compile)"
elif [ "$peer_status" = ok ] && [ "$quick" = 1 ]; then
  # The first torch.compile of a process takes 30-60 s on a 2-core CPU
  # (measured 2026-11-24 for the MNIST CNN): longer than the rest of --quick.
  compile_status="not run (--quick: torch.compile takes 30 s or more on a CPU)"
fi

# The peer's malloc as lamp_bench's: lamp_bench calls lamp::keep_host_memory()
# (--keep-host-memory on, its default), which sets glibc's mmap threshold to
# 32 MiB and its trim threshold to 256 MiB, so that the memory a step frees
# serves the next one instead of being unmapped and faulted in again. The
# Python peer gets the same two settings through glibc's variables; where
# the environment already tunes malloc, keep_host_memory() leaves it alone
# and both sides run with the environment's.
peer_env=()
if [ -z "${MALLOC_MMAP_THRESHOLD_:-}${MALLOC_TRIM_THRESHOLD_:-}" ] &&
  [[ "${GLIBC_TUNABLES:-}" != *glibc.malloc.mmap_threshold* ]] &&
  [[ "${GLIBC_TUNABLES:-}" != *glibc.malloc.trim_threshold* ]]; then
  peer_env=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456)
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
manifest="$work/manifest.tsv"
: >"$manifest"
# What the run did not run, for the report: rows a time budget skipped.
not_run="$work/not_run.txt"
: >"$not_run"
runs=0
failures=0
suffix=""
[ "$quick" = 1 ] && suffix="-quick"
[ "$suite" = float8 ] && suffix="-float8"
[ "$suite" = conv-bn ] && suffix="-conv-bn"
[ "$suite" = gpt ] && suffix="-gpt"

# report_so_far: the report of the rows finished, written after each row
# and replaced by the next: a run the device call's time limit kills (which
# removes $work) leaves the rows it had measured, marked as a run that did
# not end.
report_so_far() {
  mkdir -p "$out_dir"
  { cat "$not_run"
    echo "the rows after these: the run had not ended when this report was" \
      "written (stopped, or killed at a time limit)"
  } >"$work/not_run_yet.txt"
  if ! python3 bench/report.py "$manifest" "$out_dir" "$device" "$suffix" \
      "$python" "$work/stem" "$work/not_run_yet.txt" >/dev/null; then
    echo "run.sh: the report of the rows so far failed (see above)" >&2
  fi
}

# run_tools "TOOLS" MODEL BATCH PRECISION CHANNELS_LAST CUDNN_BENCHMARK WARMUP
#           STEPS [FLAG...]
# runs every tool of the list on one configuration and adds a line per tool
# to the manifest; the FLAGs go to every tool (run_gpt's shape and epoch).
# Tools: lamp (eager step), lamp-graph (the step as a CUDA graph),
# lamp-graph-stock-bn (the same without the fused BatchNorm + ReLU kernels:
# what they gain), lamp-graph-conv-bn (the same with BatchNorm folded into
# the convolutions, --fused-bn conv), lamp-graph-fused (the GPT's CUDA-graph
# step with its opt-in fused kernels: --fused-add-norm --fused-mlp
# --fused-head-loss --fused-weight-cast --fused-bias-grad, and
# --fp8-fused-casts in fp8),
# lamp-graph-only-add-norm, -mlp, -head-loss, -weight-cast, -bias-grad,
# -fp8-casts (the same step with one of those kernels alone: which of them
# pays; shown in the report's own table, never ranked),
# lamp-graph-sdpa-flash, -efficient, -cudnn (the GPT's CUDA-graph step with
# one attention kernel allowed, --attention; shown in the report, never
# ranked), pytorch-eager (foreach
# optimizer), pytorch-fused (fused
# SGD, or AdamW for gpt), pytorch-compile / pytorch-compile-fused
# (torch.compile, foreach / fused optimizer), pytorch-compile-ro /
# pytorch-compile-ro-fused (torch.compile mode="reduce-overhead": CUDA
# graphs), pytorch-compile-max-fused (mode="max-autotune": autotuned
# products and CUDA graphs), pytorch-graph (the whole step in one CUDA
# graph, fused optimizer). Each lamp tool is one lamp_bench process; the
# PyTorch tools share one Python process, one after the other, in the order
# given (a compile after another of the same model reuses its kernels).
# Every tool warms up once (cuDNN autotuning, compilation, graph capture),
# calibrates its step count to --min-seconds, and times that count $repeats
# times back to back: start-up, autotuning and compilation are paid once per
# tool instead of once per timed run (they were two thirds of a run's time).
run_tools() {
  local tools="$1" model="$2" batch="$3" precision="$4" cl="$5" cb="$6"
  local warmup="${warmup_override:-$7}" steps="${steps_override:-$8}"
  local args=(--model "$model" --batch-size "$batch" --precision "$precision"
    --device "$device" --warmup "$warmup" --steps "$steps"
    --min-seconds "$min_seconds" --repeats "$repeats")
  case "$model" in
    cnn) args+=(--epoch-images 60000) ;;
    gpt) ;; # run_gpt's flags say its epoch
    *) args+=(--epoch-images 50000) ;;
  esac
  args+=("${@:9}")
  [ "$cl" = 1 ] && args+=(--channels-last)
  [ "$cb" = 1 ] && args+=(--cudnn-benchmark)
  local tool status json peers=() peer_statuses=() peer_args=()
  for tool in $tools; do
    case "$tool" in
      lamp | lamp-graph | lamp-graph-stock-bn | lamp-graph-conv-bn | lamp-graph-fused | \
        lamp-graph-only-* | lamp-graph-sdpa-flash | lamp-graph-sdpa-efficient | \
        lamp-graph-sdpa-cudnn)
        runs=$((runs + 1))
        json="$work/$runs-$tool.json"
        local extra=()
        [ "$tool" = lamp-graph ] && extra=(--cuda-graph)
        [ "$tool" = lamp-graph-stock-bn ] && extra=(--cuda-graph --fused-bn off)
        [ "$tool" = lamp-graph-conv-bn ] && extra=(--cuda-graph --fused-bn conv)
        [ "$tool" = lamp-graph-sdpa-flash ] && extra=(--cuda-graph --attention flash)
        [ "$tool" = lamp-graph-sdpa-efficient ] &&
          extra=(--cuda-graph --attention memory-efficient)
        [ "$tool" = lamp-graph-sdpa-cudnn ] && extra=(--cuda-graph --attention cudnn)
        if [ "$tool" = lamp-graph-fused ]; then
          extra=(--cuda-graph --fused-add-norm --fused-mlp --fused-head-loss
            --fused-weight-cast --fused-bias-grad)
          [ "$precision" = fp8 ] && extra+=(--fp8-fused-casts)
        fi
        case "$tool" in
          lamp-graph-only-fp8-casts) extra=(--cuda-graph --fp8-fused-casts) ;;
          lamp-graph-only-*) extra=(--cuda-graph "--fused-${tool#lamp-graph-only-}") ;;
        esac
        run_one "$tool" "$json" "$bench" "${args[@]}" "${extra[@]}" --json "$json"
        record "$tool" "$model" "$batch" "$precision" "$cl" "$cb" "$json"
        # On a CPU the peer runs with lamp's thread count: torch 2.x's
        # default (every vCPU) against LibTorch's (physical cores) measured
        # the thread pools, not the step (20x apart on a busy 2-vCPU machine).
        if [ "$device" = cpu ] && [ -s "$json" ]; then
          peer_args=(--threads "$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["threads"])' "$json")")
        fi ;;
      pytorch-compile*) peers+=("$tool"); peer_statuses+=("$compile_status") ;;
      *) peers+=("$tool"); peer_statuses+=("$peer_status") ;;
    esac
  done
  [ ${#peers[@]} -eq 0 ] && return
  local runnable=() i
  for i in "${!peers[@]}"; do
    [ "${peer_statuses[$i]}" = ok ] && runnable+=("${peers[$i]}")
  done
  runs=$((runs + 1))
  json="$work/$runs-pytorch.json"
  if [ ${#runnable[@]} -gt 0 ]; then
    local list
    list=$(IFS=,; echo "${runnable[*]}")
    partly=1 run_one "$list" "$json" env "${peer_env[@]}" "$python" \
      bench/peer_pytorch.py "${args[@]}" "${peer_args[@]}" --tools "$list" \
      --json "$json"
  fi
  for i in "${!peers[@]}"; do
    if [ "${peer_statuses[$i]}" = ok ]; then
      record "${peers[$i]}" "$model" "$batch" "$precision" "$cl" "$cb" "$json"
    else
      status="${peer_statuses[$i]}" record "${peers[$i]}" "$model" "$batch" \
        "$precision" "$cl" "$cb" "$json"
    fi
  done
  report_so_far
}

# run_one LABEL JSON COMMAND...: runs a benchmark process; a failure (or no
# JSON written) marks the tools of this run as failed in the manifest. With
# partly=1, exit 3 with the JSON written (peer_pytorch.py: some of its tools
# failed, each result says which) counts as a failure of the run but keeps
# the JSON, whose other tools' results stand.
declare -A failed=()
run_one() {
  local label="$1" json="$2"
  shift 2
  echo "== [$(date +%T)] $label: ${*:2}" >&2
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -eq 3 ] && [ "${partly:-0}" = 1 ] && [ -s "$json" ]; then
    failures=$((failures + 1))
    echo "== $label: some of its tools failed (their cells say why)" >&2
  elif [ "$rc" -ne 0 ] || [ ! -s "$json" ]; then
    failed[$json]="failed (exit $rc)"
    failures=$((failures + 1))
    echo "== $label failed (exit $rc)" >&2
  fi
}

# run_gpt "TOOLS" BATCH PRECISION WARMUP STEPS LAYERS HEADS WIDTH CONTEXT:
# run_tools for lamp's GPT (dropout 0) of that shape, BATCH sequences of
# CONTEXT byte tokens per step, AdamW (bench/README.md, "The GPT rows"). An
# epoch is a million tokens (about the training part of a 1 MB text), in
# sequences of CONTEXT tokens.
run_gpt() {
  local tools="$1" batch="$2" precision="$3" warmup="$4" steps="$5"
  local layers="$6" heads="$7" width="$8" context="$9"
  local vocab=256 rest=("${@:10}") i
  for i in "${!rest[@]}"; do
    [ "${rest[$i]}" = --gpt-vocab ] && vocab="${rest[$((i + 1))]}"
  done
  # The report's row: two shapes at the same batch and mode are two rows.
  row_shape="$layers,$heads,$width,$context,$vocab"
  run_tools "$tools" gpt "$batch" "$precision" 0 0 "$warmup" "$steps" \
    --gpt-layers "$layers" --gpt-heads "$heads" --gpt-width "$width" \
    --context "$context" --epoch-images "$((1000000 / context))" "${@:10}"
  row_shape=""
}

# time_left SECONDS WHAT: whether the run so far leaves SECONDS more inside
# the GPU call's budget (LAMP_BENCH_BUDGET_S, default 450: the GPU check's
# bench call, under its 540 s limit less unpacking and report.py, which the
# 560 of before left no room for: a run of 2026-11-28 was killed at 540 s
# before its tables); if not, says which rows are skipped and where they run.
time_left() {
  local need="$1" what="$2" budget="${LAMP_BENCH_BUDGET_S:-450}"
  if (( SECONDS + need <= budget )); then
    return 0
  fi
  echo "run.sh: $what skipped: ${SECONDS}s of the ${budget}s budget" \
    "spent, about ${need}s more needed (LAMP_BENCH_BUDGET_S raises it;" \
    "--suite gpt and --suite float8 run the GPT's rows alone)" >&2
  echo "$what: skipped by the time budget (${SECONDS} s of" \
    "LAMP_BENCH_BUDGET_S=${budget} spent, about ${need} s more needed)" \
    >>"$not_run"
  return 1
}

# record TOOL MODEL BATCH PRECISION CHANNELS_LAST CUDNN_BENCHMARK JSON: one
# manifest line (status from $status when set, else the run's outcome; a GPT
# row's shape from run_gpt's $row_shape).
row_shape=""
record() {
  local line_status="${status:-${failed[$7]:-ok}}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" \
    "$line_status" "$7" "$row_shape" >>"$manifest"
}

cnn_modes=(fp32 amp-bf16 bf16)
# The GPT's opt-in fused kernels one at a time, each in lamp's CUDA-graph
# step alone: which of them makes the step faster, and so may become the
# default (lamp-graph-fused times them all together).
fused_one_tools="lamp-graph-only-add-norm lamp-graph-only-mlp lamp-graph-only-head-loss"
fused_one_tools+=" lamp-graph-only-weight-cast lamp-graph-only-bias-grad"
if [ "$suite" = conv-bn ]; then
  # BatchNorm's three levels where the GPU is busy (BatchNorm was 46% of
  # ResNet50 b512's step at the fused level on an H200), each beside
  # Python's best for these models: the whole step in one CUDA graph and
  # torch.compile reduce-overhead with the fused optimizer.
  for config in "resnet18 128" "resnet18 512" "resnet50 256" "resnet50 512"; do
    read -r model batch <<<"$config"
    run_tools "lamp-graph-stock-bn lamp-graph lamp-graph-conv-bn pytorch-graph pytorch-compile-ro-fused" \
      "$model" "$batch" amp 1 1 10 30
  done
elif [ "$suite" = gpt ]; then
  # The GPT's opt-in fused kernels (residual add + norm, bias + GELU in the
  # products' epilogues, head + cross-entropy, the weight casts in one pass,
  # the bias gradients in the weight-gradient products) in lamp's
  # CUDA-graph step, together and one at a time, beside the same step
  # without them and Python's best: the whole step in one CUDA graph and
  # torch.compile, default and max-autotune. The tanh GELU (GPT-2's) on
  # both sides, so that cuBLASLt's GELU epilogue applies.
  gpt_tools="lamp-graph lamp-graph-fused $fused_one_tools"
  gpt_tools+=" pytorch-graph pytorch-compile-fused pytorch-compile-max-fused"
  run_gpt "$gpt_tools" 16 amp-bf16 10 30 6 6 384 1024 --gpt-gelu tanh
  run_gpt "$gpt_tools" 8 amp-bf16 5 20 12 12 768 1024 --gpt-vocab 50304 \
    --gpt-gelu tanh
elif [ "$suite" = float8 ]; then
  # FP8 pays where the matrix products dominate the step: 4096-wide MLPs,
  # batch x sequence >= 8192. lamp's GPT with width 4096
  # has exactly those MLPs (4096 -> 16384 -> 4096) beside 4096-wide
  # attention projections: 2 blocks, 408 M parameters, 8 sequences of 1024
  # tokens. Tools: each side's best for FP8 (Python's is torch.compile,
  # which fuses the casts); the CUDA-graph step for lamp. nanoGPT's small
  # shape, where the casts' memory traffic weighs more, is in the default
  # run in both modes: not repeated here, so that the suite stays short.
  if [ "$device" = cuda ]; then
    for p in amp-bf16 fp8; do
      run_gpt "lamp lamp-graph pytorch-fused pytorch-compile-fused" \
        8 "$p" 5 20 2 32 4096 1024 --gpt-gelu tanh
    done
  else
    # A CPU has no FP8 units: its emulated _scaled_mm says what the casts
    # and the emulation cost, at a width a CPU steps through in seconds
    # (1 block of width 1024, 8 sequences of 128 tokens: 13.0 M parameters).
    for p in amp-bf16 fp8; do
      run_gpt "lamp pytorch-fused pytorch-compile-fused" 8 "$p" 2 10 1 8 1024 128
    done
  fi
elif [ "$quick" = 1 ]; then
  # The CPU tools (the CUDA graph reports why it does not run on a CPU).
  quick_tools="lamp pytorch-eager pytorch-fused pytorch-graph pytorch-compile-fused"
  for p in "${cnn_modes[@]}"; do run_tools "$quick_tools" cnn 64 "$p" 0 0 1 5; done
elif [ "$device" = cpu ]; then
  # A CNN step takes ~10 ms on a CPU: 400 timed steps (seconds, not tenths)
  # keep run-to-run noise to a few percent. torch.compile for the CNN and the
  # GPT only: compiling ResNet18 takes minutes per mode on a small CPU.
  cpu_tools="lamp pytorch-eager pytorch-fused"
  for p in "${cnn_modes[@]}"; do
    run_tools "$cpu_tools pytorch-compile-fused" cnn 64 "$p" 0 0 20 400
  done
  for p in "${cnn_modes[@]}"; do run_tools "$cpu_tools" resnet18 32 "$p" 0 0 2 10; done
  # A small GPT (4 layers, 4 heads, width 256, context 128; 3.3 M
  # parameters): a step of 8 sequences takes about 0.3 s in fp32 on one
  # core, and the first torch.compile of its process about 25 s. fp8 runs
  # on the CPU's emulated _scaled_mm (LibTorch 2.5 and newer; skipped with
  # the reason before): its numbers say what the emulation costs, not what
  # FP8 gains.
  for p in fp32 amp-bf16 fp8; do
    run_gpt "$cpu_tools pytorch-compile-fused" 8 "$p" 2 10 4 4 256 128
  done
else
  # On CUDA the rows run in the order of what is owed, each block after the
  # first only while the GPU call's time allows (time_left; the whole run
  # took 7.3 minutes at 3 repeats on an H200, 2026-11-30, before the blocks
  # added after the small GPT's): first the GPT rows whose figures decide
  # the GPT's defaults (its opt-in fused kernels at the small shape and
  # GPT-2 124M's, FP8 where it should pay), then the CNN rows measured on
  # every run since 2026-11-23, then lamp alone in tf32 and fp32.
  #
  # nanoGPT's small character-level GPT (6 layers, 6 heads, width 384) at
  # context 1024 (11.1 M parameters), 16 sequences (16,384 tokens) a step,
  # in amp-bf16 (the mode GPT trainers use), lamp's graph step with and
  # without its fused kernels (lamp-graph-fused) beside Python's best: the
  # whole step in one CUDA graph and torch.compile (44 s on an H200). Both
  # sides use GPT-2's tanh GELU, which cuBLASLt's GELU epilogue computes
  # (until 2026-11-30 these rows used the exact GELU: one elementwise kernel
  # either way). PyTorch eager with foreach AdamW (0.98x fused on an H200)
  # and the reduce-overhead compilation were never the best column and are
  # left out.
  # Beside them, the graph step with each attention kernel forced, for the
  # default a device should get (about 5 s each).
  small_gpt_tools="lamp lamp-graph lamp-graph-fused lamp-graph-sdpa-flash"
  small_gpt_tools+=" lamp-graph-sdpa-efficient lamp-graph-sdpa-cudnn"
  small_gpt_tools+=" pytorch-fused pytorch-graph pytorch-compile-fused"
  run_gpt "$small_gpt_tools" 16 amp-bf16 10 30 6 6 384 1024 --gpt-gelu tanh
  # The same row with each fused kernel alone (five lamp processes, about
  # 5 s each): which of them pays, the figure that decides each one's
  # default.
  if time_left 35 "the small GPT's fused kernels one at a time"; then
    run_gpt "$fused_one_tools" 16 amp-bf16 10 30 6 6 384 1024 --gpt-gelu tanh
  fi
  # GPT-2 124M's shape with its vocabulary and GELU (llm.c's and nanoGPT's
  # reference model), the same tools.
  if time_left 90 "the GPT-2 124M rows"; then
    run_gpt "lamp-graph lamp-graph-fused pytorch-graph pytorch-compile-fused" \
      8 amp-bf16 5 20 12 12 768 1024 --gpt-vocab 50304 --gpt-gelu tanh
  fi
  # Where FP8 should pay (the float8 suite's 4096-wide GPT: 2 blocks, 408 M
  # parameters, 8 sequences of 1024 tokens), lamp's graph step with and
  # without its fused kernels (in fp8 the one-pass casts too) beside the
  # compiled Python twin.
  if time_left 130 "the 4096-wide FP8 rows"; then
    for p in amp-bf16 fp8; do
      run_gpt "lamp-graph lamp-graph-fused pytorch-compile-fused" 8 "$p" 5 20 2 32 4096 1024 \
        --gpt-gelu tanh
    done
  fi
  # The CNN targets' configurations: amp with channels_last and
  # cudnn.benchmark, every tool at its best (the foreach torch.compile
  # tools, pytorch-compile and pytorch-compile-ro, would add about 90 s: run
  # them with peer_pytorch.py --tools). ResNet50 first: the row where lamp
  # is behind (122 s on an H200; ResNet18's rows 72 s each).
  all_tools="lamp lamp-graph pytorch-eager pytorch-fused pytorch-graph pytorch-compile-fused pytorch-compile-ro-fused"
  for config in "resnet50 512 125" "resnet18 128 75" "resnet18 512 75"; do
    read -r model batch need <<<"$config"
    time_left "$need" "the $model b$batch amp rows" || continue
    tools="$all_tools"
    # What the fused BatchNorm + ReLU kernels gain where the GPU is busy.
    [ "$model" = resnet50 ] && tools="$tools lamp-graph-stock-bn"
    run_tools "$tools" "$model" "$batch" amp 1 1 10 30
  done
  # The same small GPT with FP8 products (sm_89 and newer; skipped below),
  # against the Python twin of lamp's FP8 layer (peer_pytorch.py's
  # Float8Linear), eager and compiled (40 s), and lamp's graph step with
  # its fused kernels and with the one-pass FP8 casts alone (about 10 s
  # more): at this width the casts cost more than the FP8 products gain.
  if time_left 55 "the small GPT's fp8 rows"; then
    run_gpt "lamp lamp-graph lamp-graph-fused lamp-graph-only-fp8-casts pytorch-fused pytorch-compile-fused" \
      16 fp8 10 30 6 6 384 1024 --gpt-gelu tanh
  fi
  # lamp in tf32 (the default a Python user gets for convolutions on an
  # H100) and fp32, for the mixed-precision speed-up, and ResNet18 b128
  # fp32 for the seed's table (69 s).
  if time_left 70 "lamp's tf32 and fp32 rows"; then
    run_tools lamp resnet50 512 tf32 1 1 5 10
    run_tools lamp resnet50 512 fp32 1 1 5 10
    run_tools lamp resnet18 128 fp32 1 1 5 30
  fi
fi

mkdir -p "$out_dir"
python3 bench/report.py "$manifest" "$out_dir" "$device" "$suffix" "$python" \
  "$work/stem" "$not_run"

# The bar chart beside them, by scripts/plot.py with Debian's python3 (its
# interpreter, where python3-matplotlib installs). Without matplotlib the
# JSON and markdown stand alone.
stem="$(cat "$work/stem")"
plot_python=/usr/bin/python3
chart_status=0
if why="$("$plot_python" -c 'import matplotlib' 2>&1)"; then
  if ! "$plot_python" scripts/plot.py --bench "$stem.json" >/dev/null; then
    echo "run.sh: drawing $stem.png failed (the JSON and markdown are" \
      "written)" >&2
    chart_status=1
  else
    echo "wrote $stem.png"
  fi
else
  echo "run.sh: bar chart skipped: $plot_python cannot import matplotlib" \
    "(${why##*$'\n'}); apt-get install python3-matplotlib to get" \
    "$stem.png" >&2
fi

if [ "$failures" -gt 0 ]; then
  echo "run.sh: $failures of $runs runs failed" >&2
  exit 1
fi
exit "$chart_status"
