#!/usr/bin/env bash
# train_mnist started by torchrun with two CPU ranks (Gloo) on Fashion-MNIST:
# it must reach the single-process accuracy band (>= 88% after 2 epochs) and
# only rank 0 may log. The ranks train in the mode --precision auto picks for
# this CPU (amp-bf16 with BF16 hardware, fp32 without), so that the test
# fits the hardware it runs on. Exit 77 (ctest: skipped) where /usr/bin/python3 has no
# torch (torchrun comes with Debian's python3-torch).
# Usage: torchrun_mnist.sh <train_mnist> <log.jsonl>
set -euo pipefail
# shellcheck source=tests/distributed/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"
program="$1"
log="$2"
if ! /usr/bin/python3 -c "import torch.distributed.run" 2>/dev/null; then
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
# torchrun's agent serves the TCPStore the ranks meet at; its wire protocol
# changed between 1.13 and 2.x, so the program must use the same LibTorch
# as that torchrun (Debian's 1.13).
torch_version=$(/usr/bin/python3 -c "import torch; print(torch.__version__.split('+')[0][:4])")
libraries=$(ldd "$program")
if [[ "$libraries" != *"libtorch_cpu.so.${torch_version}"* ]]; then
  echo "skipped: $program does not use the LibTorch of /usr/bin/python3's torchrun (${torch_version})"
  exit 77
fi
rm -f "$log"
port=$(free_port)
# --redirects 1 --tee 1: Debian's torchrun 1.13 on Python 3.11 fails on its
# default (no redirection); this sends stdout to its log files and the console.
/usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 \
  --master_port "$port" --redirects 1 --tee 1 --no_python \
  "$program" --precision auto --epochs 2 --device cpu --no-progress \
  --log-json "$log"
/usr/bin/python3 - "$log" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
kinds = [r["record"] for r in records]
# Rank 0 only: one run header, then one record per epoch, with step records
# (every 50 steps by default) before each epoch's.
steps = [r["global_step"] for r in records if r["record"] == "step"]
if [k for k in kinds if k != "step"] != ["run", "epoch", "epoch"] or \
        records[0]["world_size"] != 2:
    sys.exit("expected rank 0's run record and 2 epoch records, got %s" % kinds)
if not steps or steps != sorted(set(steps)):
    sys.exit("expected rank 0's step records once each, got steps %s" % steps)
accuracy = records[-1]["test_accuracy"]
print("final test accuracy: %.4f (required: >= 0.88)" % accuracy)
sys.exit(0 if accuracy >= 0.88 else 1)
PY
