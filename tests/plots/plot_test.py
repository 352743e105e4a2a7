"""Specification of scripts/plot.py: the charts it draws from training logs
(new and old --log-json formats, several runs per file, step records) and
from bench/run.sh results, read back pixel by pixel, and its errors.

Run by ctest (label plots) with the interpreter that has matplotlib:
  python3 tests/plots/plot_test.py
"""
import importlib.util
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import unittest

try:
    import matplotlib.image
except ImportError as e:
    # scripts/test.sh installs matplotlib, so its absence is a failure here.
    sys.exit("plot_test: matplotlib is not available to %s (%s); install it "
             "with: apt-get install python3-matplotlib" % (sys.executable, e))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "scripts", "plot.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# matplotlib's default colour cycle (tab10), in plotting order.
COLORS = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c),
          (0xd6, 0x27, 0x28)]


def load_plot_module():
    spec = importlib.util.spec_from_file_location("plot", PLOT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = load_plot_module()


def write_jsonl(path, records):
    with open(path, "w") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record))
                    + "\n")
    return path


def new_run(run_id, precision, loss0, scale, model="cnn", epochs=3,
            steps_per_log=4, rate=5000.0, scaling=True,
            rate_field="images_per_second"):
    """Records of one run in the current schema: header, steps, epochs. The
    first step record is a warm-up one, at a tenth of the rate; without
    scaling every loss scale is 1."""
    time = "2026-11-23T02:37:00.123Z"
    records = [{"record": "run", "run_id": run_id, "time": time,
                "program": "train_mnist", "command_line": ["train_mnist"],
                "lamp_version": "0.1.0", "torch_version": "1.13.1",
                "cuda": None, "device": "cpu", "model": model,
                "precision": precision, "optimizer": "sgd", "batch_size": 128,
                "epochs": epochs, "lr": 0.05, "schedule": "onecycle",
                "seed": 0, "train_images": 60000, "test_images": 10000}]
    step = 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps_per_log):
            step += 10
            records.append({"record": "step", "run_id": run_id, "time": time,
                            "epoch": epoch, "global_step": step,
                            "loss": loss0 * 20.0 / (20 + step),
                            rate_field: rate / 10 if step == 10 else rate,
                            "warmup": step == 10,
                            "loss_scale": scale if scaling else 1.0,
                            "lr": 0.05, "skipped_steps": 0})
        records.append({"record": "epoch", "run_id": run_id, "time": time,
                        "program": "train_mnist", "model": model,
                        "precision": precision, "device": "cpu",
                        "batch_size": 128, "epoch": epoch,
                        "steps": 10 * steps_per_log, "global_step": step,
                        "train_loss": loss0 / epoch,
                        "test_loss": 1.2 * loss0 / epoch,
                        "test_accuracy": 0.9 - 0.3 * loss0 / epoch,
                        "seconds": 10.0, "warmup_seconds": 0.5,
                        rate_field: rate + epoch,
                        "peak_memory_bytes": 1 << 29,
                        "loss_scale": scale * 2 ** epoch if scaling else 1.0,
                        "skipped_steps": 0, "lr": 0.05})
    return records


def old_epochs(precision, loss0, epochs, scale=1.0):
    """Epoch records in the format before run headers (no "record")."""
    return [{"program": "train_mnist", "model": "cnn", "precision": precision,
             "device": "cpu", "batch_size": 128, "epoch": e,
             "train_loss": loss0 / e, "test_loss": 1.1 * loss0 / e,
             "test_accuracy": 0.85 - 0.2 * loss0 / e, "loss_scale": scale}
            for e in epochs]


def run_plot(*args, env=None):
    return subprocess.run([sys.executable, PLOT] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)


class Image:
    """A PNG read back, with the checks every chart must pass."""

    def __init__(self, test, path):
        test.assertTrue(os.path.isfile(path), path + " was not written")
        with open(path, "rb") as f:
            test.assertEqual(f.read(8), PNG_SIGNATURE, path + " is no PNG")
        test.assertGreater(os.path.getsize(path), 5000, path)
        self.pixels = matplotlib.image.imread(path)[:, :, :3]
        height, width = self.pixels.shape[:2]
        test.assertGreaterEqual(width, 400, path)
        test.assertGreaterEqual(height, 300, path)
        test.assertGreater(float(self.pixels.std()), 0.01,
                           path + " is a single colour")

    def count(self, rgb):
        """Pixels within a small distance of the colour rgb (0..255)."""
        target = [c / 255.0 for c in rgb]
        distance = abs(self.pixels - target).max(axis=2)
        return int((distance < 0.06).sum())


class PlotLogs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        # Two runs of the current schema in one file, their records
        # interleaved as two processes appending to one log would write them.
        amp = new_run("r-amp", "amp", 2.0, 1024.0)
        bf16 = new_run("r-bf16", "bf16", 1.6, 1.0)
        self.new = write_jsonl(os.path.join(self.tmp, "new.jsonl"),
                               amp[:5] + bf16 + amp[5:])
        # The old format: two runs, the second starting again at epoch 1.
        old = old_epochs("fp32", 1.3, [1, 2]) + \
            old_epochs("fp32", 0.9, [1, 2, 3], 8.0)
        old[3]["train_loss"] = None
        self.old = write_jsonl(os.path.join(self.tmp, "old.jsonl"), old)

    def tearDown(self):
        self.dir.cleanup()

    def test_draws_every_run_of_every_file_in_its_own_colour(self):
        out = os.path.join(self.tmp, "charts")
        result = run_plot("--out", out, "--title", "synthetic", self.new,
                          self.old)
        self.assertEqual(result.returncode, 0, result.stderr)
        names = ["loss.png", "accuracy.png", "loss-scale.png", "step-loss.png",
                 "throughput.png"]
        self.assertEqual(result.stdout.split(),
                         [os.path.join(out, n) for n in names])
        for name in names[:2]:
            image = Image(self, os.path.join(out, name))
            for i, rgb in enumerate(COLORS):  # amp, bf16, fp32 #1, fp32 #2
                self.assertGreater(image.count(rgb), 300,
                                   "%s: run %d's curve is missing" % (name, i))
        # fp32 #1 keeps scale 1: left out of the loss-scale chart, and said.
        scale = Image(self, os.path.join(out, "loss-scale.png"))
        for i in (0, 1, 3):
            self.assertGreater(scale.count(COLORS[i]), 300, "run %d" % i)
        self.assertLess(scale.count(COLORS[2]), 20)
        self.assertIn("the loss-scale chart leaves out fp32 #1 (no loss "
                      "scaling: scale 1 throughout)", result.stderr)
        steps = Image(self, os.path.join(out, "step-loss.png"))
        for rgb in COLORS[:2]:  # only the new-format runs have steps
            self.assertGreater(steps.count(rgb), 300)
        self.assertLess(steps.count(COLORS[2]), 20)
        # Only the new-format runs say how fast they were.
        rates = Image(self, os.path.join(out, "throughput.png"))
        for rgb in COLORS[:2]:
            self.assertGreater(rates.count(rgb), 1000)
        for rgb in COLORS[2:]:
            self.assertLess(rates.count(rgb), 20)

    def test_charts_of_one_log_carry_its_name_and_no_steps_no_step_chart(self):
        result = run_plot(self.old)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.split(), [
            os.path.join(self.tmp, "old-" + n)
            for n in ("loss.png", "accuracy.png", "loss-scale.png")])
        Image(self, os.path.join(self.tmp, "old-loss.png"))
        self.assertIn("no throughput chart: the logs hold no "
                      "images_per_second", result.stderr)

    def test_groups_records_by_run_id(self):
        runs = plot.read_runs(self.new)
        self.assertEqual([r.run_id for r in runs], ["r-amp", "r-bf16"])
        self.assertEqual([len(r.epochs) for r in runs], [3, 3])
        self.assertEqual([len(r.steps) for r in runs], [12, 12])
        self.assertEqual(runs[0].header["precision"], "amp")

    def test_old_logs_start_a_run_where_the_epoch_goes_down_or_repeats(self):
        path = write_jsonl(os.path.join(self.tmp, "o.jsonl"),
                           old_epochs("fp32", 1.0, [1, 2, 3]) +
                           old_epochs("fp32", 1.0, [2, 3]) +
                           old_epochs("fp32", 1.0, [3]) +
                           old_epochs("fp32", 1.0, [1]))
        runs = plot.read_runs(path)
        self.assertEqual([[e["epoch"] for e in r.epochs] for r in runs],
                         [[1, 2, 3], [2, 3], [3], [1]])

    def test_a_resumed_old_log_stays_one_run(self):
        path = write_jsonl(os.path.join(self.tmp, "o.jsonl"),
                           old_epochs("bf16", 1.0, [1, 2]) +
                           old_epochs("bf16", 1.0, [3, 4]))
        self.assertEqual(len(plot.read_runs(path)), 1)

    def test_names_runs_by_precision_and_what_differs(self):
        same = plot.read_runs(self.new) + plot.read_runs(self.old)
        plot.name_runs(same)
        self.assertEqual([r.label for r in same],
                         ["amp", "bf16", "fp32 #1", "fp32 #2"])
        path = write_jsonl(os.path.join(self.tmp, "m.jsonl"),
                           new_run("a", "bf16", 1.0, 1.0) +
                           new_run("b", "bf16", 1.0, 1.0, model="resnet18"))
        runs = plot.read_runs(path)
        plot.name_runs(runs)
        self.assertEqual([r.label for r in runs],
                         ["bf16, cnn", "bf16, resnet18"])
        lr = new_run("c", "bf16", 1.0, 1.0)
        lr[0]["lr"] = 0.1
        runs = plot.read_runs(write_jsonl(os.path.join(self.tmp, "l.jsonl"),
                                          new_run("a", "bf16", 1.0, 1.0) + lr))
        plot.name_runs(runs)
        self.assertEqual([r.label for r in runs],
                         ["bf16, lr 0.05", "bf16, lr 0.1"])
        runs = plot.read_runs(write_jsonl(
            os.path.join(self.tmp, "l3.jsonl"),
            new_run("a", "bf16", 1.0, 1.0) + lr + new_run("d", "bf16", 1.0,
                                                          1.0)))
        plot.name_runs(runs)
        self.assertEqual([r.label for r in runs],
                         ["bf16, lr 0.05 #1", "bf16, lr 0.1",
                          "bf16, lr 0.05 #2"])

    def test_a_null_loss_is_a_gap_not_an_error(self):
        # setUp's old log has one (a non-finite loss is written as null); the
        # drawing tests draw it.
        runs = plot.read_runs(self.old)
        xs, ys = plot.series(runs[1].epochs, "epoch", "train_loss")
        self.assertEqual(xs, [1.0, 2.0, 3.0])
        self.assertTrue(math.isnan(ys[1]))
        self.assertEqual(ys[2], 0.3)

    def partial_log(self, name, subset=True):
        """A two-epoch run whose second epoch --max-steps cut after 2 of 6
        steps, evaluated (with subset) on 2 of 4 test batches."""
        records = new_run("p", "bf16", 1.0, 1.0, epochs=2)
        for record in records:
            if record["record"] == "epoch":
                record.update({"steps": 6, "steps_in_epoch": 6,
                               "partial": False, "test_subset": False,
                               "test_batches": 4, "test_batches_in_set": 4})
        records[-1].update({"steps": 2, "partial": True,
                            "test_subset": subset, "test_batches": 2})
        return write_jsonl(os.path.join(self.tmp, name), records)

    def test_a_partial_epoch_is_drawn_at_the_fraction_trained_and_noted(self):
        runs = plot.read_runs(self.partial_log("partial.jsonl"))
        xs, ys, partial = plot.epoch_series(runs[0].epochs, "train_loss")
        self.assertEqual(xs, [1.0, 1.0 + 2 / 6])
        self.assertEqual(partial, [False, True])
        # Records that say nothing of it (older logs) are whole epochs.
        xs, _, partial = plot.epoch_series(runs[0].epochs[:1] +
                                           old_epochs("fp32", 1.0, [2]),
                                           "train_loss")
        self.assertEqual((xs, partial), ([1.0, 2.0], [False, False]))
        # Partial without "partial" (steps short of steps_in_epoch) too.
        self.assertTrue(plot.is_partial({"epoch": 1, "steps": 3,
                                         "steps_in_epoch": 7}))
        out = os.path.join(self.tmp, "charts")
        result = run_plot("--out", out, os.path.join(self.tmp,
                                                     "partial.jsonl"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(len(result.stdout.split()), 5)  # only the paths
        self.assertIn("bf16: epoch 2: partial (2 of 6 steps), drawn hollow "
                      "at 1.33; its test metrics are over 2 of 4 test "
                      "batches, marked x", result.stderr)
        self.assertNotIn("epoch 1:", result.stderr)

    def test_test_metrics_over_a_subset_are_crossed(self):
        whole = os.path.join(self.tmp, "whole")
        subset = os.path.join(self.tmp, "subset")
        for folder, flag in ((whole, False), (subset, True)):
            result = run_plot("--out", folder,
                              self.partial_log("l.jsonl", subset=flag))
            self.assertEqual(result.returncode, 0, result.stderr)
        black = (0, 0, 0)
        with_cross = Image(self, os.path.join(subset, "l-accuracy.png"))
        without = Image(self, os.path.join(whole, "l-accuracy.png"))
        # The cross and its legend entry, in black.
        self.assertGreater(with_cross.count(black), without.count(black) + 40)

    def test_no_loss_scale_chart_where_no_run_scales_its_loss(self):
        # fp32 and amp-bf16 keep scale 1: the chart would be a flat line.
        path = write_jsonl(os.path.join(self.tmp, "cpu.jsonl"),
                           new_run("a", "fp32", 1.0, 1.0, scaling=False) +
                           new_run("b", "amp-bf16", 1.0, 1.0, scaling=False))
        runs = plot.read_runs(path)
        self.assertEqual([plot.scales_loss(r) for r in runs], [False, False])
        result = run_plot("--out", self.tmp, path)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([os.path.basename(p) for p in result.stdout.split()],
                         ["cpu-loss.png", "cpu-accuracy.png",
                          "cpu-step-loss.png", "cpu-throughput.png"])
        self.assertIn("no loss-scale chart: no run scales its loss (fp32, "
                      "amp-bf16: scale 1 throughout", result.stderr)
        # amp scales at scale 1 too (a static scaler): it is drawn.
        self.assertTrue(plot.scales_loss(plot.read_runs(write_jsonl(
            os.path.join(self.tmp, "s.jsonl"),
            new_run("c", "amp", 1.0, 1.0, scaling=False)))[0]))

    def test_runs_by_steps_draw_evaluations_lr_and_gradient_norm(self):
        # A run of lamp 0.5: step records with grad_norm (one null: a step
        # whose cycle did not end), evaluations every N steps, and epochs
        # that were not evaluated (their test fields are 0, not losses).
        records = new_run("s", "amp-bf16", 2.0, 1.0, scaling=False)
        for r in records:
            if r["record"] == "step":
                r["grad_norm"] = None if r["global_step"] == 20 else \
                    4.0 / r["global_step"]
                r["lr"] = 1e-3 * min(1.0, r["global_step"] / 40)
            if r["record"] == "epoch":
                r.update(evaluated=False, test_loss=0, test_accuracy=0)
        records += [{"record": "evaluation", "run_id": "s", "global_step": g,
                     "epoch": g // 40 + 1, "test_loss": 3.0 / g,
                     "test_accuracy": 0.5} for g in (40, 80, 120)]
        path = write_jsonl(os.path.join(self.tmp, "gpt.jsonl"), records)
        runs = plot.read_runs(path)
        self.assertEqual([len(runs[0].evaluations)], [3])
        xs, ys, _ = plot.epoch_series(runs[0].epochs, "test_loss")
        self.assertTrue(all(math.isnan(v) for v in ys))
        result = run_plot("--out", self.tmp, path)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual([os.path.basename(p) for p in result.stdout.split()],
                         ["gpt-loss.png", "gpt-accuracy.png",
                          "gpt-step-loss.png", "gpt-step-lr.png",
                          "gpt-step-grad-norm.png", "gpt-throughput.png"])
        for name in ("gpt-step-lr.png", "gpt-step-grad-norm.png"):
            self.assertGreater(
                Image(self, os.path.join(self.tmp, name)).count(COLORS[0]),
                300, name)
        # The evaluations are drawn on the step chart, beside the training
        # loss: more of the run's colour than the training curve alone.
        alone = write_jsonl(os.path.join(self.tmp, "alone.jsonl"),
                            [r for r in records
                             if r["record"] != "evaluation"])
        self.assertEqual(run_plot("--out", self.tmp, alone).returncode, 0)
        with_evals = Image(self, os.path.join(self.tmp, "gpt-step-loss.png"))
        without = Image(self, os.path.join(self.tmp, "alone-step-loss.png"))
        self.assertGreater(with_evals.count(COLORS[0]),
                           without.count(COLORS[0]) + 200)

    def test_throughput_of_each_run_side_by_side(self):
        fp32 = write_jsonl(os.path.join(self.tmp, "fp32.jsonl"),
                           new_run("a", "fp32", 1.0, 1.0, rate=4000.0,
                                   scaling=False))
        bf16 = write_jsonl(os.path.join(self.tmp, "bf16.jsonl"),
                           new_run("b", "amp-bf16", 1.0, 1.0, rate=9000.0,
                                   scaling=False))
        runs = plot.read_runs(fp32) + plot.read_runs(bf16)
        # Warm-up step records are left out; the bars are the last epochs.
        steps, rates = plot.step_rates(runs[1])
        self.assertEqual(steps[0], 20.0)
        self.assertEqual(set(rates), {9000.0})
        self.assertEqual([plot.last_epoch_rate(r) for r in runs],
                         [4003.0, 9003.0])
        self.assertEqual(plot.rate_field(runs[0]),
                         ("images_per_second", "images/s"))
        out = os.path.join(self.tmp, "charts")
        result = run_plot("--out", out, fp32, bf16)
        self.assertEqual(result.returncode, 0, result.stderr)
        path = os.path.join(out, "throughput.png")
        self.assertIn(path, result.stdout.split())
        image = Image(self, path)
        height, width = image.pixels.shape[:2]
        self.assertGreaterEqual((width, height), (1600, 700))
        self.assertLess(os.path.getsize(path), 1 << 20)
        # Each run's curve on the left and its bar on the right, the faster
        # run's bar the taller.
        right = image.pixels[:, width * 6 // 10:]
        for rgb in COLORS[:2]:
            self.assertGreater(image.count(rgb), 1000)

        def rows(rgb):
            target = [c / 255.0 for c in rgb]
            hit = (abs(right - target).max(axis=2) < 0.06).any(axis=1)
            return int(hit.sum())

        self.assertGreater(rows(COLORS[0]), 100, "no fp32 bar")
        self.assertGreater(rows(COLORS[1]), 1.8 * rows(COLORS[0]),
                           "the amp-bf16 bar is not about 9/4 as tall")

    def test_logs_that_count_tokens_chart_tokens_per_second(self):
        tokens = write_jsonl(os.path.join(self.tmp, "lm.jsonl"),
                             new_run("t", "amp-bf16", 1.0, 1.0,
                                     rate_field="tokens_per_second"))
        runs = plot.read_runs(tokens)
        self.assertEqual(plot.rate_field(runs[0]),
                         ("tokens_per_second", "tokens/s"))
        images = write_jsonl(os.path.join(self.tmp, "cnn.jsonl"),
                             new_run("i", "fp32", 1.0, 1.0))
        out = os.path.join(self.tmp, "charts")
        result = run_plot("--out", out, tokens, images)
        self.assertEqual(result.returncode, 0, result.stderr)
        # Two units are never drawn on one axis.
        names = [os.path.basename(p) for p in result.stdout.split()]
        self.assertIn("throughput-tokens.png", names)
        self.assertIn("throughput-images.png", names)
        self.assertNotIn("throughput.png", names)
        Image(self, os.path.join(out, "throughput-tokens.png"))

    def expect_error(self, args, *messages, code=1, env=None):
        result = run_plot(*args, env=env)
        self.assertEqual(result.returncode, code, result.stderr)
        for message in messages:
            self.assertIn(message, result.stderr)
        self.assertEqual(result.stdout, "")

    def test_a_line_that_is_not_json_names_file_and_line(self):
        path = write_jsonl(os.path.join(self.tmp, "bad.jsonl"),
                           old_epochs("fp32", 1.0, [1, 2]) +
                           ["{\"epoch\": 3,"])
        self.expect_error([path], path + ":3: not JSON")
        path = write_jsonl(os.path.join(self.tmp, "list.jsonl"), [[1, 2]])
        self.expect_error([path], path + ":1: a JSON list, not an object")

    def test_missing_and_empty_files_and_logs_without_epochs_fail(self):
        missing = os.path.join(self.tmp, "missing.jsonl")
        self.expect_error([self.new, missing], missing + ": no such file")
        empty = write_jsonl(os.path.join(self.tmp, "empty.jsonl"), ["", " "])
        self.expect_error([empty], empty + ": empty log")
        header = write_jsonl(os.path.join(self.tmp, "header.jsonl"),
                             new_run("h", "fp32", 1.0, 1.0)[:1])
        self.expect_error([header], "no epoch records in " + header)
        self.expect_error(["--out", self.new, self.old],
                          "--out %s exists and is not a folder" % self.new)

    def test_usage_errors_exit_2(self):
        self.expect_error([], "usage: plot.py", code=2)
        self.expect_error(["--colour", "red", self.old], "usage: plot.py",
                          code=2)
        result = run_plot("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("--bench", result.stdout)

    def test_without_matplotlib_it_says_what_to_install(self):
        fake = os.path.join(self.tmp, "fake", "matplotlib")
        os.makedirs(fake)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named matplotlib')\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(fake))
        self.expect_error([self.old], "apt-get install python3-matplotlib",
                          env=env)
        self.expect_error(["--bench", write_bench(self.tmp)],
                          "apt-get install python3-matplotlib", env=env)


def write_bench(folder):
    """A bench/run.sh report: two models, two tools, one entry skipped and
    one with three repeated runs."""
    def entry(rate, **extra):
        return dict({"images_per_second": rate, "status": "ok",
                     "skipped": None}, **extra)

    def row(model, batch, precision, lamp, peer):
        return {"model": model, "batch_size": batch, "precision": precision,
                "channels_last": model == "resnet18",
                "cudnn_benchmark": False, "lamp": lamp,
                "pytorch-eager": peer}

    report = {"date": "2026-11-22T07:59:23Z", "device": "cpu",
              "device_name": "Test CPU", "repeats": 3,
              "tools": {"lamp": {"tool": "lamp"},
                        "pytorch-eager": {"tool": "pytorch-eager"}},
              "rows": [row("cnn", 64, "fp32", entry(4871.0), entry(4324.0)),
                       row("cnn", 64, "bf16",
                           entry(9502.0, runs_images_per_second=[
                               9100.0, 9502.0, 9700.0]),
                           entry(None, skipped="no FP16 on CPU")),
                       row("resnet18", 32, "fp32", entry(33.0), entry(33.3)),
                       row("resnet18", 32, "bf16", entry(71.6),
                           {"status": "not run (no torch)"})],
              "seed": []}
    path = os.path.join(folder, "cpu-2026-11-22.json")
    with open(path, "w") as f:
        json.dump(report, f)
    return path


class BenchPanels(unittest.TestCase):
    def test_a_panel_per_model_and_gpt_shape_in_the_row_s_unit(self):
        # GPT-2 124M's row and the 4096-wide one share batch 8 and amp-bf16:
        # two panels, in tokens/s; the CNN rows of one model share theirs;
        # a row from before the unit was recorded is in images/s.
        def row(model, text=None, unit=None):
            return dict({"model": model, "batch_size": 8,
                         "precision": "amp-bf16"},
                        **({"model_text": text} if text else {}),
                        **({"unit": unit} if unit else {}))
        small = "gpt (12 layers, 12 heads, width 768, context 1024, vocab 50304)"
        wide = "gpt (2 layers, 32 heads, width 4096, context 1024, vocab 256)"
        rows = [row("gpt", small, "tokens/s"), row("gpt", wide, "tokens/s"),
                row("resnet50", "resnet50", "img/s"),
                row("resnet50", "resnet50", "img/s"), row("cnn")]
        panels = plot.bench_panels(rows)
        self.assertEqual([(title, unit, len(group))
                          for title, unit, group in panels],
                         [(small, "tokens/s", 1), (wide, "tokens/s", 1),
                          ("resnet50", "images/s", 2),
                          ("cnn", "images/s", 1)])

    def test_rates_in_tokens_scale_the_repeats(self):
        entry = {"images_per_second": 10.0, "tokens_per_second": 10240.0,
                 "runs_images_per_second": [9.0, 10.0, 11.0]}
        self.assertEqual(plot.bench_rate(entry, "tokens/s"),
                         (10240.0, [9216.0, 10240.0, 11264.0]))
        self.assertEqual(plot.bench_rate(entry, "images/s"),
                         (10.0, [9.0, 10.0, 11.0]))
        self.assertEqual(plot.bench_rate({"images_per_second": 5.0},
                                         "tokens/s"), (5.0, [5.0]))


class PlotBench(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def test_draws_a_bar_per_tool_and_configuration_beside_the_json(self):
        path = write_bench(self.tmp)
        result = run_plot("--bench", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        png = os.path.join(self.tmp, "cpu-2026-11-22.png")
        self.assertEqual(result.stdout.split(), [png])
        image = Image(self, png)
        self.assertGreater(image.count(COLORS[0]), 5000, "no lamp bars")
        self.assertGreater(image.count(COLORS[1]), 5000, "no PyTorch bars")

    def test_a_tool_that_never_ran_keeps_its_legend_entry(self):
        path = write_bench(self.tmp)
        with open(path) as f:
            report = json.load(f)
        for row in report["rows"]:
            row["pytorch-eager"] = {"status": "not run (no torch)"}
        with open(path, "w") as f:
            json.dump(report, f)
        result = run_plot("--bench", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        image = Image(self, os.path.join(self.tmp, "cpu-2026-11-22.png"))
        self.assertGreater(image.count(COLORS[0]), 5000)
        self.assertGreater(image.count(COLORS[1]), 50, "no legend patch")
        self.assertLess(image.count(COLORS[1]), 1000, "bars that never ran")

    def test_bad_results_fail(self):
        path = os.path.join(self.tmp, "bad.json")
        with open(path, "w") as f:
            f.write("{\"rows\": [")
        result = run_plot("--bench", path)
        self.assertEqual(result.returncode, 1)
        self.assertIn(path + ": not JSON", result.stderr)
        with open(path, "w") as f:
            json.dump({"rows": []}, f)
        result = run_plot("--bench", path)
        self.assertEqual(result.returncode, 1)
        self.assertIn("no \"rows\" with results", result.stderr)

    def test_a_failed_write_keeps_the_chart_that_was_there(self):
        # A file size limit below a chart's size (a full disk fails alike):
        # the error names the chart, and the one drawn before stays whole.
        path = write_bench(self.tmp)
        self.assertEqual(run_plot("--bench", path).returncode, 0)
        png = os.path.join(self.tmp, "cpu-2026-11-22.png")
        with open(png, "rb") as f:
            before = f.read()
        result = subprocess.run(
            [sys.executable, PLOT, "--bench", path], capture_output=True,
            text=True, timeout=60, preexec_fn=lambda: resource.setrlimit(
                resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY)))
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("plot.py: error: cannot write %s: File too large" % png,
                      result.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(self.tmp)),
                         ["cpu-2026-11-22.json", "cpu-2026-11-22.png"])

    def test_charts_that_would_overwrite_each_other_or_an_input_fail(self):
        first = write_bench(os.path.join(self.tmp))
        os.makedirs(os.path.join(self.tmp, "b"))
        second = write_bench(os.path.join(self.tmp, "b"))
        out = os.path.join(self.tmp, "out")
        result = run_plot("--bench", first, second, "--out", out)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("%s and %s would both be drawn to %s; rename one or "
                      "draw them into different --out folders" %
                      (first, second, os.path.join(out, "cpu-2026-11-22.png")),
                      result.stderr)
        self.assertEqual(os.listdir(out), [])
        named_png = os.path.join(self.tmp, "results.png")
        os.rename(first, named_png)
        result = run_plot("--bench", named_png)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("the chart %s would overwrite one of the files read; "
                      "give another --out" % named_png, result.stderr)
        with open(named_png) as f:
            self.assertEqual(json.load(f)["device"], "cpu")

    def test_a_reader_that_goes_away_is_an_error_not_a_traceback(self):
        path = write_bench(self.tmp)
        result = subprocess.run(
            ["bash", "-c", '"$1" "$2" --bench "$3" | head -c 0; '
             'exit "${PIPESTATUS[0]}"', "_", sys.executable, PLOT, path],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr,
                         "plot.py: error: cannot write to standard output "
                         "(Broken pipe): its reader has gone; the charts are "
                         "written\n")
        Image(self, os.path.join(self.tmp, "cpu-2026-11-22.png"))


if __name__ == "__main__":
    unittest.main()
