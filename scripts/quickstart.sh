#!/usr/bin/env bash
# Installs what is missing, builds lamp and its examples (Release, Debian's
# LibTorch) into build/release, and trains on Fashion-MNIST. Extra arguments go
# to the training program.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$LAMP_ROOT"

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  echo "Usage: scripts/quickstart.sh [ARGS for train_mnist...]"
  exit 0
fi

data=/usr/share/datasets/fashion-mnist
build=build/release

lamp_ensure_packages "${LAMP_BUILD_PACKAGES[@]}" dataset-fashion-mnist
lamp_configure_and_build "$build" "$(lamp_nproc)" -DLAMP_BUILD_TESTS=OFF

if [ ! -x "$build/examples/train_mnist" ]; then
  lamp_log "lamp is built in $build. The real-data training programs (train_mnist on Fashion-MNIST, train_cifar10) come with the examples milestone."
  lamp_log "Meanwhile, a demo on SYNTHETIC data: train_step_demo in fp32 and in mixed precision (bf16 on this CPU)."
  for precision in fp32 bf16; do
    "$build/examples/train_step_demo" --precision "$precision" --steps 60
  done
  exit 0
fi
lamp_log "Training on Fashion-MNIST from $data"
exec "$build/examples/train_mnist" --data "$data" "$@"
