#!/usr/bin/env python3
"""bench/run.sh's CUDA run without a GPU: which rows it runs, in which
order, and which blocks its time budget skips, with a stand-in lamp_bench
that records its arguments and writes a result, and a stand-in Python
without torch (so the PyTorch columns read "not run"). A mistake in the CUDA
branch would otherwise show only on a GPU machine, after its call's minutes
are spent. Standard library only."""

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# lamp_bench's stand-in: appends its arguments to $RUN_PLAN_LOG, one line a
# process, and writes its --json as lamp_bench does (a header and one
# result, with the fields bench/report.py reads).
FAKE_BENCH = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["RUN_PLAN_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    def flag(name, default=None):
        return args[args.index(name) + 1] if name in args else default
    result = {"model": flag("--model"), "batch_size": int(flag("--batch-size")),
              "precision": flag("--precision"),
              "channels_last": "--channels-last" in args,
              "cudnn_benchmark": "--cudnn-benchmark" in args,
              "steps": 30, "warmup": 10, "epoch_images": 50000,
              "images_per_second": 100.0,
              "repeats_images_per_second": [100.0, 100.0, 100.0],
              "skipped": None, "skipped_steps": 0, "steps_run": 130,
              "peak_memory_bytes": 2 ** 30}
    if flag("--model") == "gpt":
        context = int(flag("--context"))
        result.update({"context": context, "tokens_per_second": 100.0 * context,
                       "gpt_layers": int(flag("--gpt-layers")),
                       "gpt_heads": int(flag("--gpt-heads")),
                       "gpt_width": int(flag("--gpt-width")),
                       "vocab_size": int(flag("--gpt-vocab", "256"))})
    with open(flag("--json"), "w") as out:
        json.dump({"torch_version": "2.11.0", "device": "cuda",
                   "device_name": "a stand-in", "threads": 1,
                   "results": [result]}, out)
    """)

# The first block, which runs whatever the budget: the small GPT's lamp
# processes, as CudaRunPlan.describe() names them.
SMALL_GPT_ROWS = [
    ("gpt", 384, "amp-bf16", "lamp"),
    ("gpt", 384, "amp-bf16", "lamp-graph"),
    ("gpt", 384, "amp-bf16", "lamp-graph-fused"),
    ("gpt", 384, "amp-bf16", "lamp-graph-sdpa-flash"),
    ("gpt", 384, "amp-bf16", "lamp-graph-sdpa-memory-efficient"),
    ("gpt", 384, "amp-bf16", "lamp-graph-sdpa-cudnn"),
]

# The small GPT's fused kernels one at a time, the block after it.
ONE_FUSION_ROWS = [
    ("gpt", 384, "amp-bf16", "lamp-graph-only-" + name)
    for name in ("add-norm", "mlp", "head-loss", "weight-cast", "bias-grad")
]

# The Python for the PyTorch side: one without torch.
NO_TORCH_PYTHON = "#!/bin/sh\nexit 1\n"

# A Python "with torch" for the PyTorch side: every `-c` probe succeeds, and
# bench/peer_pytorch.py's run appends its malloc variables to
# $RUN_PLAN_LOG.peer and writes a result per tool of --tools.
FAKE_PEER_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    args = sys.argv[1:]
    if args[:1] == ["-c"]:
        sys.exit(0)
    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    with open(os.environ["RUN_PLAN_LOG"] + ".peer", "a") as log:
        log.write(json.dumps({n: os.environ.get(n) for n in names}) + "\\n")
    def flag(name, default=None):
        return args[args.index(name) + 1] if name in args else default
    results = [{"tool": tool, "model": flag("--model"),
                "batch_size": int(flag("--batch-size")),
                "precision": flag("--precision"),
                "channels_last": False, "cudnn_benchmark": False,
                "steps": 5, "warmup": 1, "epoch_images": 60000,
                "images_per_second": 100.0,
                "repeats_images_per_second": [100.0],
                "skipped": None, "skipped_steps": 0, "steps_run": 6,
                "peak_memory_bytes": 2 ** 30}
               for tool in flag("--tools").split(",")]
    # $FAIL_TOOL's run fails as peer_pytorch.py reports one of several.
    for result in results:
        if result["tool"] == os.environ.get("FAIL_TOOL"):
            del result["images_per_second"]
            result["failed"] = "TypeError: a stand-in's mistake"
    with open(flag("--json"), "w") as out:
        json.dump({"tool": flag("--tools"), "torch_version": "2.11.0",
                   "device": "cpu", "device_name": "a stand-in",
                   "threads": 1, "results": results}, out)
    sys.exit(3 if any(r.get("failed") for r in results) else 0)
    """)


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class CudaRunPlan(unittest.TestCase):
    def run_plan(self, budget):
        """Runs bench/run.sh --device cuda with the stand-ins and the budget;
        gives (the lamp_bench runs as (model, width or batch, precision,
        tool) tuples, stderr, the exit code, the reports' texts by file
        name)."""
        with tempfile.TemporaryDirectory() as tmp:
            bench = os.path.join(tmp, "lamp_bench")
            python = os.path.join(tmp, "python")
            log = os.path.join(tmp, "runs.log")
            executable(bench, FAKE_BENCH)
            executable(python, NO_TORCH_PYTHON)
            env = dict(os.environ, LAMP_BENCH=bench, LAMP_PYTHON_TORCH=python,
                       LAMP_BENCH_BUDGET_S=str(budget), RUN_PLAN_LOG=log)
            proc = subprocess.run(
                ["bash", os.path.join(ROOT, "bench", "run.sh"),
                 "--device", "cuda", "--repeats", "1",
                 "--out", os.path.join(tmp, "out")],
                cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=120)
            runs = []
            if os.path.exists(log):
                with open(log) as f:
                    for line in f:
                        args = json.loads(line)
                        runs.append(self.describe(args))
            reports = {}
            out = os.path.join(tmp, "out")
            for name in (os.listdir(out) if os.path.isdir(out) else []):
                if name.endswith((".md", ".json")):  # not the chart
                    with open(os.path.join(out, name)) as f:
                        reports[name] = f.read()
            return runs, proc.stderr, proc.returncode, reports

    @staticmethod
    def describe(args):
        def flag(name, default=None):
            return args[args.index(name) + 1] if name in args else default
        if "--cuda-graph" not in args:
            tool = "lamp"
        elif "--attention" in args:
            tool = "lamp-graph-sdpa-" + flag("--attention")
        elif sum(a.startswith("--fused-") and a != "--fused-bn"
                 for a in args) > 1:
            tool = "lamp-graph-fused"
        elif any(a.startswith("--fused-") and a != "--fused-bn"
                 for a in args):
            tool = "lamp-graph-only-" + next(
                a for a in args
                if a.startswith("--fused-") and a != "--fused-bn")[8:]
        elif "--fp8-fused-casts" in args:
            tool = "lamp-graph-only-fp8-casts"
        elif flag("--fused-bn") == "off":
            tool = "lamp-graph-stock-bn"
        else:
            tool = "lamp-graph"
        size = flag("--gpt-width") if flag("--model") == "gpt" \
            else flag("--batch-size")
        return (flag("--model"), int(size), flag("--precision"), tool)

    def test_a_whole_budget_runs_the_gpt_rows_first_then_the_cnns(self):
        runs, stderr, rc, reports = self.run_plan(budget=100000)
        self.assertEqual(rc, 0, stderr)
        self.assertNotIn("skipped:", stderr)
        self.assertEqual(runs, SMALL_GPT_ROWS + ONE_FUSION_ROWS + [
            ("gpt", 768, "amp-bf16", "lamp-graph"),
            ("gpt", 768, "amp-bf16", "lamp-graph-fused"),
            ("gpt", 4096, "amp-bf16", "lamp-graph"),
            ("gpt", 4096, "amp-bf16", "lamp-graph-fused"),
            ("gpt", 4096, "fp8", "lamp-graph"),
            ("gpt", 4096, "fp8", "lamp-graph-fused"),
            ("resnet50", 512, "amp", "lamp"),
            ("resnet50", 512, "amp", "lamp-graph"),
            ("resnet50", 512, "amp", "lamp-graph-stock-bn"),
            ("resnet18", 128, "amp", "lamp"),
            ("resnet18", 128, "amp", "lamp-graph"),
            ("resnet18", 512, "amp", "lamp"),
            ("resnet18", 512, "amp", "lamp-graph"),
            ("gpt", 384, "fp8", "lamp"),
            ("gpt", 384, "fp8", "lamp-graph"),
            ("gpt", 384, "fp8", "lamp-graph-fused"),
            ("gpt", 384, "fp8", "lamp-graph-only-fp8-casts"),
            ("resnet50", 512, "tf32", "lamp"),
            ("resnet50", 512, "fp32", "lamp"),
            ("resnet18", 128, "fp32", "lamp"),
        ])
        # The report of the whole run is written, GPT-2 124M's row and the
        # 4096-wide one apart although both are 8 sequences in amp-bf16.
        md = [text for name, text in reports.items() if name.endswith(".md")]
        self.assertEqual(len(md), 1, sorted(reports))
        self.assertTrue(any(n.endswith(".json") for n in reports),
                        sorted(reports))
        headline = md[0].split("## ")[0]
        for shape in ("12 layers, 12 heads, width 768",
                      "2 layers, 32 heads, width 4096",
                      "6 layers, 6 heads, width 384"):
            self.assertIn("| gpt (%s" % shape, headline)
        self.assertEqual(headline.count("| gpt ("), 5, headline)
        # The kernels alone, in their own table: the small GPT's amp-bf16
        # row (stand-in rates, all 1.00x) and its fp8 row.
        fusions = md[0].split("## The GPT's fused kernels one at a time")[1]
        fusions = fusions.split("\n## ")[0]
        rows = [l for l in fusions.splitlines() if l.startswith("| gpt (")]
        self.assertEqual(len(rows), 2, fusions)
        self.assertIn("| amp-bf16 | tokens/s | 102400 | 1.00x | 1.00x | "
                      "1.00x | 1.00x | 1.00x | - | 1.00x |", rows[0])
        self.assertIn("| fp8 | tokens/s | 102400 | - | - | - | - | - | "
                      "1.00x | 1.00x |", rows[1])

    def test_the_fused_tool_asks_for_every_fused_kernel(self):
        runs, stderr, rc, _ = self.run_plan(budget=100000)
        self.assertEqual(rc, 0, stderr)
        # run.sh's lines name each process's arguments, which describe()
        # reduces to a tool's name.
        self.assertIn("--fused-mlp --fused-head-loss --fused-weight-cast "
                      "--fused-bias-grad", stderr)
        self.assertIn("--precision fp8", stderr)
        fp8_fused = [line for line in stderr.splitlines()
                     if line.startswith("== [") and "lamp-graph-fused:" in line
                     and "--precision fp8" in line]
        self.assertTrue(fp8_fused, stderr)
        for line in fp8_fused:
            self.assertIn("--fp8-fused-casts", line)
        # Each kernel alone: the graph step with that one flag, no other
        # fused kernel; in the small GPT's row (its shape and batch), so
        # that the report sets them beside its lamp-graph.
        alone = [line for line in stderr.splitlines()
                 if line.startswith("== [") and "lamp-graph-only-" in line]
        self.assertEqual(len(alone), 6, stderr)
        for line in alone:
            name = line.split("lamp-graph-only-")[1].split(":")[0]
            flag = "--fp8-fused-casts" if name == "fp8-casts" \
                else "--fused-" + name
            args = line.split(": ", 1)[1].split()
            self.assertEqual([a for a in args if "fused" in a], [flag], line)
            self.assertIn("--cuda-graph", args)
            self.assertIn("--gpt-width 384", line)
            self.assertIn("--batch-size 16", line)
        # GPT-2 124M's rows: its vocabulary and GELU.
        gpt2 = [line for line in stderr.splitlines()
                if line.startswith("== [") and "--gpt-width 768" in line]
        self.assertEqual(len(gpt2), 2, stderr)
        for line in gpt2:
            self.assertIn("--gpt-vocab 50304", line)
            self.assertIn("--gpt-gelu tanh", line)

    def test_a_spent_budget_runs_the_small_gpt_and_names_every_block_skipped(self):
        runs, stderr, rc, _ = self.run_plan(budget=0)
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(runs, SMALL_GPT_ROWS)
        skipped = [line.split(" skipped:")[0].replace("run.sh: ", "")
                   for line in stderr.splitlines() if " skipped: " in line]
        self.assertEqual(skipped, [
            "the small GPT's fused kernels one at a time",
            "the GPT-2 124M rows", "the 4096-wide FP8 rows",
            "the resnet50 b512 amp rows", "the resnet18 b128 amp rows",
            "the resnet18 b512 amp rows", "the small GPT's fp8 rows",
            "lamp's tf32 and fp32 rows"])
        self.assertIn("LAMP_BENCH_BUDGET_S raises it", stderr)


class PeerEnvironment(unittest.TestCase):
    def run_quick(self, extra_env):
        """Runs bench/run.sh --quick --device cpu with the stand-ins (a Python
        "with torch") and gives (the peer processes' malloc variables,
        stderr, the exit code)."""
        with tempfile.TemporaryDirectory() as tmp:
            bench = os.path.join(tmp, "lamp_bench")
            python = os.path.join(tmp, "python")
            log = os.path.join(tmp, "runs.log")
            executable(bench, FAKE_BENCH)
            executable(python, FAKE_PEER_PYTHON)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
            env.update(LAMP_BENCH=bench, LAMP_PYTHON_TORCH=python,
                       RUN_PLAN_LOG=log, **extra_env)
            proc = subprocess.run(
                ["bash", os.path.join(ROOT, "bench", "run.sh"),
                 "--quick", "--device", "cpu",
                 "--out", os.path.join(tmp, "out")],
                cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=120)
            peers = []
            if os.path.exists(log + ".peer"):
                with open(log + ".peer") as f:
                    peers = [json.loads(line) for line in f]
            self.reports = {}
            out = os.path.join(tmp, "out")
            for name in (os.listdir(out) if os.path.isdir(out) else []):
                if name.endswith(".md"):
                    with open(os.path.join(out, name)) as f:
                        self.reports[name] = f.read()
            return peers, proc.stderr, proc.returncode

    def test_the_peer_gets_lamp_bench_s_malloc_thresholds(self):
        # lamp::keep_host_memory()'s defaults (HostMemoryOptions): a 32 MiB
        # mmap threshold and a 256 MiB trim threshold.
        peers, stderr, rc = self.run_quick({})
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(len(peers), 3, stderr)  # fp32, amp-bf16, bf16
        for peer in peers:
            self.assertEqual(peer, {"MALLOC_MMAP_THRESHOLD_": "33554432",
                                    "MALLOC_TRIM_THRESHOLD_": "268435456"})

    def test_an_environment_that_tunes_malloc_is_left_to_both(self):
        # lamp_bench then leaves malloc as the environment sets it, and the
        # peer runs with the same environment.
        peers, stderr, rc = self.run_quick({"MALLOC_TRIM_THRESHOLD_": "0"})
        self.assertEqual(rc, 0, stderr)
        self.assertEqual(len(peers), 3, stderr)
        for peer in peers:
            self.assertEqual(peer, {"MALLOC_MMAP_THRESHOLD_": None,
                                    "MALLOC_TRIM_THRESHOLD_": "0"})


    def test_a_failed_tool_fails_the_run_and_keeps_the_others(self):
        # peer_pytorch.py's exit 3: one tool of its process failed, the JSON
        # holds the others' results. The run fails (exit 1, counted), and
        # the report keeps the other tools' rates and the failed one's cell.
        peers, stderr, rc = self.run_quick({"FAIL_TOOL": "pytorch-fused"})
        self.assertEqual(rc, 1, stderr)
        self.assertIn("some of its tools failed", stderr)
        self.assertIn("run.sh: 3 of ", stderr)  # fp32, amp-bf16, bf16
        self.assertNotIn("failed (exit 3)", stderr)
        md = "".join(self.reports.values())
        self.assertIn("a stand-in's mistake", md)
        # Each mode's row: PyTorch eager's stand-in rate, then the failed
        # fused cell, and the headline naming it as left out.
        rows = [line for line in md.splitlines()
                if line.startswith("| cnn | 64 |") and "failed [1]" in line]
        self.assertEqual(len(rows), 3, md)
        for row in rows:
            self.assertIn("| img/s | 100 (0.0%) | 100 | failed [1] |", row)
            self.assertIn("(without eager, fused optimizer", row)


class Flags(unittest.TestCase):
    def test_quick_goes_with_the_default_suite_only(self):
        # --quick runs the MNIST CNN alone: another suite's compiled columns
        # would read "not run" and its headline compare against the rest.
        for suite in ("gpt", "conv-bn", "float8"):
            proc = subprocess.run(
                ["bash", os.path.join(ROOT, "bench", "run.sh"), "--quick",
                 "--suite", suite, "--device", "cuda"],
                cwd=ROOT, capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn(f"--quick and --suite {suite} do not go together",
                          proc.stderr)


if __name__ == "__main__":
    unittest.main()
