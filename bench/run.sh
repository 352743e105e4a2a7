#!/usr/bin/env bash
# Times lamp's C++ training step (lamp_bench) and the same step in Python
# PyTorch (bench/peer_pytorch.py) on the same configurations, on this machine,
# and writes bench/results/<device>-<date>.json and .md, and a bar chart of
# images/s, .png (scripts/plot.py --bench; skipped without matplotlib). See
# bench/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/run.sh [options]

  --device cpu|cuda  where to run (default: cuda when nvidia-smi lists a GPU)
  --quick            only the MNIST CNN configurations, few steps (smoke test)
  --steps N          timed steps for every configuration (default: per config)
  --warmup N         untimed steps for every configuration (default: per config)
  --repeats N        timed runs of every configuration and tool, back to back
                     after one warm-up (default: 3 on CUDA, 1 on CPU); the
                     report shows the median and the spread (max - min) /
                     median
  --min-seconds S    time at least S seconds of steps per run (default 2 on
                     CUDA, 0 on CPU): more steps than --steps when faster
  --out DIR          results folder (default: bench/results); the .json and
                     .md reports, and a .png bar chart of images/s when
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
steps_override=""
warmup_override=""
repeats=""
min_seconds=""
out_dir="bench/results"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --quick) quick=1; shift ;;
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
if [ "$device" = cuda ]; then
  repeats="${repeats:-3}"
  min_seconds="${min_seconds:-2}"
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
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
manifest="$work/manifest.tsv"
: >"$manifest"
runs=0
failures=0

# run_tools "TOOLS" MODEL BATCH PRECISION CHANNELS_LAST CUDNN_BENCHMARK WARMUP
#           STEPS
# runs every tool of the list on one configuration and adds a line per tool
# to the manifest. Tools: lamp (eager step), lamp-graph (the step as a CUDA
# graph), pytorch-eager (foreach SGD), pytorch-fused (fused SGD),
# pytorch-compile (torch.compile), pytorch-compile-ro (torch.compile
# mode="reduce-overhead": CUDA graphs). Each lamp tool is one lamp_bench
# process; the PyTorch tools share one Python process, one after the other.
# Every tool warms up once (cuDNN autotuning, compilation, graph capture),
# calibrates its step count to --min-seconds, and times that count $repeats
# times back to back: start-up, autotuning and compilation are paid once per
# tool instead of once per timed run (they were two thirds of a run's time).
run_tools() {
  local tools="$1" model="$2" batch="$3" precision="$4" cl="$5" cb="$6"
  local warmup="${warmup_override:-$7}" steps="${steps_override:-$8}"
  local epoch_images=50000
  [ "$model" = cnn ] && epoch_images=60000
  local args=(--model "$model" --batch-size "$batch" --precision "$precision"
    --device "$device" --warmup "$warmup" --steps "$steps"
    --min-seconds "$min_seconds" --repeats "$repeats"
    --epoch-images "$epoch_images")
  [ "$cl" = 1 ] && args+=(--channels-last)
  [ "$cb" = 1 ] && args+=(--cudnn-benchmark)
  local tool status json peers=() peer_statuses=()
  for tool in $tools; do
    case "$tool" in
      lamp | lamp-graph)
        runs=$((runs + 1))
        json="$work/$runs-$tool.json"
        local extra=()
        [ "$tool" = lamp-graph ] && extra=(--cuda-graph)
        run_one "$tool" "$json" "$bench" "${args[@]}" "${extra[@]}" --json "$json"
        record "$tool" "$model" "$batch" "$precision" "$cl" "$cb" "$json" ;;
      pytorch-compile | pytorch-compile-ro) peers+=("$tool"); peer_statuses+=("$compile_status") ;;
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
    run_one "$list" "$json" "$python" bench/peer_pytorch.py "${args[@]}" \
      --tools "$list" --json "$json"
  fi
  for i in "${!peers[@]}"; do
    if [ "${peer_statuses[$i]}" = ok ]; then
      record "${peers[$i]}" "$model" "$batch" "$precision" "$cl" "$cb" "$json"
    else
      status="${peer_statuses[$i]}" record "${peers[$i]}" "$model" "$batch" \
        "$precision" "$cl" "$cb" "$json"
    fi
  done
}

# run_one LABEL JSON COMMAND...: runs a benchmark process; a failure (or no
# JSON written) marks the tools of this run as failed in the manifest.
declare -A failed=()
run_one() {
  local label="$1" json="$2"
  shift 2
  echo "== [$(date +%T)] $label: ${*:2}" >&2
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -ne 0 ] || [ ! -s "$json" ]; then
    failed[$json]="failed (exit $rc)"
    failures=$((failures + 1))
    echo "== $label failed (exit $rc)" >&2
  fi
}

# record TOOL MODEL BATCH PRECISION CHANNELS_LAST CUDNN_BENCHMARK JSON: one
# manifest line (status from $status when set, else the run's outcome).
record() {
  local line_status="${status:-${failed[$7]:-ok}}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" \
    "$line_status" "$7" >>"$manifest"
}

both() {
  run_tools "lamp pytorch-eager" "$@"
}

cnn_modes=(fp32 amp-bf16 bf16)
if [ "$quick" = 1 ]; then
  for p in "${cnn_modes[@]}"; do both cnn 64 "$p" 0 0 1 5; done
elif [ "$device" = cpu ]; then
  # A CNN step takes ~10 ms on a CPU: 400 timed steps (seconds, not tenths)
  # keep run-to-run noise to a few percent.
  for p in "${cnn_modes[@]}"; do both cnn 64 "$p" 0 0 20 400; done
  for p in "${cnn_modes[@]}"; do both resnet18 32 "$p" 0 0 2 10; done
else
  # The targets' configurations: amp with channels_last and cudnn.benchmark,
  # every tool; fp32 beside them for the memory and mixed-precision ratios.
  all_tools="lamp lamp-graph pytorch-eager pytorch-fused pytorch-compile pytorch-compile-ro"
  for config in "resnet18 128" "resnet18 512" "resnet50 512"; do
    read -r model batch <<<"$config"
    run_tools "$all_tools" "$model" "$batch" amp 1 1 10 30
  done
  run_tools lamp resnet50 512 fp32 1 1 5 10
  run_tools lamp resnet18 128 fp32 1 1 5 30
fi

mkdir -p "$out_dir"
suffix=""
[ "$quick" = 1 ] && suffix="-quick"
python3 - "$manifest" "$out_dir" "$device" "$suffix" "$python" "$work/stem" <<'PYEOF'
"""Joins the per-run JSON files of run.sh into one JSON report and markdown
tables: per configuration and tool, the median of the repeated runs and their
spread. Standard library only (no torch)."""
import datetime
import json
import os
import re
import statistics
import sys

manifest_path, out_dir, device, suffix, peer_python, stem_path = sys.argv[1:7]
TOOLS = ("lamp", "lamp-graph", "pytorch-eager", "pytorch-fused",
         "pytorch-compile", "pytorch-compile-ro")
TITLES = {"lamp": "lamp", "lamp-graph": "lamp (CUDA graph)",
          "pytorch-eager": "PyTorch eager", "pytorch-fused": "eager, fused SGD",
          "pytorch-compile": "torch.compile",
          "pytorch-compile-ro": "torch.compile reduce-overhead"}
KEY = ("model", "batch_size", "precision", "channels_last", "cudnn_benchmark")
SEED = [  # kentaroy47/pytorch-cifar10-fp16, RTX 2080 Ti, s/epoch
    {"model": "resnet18", "batch_size": 128, "fp32": 15.0, "fp16": 10.0},
    {"model": "resnet50", "batch_size": 512, "fp32": 58.0, "fp16": 27.0},
]

headers = {}  # tool -> the tool's top-level JSON fields
runs = {}     # (key, tool) -> [result or {"status": ...}] over the repeats
order = []
with open(manifest_path) as manifest:
    for line in manifest:
        tool, model, batch, precision, cl, cb, status, path = \
            line.rstrip("\n").split("\t")
        key = (model, int(batch), precision, cl == "1", cb == "1")
        if key not in order:
            order.append(key)
        entry = {"status": status}
        if status == "ok":
            with open(path) as f:
                report = json.load(f)
            headers.setdefault(tool, {k: v for k, v in report.items()
                                      if k != "results"})
            for result in report["results"]:
                # A process of several tools tags each result with its own.
                if result["precision"] == precision and \
                        result.get("tool", tool) == tool:
                    entry = dict(result, status="ok")
        runs.setdefault((key, tool), []).append(entry)


def ok(entry):
    return bool(entry) and entry.get("status") == "ok" and \
        not entry.get("skipped") and entry.get("images_per_second")


def summary(entries):
    """The median timed run (by images/s) with the spread of all of them:
    each entry's repeats_images_per_second, or its one rate."""
    good = sorted((e for e in entries if ok(e)),
                  key=lambda e: e["images_per_second"])
    if not good:
        return entries[0]
    median = dict(good[(len(good) - 1) // 2])
    rates = [rate for e in good
             for rate in e.get("repeats_images_per_second",
                               [e["images_per_second"]])]
    median["images_per_second"] = statistics.median(rates)
    median["seconds_per_epoch"] = median["epoch_images"] / \
        median["images_per_second"]
    median["runs_images_per_second"] = rates
    median["spread"] = (max(rates) - min(rates)) / statistics.median(rates)
    return median


rows = {key: {"key": dict(zip(KEY, key))} for key in order}
for (key, tool), entries in runs.items():
    rows[key][tool] = summary(entries)

first = next(iter(headers.values()), {})
device_name = first.get("device_name", device)
date = datetime.datetime.now(datetime.timezone.utc)
slug = "cpu" if device == "cpu" else \
    re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or device
stem = os.path.join(out_dir, "%s-%s%s" % (slug, date.strftime("%Y-%m-%d"),
                                          suffix))
notes = []


def rate(entry):
    return entry["images_per_second"] if ok(entry) else None


def seconds(entry):
    return entry["seconds_per_epoch"] if ok(entry) else None


def cell_rate(entry):
    if entry is None:
        return "-"
    if entry.get("status") != "ok":
        return entry["status"]
    if entry.get("skipped"):
        notes.append(entry["skipped"])
        return "skipped [%d]" % len(notes)
    text = "%.0f" % entry["images_per_second"]
    if len(entry.get("runs_images_per_second", [])) > 1:
        text += " (±%.1f%%)" % (50 * entry["spread"])
    return text


def cell_memory(entry):
    if not ok(entry) or entry.get("peak_memory_bytes") is None:
        return "-"
    return "%.0f MiB" % (entry["peak_memory_bytes"] / 2.0 ** 20)


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return "-"
    return "%.2fx" % (numerator / denominator)


def mode_text(key):
    parts = [key[2]]
    if key[3]:
        parts.append("channels_last")
    if key[4]:
        parts.append("cudnn.benchmark")
    return ", ".join(parts)


present = [t for t in TOOLS if any(t in rows[k] for k in order)]
table = []
for key in order:
    row = rows[key]
    lamp_best = max([r for r in (rate(row.get("lamp")), rate(row.get("lamp-graph")))
                     if r is not None], default=None)
    compiled = max([r for r in (rate(row.get("pytorch-compile")),
                                rate(row.get("pytorch-compile-ro")))
                    if r is not None], default=None)
    fp32 = rows.get((key[0], key[1], "fp32", key[3], key[4]), {}).get("lamp")
    table.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
        key[0], key[1], mode_text(key),
        " | ".join(cell_rate(row.get(t)) for t in present),
        ratio(lamp_best, rate(row.get("pytorch-eager"))),
        ratio(lamp_best, compiled), cell_memory(row.get("lamp")),
        "%s (%s)" % (cell_memory(fp32), ratio(
            (row.get("lamp") or {}).get("peak_memory_bytes"),
            (fp32 or {}).get("peak_memory_bytes"))) if ok(fp32) and key[2] != "fp32"
        else "-"))


def find(model, batch, precision, tool="lamp"):
    """The seed-comparable result: channels_last + benchmark first."""
    for cl, cb in ((True, True), (False, True), (False, False)):
        row = rows.get((model, batch, precision, cl, cb))
        if row and seconds(row.get(tool)) is not None:
            return seconds(row[tool])
    return None


def fmt(s):
    return "-" if s is None else ("%.2f s" % s if s < 100 else "%.0f s" % s)


seed_rows = []
seed_json = []
for seed in SEED:
    m, b = seed["model"], seed["batch_size"]
    ours = {p: find(m, b, p) for p in ("fp32", "tf32", "half", "amp")}
    seed_json.append(dict(seed, lamp=ours))
    seed_rows.append("| %s | %d | %.0f s | %.0f s | %.2fx | %s | %s | %s | %s "
                     "| %s | %s |" % (
                         m, b, seed["fp32"], seed["fp16"],
                         seed["fp32"] / seed["fp16"], fmt(ours["fp32"]),
                         fmt(ours["tf32"]), fmt(ours["half"]),
                         ratio(ours["fp32"], ours["half"]), fmt(ours["amp"]),
                         ratio(ours["fp32"], ours["amp"])))


def version(tool):
    h = headers.get(tool)
    if h:
        return "torch %s" % h.get("torch_version", "?")
    statuses = {e["status"] for (k, t), es in runs.items() if t == tool
                for e in es}
    return ", ".join(sorted(statuses)) or "not run"


repeats = max((len(summary(es).get("runs_images_per_second", [None]))
               for es in runs.values()), default=1)
steps = sorted({(r.get("warmup"), r.get("steps")) for es in runs.values()
                for r in es if ok(r) and r.get("steps")})
lines = [
    "# lamp vs PyTorch: one training step, same configurations",
    "",
    "- Device: %s (%s)" % (device_name, device),
    "- lamp: %s" % ("lamp_bench, LibTorch %s" % headers["lamp"].get(
        "torch_version", "?") if "lamp" in headers else version("lamp")),
    "- PyTorch: %s (%s)" % (version("pytorch-eager"), peer_python),
    "- Date: %s" % date.strftime("%Y-%m-%d %H:%M UTC"),
    "- Runs: each tool warms up once per configuration (cuDNN autotuning, "
    "compilation, graph capture), then times %d run(s) of at least the "
    "calibrated step count back to back; each cell is the median images/s "
    "(± half the spread max - min, relative)" % repeats,
]
threads = ", ".join("%s %s" % (t, headers[t]["threads"]) for t in TOOLS
                    if headers.get(t, {}).get("threads") is not None)
if device == "cpu" and threads:
    lines.append("- Threads: " + threads)
lines += [
    "- TF32: off in fp32 rows, on in tf32 rows (cuBLAS and cuDNN); the other "
    "modes keep PyTorch's defaults (cuDNN TF32 on, cuBLAS off)"
    + ("; irrelevant on CPU" if device == "cpu" else ""),
    "- Step: one synthetic batch resident on the device (no data loading), "
    "SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4 (lamp: "
    "lamp::optim::SGD, fused where available); (warmup, timed) steps: %s"
    % ", ".join("(%s, %s)" % s for s in steps),
    "- Peak memory: %s" % ("torch.cuda.max_memory_allocated per run"
                           if device == "cuda" else
                           "peak RSS of the process (one process per run)"),
    "",
    "| model | batch | mode | %s | best lamp vs PyTorch eager "
    "| best lamp vs best compiled | peak memory (lamp) "
    "| lamp fp32 memory (ratio) |" % " | ".join(
        TITLES[t] + " img/s" for t in present),
    "|---|---|---|%s---|---|---|---|" % ("---|" * len(present)),
] + table
if notes:
    lines += [""] + ["[%d] %s" % (i + 1, n) for i, n in enumerate(notes)]
lines += [
    "",
    "## Beside the seed's numbers",
    "",
    "The seed (kentaroy47/pytorch-cifar10-fp16) timed whole CIFAR-10 epochs "
    "on an RTX 2080 Ti, data loading included; its FP16 is pure half with "
    "FP32 BatchNorm and no master weights or loss scaling. lamp's columns "
    "are this run's synthetic-batch epochs on %s; '-' where this run has no "
    "such configuration." % device_name,
    "",
    "| model | batch | seed FP32 (2080 Ti) | seed FP16 (2080 Ti) "
    "| seed speed-up | lamp fp32 | lamp tf32 | lamp half "
    "| lamp half vs fp32 | lamp amp | lamp amp vs fp32 |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
] + seed_rows

merged = {
    "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
    "device": device,
    "device_name": device_name,
    "repeats": repeats,
    "tools": {t: headers.get(t) or {"status": version(t)} for t in present},
    "rows": [dict(rows[k]["key"], **{t: rows[k][t] for t in TOOLS
                                     if t in rows[k]}) for k in order],
    "seed": seed_json,
}
with open(stem + ".json", "w") as f:
    json.dump(merged, f, indent=2)
    f.write("\n")
with open(stem + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
print("\nwrote %s.json and %s.md" % (stem, stem))
with open(stem_path, "w") as f:
    f.write(stem)
PYEOF

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
