#!/usr/bin/env bash
# Installs what is missing, builds lamp and its examples (Release, Debian's
# LibTorch) into build/release, and trains on Fashion-MNIST. Extra arguments go
# to the training program.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  echo "Usage: scripts/quickstart.sh [extra flags for train_mnist / train_cifar10...]"
  echo "Builds lamp (Release) and trains in fp32, amp-bf16 and bf16, side by side;"
  echo "charts of the runs land in runs/quickstart/ (scripts/plot.py)."
  echo "On a CPU without BF16 hardware (no AVX512-BF16 or AMX-BF16), where the BF16"
  echo "modes are emulated and many times slower than fp32, the BF16 runs are short"
  echo "demonstrations (--max-steps) unless told otherwise."
  echo "LAMP_QUICKSTART_EPOCHS sets the epochs per run (default 2)."
  echo "LAMP_QUICKSTART_BF16 = auto (default: full where BF16 is native, short where"
  echo "  emulated) | full | short | skip."
  echo "LAMP_QUICKSTART_SHORT_STEPS sets the steps of a short run (default 30)."
  exit 0
fi

data=/usr/share/datasets/fashion-mnist
build=build/release

lamp_ensure_packages "${LAMP_BUILD_PACKAGES[@]}" dataset-fashion-mnist python3-matplotlib
lamp_configure_and_build "$build" "$(lamp_nproc)" -DLAMP_BUILD_TESTS=OFF

runs=runs/quickstart
mkdir -p "$runs"

# The last epoch's FIELD from a JSON-lines log written by --log-json.
field() { tail -n 1 "$1" | sed -E "s/.*\"$2\":([^,}]*).*/\1/"; }

cifar=data/cifar-10-batches-bin
if [ -f "$cifar/data_batch_1.bin" ]; then
  program=train_cifar10
  args=(--data "$cifar")
  lamp_log "CIFAR-10 found in $cifar: training a ResNet18 with train_cifar10"
else
  program=train_mnist
  args=(--data "$data")
  lamp_log "No CIFAR-10 in $cifar (scripts/get_cifar10.sh fetches it): training the MNIST CNN on Debian's Fashion-MNIST ($data)"
fi

# FP32 against mixed precision. This build uses Debian's CPU LibTorch, whose
# mixed precision is BF16: autocast (amp-bf16) and the converted network with
# FP32 master weights (bf16). Where the CPU has no BF16 hardware those two
# are emulated (about 16x slower than fp32), so they run a short
# demonstration instead of the whole epochs: the program's own table
# (--precision-support) decides.
support="$("$build/examples/$program" --precision-support --device cpu)"
printf '%s\n' "$support"
bf16_level="$(sed -nE 's/^  amp-bf16 +(native|emulated|unavailable) .*/\1/p' <<<"$support")"
bf16="${LAMP_QUICKSTART_BF16:-auto}"
case "$bf16" in
  auto) [ "$bf16_level" = native ] && bf16=full || bf16=short ;;
  full | short | skip) ;;
  *) lamp_die "LAMP_QUICKSTART_BF16=$bf16: give auto, full, short or skip" ;;
esac
short_steps="${LAMP_QUICKSTART_SHORT_STEPS:-30}"
if [ "$bf16" != full ]; then
  lamp_log "amp-bf16 and bf16 are $bf16_level on this CPU: $(
    [ "$bf16" = short ] && echo "short runs of $short_steps steps" || echo "skipped")"
fi

modes=(fp32)
[ "$bf16" != skip ] && modes+=(amp-bf16 bf16)
for mode in "${modes[@]}"; do
  log="$runs/$program-$mode.jsonl"
  rm -f "$log"
  extra=(--epochs "${LAMP_QUICKSTART_EPOCHS:-2}")
  if [ "$mode" != fp32 ] && [ "$bf16" = short ]; then
    # Its speed is the point; one evaluation batch (of 1,000) says it runs.
    extra=(--epochs 1 --max-steps "$short_steps" --limit-eval-batches 1)
  fi
  lamp_log "$program --precision $mode ${args[*]} ${extra[*]}"
  "$build/examples/$program" --precision "$mode" --log-json "$log" "${args[@]}" "${extra[@]}" "$@"
done

echo
printf '%-10s %14s %14s %12s %14s\n' precision "test accuracy" "s/epoch" "images/s" "peak memory"
for mode in "${modes[@]}"; do
  log="$runs/$program-$mode.jsonl"
  if [ "$mode" != fp32 ] && [ "$bf16" = short ]; then
    # A few steps: their speed is a measurement, their accuracy is not.
    printf '%-10s %14s %14s %12.0f %10.0f MiB  (%s steps; BF16 %s here)\n' "$mode" - - \
      "$(field "$log" images_per_second)" \
      "$(awk "BEGIN{print $(field "$log" peak_memory_bytes)/1048576}")" "$short_steps" "$bf16_level"
    continue
  fi
  printf '%-10s %13.2f%% %14.2f %12.0f %10.0f MiB\n' "$mode" \
    "$(awk "BEGIN{print 100*$(field "$log" test_accuracy)}")" \
    "$(field "$log" seconds)" "$(field "$log" images_per_second)" \
    "$(awk "BEGIN{print $(field "$log" peak_memory_bytes)/1048576}")"
done
echo "(last epoch of each run; logs in $runs/)"

# The runs overlaid: loss and test accuracy per epoch, loss per logged step,
# throughput (and the loss scale of runs that scale the loss). The
# charts are an extra; the runs and their logs stand without them.
# (Whole epochs only: a short run has no epoch to draw.)
logs=("$runs/$program-fp32.jsonl")
if [ "$bf16" = full ]; then
  logs+=("$runs/$program-amp-bf16.jsonl" "$runs/$program-bf16.jsonl")
fi
lamp_log "Plotting the runs: scripts/plot.py --out $runs ${logs[*]}"
if charts="$(scripts/plot.py --out "$runs" --title "$program" "${logs[@]}")"; then
  echo "charts: ${charts//$'\n'/ }"
else
  lamp_log "no charts (see the error above); the logs are in $runs/"
fi
