#!/usr/bin/python3
"""Draws lamp's training logs and benchmark results as PNG charts.

  scripts/plot.py [--out DIR] [--title T] LOG.jsonl...
  scripts/plot.py --bench [--out DIR] [--title T] RESULTS.json...

Training logs are the JSON Lines files the training programs write with
--log-json. One chart per quantity, every run of every file overlaid:

  <name>loss.png        train and test loss per epoch
  <name>accuracy.png    test accuracy per epoch
  <name>loss-scale.png  loss scale per epoch (log axis), of the runs that
                        scale the loss only ("amp" and "half", or a scale
                        other than 1 in the log); the runs left out, or why
                        there is no such chart, are named on stderr
  <name>step-loss.png   training loss per logged step (only when the logs
                        hold "step" records: the programs write one every
                        --log-every steps, 50 by default), and the test loss
                        of each --eval-every evaluation
  <name>step-lr.png     learning rate per logged step (logs of lamp 0.5
                        and later, whose step records carry "grad_norm")
  <name>step-grad-norm.png
                        the gradients' norm before clipping per logged step
                        (log axis; runs with --max-grad-norm)
  <name>throughput.png  images/s per run (tokens/s for logs that count
                        tokens, "tokens_per_second"): over the training
                        steps, and each run's last epoch side by side

<name> is the log's file name without .jsonl and a dash when one log is
given, nothing when several are.

An epoch cut short by --max-steps ("partial": true, "steps" of
"steps_in_epoch") is drawn with a hollow marker at the fraction of the epoch
it trained (2 of 6 steps into epoch 2: at 1.33), never as a whole epoch; a
test loss or accuracy over the first batches of the test set only
(--limit-eval-batches, "test_subset": true) is marked with a cross. The
legend names both marks, and a note on stderr names each such epoch. A log holds "run", "epoch" and "step"
records (the "record" field; lines without it are epoch records, the format
before run headers) and may hold several runs: records are grouped by
"run_id", or, in logs without one, a new run starts where "epoch" goes down
or starts again at 1. Each run is named by its precision, plus its model,
program or device where those differ between the runs.

--bench reads bench/run.sh's bench/results/<device>-<date>.json and writes a
bar chart of images per second per configuration and tool,
<device>-<date>.png, beside it (or in --out DIR).

The shebang is Debian's interpreter, the one python3-matplotlib installs
into. Exit status: 0 when every chart was written, 1 on a bad or missing
input or without matplotlib, 2 on a usage error.
"""
import argparse
import json
import math
import os
import sys

# What names a run: its precision, then these where runs differ in them, then
# (only for runs that are still alike) the other settings.
NAME_FIELDS = ("model", "program", "device")
OTHER_FIELDS = ("batch_size", "optimizer", "lr", "schedule", "seed")
INSTALL_HINT = "apt-get install python3-matplotlib"
# The precision modes that scale the loss (FP16); the others keep scale 1.
SCALING_PRECISIONS = ("amp", "half")
# Throughput fields of the records, with the unit an axis names.
RATE_FIELDS = (("tokens_per_second", "tokens/s"),
               ("sequences_per_second", "sequences/s"),
               ("images_per_second", "images/s"))
# Per run in the step charts, so that runs whose curves coincide (fp32 and
# amp-bf16 train alike) stay apart.
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v")
# Sizes of the charts: readable on a screen and in a document.
FIGURE_SIZE = (9, 5.5)
DPI = 150


# The files read, as real paths: no chart may be written over one.
INPUTS = set()


def write_figure(fig, path):
    """Writes `fig` as a PNG at `path` whole or not at all: drawn into a
    temporary file beside it and renamed over it, so that a full disk or a
    file size limit (`ulimit -f`) leaves the chart that was there, not half
    of a new one."""
    if os.path.realpath(path) in INPUTS:
        raise PlotError("the chart %s would overwrite one of the files read; "
                        "give another --out" % path)
    temporary = "%s.tmp-%d" % (path, os.getpid())
    try:
        fig.savefig(temporary, format="png")
        os.replace(temporary, path)
    except OSError as e:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise PlotError("cannot write %s: %s" % (path, e.strerror or e))


class PlotError(Exception):
    """A problem with the inputs or the environment, reported in one line."""


def load_matplotlib():
    """pyplot on the Agg backend (files only, no display needed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotError("matplotlib is not available to %s (%s); on Debian "
                        "install it with: %s" %
                        (sys.executable, e, INSTALL_HINT)) from None
    return plt


def folder(path):
    """The folder of a file, "." for a bare name."""
    return os.path.dirname(path) or "."


def read_text(path):
    if not os.path.exists(path):
        raise PlotError("%s: no such file" % path)
    if not os.path.isfile(path):
        raise PlotError("%s: not a regular file" % path)
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# training logs

class Run:
    """One training run: its header fields and its epoch and step records."""

    def __init__(self, path, run_id):
        self.path = path
        self.run_id = run_id
        self.header = {}
        self.epochs = []
        self.steps = []
        self.evaluations = []  # --eval-every's, by step
        self.label = ""

    def field(self, name):
        """A setting of the run: from its header, else its first epoch."""
        if name in self.header:
            return self.header[name]
        for record in self.epochs:
            if name in record:
                return record[name]
        return None


def read_records(path):
    """The JSON objects of a JSON Lines file, with their line numbers."""
    records = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise PlotError("%s:%d: not JSON (%s); every line of a --log-json "
                            "file is one JSON object" % (path, number, e)) \
                from None
        if not isinstance(record, dict):
            raise PlotError("%s:%d: a JSON %s, not an object; every line of a "
                            "--log-json file is one JSON object" %
                            (path, number, type(record).__name__))
        records.append((number, record))
    if not records:
        raise PlotError("%s: empty log, no records; it fills once the run "
                        "started with --log-json %s has finished an epoch" %
                        (path, path))
    return records


def read_runs(path):
    """The runs of one log, in the order they start."""
    runs = {}
    order = []
    last_epoch = None
    legacy = 0  # runs without run_id so far

    def run_for(key):
        if key not in runs:
            runs[key] = Run(path, key if isinstance(key, str) else None)
            order.append(key)
        return runs[key]

    for number, record in read_records(path):
        kind = record.get("record", "epoch")
        if "run_id" in record:
            run = run_for(str(record["run_id"]))
        else:
            epoch = record.get("epoch")
            if kind == "epoch" and isinstance(epoch, (int, float)):
                if last_epoch is None or epoch <= last_epoch:
                    legacy += 1
                last_epoch = epoch
            run = run_for(max(legacy, 1))
        if kind == "run":
            run.header = record
        elif kind == "epoch":
            if not isinstance(record.get("epoch"), (int, float)):
                raise PlotError("%s:%d: an epoch record without a numeric "
                                "\"epoch\" field" % (path, number))
            run.epochs.append(record)
        elif kind == "step":
            if not isinstance(record.get("global_step"), (int, float)):
                raise PlotError("%s:%d: a step record without a numeric "
                                "\"global_step\" field" % (path, number))
            run.steps.append(record)
        elif kind == "evaluation":
            if not isinstance(record.get("global_step"), (int, float)):
                raise PlotError("%s:%d: an evaluation record without a "
                                "numeric \"global_step\" field" %
                                (path, number))
            run.evaluations.append(record)
        # Other record kinds are for other readers; the charts skip them.
    return [runs[key] for key in order]


def name_runs(runs):
    """Labels each run by its precision and the settings that tell it apart
    from the others; the run's number where nothing does."""

    def differs(field, group):
        return len({json.dumps(r.field(field)) for r in group
                    if r.field(field) is not None}) > 1

    def describe(run, fields, with_names):
        return [("%s %s" % (f, run.field(f)) if with_names
                 else str(run.field(f)))
                for f in fields if run.field(f) is not None]

    shown = [f for f in NAME_FIELDS if differs(f, runs)]
    for run in runs:
        run.label = ", ".join([str(run.field("precision") or "run")] +
                              describe(run, shown, False))
    for label in {r.label for r in runs}:
        alike = [r for r in runs if r.label == label]
        extra = [f for f in OTHER_FIELDS if differs(f, alike)]
        for run in alike:
            run.label = ", ".join([label] + describe(run, extra, True))
    labels = [r.label for r in runs]
    for i, run in enumerate(runs):
        if labels.count(labels[i]) > 1:
            run.label += " #%d" % labels[:i + 1].count(labels[i])


def number(value):
    """A float for a JSON value; NaN for null (a non-finite loss is written
    as null) or anything else that is not a number."""
    return float(value) if isinstance(value, (int, float)) else math.nan


def series(records, x, y, scale=1.0):
    xs = [number(r.get(x)) for r in records]
    ys = [number(r.get(y)) * scale for r in records]
    return xs, ys


def trained_steps(record):
    """The steps of the record's epoch trained in all: its own and, where a
    run resumed inside it, those before ("resumed_steps")."""
    steps, resumed = record.get("steps"), record.get("resumed_steps", 0)
    if not isinstance(steps, (int, float)):
        return steps
    return steps + (resumed if isinstance(resumed, (int, float)) else 0)


def is_partial(record):
    """Whether the run ended inside the epoch of this record (--max-steps,
    --steps)."""
    steps, whole = trained_steps(record), record.get("steps_in_epoch")
    if record.get("partial") is True:
        return True
    return (isinstance(steps, (int, float)) and
            isinstance(whole, (int, float)) and steps < whole)


def epoch_x(record):
    """Where an epoch record is drawn: at its epoch, or for a partial epoch
    at the fraction of it that was trained (epoch - 1 + steps / whole)."""
    epoch = number(record.get("epoch"))
    if not is_partial(record):
        return epoch
    steps, whole = trained_steps(record), record.get("steps_in_epoch")
    if not (isinstance(steps, (int, float)) and
            isinstance(whole, (int, float)) and whole > 0):
        return epoch  # partial, but how far is not said: marked only
    return epoch - 1 + steps / whole


def epoch_series(records, y, scale=1.0):
    """xs (epoch_x), ys, and which points are partial epochs. The test
    metrics of an epoch that was not evaluated (--eval-every evaluates by
    steps: "evaluated" false) are gaps, not zeros."""
    def value(r):
        if y.startswith("test_") and r.get("evaluated") is False:
            return math.nan
        return number(r.get(y)) * scale
    return ([epoch_x(r) for r in records], [value(r) for r in records],
            [is_partial(r) for r in records])


def notes(run):
    """stderr lines naming the run's partial epochs and test subsets."""
    lines = []
    for r in run.epochs:
        what = []
        if is_partial(r):
            what.append("partial (%s of %s steps), drawn hollow at %.2f" %
                        (r.get("steps", "?"), r.get("steps_in_epoch", "?"),
                         epoch_x(r)))
        if r.get("test_subset") is True:
            what.append("its test metrics are over %s of %s test batches, "
                        "marked x" % (r.get("test_batches", "?"),
                                      r.get("test_batches_in_set", "?")))
        if what:
            lines.append("plot.py: note: %s: %s: epoch %s: %s" %
                         (run.path, run.label, r.get("epoch"),
                          "; ".join(what)))
    return lines


def scales_loss(run):
    """Whether the run scales its loss: its mode does ("amp", "half"), or
    its log shows a scale other than 1 (a forced scaler)."""
    if run.field("precision") in SCALING_PRECISIONS:
        return True
    return any(isinstance(r.get("loss_scale"), (int, float)) and
               r.get("loss_scale") != 1 for r in run.epochs + run.steps)


def rate_field(run):
    """The run's throughput field and unit: tokens/s where its records
    count tokens, images/s otherwise."""
    for field, unit in RATE_FIELDS:
        if any(field in r for r in run.epochs + run.steps):
            return field, unit
    return RATE_FIELDS[-1]


def step_rates(run):
    """(global steps, rates) of the run's step records, warm-up steps left
    out (their rate includes the first step's set-up); for a run without
    step records, its epochs at their last step."""
    field = rate_field(run)[0]
    records = [r for r in run.steps if r.get("warmup") is not True]
    if not records:
        records = run.epochs
    return series(records, "global_step", field)


def last_epoch_rate(run):
    """The run's last epoch's throughput (warm-up excluded, as the epoch line
    prints it); NaN without one."""
    field = rate_field(run)[0]
    return number(run.epochs[-1].get(field)) if run.epochs else math.nan


def context(runs):
    """What all runs share, for a chart's subtitle: "train_mnist, cnn on cpu,
    batch 128"; empty where they share nothing."""
    def shared(name):
        values = {json.dumps(r.field(name)) for r in runs}
        value = runs[0].field(name)
        return value if len(values) == 1 and value is not None else None

    parts = []
    if shared("program"):
        parts.append(str(shared("program")))
    where = " on ".join(str(v) for v in (shared("model"), shared("device"))
                        if v is not None)
    if where:
        parts.append(where)
    if shared("batch_size"):
        parts.append("batch %s" % shared("batch_size"))
    for examples in ("images", "sequences"):
        if shared("train_" + examples) and shared("test_" + examples):
            parts.append("%s train / %s test %s" %
                         (shared("train_" + examples),
                          shared("test_" + examples), examples))
    return ", ".join(parts)


def step_style(i):
    """Line style, width and marker of the i-th run in the step charts."""
    return dict(linestyle=LINE_STYLES[i % len(LINE_STYLES)],
                linewidth=line_width(i), marker=MARKERS[i % len(MARKERS)],
                markersize=4)


def mark_epochs(ax, runs):
    """Faint vertical lines where the first run with step records ended an
    epoch (its epoch records' global_step), for the step charts."""
    for run in runs:
        ends = [number(r.get("global_step")) for r in run.epochs
                if not is_partial(r)]
        ends = [x for x in ends if not math.isnan(x)]
        if run.steps and ends:
            for x in ends[:-1]:
                ax.axvline(x, color="gray", linewidth=0.8, linestyle=":",
                           alpha=0.7)
            ax.annotate("dotted lines: epoch ends (%s)" % run.label,
                        (0.99, 0.01), xycoords="axes fraction",
                        ha="right", va="bottom", fontsize="x-small",
                        color="dimgray")
            return


def line_width(i):
    """Earlier runs drawn wider, so that a later run's curve on top of the
    same values (fp32 and amp-bf16 train alike) leaves them visible."""
    return max(1.5, 4.0 - 1.0 * i)


def plot_epochs(ax, run, y, style, color, label, scale=1.0, positive=False,
                subset_marks=False, width=1.8):
    """One run's curve per epoch: partial epochs hollow, test metrics over
    a subset of the test set (subset_marks) crossed."""
    xs, ys, partial = epoch_series(run.epochs, y, scale)
    if positive:
        ys = [v if v > 0 else math.nan for v in ys]  # no log of 0
    ax.plot(xs, ys, style, color=color, label=label, linewidth=width)
    hollow = [(x, v) for x, v, p in zip(xs, ys, partial) if p]
    if hollow:
        ax.plot(*zip(*hollow), style[0], color=color, markerfacecolor="white",
                markersize=9, linestyle="none",
                label="_partial epoch (hollow, at the fraction trained)")
    crossed = [(x, v) for x, v, r in zip(xs, ys, run.epochs)
               if subset_marks and r.get("test_subset") is True]
    if crossed:
        ax.plot(*zip(*crossed), "x", color="black", markersize=10,
                linestyle="none",
                label="_test metric over a subset of the test set")


def legend_marks(ax):
    """Legend entries for the marks drawn (their labels start with "_" so
    that each run does not repeat them)."""
    labels = {line.get_label() for line in ax.get_lines()}
    if "_partial epoch (hollow, at the fraction trained)" in labels:
        ax.plot([], [], "o", color="gray", markerfacecolor="white",
                linestyle="none",
                label="partial epoch (hollow, at the fraction trained)")
    if "_test metric over a subset of the test set" in labels:
        ax.plot([], [], "x", color="black", linestyle="none",
                label="test metric over a subset of the test set")


def style(plt):
    """Font sizes that stay readable at FIGURE_SIZE."""
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 13,
                         "axes.labelsize": 11, "legend.fontsize": 10,
                         "lines.linewidth": 1.8, "lines.markersize": 6})


def epoch_figure(plt, title, ylabel, log=False, subtitle=""):
    fig, ax = plt.subplots(figsize=FIGURE_SIZE, dpi=DPI)
    ax.set_title(title + ("\n" + subtitle if subtitle else ""))
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    # Whole epochs only, even for a one-epoch run (one tick is enough).
    ax.xaxis.get_major_locator().set_params(integer=True, min_n_ticks=1)
    if log:
        # Loss scales are powers of 2: ticks at 2^k, labelled so.
        from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(
            lambda v, _: "$2^{%d}$" % round(math.log2(v)) if v > 0 else ""))
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def save(plt, fig, ax, path):
    legend_marks(ax)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
    return path


def plot_logs(paths, out_dir, title):
    runs = [run for path in paths for run in read_runs(path)]
    if not any(run.epochs for run in runs):
        raise PlotError("no epoch records in %s: nothing to plot (a log gets "
                        "one after every epoch of a run with --log-json)" %
                        ", ".join(paths))
    name_runs(runs)
    plt = load_matplotlib()
    style(plt)
    stem = ""
    if len(paths) == 1:
        base = os.path.basename(paths[0])
        stem = (base[:-len(".jsonl")] if base.endswith(".jsonl")
                else os.path.splitext(base)[0]) + "-"
    prefix = title + ": " if title else ""
    subtitle = context(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []

    def color(i):
        return colors[i % len(colors)]

    def out(name):
        return os.path.join(out_dir, stem + name)

    for run in runs:
        for line in notes(run):
            print(line, file=sys.stderr)

    fig, ax = epoch_figure(plt, prefix + "loss per epoch",
                           "loss (train: mean over the epoch; test: test set)",
                           subtitle=subtitle)
    for i, run in enumerate(runs):
        if run.epochs:
            plot_epochs(ax, run, "train_loss", "o-", color(i),
                        run.label + ", train", width=line_width(i))
            plot_epochs(ax, run, "test_loss", "s--", color(i),
                        run.label + ", test", subset_marks=True,
                        width=line_width(i))
    written.append(save(plt, fig, ax, out("loss.png")))

    # A language model's accuracy is the next token's (train_gpt's records
    # count sequences); a classifier's, the class's.
    language_model = bool(runs) and all(
        any("tokens_per_second" in r for r in run.epochs) for run in runs)
    accuracy = "next-token accuracy" if language_model else "accuracy"
    fig, ax = epoch_figure(plt, prefix + "test %s per epoch" % accuracy,
                           "test %s (%%)" % accuracy, subtitle=subtitle)
    for i, run in enumerate(runs):
        if run.epochs:
            plot_epochs(ax, run, "test_accuracy", "o-", color(i), run.label,
                        scale=100.0, subset_marks=True, width=line_width(i))
    written.append(save(plt, fig, ax, out("accuracy.png")))

    chart = plot_loss_scale(plt, runs, color, prefix, subtitle,
                            out("loss-scale.png"))
    if chart:
        written.append(chart)

    if any(run.steps or run.evaluations for run in runs):
        evaluated = any(run.evaluations for run in runs)
        fig, ax = epoch_figure(
            plt, prefix + "loss per logged step",
            "training loss (mean since the last record)" +
            ("; test loss at each evaluation" if evaluated else ""),
            subtitle=subtitle)
        ax.set_xlabel("training step (all epochs)")
        for i, run in enumerate(runs):
            if run.steps:
                ax.plot(*series(run.steps, "global_step", "loss"),
                        color=color(i), label=run.label, **step_style(i))
            if run.evaluations:
                ax.plot(*series(run.evaluations, "global_step", "test_loss"),
                        "s--", color=color(i), label=run.label + ", test",
                        linewidth=line_width(i))
        mark_epochs(ax, runs)
        written.append(save(plt, fig, ax, out("step-loss.png")))

    # Logs of lamp 0.5 and later carry the gradient norm (null without
    # --max-grad-norm) beside the learning rate in every step record.
    newer = [(i, run) for i, run in enumerate(runs)
             if any("grad_norm" in r for r in run.steps)]
    if newer:
        fig, ax = epoch_figure(plt, prefix + "learning rate per logged step",
                               "learning rate", subtitle=subtitle)
        ax.set_xlabel("training step (all epochs)")
        for i, run in newer:
            ax.plot(*series(run.steps, "global_step", "lr"), color=color(i),
                    label=run.label, **step_style(i))
        mark_epochs(ax, runs)
        written.append(save(plt, fig, ax, out("step-lr.png")))
    normed = [(i, run) for i, run in newer
              if any(isinstance(r.get("grad_norm"), (int, float))
                     for r in run.steps)]
    if normed:
        fig, ax = epoch_figure(plt, prefix + "gradient norm per logged step",
                               "gradients' L2 norm before clipping",
                               subtitle=subtitle)
        ax.set_xlabel("training step (all epochs)")
        ax.set_yscale("log")
        for i, run in normed:
            xs, ys = series(run.steps, "global_step", "grad_norm")
            ax.plot(xs, [v if v > 0 else math.nan for v in ys],
                    color=color(i), label=run.label, **step_style(i))
        mark_epochs(ax, runs)
        written.append(save(plt, fig, ax, out("step-grad-norm.png")))

    by_unit = {}
    for i, run in enumerate(runs):
        if any(not math.isnan(v) for v in step_rates(run)[1]):
            by_unit.setdefault(rate_field(run)[1], []).append((i, run))
    if not by_unit:
        print("plot.py: note: no throughput chart: the logs hold no "
              "images_per_second or tokens_per_second", file=sys.stderr)
    for unit, members in by_unit.items():
        name = "throughput.png" if len(by_unit) == 1 else \
            "throughput-%s.png" % unit.split("/")[0]
        written.append(plot_throughput(plt, members, unit, color,
                                       prefix, subtitle, out(name)))
    return written


def plot_loss_scale(plt, runs, color, prefix, subtitle, path):
    """The loss scale per epoch of the runs that scale the loss; the others
    are named on the chart and on stderr. None (no chart) where no run
    scales its loss."""
    unscaled = [run.label for run in runs if run.epochs and
                not scales_loss(run)]
    if len(unscaled) == len([run for run in runs if run.epochs]):
        print("plot.py: note: no loss-scale chart: no run scales its loss "
              "(%s: scale 1 throughout; only amp and half scale it)" %
              ", ".join(unscaled), file=sys.stderr)
        return None
    fig, ax = epoch_figure(plt, prefix + "loss scale at the end of each "
                           "epoch", "loss scale (log scale)", log=True,
                           subtitle=subtitle)
    for i, run in enumerate(runs):
        if run.epochs and scales_loss(run):
            plot_epochs(ax, run, "loss_scale", "o-", color(i), run.label,
                        positive=True, width=line_width(i))
    if unscaled:
        ax.annotate("not drawn (no loss scaling, scale 1): " +
                    ", ".join(unscaled), (0.01, 0.01),
                    xycoords="figure fraction", fontsize="small",
                    color="dimgray")
        print("plot.py: note: the loss-scale chart leaves out %s (no "
              "loss scaling: scale 1 throughout)" % ", ".join(unscaled),
              file=sys.stderr)
    return save(plt, fig, ax, path)


def plot_throughput(plt, members, unit, color, prefix, subtitle, path):
    """Throughput over the training steps (left) and each run's last epoch
    side by side (right), one colour per run."""
    fig, (over, bars) = plt.subplots(
        1, 2, figsize=(FIGURE_SIZE[0] * 1.45, FIGURE_SIZE[1]), dpi=DPI,
        gridspec_kw={"width_ratios": [3, 2]})
    fig.suptitle(prefix + "training throughput" +
                 ("\n" + subtitle if subtitle else ""))
    for i, run in members:
        over.plot(*step_rates(run), color=color(i), label=run.label,
                  **step_style(i))
    mark_epochs(over, [run for _, run in members])
    over.set_title("over the run (warm-up steps left out)")
    over.set_xlabel("training step (all epochs)")
    over.set_ylabel("%s (higher is better)" % unit)
    over.set_ylim(bottom=0)
    over.grid(True, alpha=0.3)
    over.legend()
    rates = [last_epoch_rate(run) for _, run in members]
    positions = range(len(members))
    drawn = bars.bar(positions, [0 if math.isnan(r) else r for r in rates],
                     0.6, color=[color(i) for i, _ in members])
    first = rates[0]

    def bar_text(rate):
        if math.isnan(rate):
            return "-"
        if len(rates) == 1 or math.isnan(first) or first <= 0:
            return "%.0f" % rate
        return "%.0f\n(%.2fx)" % (rate, rate / first)

    bars.bar_label(drawn, labels=[bar_text(r) for r in rates], padding=2)
    bars.set_xticks(list(positions))
    bars.set_xticklabels([run.label for _, run in members],
                         rotation=20 if len(members) > 3 else 0,
                         ha="right" if len(members) > 3 else "center")
    bars.set_title("last epoch of each run" +
                   (" (x: vs %s)" % members[0][1].label
                    if len(members) > 1 else ""))
    bars.set_ylabel(unit)
    bars.margins(y=0.12)
    bars.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
    return path


# benchmark results

def config_name(row):
    parts = ["batch %s" % row.get("batch_size", "?"),
             str(row.get("precision", "?"))]
    if row.get("channels_last"):
        parts.append("channels_last")
    if row.get("cudnn_benchmark"):
        parts.append("cudnn.benchmark")
    return "\n".join(parts)


def read_bench(path):
    try:
        report = json.loads(read_text(path))
    except ValueError as e:
        raise PlotError("%s: not JSON (%s); give the .json that bench/run.sh "
                        "wrote" % (path, e)) from None
    rows = report.get("rows") if isinstance(report, dict) else None
    if not isinstance(rows, list) or not rows:
        raise PlotError("%s: no \"rows\" with results; give the .json that "
                        "bench/run.sh wrote" % path)
    return report


UNIT_NAMES = {"img/s": "images/s", "tokens/s": "tokens/s",
              "sequences/s": "sequences/s"}


def bench_panels(rows):
    """The chart's panels, in the rows' order: (title, y-axis unit, rows),
    one per model, and per GPT shape (bench/report.py's "model_text": two
    shapes of one batch and mode are two panels, their rates apart by
    orders of magnitude), in the rows' unit (images/s before the unit was
    recorded)."""
    panels = {}
    for row in rows:
        title = str(row.get("model_text") or row.get("model"))
        unit = UNIT_NAMES.get(row.get("unit"), "images/s")
        panels.setdefault((title, unit), []).append(row)
    return [(title, unit, group) for (title, unit), group in panels.items()]


def bench_rate(entry, unit):
    """A result's rate in `unit` and its repeated runs' rates: tokens/s from
    images (sequences) per second times the tokens a sequence has."""
    rate = entry.get("images_per_second")
    runs = entry.get("runs_images_per_second") or [rate]
    tokens = entry.get("tokens_per_second")
    if unit == "tokens/s" and isinstance(tokens, (int, float)) and rate:
        scale = tokens / rate
        return tokens, [r * scale for r in runs]
    return rate, runs


def plot_bench(path, out_dir, title):
    """A bar chart of each row's rate: one panel per model and GPT shape
    (their rates differ by orders of magnitude), one group per
    configuration, one bar per tool; the whiskers span the repeated runs."""
    report = read_bench(path)
    rows = report["rows"]
    tools = [t for t in report.get("tools") or {}
             if any(isinstance(r.get(t), dict) for r in rows)]
    if not tools:
        raise PlotError("%s: the rows name no tool (\"tools\" is empty or "
                        "missing); give the .json that bench/run.sh wrote" %
                        path)
    plt = load_matplotlib()
    from matplotlib.patches import Patch
    panels = bench_panels(rows)
    fig, axes = plt.subplots(1, len(panels), squeeze=False, dpi=100,
                             figsize=(max(6, 3 + 2.2 * len(rows)), 5))
    width = 0.8 / len(tools)
    for ax, (model, unit, group) in zip(axes[0], panels):
        for t, tool in enumerate(tools):
            xs, ys, low, high = [], [], [], []
            for g, row in enumerate(group):
                entry = row.get(tool) or {}
                rate, rates = bench_rate(entry, unit)
                x = g + (t - (len(tools) - 1) / 2) * width
                if entry.get("status") != "ok" or entry.get("skipped") or \
                        not isinstance(rate, (int, float)):
                    if entry:  # "not run (no torch)" -> "not run"
                        why = "skipped" if entry.get("status") == "ok" \
                            else str(entry.get("status")).split(" (")[0]
                        ax.annotate(why, (x, 0), ha="center", va="bottom",
                                    fontsize="x-small", rotation=90)
                    continue
                xs.append(x)
                ys.append(rate)
                low.append(rate - min(rates))
                high.append(max(rates) - rate)
            spread = any(low) or any(high)
            bars = ax.bar(xs, ys, width, yerr=[low, high] if spread else None,
                          capsize=2, color="C%d" % t)
            ax.bar_label(bars, fmt="%.0f", fontsize="x-small", padding=2)
        ax.set_xlim(-0.5, len(group) - 0.5)
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels([config_name(r) for r in group], fontsize="small")
        ax.set_ylabel("%s (higher is better)" % unit)
        ax.set_title(model, fontsize="small" if len(model) > 20 else None)
        ax.margins(y=0.15)
        ax.grid(True, axis="y", alpha=0.3)
    # Handles of their own: a tool without a single bar still gets its entry.
    fig.legend([Patch(color="C%d" % t) for t in range(len(tools))], tools,
               loc="upper right", fontsize="small")
    when = str(report.get("date", ""))[:10]
    fig.suptitle((title + ": " if title else "") + "training-step throughput, "
                 "%s (%s)%s" % (report.get("device_name", "?"),
                                report.get("device", "?"),
                                ", " + when if when else ""))
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    out = bench_chart(path, out_dir)
    write_figure(fig, out)
    plt.close(fig)
    return out


def bench_chart(path, out_dir):
    """Where the chart of bench result `path` goes."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(out_dir, stem + ".png")


# main

def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="plot.py",
        description="Draws PNG charts of lamp training logs (--log-json "
        "files: loss, test accuracy and loss scale per epoch, loss per "
        "logged step, throughput) or, with --bench, of bench/run.sh results (images/s "
        "per configuration and tool). Prints the paths it wrote.")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="training logs (JSON Lines, several runs each "
                        "allowed; all overlaid), or with --bench the .json "
                        "files of bench/run.sh")
    parser.add_argument("--bench", action="store_true",
                        help="the files are bench/run.sh results: one bar "
                        "chart each, named like the file with .png")
    parser.add_argument("--out", metavar="DIR",
                        help="folder for the PNGs (created if missing; "
                        "default: the folder of the first log, or of each "
                        "bench result)")
    parser.add_argument("--title", default="",
                        help="put before every chart's title")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    try:
        if args.out:
            if os.path.exists(args.out) and not os.path.isdir(args.out):
                raise PlotError("--out %s exists and is not a folder; give a "
                                "folder for the PNGs" % args.out)
            os.makedirs(args.out, exist_ok=True)
        INPUTS.update(os.path.realpath(path) for path in args.files)
        if args.bench:
            charts = {}
            for path in args.files:
                read_bench(path)  # every input checked before any drawing
                chart = bench_chart(path, args.out or folder(path))
                if os.path.realpath(chart) in charts:
                    raise PlotError(
                        "%s and %s would both be drawn to %s; rename one or "
                        "draw them into different --out folders" %
                        (charts[os.path.realpath(chart)], path, chart))
                charts[os.path.realpath(chart)] = path
            written = [plot_bench(path, args.out or folder(path), args.title)
                       for path in args.files]
        else:
            written = plot_logs(args.files, args.out or folder(args.files[0]),
                                args.title)
    except (PlotError, OSError) as e:
        print("plot.py: error: %s" % e, file=sys.stderr)
        return 1
    try:
        for path in written:
            print(path)
        sys.stdout.flush()
    except BrokenPipeError:
        # `| head -1`: the charts are written; the paths' reader has gone.
        # Python would otherwise print a traceback, then another at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("plot.py: error: cannot write to standard output (Broken "
              "pipe): its reader has gone; the charts are written",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
