#!/usr/bin/env python3
"""Joins bench/run.sh's per-run JSON files into one JSON report and markdown
tables. Standard library only (no torch): run.sh calls it as

  report.py MANIFEST OUT_DIR DEVICE SUFFIX PEER_PYTHON STEM_FILE [NOT_RUN_FILE]

MANIFEST has a line per configuration and tool (tab-separated: tool, model,
batch, precision, channels_last 0/1, cudnn_benchmark 0/1, status, JSON path);
the report lands in OUT_DIR/<device>-<date><SUFFIX>.{json,md} and its stem in
STEM_FILE (where STEM_FILE already names one, from this run's earlier call,
the report replaces it). NOT_RUN_FILE's lines (rows a time budget skipped,
a run stopped before its end) head the markdown under "Not run" and are the
JSON's "not_run".

Per configuration (row) and tool: the median images/s of the repeated runs
and their spread, (max - min) / median, flagged above NOISY_SPREAD; a result
whose final loss or parameters were not finite is marked garbage and never
ranked. Per row, two like-for-like ratios (lamp eager vs PyTorch eager with
the fused optimizer; lamp's CUDA-graph step vs PyTorch's whole-step CUDA
graph) and the headline: lamp's best tool against the best PyTorch column.
Where a GPT row has lamp's graph step with one fused kernel alone (the
lamp-graph-only-* tools), a table of their ratios to lamp-graph.

GPT rows (model "gpt") count sequences of `context` tokens where the CNN rows
count images: the tables show their rates in tokens/s (images_per_second
times the context the results record), the unit column says which; ratios
are the same in either unit.
"""

import datetime
import json
import os
import re
import statistics
import sys

# lamp's GPT graph step with one of its opt-in fused kernels alone (the
# lamp_bench flag each adds to --cuda-graph): which of them pays, and so may
# become the default. Shown in their own table against lamp-graph, never
# ranked or in the main table.
ONE_FUSION_FLAGS = {
    "lamp-graph-only-add-norm": "--fused-add-norm",
    "lamp-graph-only-mlp": "--fused-mlp",
    "lamp-graph-only-head-loss": "--fused-head-loss",
    "lamp-graph-only-weight-cast": "--fused-weight-cast",
    "lamp-graph-only-bias-grad": "--fused-bias-grad",
    "lamp-graph-only-fp8-casts": "--fp8-fused-casts",
}
ONE_FUSION_TOOLS = tuple(ONE_FUSION_FLAGS)
LAMP_TOOLS = ("lamp", "lamp-graph", "lamp-graph-stock-bn",
              "lamp-graph-conv-bn", "lamp-graph-fused",
              "lamp-graph-sdpa-flash", "lamp-graph-sdpa-efficient",
              "lamp-graph-sdpa-cudnn") + ONE_FUSION_TOOLS
# lamp's graph step with one attention kernel forced (lamp_bench
# --attention): what each backend costs, beside LibTorch's choice. Shown,
# never ranked: the headline is lamp as its programs run, and a user's
# program would have to force the backend itself.
ATTENTION_TOOLS = ("lamp-graph-sdpa-flash", "lamp-graph-sdpa-efficient",
                   "lamp-graph-sdpa-cudnn")
RANKED_LAMP_TOOLS = tuple(t for t in LAMP_TOOLS if t not in ATTENTION_TOOLS
                          and t not in ONE_FUSION_TOOLS)
PYTORCH_TOOLS = ("pytorch-eager", "pytorch-fused", "pytorch-compile",
                 "pytorch-compile-ro", "pytorch-compile-fused",
                 "pytorch-compile-ro-fused", "pytorch-compile-max-fused",
                 "pytorch-graph")
TOOLS = LAMP_TOOLS + PYTORCH_TOOLS
TITLES = {
    "lamp": "lamp",
    "lamp-graph": "lamp (CUDA graph)",
    "lamp-graph-stock-bn": "lamp (CUDA graph, --fused-bn off)",
    "lamp-graph-conv-bn": "lamp (CUDA graph, --fused-bn conv)",
    "lamp-graph-fused": "lamp (CUDA graph, the GPT's fused kernels)",
    "lamp-graph-sdpa-flash": "lamp (CUDA graph, flash attention only)",
    "lamp-graph-sdpa-efficient": "lamp (CUDA graph, memory-efficient "
                                 "attention only)",
    "lamp-graph-sdpa-cudnn": "lamp (CUDA graph, cuDNN attention only)",
    **{t: "lamp (CUDA graph, %s alone)" % f
       for t, f in ONE_FUSION_FLAGS.items()},
    "pytorch-eager": "PyTorch eager",
    "pytorch-fused": "eager, fused optimizer",
    "pytorch-compile": "torch.compile",
    "pytorch-compile-ro": "torch.compile reduce-overhead",
    "pytorch-compile-fused": "torch.compile, fused optimizer",
    "pytorch-compile-ro-fused": "torch.compile reduce-overhead, fused "
                                "optimizer",
    "pytorch-compile-max-fused": "torch.compile max-autotune, fused "
                                 "optimizer",
    "pytorch-graph": "whole step in one CUDA graph",
}
# (numerator, denominator) of the like-for-like ratios, by JSON name.
LIKE_FOR_LIKE = {
    "lamp_vs_pytorch_fused": ("lamp", "pytorch-fused"),
    "lamp_graph_vs_pytorch_graph": ("lamp-graph", "pytorch-graph"),
}
NOISY_SPREAD = 0.05
NOISY_MARK = "\u26a0"  # a warning sign
KEY = ("model", "batch_size", "precision", "channels_last", "cudnn_benchmark")
FULL_PRECISIONS = ("fp32", "tf32")
GPT_SHAPE = ("gpt_layers", "gpt_heads", "gpt_width", "context")
# FP8's goal against amp-bf16 where the products dominate (the large-layer
# rows of run.sh --suite float8).
FLOAT8_GOAL = 1.3
SEED = [  # kentaroy47/pytorch-cifar10-fp16, RTX 2080 Ti, s/epoch
    {"model": "resnet18", "batch_size": 128, "fp32": 15.0, "fp16": 10.0},
    {"model": "resnet50", "batch_size": 512, "fp32": 58.0, "fp16": 27.0},
]


# ---------------------------------------------------------------------------
# Reading and summarising
# ---------------------------------------------------------------------------


def read_manifest(path):
    """Returns (headers, runs, order): each tool's top-level JSON fields, the
    entries per (row key, tool), and the row keys in manifest order."""
    headers = {}
    runs = {}
    order = []
    shapes = {}  # a GPT row's shape, from its results
    with open(path) as manifest:
        for line in manifest:
            fields = line.rstrip("\n").split("\t")
            tool, model, batch, precision, cl, cb, status, result_path = \
                fields[:8]
            # A GPT row's shape as run.sh gave it (layers, heads, width,
            # context, vocabulary), so that two shapes of the same batch and
            # mode are two rows; "" for the CNNs and older manifests.
            row_shape = fields[8] if len(fields) > 8 else ""
            key = (model, int(batch), precision, cl == "1", cb == "1",
                   row_shape)
            if key not in order:
                order.append(key)
            entry = {"status": status}
            if status == "ok":
                with open(result_path) as f:
                    report = json.load(f)
                headers.setdefault(tool, {k: v for k, v in report.items()
                                          if k != "results"})
                for result in report["results"]:
                    # A process of several tools tags each result with its
                    # own.
                    if result["precision"] == precision and \
                            result.get("tool", tool) == tool:
                        entry = dict(result, status="ok")
                # Results without a vocabulary were of bytes, without a
                # GELU of the exact one (both sides' default before they
                # recorded it).
                shape = tuple(entry.get(f) for f in GPT_SHAPE) + (
                    entry.get("vocab_size") or 256,
                    entry.get("gpt_gelu") or "exact")
                if model == "gpt" and shape[0] is not None and \
                        shapes.setdefault(key, shape) != shape:
                    sys.exit("report.py: two GPT shapes, %s and %s, share "
                             "the row of batch %s in %s: give their run_gpt "
                             "calls in bench/run.sh their shapes" %
                             (shapes[key], shape, batch, precision))
            runs.setdefault((key, tool), []).append(entry)
    return headers, runs, order


def ok(entry):
    """A timed result (it ran and was not skipped), garbage or not."""
    return bool(entry) and entry.get("status") == "ok" and \
        not entry.get("skipped") and bool(entry.get("images_per_second"))


def garbage(entry):
    """Why the result trained on garbage (non-finite final loss or
    parameters), or None; a result without the check is not garbage."""
    if ok(entry) and entry.get("finite") is False:
        return entry.get("garbage") or "non-finite loss or params"
    return None


def usable(entry):
    """A result that may be compared and ranked."""
    return ok(entry) and garbage(entry) is None


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
    picked = median["images_per_second"]
    median["images_per_second"] = statistics.median(rates)
    # A tool's FLOP rates are of the run it picked (the lower middle of an
    # even count of repeats): at the median shown instead.
    for field in ("tflops", "mfu"):
        if median.get(field) is not None and picked:
            median[field] *= median["images_per_second"] / picked
    median["seconds_per_epoch"] = median["epoch_images"] / \
        median["images_per_second"]
    median["runs_images_per_second"] = rates
    if median.get("context"):
        median["tokens_per_second"] = \
            median["images_per_second"] * median["context"]
    median["spread"] = (max(rates) - min(rates)) / statistics.median(rates)
    median["noisy"] = median["spread"] > NOISY_SPREAD
    if any(e.get("finite") is False for e in good):
        median["finite"] = False
        median["garbage"] = next(garbage(e) for e in good if garbage(e))
    return median


def rate(entry):
    return entry["images_per_second"] if usable(entry) else None


# ---------------------------------------------------------------------------
# Units: images/s, or tokens/s for a GPT
# ---------------------------------------------------------------------------


def row_context(row):
    """The tokens per sequence of a GPT row, as its results record them
    (`context`), or None."""
    for entry in row.values():
        if isinstance(entry, dict) and entry.get("context"):
            return entry["context"]
    return None


def row_unit(key, row):
    """(unit, items per image-or-sequence): images/s for the CNNs; for a GPT
    tokens/s (sequences/s where no result recorded the context)."""
    if key[0] != "gpt":
        return "img/s", 1
    context = row_context(row)
    return ("tokens/s", context) if context else ("sequences/s", 1)


def model_text(key, row):
    """The row's model: its name, and a GPT's shape where recorded."""
    if key[0] != "gpt":
        return key[0]
    for entry in row.values():
        if isinstance(entry, dict) and entry.get("gpt_layers"):
            return "gpt (%d layers, %d heads, width %d, context %d, "\
                "vocab %d)" % (
                    entry["gpt_layers"], entry["gpt_heads"],
                    entry["gpt_width"], entry["context"],
                    entry.get("vocab_size") or 256)
    return key[0]


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def best(row, tools):
    """The fastest usable tool of `tools` in the row, or None."""
    rated = [(rate(row.get(t)), t) for t in tools if rate(row.get(t))]
    return max(rated)[1] if rated else None


def unusable(row, tools):
    """The tools of `tools` the row ran, or meant to, whose result is not
    usable (failed, skipped or not run), in `tools`' order."""
    return [t for t in tools
            if row.get(t) is not None and rate(row.get(t)) is None]


def row_ratios(row):
    """The row's like-for-like ratios and the headline, best lamp vs best
    PyTorch (None where a side has no usable result), with the PyTorch tools
    the headline could not weigh (a torch.compile that failed leaves it
    against the rest: `pytorch_unusable` says so)."""
    out = {name: ratio(rate(row.get(a)), rate(row.get(b)))
           for name, (a, b) in LIKE_FOR_LIKE.items()}
    lamp_best = best(row, RANKED_LAMP_TOOLS)
    pytorch_best = best(row, PYTORCH_TOOLS)
    out["best_lamp"] = lamp_best
    out["best_pytorch"] = pytorch_best
    out["pytorch_unusable"] = unusable(row, PYTORCH_TOOLS)
    out["best_lamp_vs_best_pytorch"] = ratio(
        rate(row.get(lamp_best)), rate(row.get(pytorch_best)))
    return out


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def times(value):
    return "-" if value is None else "%.2fx" % value


def mib(value):
    return "-" if value is None else "%.0f" % (value / 2.0 ** 20)


class Notes:
    """Footnotes for skipped cells, numbered in order of first use."""

    def __init__(self):
        self.texts = []

    def ref(self, text):
        if text not in self.texts:
            self.texts.append(text)
        return "[%d]" % (self.texts.index(text) + 1)


def cell_rate(entry, notes, scale=1):
    """The median rate times `scale` (the context in a GPT row), the
    spread, and the noise and garbage marks."""
    if entry is None:
        return "-"
    if entry.get("status") != "ok":
        return entry["status"]
    if entry.get("skipped"):
        return "skipped " + notes.ref(entry["skipped"])
    if entry.get("failed"):  # one tool of the peer's several
        return "failed " + notes.ref(entry["failed"])
    text = "%.0f" % (entry["images_per_second"] * scale)
    if len(entry.get("runs_images_per_second", [])) > 1:
        text += " (%.1f%%)" % (100 * entry["spread"])
        if entry.get("noisy"):
            text += " " + NOISY_MARK
    if garbage(entry):
        text += " garbage: " + garbage(entry)
    return text


def cell_memory(entry, device):
    """steady peak / reserved MiB (or the whole-run peak where a tool did not
    record them) and the skipped steps."""
    if not ok(entry):
        return "-"
    parts = []
    steady = entry.get("steady_peak_bytes")
    reserved = entry.get("reserved_bytes")
    if steady is None and reserved is not None and \
            entry.get("peak_memory_bytes") is not None:
        # No steady-state count (CUDA graph trees; peer_pytorch.py).
        parts.append("peak %s, warm-up included / %s" % (
            mib(entry["peak_memory_bytes"]), mib(reserved)))
    elif steady is not None or reserved is not None:
        parts.append("%s / %s" % (mib(steady), mib(reserved)))
    elif entry.get("peak_memory_bytes") is not None:
        parts.append(("peak %s, warm-up included" if device == "cuda"
                      else "RSS %s") % mib(entry["peak_memory_bytes"]))
    skipped = entry.get("skipped_steps")
    if skipped is not None:
        total = entry.get("steps_run")
        parts.append("%d/%d skipped" % (skipped, total) if total
                     else "%d skipped" % skipped)
    return "; ".join(parts) or "-"


def mode_text(key):
    parts = [key[2]]
    if key[3]:
        parts.append("channels_last")
    if key[4]:
        parts.append("cudnn.benchmark")
    return ", ".join(parts)


def best_mfu(row):
    """The highest model FLOPs utilisation among the row's usable lamp
    results (lamp_bench's `mfu`: the model's FLOP/s over the device's dense
    peak for the precision), as a percentage; '-' where none recorded one
    (a CPU, a GPU without a known peak)."""
    values = [row[t]["mfu"] for t in RANKED_LAMP_TOOLS
              if usable(row.get(t)) and row[t].get("mfu") is not None]
    return "%.1f%%" % (100 * max(values)) if values else "-"


def main_table(rows, order, present, notes):
    lines = [
        "| model | batch | mode | unit | %s | lamp vs eager, fused "
        "optimizer | lamp graph vs PyTorch graph | **best lamp vs best "
        "PyTorch** | best lamp | best PyTorch | best lamp MFU |"
        % " | ".join(TITLES[t] for t in present),
        "|---|---|---|---|%s---|---|---|---|---|---|" % ("---|" * len(present)),
    ]
    for key in order:
        row = rows[key]
        ratios = row_ratios(row)
        headline = times(ratios["best_lamp_vs_best_pytorch"])
        headline_cell = "**%s**" % headline if headline != "-" else headline
        if headline != "-" and ratios["pytorch_unusable"]:
            # Against the PyTorch tools that ran: one that failed or was
            # skipped might have been the best.
            headline_cell += " (without %s)" % ", ".join(
                TITLES.get(t, t) for t in ratios["pytorch_unusable"])
        unit, scale = row_unit(key, row)
        # Which lamp tool the headline is, an opt-in one (the GPT's fused
        # kernels, the folded BatchNorm) named as such.
        lines.append(
            "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                model_text(key, row), key[1], mode_text(key), unit,
                " | ".join(cell_rate(row.get(t), notes, scale)
                           for t in present),
                times(ratios["lamp_vs_pytorch_fused"]),
                times(ratios["lamp_graph_vs_pytorch_graph"]),
                headline_cell,
                TITLES.get(ratios["best_lamp"], "-"),
                TITLES.get(ratios["best_pytorch"], "-"), best_mfu(row)))
    return lines


def memory_table(rows, order, present, device):
    lines = [
        "| model | batch | mode | %s |" % " | ".join(TITLES[t]
                                                   for t in present),
        "|---|---|---|%s" % ("---|" * len(present)),
    ]
    for key in order:
        cells = [cell_memory(rows[key].get(t), device) for t in present]
        if any(c != "-" for c in cells):
            lines.append("| %s | %d | %s | %s |" % (
                model_text(key, rows[key]), key[1], mode_text(key),
                " | ".join(cells)))
    return lines


def mixed_precision_table(rows, order, present):
    """Each mixed mode against fp32 and tf32: same tool, model, batch,
    layout and cuDNN setting."""
    lines = []
    for key in order:
        if key[2] in FULL_PRECISIONS:
            continue
        full = {p: rows.get(key[:2] + (p,) + key[3:], {})
                for p in FULL_PRECISIONS}
        unit, scale = row_unit(key, rows[key])

        def scaled(value):
            return "-" if value is None else "%.0f" % (value * scale)

        for tool in present:
            mixed = rate(rows[key].get(tool))
            base = {p: rate(full[p].get(tool)) for p in FULL_PRECISIONS}
            if mixed is None or all(v is None for v in base.values()):
                continue
            lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |"
                         % (model_text(key, rows[key]), key[1],
                            mode_text(key), TITLES[tool], unit,
                            scaled(mixed), scaled(base["tf32"]),
                            scaled(base["fp32"]),
                            times(ratio(mixed, base["tf32"])),
                            times(ratio(mixed, base["fp32"]))))
    if not lines:
        return []
    return [
        "| model | batch | mode | tool | unit | rate | tf32 | fp32 "
        "| vs tf32 | vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ] + lines


def float8_table(rows, order, present):
    """fp8 against amp-bf16: same tool, model shape and batch."""
    lines = []
    for key in order:
        if key[2] != "fp8":
            continue
        bf16 = rows.get(key[:2] + ("amp-bf16",) + key[3:], {})
        unit, scale = row_unit(key, rows[key])
        for tool in present:
            fp8, base = rate(rows[key].get(tool)), rate(bf16.get(tool))
            if fp8 is None or base is None:
                continue
            lines.append("| %s | %d | %s | %s | %.0f | %.0f | %s |" % (
                model_text(key, rows[key]), key[1], TITLES[tool], unit,
                base * scale, fp8 * scale, times(ratio(fp8, base))))
    if not lines:
        return []
    return [
        "| model | batch | tool | unit | amp-bf16 | fp8 | fp8 vs amp-bf16 |",
        "|---|---|---|---|---|---|---|",
    ] + lines


def fusion_table(rows, order):
    """Per row with lamp-graph and a one-fusion tool: each of the GPT's
    fused kernels alone, and all of them (lamp-graph-fused), as a ratio of
    the same graph step without them; the lines and, per row, the ratios by
    tool for the JSON."""
    columns = [t for t in ONE_FUSION_TOOLS + ("lamp-graph-fused",)
               if any(t in rows[k] for k in order
                      if any(f in rows[k] for f in ONE_FUSION_TOOLS))]
    lines, ratios = [], {}
    for key in order:
        row = rows[key]
        if not any(t in row for t in ONE_FUSION_TOOLS):
            continue
        base = row.get("lamp-graph")
        unit, scale = row_unit(key, row)
        cells, row_ratios_by_tool = [], {}
        for tool in columns:
            entry = row.get(tool)
            value = ratio(rate(entry), rate(base))
            if value is None:
                cells.append("-" if entry is None else (
                    entry["status"] if entry.get("status") != "ok"
                    else "skipped" if entry.get("skipped")
                    else "failed" if entry.get("failed")
                    else "garbage" if garbage(entry) else "-"))
                continue
            row_ratios_by_tool[tool] = value
            text = times(value)
            if entry.get("noisy") or base.get("noisy"):
                text += " " + NOISY_MARK
            cells.append(text)
        ratios[key] = row_ratios_by_tool
        base_text = "-" if rate(base) is None else \
            "%.0f" % (rate(base) * scale)
        lines.append("| %s | %d | %s | %s | %s | %s |" % (
            model_text(key, row), key[1], mode_text(key), unit, base_text,
            " | ".join(cells)))
    if not lines:
        return [], {}
    header = [
        "| model | batch | mode | unit | %s | %s |" % (
            TITLES["lamp-graph"],
            " | ".join("%s vs it" % (ONE_FUSION_FLAGS[t] + " alone"
                                     if t in ONE_FUSION_FLAGS
                                     else "all of them")
                       for t in columns)),
        "|---|---|---|---|---|%s" % ("---|" * len(columns)),
    ]
    return header + lines, ratios


def seed_table(rows, device_name):
    def seconds(model, batch, precision):
        """The seed-comparable lamp result: channels_last + benchmark
        first."""
        for cl, cb in ((True, True), (False, True), (False, False)):
            entry = rows.get((model, batch, precision, cl, cb, ""),
                             {}).get("lamp")
            if usable(entry):
                return entry["seconds_per_epoch"]
        return None

    def fmt(s):
        return "-" if s is None else ("%.2f s" % s if s < 100 else "%.0f s" % s)

    lines = [
        "The seed (kentaroy47/pytorch-cifar10-fp16) timed whole CIFAR-10 "
        "epochs on an RTX 2080 Ti, data loading included; its FP16 is pure "
        "half with FP32 BatchNorm and no master weights or loss scaling. "
        "lamp's columns are this run's synthetic-batch epochs on %s; '-' "
        "where this run has no such configuration." % device_name,
        "",
        "| model | batch | seed FP32 (2080 Ti) | seed FP16 (2080 Ti) "
        "| seed speed-up | lamp fp32 | lamp tf32 | lamp half "
        "| lamp half vs fp32 | lamp amp | lamp amp vs fp32 "
        "| lamp amp vs tf32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    seed_json = []
    for seed in SEED:
        m, b = seed["model"], seed["batch_size"]
        ours = {p: seconds(m, b, p) for p in ("fp32", "tf32", "half", "amp")}
        seed_json.append(dict(seed, lamp=ours))
        lines.append(
            "| %s | %d | %.0f s | %.0f s | %.2fx | %s | %s | %s | %s | %s "
            "| %s | %s |" % (
                m, b, seed["fp32"], seed["fp16"],
                seed["fp32"] / seed["fp16"], fmt(ours["fp32"]),
                fmt(ours["tf32"]), fmt(ours["half"]),
                times(ratio(ours["fp32"], ours["half"])), fmt(ours["amp"]),
                times(ratio(ours["fp32"], ours["amp"])),
                times(ratio(ours["tf32"], ours["amp"]))))
    return lines, seed_json


def build(headers, runs, order, device, peer_python, date):
    """The markdown lines and the merged JSON of one run."""
    rows = {key: {} for key in order}
    for (key, tool), entries in runs.items():
        rows[key][tool] = summary(entries)
    # The main tables' tools; the one-fusion tools have a table of their
    # own.
    present = [t for t in TOOLS if any(t in rows[k] for k in order)
               and t not in ONE_FUSION_TOOLS]
    first = next(iter(headers.values()), {})
    device_name = first.get("device_name", device)

    def version(tools):
        for tool in tools:
            if headers.get(tool):
                return "torch %s" % headers[tool].get("torch_version", "?")
        statuses = {e["status"] for (k, t), es in runs.items() if t in tools
                    for e in es}
        return ", ".join(sorted(statuses)) or "not run"

    repeats = max((len(rows[k][t].get("runs_images_per_second", [None]))
                   for k in order for t in rows[k]), default=1)
    steps = sorted({(r.get("warmup"), r.get("steps")) for es in runs.values()
                    for r in es if ok(r) and r.get("steps")})
    unchecked = [t for t in present
                 if any(ok(rows[k].get(t)) and "finite" not in rows[k][t]
                        for k in order)]
    notes = Notes()
    table = main_table(rows, order, present, notes)
    lines = [
        "# lamp vs PyTorch: one training step, same configurations",
        "",
        "- Device: %s (%s)" % (device_name, device),
        "- lamp: %s" % ("lamp_bench, LibTorch %s" % headers["lamp"].get(
            "torch_version", "?") if "lamp" in headers
            else version(LAMP_TOOLS)),
        "- PyTorch: %s (%s)" % (version(PYTORCH_TOOLS), peer_python),
        "- Date: %s" % date.strftime("%Y-%m-%d %H:%M UTC"),
        "- Headline: **best lamp vs best PyTorch**, lamp's faster tool "
        "(eager or CUDA graph) against the fastest PyTorch column of the "
        "same row; a result whose final loss or parameters are not finite "
        "reads 'garbage' and is never ranked; the columns with one "
        "attention kernel forced are shown, never ranked",
        "- Like for like: lamp eager against PyTorch eager with the fused "
        "optimizer (GradScaler hands the scale and overflow flag to the "
        "fused kernel, no host sync); lamp's CUDA-graph step against "
        "PyTorch's whole step (forward, backward, GradScaler, fused "
        "optimizer) in one CUDA graph",
        "- Runs: each tool warms up once per configuration (cuDNN "
        "autotuning, compilation, graph capture), then times %d run(s) of "
        "at least the calibrated step count back to back; each cell is the "
        "median rate in the row's unit and, in brackets, the spread of the "
        "runs ((max - min) / median); %s marks a spread over %.0f%%, a "
        "median less certain than the rest" % (repeats, NOISY_MARK,
                                                100 * NOISY_SPREAD),
    ]
    has_gpt = any(key[0] == "gpt" for key in order)
    if has_gpt:
        lines.append(
            "- GPT rows: batch is sequences of `context` byte tokens, the "
            "rate tokens/s (sequences/s x context)")
    threads = ", ".join("%s %s" % (t, headers[t]["threads"]) for t in TOOLS
                        if headers.get(t, {}).get("threads") is not None)
    if device == "cpu" and threads:
        lines.append("- Threads: " + threads)
    lines += [
        "- TF32: off in fp32 rows, on in tf32 rows (cuBLAS and cuDNN); the "
        "other modes keep PyTorch's defaults (cuDNN TF32 on, cuBLAS off)"
        + ("; irrelevant on CPU" if device == "cpu" else ""),
        "- Step: one synthetic batch resident on the device (no data "
        "loading), SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4 "
        "(lamp: lamp::optim::SGD, fused where available)%s; (warmup, timed) "
        "steps: %s" % (
            "; GPT rows: gradients clipped to global norm 1.0, AdamW lr "
            "1e-3, betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on the "
            "tensors of 2+ dimensions (embeddings included), dropout 0"
            if has_gpt else "",
            ", ".join("(%s, %s)" % s for s in steps)),
    ]
    if unchecked:
        lines.append("- Unchecked: %s recorded no finite check of the final "
                     "loss and parameters (no `finite` field); ranked as if "
                     "finite" % ", ".join(unchecked))
    lines += [""] + table
    if notes.texts:
        lines += [""] + ["[%d] %s" % (i + 1, n)
                         for i, n in enumerate(notes.texts)]
    lines += [
        "",
        "## Memory and skipped steps",
        "",
    ]
    if device == "cuda":
        lines.append(
            "Steady-state peak / reserved, MiB: the peak allocated after "
            "warm-up (reset after the untimed steps, so cuDNN's autotuning "
            "workspace is not counted) and what the caching allocator "
            "reserves after the timed steps, CUDA-graph pools included. "
            "'warm-up included' where a tool recorded only its whole-run "
            "peak. k/n skipped: steps the loss scaler skipped (inf/NaN "
            "gradients) of all the steps the tool ran, warm-up included.")
    else:
        lines.append(
            "RSS: the peak resident memory of the process while the tool "
            "ran. k/n skipped: steps the loss scaler skipped (inf/NaN "
            "gradients) of all the steps the tool ran, warm-up included.")
    lines += [""] + memory_table(rows, order, present, device)
    mixed = mixed_precision_table(rows, order, present)
    if mixed:
        lines += ["", "## Mixed precision against FP32 and TF32", "",
                  "The same tool, model and batch in fp32 (TF32 off) and "
                  "tf32 (TF32 on, the default a Python user gets on an "
                  "H100 for convolutions); rates in the row's unit.",
                  ""] + mixed
    fp8 = float8_table(rows, order, present)
    if fp8:
        lines += ["", "## FP8 against amp-bf16", "",
                  "The same tool, model and batch with FP8 products in the "
                  "converted Linear layers (fp8) and in BF16 (amp-bf16); "
                  "the goal where the products dominate (4096-wide layers, "
                  "8,192 tokens a step, on an H100): %.1fx. On a CPU, fp8 "
                  "runs on LibTorch's emulated _scaled_mm: its ratio is the "
                  "emulation's cost, not FP8's gain." % FLOAT8_GOAL,
                  ""] + fp8
    fusions, fusion_ratios = fusion_table(rows, order)
    if fusions:
        lines += ["", "## The GPT's fused kernels one at a time", "",
                  "lamp's GPT CUDA-graph step with one of its opt-in fused "
                  "kernels alone, and with all of them (lamp-graph-fused), "
                  "against the same step without them (%s, its rate in the "
                  "row's unit): above 1.00x the step is faster. %s marks a "
                  "ratio with a noisy side. A kernel becomes the default "
                  "only where it is faster by more than the noise and its "
                  "_CUDA tests pass." % (TITLES["lamp-graph"], NOISY_MARK),
                  ""] + fusions
    seed_lines, seed_json = seed_table(rows, device_name)
    lines += ["", "## Beside the seed's numbers", ""] + seed_lines

    merged = {
        "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "device_name": device_name,
        "repeats": repeats,
        "noisy_spread": NOISY_SPREAD,
        "tools": {t: headers.get(t) or {"status": version((t,))}
                  for t in present},
        "rows": [dict(dict(zip(KEY, k)), unit=row_unit(k, rows[k])[0],
                      model_text=model_text(k, rows[k]),
                      ratios=row_ratios(rows[k]),
                      **({"fusions_vs_lamp_graph": fusion_ratios[k]}
                         if k in fusion_ratios else {}),
                      **{t: rows[k][t] for t in TOOLS if t in rows[k]})
                 for k in order],
        "seed": seed_json,
    }
    return lines, merged, device_name


def free_stem(base):
    """`base`, or base-2, base-3, ... where an earlier run of the day wrote
    results under it: a second run never overwrites the first's."""
    stem, n = base, 1
    while os.path.exists(stem + ".json") or os.path.exists(stem + ".md"):
        n += 1
        stem = "%s-%d" % (base, n)
    return stem


def write_whole(path, text):
    """`text` at `path` whole or not at all (a temporary file renamed)."""
    temporary = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(temporary, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except OSError:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise


def read_not_run(path):
    """The lines of NOT_RUN_FILE: the rows run.sh did not run (a time
    budget spent) and whether the run ended before its last row."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def main(argv):
    manifest_path, out_dir, device, suffix, peer_python, stem_path = argv[:6]
    not_run = read_not_run(argv[6] if len(argv) > 6 else None)
    headers, runs, order = read_manifest(manifest_path)
    date = datetime.datetime.now(datetime.timezone.utc)
    lines, merged, device_name = build(headers, runs, order, device,
                                       peer_python, date)
    if not_run:
        # Said where the tables are read: a row the run skipped is no row
        # of this device's to compare.
        lines[1:1] = ["", "**Not run:**", ""] + \
            ["- " + line for line in not_run]
        merged["not_run"] = not_run
    slug = "cpu" if device == "cpu" else \
        re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or device
    # The same run writes its report as its rows finish: each write
    # replaces the last (the stem it chose first), a new run never does.
    previous = ""
    if os.path.exists(stem_path):
        with open(stem_path) as f:
            previous = f.read().strip()
    stem = previous or free_stem(os.path.join(out_dir, "%s-%s%s" % (
        slug, date.strftime("%Y-%m-%d"), suffix)))
    write_whole(stem + ".json", json.dumps(merged, indent=2) + "\n")
    write_whole(stem + ".md", "\n".join(lines) + "\n")
    # Before anything is printed: run.sh reads it to draw the chart, even
    # when the reader of this output has gone.
    write_whole(stem_path, stem)
    try:
        print("\n".join(lines))
        print("\nwrote %s.json and %s.md" % (stem, stem))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("report.py: cannot write to standard output (Broken pipe); "
              "the results are in %s.json and %s.md" % (stem, stem),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
