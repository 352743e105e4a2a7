#!/usr/bin/env bash
# Starts N copies of a command as the ranks of one process group on this
# machine (the variables torchrun would set), waits for all, and fails if any
# rank fails. Usage: run_ranks.sh N command [args...]
set -u -o pipefail
# shellcheck source=tests/distributed/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"
n="$1"
shift
port=$(free_port)
pids=()
for ((rank = 0; rank < n; rank++)); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE="$n" RANK="$rank" \
    LOCAL_RANK="$rank" LOCAL_WORLD_SIZE="$n" "$@" 2>&1 | sed "s/^/[rank $rank] /" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit "$status"
