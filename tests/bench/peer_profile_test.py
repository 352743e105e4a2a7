#!/usr/bin/env python3
"""bench/peer_pytorch.py --profile-steps: the top-kernels list that is set
beside lamp_bench --profile's (ranking, per-step numbers, the printed lines)
from made-up times, then a real profile of a tiny GPT step on the CPU. And
the calibration of the timed step count to --min-seconds. Needs torch
(LAMP_PYTHON_TORCH)."""

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

# Importing bench/peer_pytorch.py leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "bench"))
import peer_pytorch  # noqa: E402


class Warmup(unittest.TestCase):
    def test_compile_and_graph_tools_warm_up_at_least_three_steps(self):
        # torch.compile's compilation and its CUDA graphs' recording, and
        # the whole-step graph's capture, stay out of the timed steps
        # whatever --warmup says; the eager tools take it as given.
        for name, tool in peer_pytorch.TOOLS.items():
            want_floor = tool.compile or tool.cuda_graph
            for requested in (0, 1, 5):
                self.assertEqual(
                    peer_pytorch.warmup_steps(tool, requested),
                    max(requested, 3) if want_floor else requested, name)


class TopKernels(unittest.TestCase):
    TIMES = [("gemm_b", 3.0), ("gemm_a", 3.0), ("layer_norm", 1.0),
             ("flash_fwd", 6.0), ("layer_norm", 1.0), ("layer_norm", 1.0),
             ("layer_norm", 1.0)]

    def test_largest_first_per_step(self):
        top = peer_pytorch.top_kernels(self.TIMES, steps=2, count=3)
        self.assertEqual([k["name"] for k in top],
                         ["flash_fwd", "layer_norm", "gemm_a"])  # tie: name
        self.assertAlmostEqual(top[0]["seconds_per_step"], 3e-6)
        self.assertEqual(top[1]["launches_per_step"], 2.0)
        self.assertAlmostEqual(top[1]["seconds_per_step"], 2e-6)

    def test_lines_as_lamp_bench_prints_them(self):
        top = peer_pytorch.top_kernels(self.TIMES, steps=2, count=2)
        text = peer_pytorch.format_top_kernels(top, step_seconds=20e-6)
        # The same columns as bench/profile_table_test.cpp's expectation.
        self.assertEqual(text.splitlines(), [
            "  ms/step   share launches  kernel",
            "    0.003   15.0%      0.5  flash_fwd",
            "    0.002   10.0%      2.0  layer_norm"])
        self.assertEqual(peer_pytorch.format_top_kernels([], 1.0), "")

    def test_long_names_are_cut(self):
        limit = peer_pytorch.TOP_NAME_CHARS
        top = peer_pytorch.top_kernels([("k" * 150, 10.0)], steps=1)
        line = peer_pytorch.format_top_kernels(top, 1e-3).splitlines()[1]
        self.assertTrue(line.endswith("k" * (limit - 3) + "..."))
        self.assertNotIn("k" * (limit - 2), line)


class ProfileRun(unittest.TestCase):
    def test_gpt_step_on_the_cpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "peer.json")
            out = io.StringIO()
            with contextlib.redirect_stdout(out), \
                    contextlib.redirect_stderr(io.StringIO()):
                peer_pytorch.main([
                    "--model", "gpt", "--gpt-layers", "1", "--gpt-heads", "2",
                    "--gpt-width", "32", "--context", "16", "--batch-size",
                    "2", "--device", "cpu", "--warmup", "1", "--steps", "2",
                    "--threads", "1", "--profile-steps", "2", "--json", path])
            with open(path) as f:
                result = json.load(f)["results"][0]
        profile = result["profile"]
        self.assertEqual(profile["steps"], 2)
        self.assertGreater(profile["seconds_per_step"], 0)
        kernels = profile["top_kernels"]
        self.assertEqual(len(kernels), peer_pytorch.TOP_KERNELS)
        seconds = [k["seconds_per_step"] for k in kernels]
        self.assertEqual(seconds, sorted(seconds, reverse=True))
        # The GPT's products are among the ops that take the most time.
        self.assertIn("aten::mm", [k["name"] for k in kernels])
        self.assertIn("profile of 2 steps (CPU ops, self time)",
                      out.getvalue())

    def test_no_profile_without_the_flag(self):
        args = peer_pytorch.parse_args(["--model", "gpt", "--device", "cpu"])
        self.assertEqual(args.profile_steps, 0)


class FailedTools(unittest.TestCase):
    """A tool of several that fails: its cell says why, the others' results
    are written, and the process's exit says that not all of it ran."""

    def run_two_tools(self, error):
        """pytorch-eager and pytorch-fused on a tiny CPU GPT, the fused one's
        warm-up raising `error`: (main's return, the written results)."""
        real = peer_pytorch.PeerStep

        class Failing(real):
            def warm_up(self, steps):
                if self.optimizer_impl == "fused":
                    raise error
                return real.warm_up(self, steps)

        def make(args, precision):
            step = Failing(args, precision)
            step.optimizer_impl = args.optimizer_impl
            return step

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "peer.json")
            peer_pytorch.PeerStep = make
            try:
                with contextlib.redirect_stdout(io.StringIO()), \
                        contextlib.redirect_stderr(io.StringIO()):
                    rc = peer_pytorch.main([
                        "--model", "gpt", "--gpt-layers", "1",
                        "--gpt-heads", "2", "--gpt-width", "32",
                        "--context", "16", "--batch-size", "2",
                        "--device", "cpu", "--warmup", "1", "--steps", "2",
                        "--threads", "1", "--tools",
                        "pytorch-eager,pytorch-fused", "--json", path])
            finally:
                peer_pytorch.PeerStep = real
            with open(path) as f:
                return rc, json.load(f)["results"]

    def test_a_mistake_fails_the_run_and_keeps_the_other_results(self):
        # A TypeError that names no missing argument is a mistake in the
        # step, not something this torch lacks: a failure, not a skip.
        rc, results = self.run_two_tools(
            TypeError("unsupported operand type(s) for +: 'int' and 'str'"))
        self.assertEqual(rc, peer_pytorch.PARTLY_FAILED)
        by_tool = {r["tool"]: r for r in results}
        self.assertGreater(by_tool["pytorch-eager"]["images_per_second"], 0)
        self.assertIsNone(by_tool["pytorch-eager"].get("failed"))
        self.assertIsNone(by_tool["pytorch-fused"]["skipped"])
        self.assertIn("TypeError: unsupported operand",
                      by_tool["pytorch-fused"]["failed"])

    def test_what_this_torch_lacks_is_a_skip(self):
        rc, results = self.run_two_tools(TypeError(
            "__init__() got an unexpected keyword argument 'fused'"))
        self.assertEqual(rc, 0)
        fused = {r["tool"]: r for r in results}["pytorch-fused"]
        self.assertIn("not supported by torch", fused["skipped"])
        self.assertIsNone(fused.get("failed"))


class Calibration(unittest.TestCase):
    """timed_runs() with made-up step times: the counts it runs."""

    def counts_run(self, min_seconds, seconds_per_step):
        counts = []

        def time_steps(step, steps, device):
            counts.append(steps)
            return steps * seconds_per_step

        args = argparse.Namespace(steps=5, min_seconds=min_seconds,
                                  repeats=2, batch_size=1, device="cpu")
        saved = peer_pytorch.time_steps
        peer_pytorch.time_steps = time_steps
        try:
            steps, rates = peer_pytorch.timed_runs(None, args)
        finally:
            peer_pytorch.time_steps = saved
        return counts, steps, rates

    def test_calibrates_to_the_time_asked_for(self):
        counts, steps, rates = self.counts_run(1.0, 1e-3)
        # 5 steps take 5 ms: 1.2 * 1 s / 5 ms * 5 + 1 = 1201 steps.
        self.assertEqual(counts, [5, 1201, 1201])
        self.assertEqual(steps, 1201)
        self.assertEqual(len(rates), 2)

    def test_fast_steps_are_capped_before_they_run(self):
        # An hour of 1-ns steps would be 4e12 of them.
        counts, steps, _ = self.counts_run(3600.0, 1e-9)
        self.assertEqual(max(counts), peer_pytorch.MAX_TIMED_STEPS)
        self.assertEqual(steps, peer_pytorch.MAX_TIMED_STEPS)

    def test_an_absurd_min_seconds_is_refused(self):
        for text in ("1e300", "3601", "-1", "nan", "inf", "abc"):
            with contextlib.redirect_stderr(io.StringIO()), \
                    self.assertRaises(SystemExit, msg=text):
                peer_pytorch.parse_args(["--min-seconds", text])
        self.assertEqual(
            peer_pytorch.parse_args(["--min-seconds", "3600"]).min_seconds,
            3600.0)


if __name__ == "__main__":
    unittest.main()
