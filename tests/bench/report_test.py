#!/usr/bin/env python3
"""bench/report.py's tables from hand-made results: the like-for-like and
best-vs-best ratios, garbage never ranked, the spread flag, the memory and
skipped-step cells, the mixed-precision speed-ups, results from a
lamp_bench that records no finite check or steady-state memory, and GPT rows
in tokens/s. Standard library only."""

import json
import os
import sys
import tempfile
import unittest

# Importing bench/report.py leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "bench"))
import report  # noqa: E402

MIB = 2 ** 20
ROW = ("resnet50", 512, "amp", True, True)


def result(rates, **extra):
    """One tool's result as lamp_bench or peer_pytorch.py writes it."""
    median = sorted(rates)[(len(rates) - 1) // 2]
    return dict({"model": "resnet50", "batch_size": 512, "precision": "amp",
                 "channels_last": True, "cudnn_benchmark": True,
                 "steps": 80, "warmup": 10, "epoch_images": 50000,
                 "images_per_second": median,
                 "repeats_images_per_second": rates, "skipped": None},
                **extra)


def peer(rates, tool, **extra):
    return result(rates, **dict({
        "tool": tool, "skipped_steps": 2, "steps_run": 500,
        "final_loss": 2.3, "finite": True, "garbage": None,
        "steady_peak_bytes": 6000 * MIB, "reserved_bytes": 7000 * MIB,
        "peak_memory_bytes": 9000 * MIB}, **extra))


# lamp_bench as of 2026-11-24: skipped_steps and the whole-run peak, no
# finite check, no steady-state or reserved bytes.
LAMP = result([15800.0, 15900.0, 16000.0, 15850.0, 15950.0],
              skipped_steps=3, peak_memory_bytes=6900 * MIB)
LAMP_GRAPH = result([16000.0, 16040.0, 16050.0, 16020.0, 16030.0],
                    skipped_steps=2, peak_memory_bytes=7100 * MIB)
PEERS = [
    peer([14000.0, 14500.0, 15000.0, 14400.0, 14600.0], "pytorch-eager"),
    peer([15800.0, 15850.0, 15900.0, 15860.0, 15870.0], "pytorch-fused"),
    # The fastest PyTorch column, but it trained on NaNs: never ranked.
    peer([19000.0, 19100.0, 19200.0, 19050.0, 19150.0],
         "pytorch-compile-fused", finite=False,
         garbage="non-finite params"),
    # 17,000 +- 4%: a spread of 8% (flagged). CUDA graph trees left no
    # steady-state peak (peer_pytorch.py records None).
    peer([16320.0, 17000.0, 17680.0, 16900.0, 17100.0],
         "pytorch-compile-ro-fused", steady_peak_bytes=None),
    peer([12800.0, 12900.0, 13000.0, 12950.0, 12850.0], "pytorch-graph"),
]


def run_main(manifest, out, device, suffix, stem_file, not_run=()):
    """report.main as bench/run.sh calls it, its tables unprinted; the stem
    it wrote to `stem_file`."""
    extra = []
    if not_run:
        extra = [stem_file + ".not_run"]
        with open(extra[0], "w") as f:
            f.write("\n".join(not_run) + "\n")
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            report.main([manifest, out, device, suffix, "python3",
                         stem_file] + extra)
        finally:
            sys.stdout = stdout
    with open(stem_file) as f:
        return f.read()


class Fixture:
    """A manifest and per-run JSON files, as bench/run.sh leaves them."""

    def __init__(self, folder):
        self.folder = folder
        self.lines = []
        self.count = 0

    def write(self, report_json):
        self.count += 1
        path = os.path.join(self.folder, "%d.json" % self.count)
        with open(path, "w") as f:
            json.dump(report_json, f)
        return path

    def add(self, tools, results, key=ROW, status="ok", shape=None):
        """shape: a GPT row's shape column as run.sh's run_gpt writes it
        ("layers,heads,width,context,vocab"); None writes the 8 columns of
        manifests before it."""
        path = self.write({"tool": ",".join(tools), "torch_version": "2.11.0",
                           "device_name": "Test GPU", "threads": 16,
                           "results": results}) if status == "ok" else "-"
        for tool in tools:
            self.lines.append("\t".join([
                tool, key[0], str(key[1]), key[2], "1" if key[3] else "0",
                "1" if key[4] else "0", status, path] +
                ([] if shape is None else [shape])))

    def manifest(self):
        path = os.path.join(self.folder, "manifest.tsv")
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        return path


def standard(folder):
    fixture = Fixture(folder)
    fixture.add(["lamp"], [LAMP])
    fixture.add(["lamp-graph"], [LAMP_GRAPH])
    fixture.add([p["tool"] for p in PEERS], PEERS)
    for precision, lamp_rate in (("tf32", 8000.0), ("fp32", 2850.0)):
        key = ("resnet50", 512, precision, True, True)
        fixture.add(["lamp"], [dict(result([lamp_rate]),
                                    precision=precision)], key=key)
    return fixture


class Report(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.tmp = self.dir.name
        headers, runs, order = report.read_manifest(
            standard(self.tmp).manifest())
        self.lines, self.merged, _ = report.build(
            headers, runs, order, "cuda", "python3",
            report.datetime.datetime(2026, 11, 24, 12, 0))
        self.text = "\n".join(self.lines)
        self.row = self.merged["rows"][0]

    def tearDown(self):
        self.dir.cleanup()

    def table_row(self, heading, prefix):
        """The cells of the first line starting with `prefix` in the table
        after `heading`."""
        start = self.lines.index(heading) if heading else 0
        line = next(l for l in self.lines[start:] if l.startswith(prefix))
        return [c.strip() for c in line.strip("|").split("|")]

    def test_like_for_like_ratios(self):
        ratios = self.row["ratios"]
        self.assertAlmostEqual(ratios["lamp_vs_pytorch_fused"],
                               15900.0 / 15860.0)
        self.assertAlmostEqual(ratios["lamp_graph_vs_pytorch_graph"],
                               16030.0 / 12900.0)

    def test_best_vs_best_skips_garbage(self):
        ratios = self.row["ratios"]
        self.assertEqual(ratios["best_lamp"], "lamp-graph")
        self.assertEqual(ratios["best_pytorch"], "pytorch-compile-ro-fused")
        self.assertAlmostEqual(ratios["best_lamp_vs_best_pytorch"],
                               16030.0 / 17000.0)
        cells = self.table_row(None, "| resnet50 | 512 | amp,")
        self.assertIn("19100 (1.0%) garbage: non-finite params", cells)
        # The headline names the PyTorch tool it left out.
        self.assertEqual(cells[-4:], [
            "**0.94x** (without %s)"
            % report.TITLES["pytorch-compile-fused"],
            report.TITLES["lamp-graph"],
            report.TITLES["pytorch-compile-ro-fused"], "-"])
        self.assertEqual(ratios["pytorch_unusable"], ["pytorch-compile-fused"])

    def test_spread_over_5_percent_is_flagged(self):
        entry = self.row["pytorch-compile-ro-fused"]
        self.assertAlmostEqual(entry["spread"], 0.08)
        self.assertTrue(entry["noisy"])
        self.assertFalse(self.row["pytorch-fused"]["noisy"])
        cells = self.table_row(None, "| resnet50 | 512 | amp,")
        self.assertIn("17000 (8.0%) " + report.NOISY_MARK, cells)
        self.assertIn("15860 (0.6%)", cells)
        self.assertIn(report.NOISY_MARK + " marks a spread over 5%",
                      self.text)

    def test_memory_and_skipped_steps(self):
        cells = self.table_row("## Memory and skipped steps",
                               "| resnet50 | 512 | amp,")
        self.assertEqual(cells[3], "peak 6900, warm-up included; 3 skipped")
        self.assertIn("6000 / 7000; 2/500 skipped", cells)
        self.assertIn("peak 9000, warm-up included / 7000; 2/500 skipped",
                      cells)

    def test_a_lamp_without_finite_check_is_named(self):
        self.assertIn("- Unchecked: lamp, lamp-graph recorded no finite "
                      "check", self.text)

    def test_mixed_precision_against_tf32_and_fp32(self):
        cells = self.table_row("## Mixed precision against FP32 and TF32",
                               "| resnet50 | 512 | amp,")
        self.assertEqual(cells[3:], ["lamp", "img/s", "15900", "8000",
                                     "2850", "1.99x", "5.58x"])
        seed = self.table_row("## Beside the seed's numbers", "| resnet50 |")
        self.assertEqual(seed[-2:], ["5.58x", "1.99x"])


GPT_KEY = ("gpt", 16, "amp-bf16", False, False)
GPT_SHAPE = {"model": "gpt", "batch_size": 16, "channels_last": False,
             "cudnn_benchmark": False, "gpt_layers": 6, "gpt_heads": 6,
             "gpt_width": 384, "context": 1024}
GPT_ROW = ("| gpt (6 layers, 6 heads, width 384, context 1024, vocab 256) "
           "| 16 |")


def gpt(rates, tool=None, precision="amp-bf16", **extra):
    """A GPT result: images_per_second counts sequences of 1024 tokens."""
    fields = dict(GPT_SHAPE, precision=precision, epoch_images=976,
                  tokens_per_second=sorted(rates)[(len(rates) - 1) // 2] *
                  1024, **extra)
    return peer(rates, tool, **fields) if tool else result(rates, **fields)


class GPTRows(unittest.TestCase):
    """GPT rows show tokens/s (sequences/s x context) beside CNN rows in
    img/s; the ratios do not depend on the unit."""

    def build(self, fixture):
        headers, runs, order = report.read_manifest(fixture.manifest())
        lines, merged, _ = report.build(
            headers, runs, order, "cuda", "python3",
            report.datetime.datetime(2026, 11, 24, 12, 0))
        return lines, merged

    def test_gpt_rows_render_in_tokens_per_second(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [LAMP])
            fixture.add(["lamp"], [gpt([30.0, 31.0, 32.0])], key=GPT_KEY)
            fixture.add(["pytorch-fused"],
                        [gpt([24.0, 25.0, 26.0], "pytorch-fused")],
                        key=GPT_KEY)
            fp32 = GPT_KEY[:2] + ("fp32",) + GPT_KEY[3:]
            fixture.add(["lamp"], [gpt([10.0], precision="fp32")], key=fp32)
            lines, merged = self.build(fixture)
        text = "\n".join(lines)
        header = next(l for l in lines if l.startswith("| model |"))
        self.assertIn("| unit | lamp | eager, fused optimizer |", header)
        self.assertNotIn("img/s", header)
        cells = [c.strip() for c in next(
            l for l in lines if l.startswith(GPT_ROW)).strip("|").split("|")]
        # 31 and 25 sequences/s of 1024 tokens.
        self.assertEqual(cells[2:6], ["amp-bf16", "tokens/s",
                                      "31744 (6.5%) " + report.NOISY_MARK,
                                      "25600 (8.0%) " + report.NOISY_MARK])
        self.assertEqual(cells[6], "1.24x")
        # No MFU recorded (a peak-less device): '-'.
        self.assertEqual(cells[-1], "-")
        resnet = next(l for l in lines if l.startswith("| resnet50 |"))
        self.assertIn("| amp, channels_last, cudnn.benchmark | img/s | 15900",
                      resnet)
        self.assertIn("- GPT rows: batch is sequences of `context` byte "
                      "tokens, the rate tokens/s", text)
        self.assertIn("AdamW lr 1e-3, betas (0.9, 0.99)", text)
        mixed = lines[lines.index("## Mixed precision against FP32 and "
                                  "TF32"):]
        row = [c.strip() for c in next(
            l for l in mixed if l.startswith(GPT_ROW)).strip("|").split("|")]
        self.assertEqual(row[3:], ["lamp", "tokens/s", "31744", "-", "10240",
                                   "-", "3.10x"])
        rows = {r["model"] + r["precision"]: r for r in merged["rows"]}
        self.assertEqual(rows["gptamp-bf16"]["unit"], "tokens/s")
        self.assertEqual(rows["resnet50amp"]["unit"], "img/s")
        # The JSON's rows name the GPT's shape as the table does (two
        # shapes of one batch and mode are otherwise one label in a chart).
        self.assertEqual(rows["gptamp-bf16"]["model_text"],
                         GPT_ROW.split(" | ")[0][2:])
        self.assertEqual(rows["resnet50amp"]["model_text"], "resnet50")
        self.assertAlmostEqual(
            rows["gptamp-bf16"]["lamp"]["tokens_per_second"], 31.0 * 1024)
        self.assertAlmostEqual(
            rows["gptamp-bf16"]["ratios"]["lamp_vs_pytorch_fused"], 31 / 25)

    def test_fp8_against_amp_bf16_per_tool(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fp8 = GPT_KEY[:2] + ("fp8",) + GPT_KEY[3:]
            fixture.add(["lamp-graph"], [gpt([40.0])], key=GPT_KEY)
            fixture.add(["lamp-graph"], [gpt([52.0], precision="fp8")],
                        key=fp8)
            # Only in fp8: no ratio, no row.
            fixture.add(["pytorch-compile-fused"],
                        [gpt([30.0], "pytorch-compile-fused",
                             precision="fp8")], key=fp8)
            lines, _ = self.build(fixture)
        table = lines[lines.index("## FP8 against amp-bf16"):]
        rows = [l for l in table if l.startswith(GPT_ROW)]
        self.assertEqual(len(rows), 1, rows)
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        self.assertEqual(cells[2:], ["lamp (CUDA graph)", "tokens/s", "40960",
                                     "53248", "1.30x"])

    def test_best_lamp_mfu_and_the_vocabulary(self):
        # The MFU column takes the best of lamp's usable results, never a
        # PyTorch tool's; the model names its vocabulary.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [gpt([30.0], mfu=0.125, vocab_size=50304)],
                        key=GPT_KEY)
            fixture.add(["lamp-graph"],
                        [gpt([31.0], mfu=0.1875, vocab_size=50304)],
                        key=GPT_KEY)
            fixture.add(["pytorch-fused"],
                        [gpt([40.0], "pytorch-fused", mfu=0.5,
                             vocab_size=50304)], key=GPT_KEY)
            lines, _ = self.build(fixture)
        row = next(l for l in lines if l.startswith(
            "| gpt (6 layers, 6 heads, width 384, context 1024, vocab 50304)"))
        self.assertEqual(row.strip("|").split("|")[-1].strip(), "18.8%")
        header = next(l for l in lines if l.startswith("| model |"))
        self.assertTrue(header.endswith("| best lamp MFU |"), header)

    def test_a_forced_attention_kernel_is_shown_never_ranked(self):
        # The flash-only step is the row's fastest lamp column: shown under
        # its title, but the headline and the MFU are lamp-graph's.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp-graph"], [gpt([30.0], mfu=0.125)],
                        key=GPT_KEY)
            fixture.add(["lamp-graph-sdpa-flash"], [gpt([45.0], mfu=0.25)],
                        key=GPT_KEY)
            fixture.add(["pytorch-graph"], [gpt([40.0], "pytorch-graph")],
                        key=GPT_KEY)
            lines, merged = self.build(fixture)
        header = next(l for l in lines if l.startswith("| model |"))
        self.assertIn("| lamp (CUDA graph, flash attention only) |", header)
        row = next(l for l in lines if l.startswith(GPT_ROW))
        self.assertIn("| 46080 ", row)  # 45 sequences/s of 1024 tokens
        ratios = merged["rows"][0]["ratios"]
        self.assertEqual(ratios["best_lamp"], "lamp-graph")
        self.assertAlmostEqual(ratios["best_lamp_vs_best_pytorch"], 0.75)
        self.assertEqual(row.strip("|").split("|")[-1].strip(), "12.5%")

    def test_each_fused_kernel_alone_against_the_graph_step(self):
        # Five fused kernels alone and all of them, against lamp-graph (40
        # sequences/s): their own table, never the main one or the ranking,
        # although the head-loss fusion alone is the row's fastest lamp.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp-graph"], [gpt([40.0])], key=GPT_KEY)
            fixture.add(["lamp-graph-fused"], [gpt([48.0])], key=GPT_KEY)
            fixture.add(["pytorch-graph"], [gpt([40.0], "pytorch-graph")],
                        key=GPT_KEY)
            fixture.add(["lamp-graph-only-add-norm"], [gpt([44.0])],
                        key=GPT_KEY)
            # 36 +- 10%: noisy.
            fixture.add(["lamp-graph-only-mlp"], [gpt([32.4, 36.0, 36.0])],
                        key=GPT_KEY)
            fixture.add(["lamp-graph-only-head-loss"], [gpt([60.0])],
                        key=GPT_KEY)
            fixture.add(["lamp-graph-only-bias-grad"], [],
                        key=GPT_KEY, status="failed (exit 1)")
            fixture.add(["lamp-graph-only-weight-cast"],
                        [gpt([50.0], finite=False)], key=GPT_KEY)
            # A row without a one-fusion tool has no line in that table.
            fp8 = GPT_KEY[:2] + ("fp8",) + GPT_KEY[3:]
            fixture.add(["lamp-graph"], [gpt([52.0], precision="fp8")],
                        key=fp8)
            lines, merged = self.build(fixture)
        header = next(l for l in lines if l.startswith("| model |"))
        self.assertNotIn("alone", header)
        self.assertIn("lamp (CUDA graph, the GPT's fused kernels)", header)
        ratios = merged["rows"][0]["ratios"]
        self.assertEqual(ratios["best_lamp"], "lamp-graph-fused")
        self.assertAlmostEqual(ratios["best_lamp_vs_best_pytorch"], 1.2)
        table = lines[lines.index("## The GPT's fused kernels one at a "
                                  "time"):]
        header = next(l for l in table if l.startswith("| model |"))
        self.assertEqual(
            [c.strip() for c in header.strip("|").split("|")][4:], [
                "lamp (CUDA graph)", "--fused-add-norm alone vs it",
                "--fused-mlp alone vs it", "--fused-head-loss alone vs it",
                "--fused-weight-cast alone vs it",
                "--fused-bias-grad alone vs it", "all of them vs it"])
        rows = [l for l in table if l.startswith("| gpt (")]
        self.assertEqual(len(rows), 1, rows)
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        self.assertEqual(cells[2:], [
            "amp-bf16", "tokens/s", "40960", "1.10x",
            "0.90x " + report.NOISY_MARK, "1.50x", "garbage",
            "failed (exit 1)", "1.20x"])
        fusions = merged["rows"][0]["fusions_vs_lamp_graph"]
        self.assertEqual(sorted(fusions), [
            "lamp-graph-fused", "lamp-graph-only-add-norm",
            "lamp-graph-only-head-loss", "lamp-graph-only-mlp"])
        self.assertAlmostEqual(fusions["lamp-graph-only-add-norm"], 1.1)
        self.assertNotIn("fusions_vs_lamp_graph", merged["rows"][1])
        self.assertNotIn("lamp-graph-only-add-norm", merged["tools"])

    def test_two_gpt_shapes_in_one_row_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [gpt([30.0])], key=GPT_KEY)
            fixture.add(["lamp-graph"], [gpt([30.0], gpt_width=4096)],
                        key=GPT_KEY)
            with self.assertRaises(SystemExit) as refused:
                report.read_manifest(fixture.manifest())
        self.assertIn("two GPT shapes", str(refused.exception))
        self.assertIn("their shapes", str(refused.exception))

    def test_flop_rates_follow_the_median_shown(self):
        # Two repeats: lamp_bench stored the FLOP rates of the lower one
        # (100 sequences/s); the cell shows their median, 150.
        entry = gpt([100.0, 200.0], mfu=0.1, tflops=10.0)
        entry["images_per_second"] = 100.0
        merged = report.summary([dict(entry, status="ok")])
        self.assertEqual(merged["images_per_second"], 150.0)
        self.assertAlmostEqual(merged["mfu"], 0.15)
        self.assertAlmostEqual(merged["tflops"], 15.0)

    def test_two_gelus_in_one_row_are_refused(self):
        # Both sides record their GELU (the peer since it does): a row
        # whose two sides ran different models is no comparison.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [gpt([30.0], gpt_gelu="exact")],
                        key=GPT_KEY)
            fixture.add(["pytorch-eager"], [gpt([30.0], gpt_gelu="tanh")],
                        key=GPT_KEY)
            with self.assertRaises(SystemExit) as refused:
                report.read_manifest(fixture.manifest())
        self.assertIn("'exact'", str(refused.exception))
        self.assertIn("'tanh'", str(refused.exception))

    def test_two_gpt_shapes_run_sh_names_are_two_rows(self):
        # GPT-2 124M and the 4096-wide GPT, both 8 sequences in amp-bf16:
        # each in its own row, in manifest order, each with its own tools.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            wide = dict(gpt_layers=2, gpt_heads=32, gpt_width=4096)
            fixture.add(["lamp"], [gpt([30.0], **wide)], key=GPT_KEY,
                        shape="2,32,4096,1024,256")
            fixture.add(["lamp"], [gpt([50.0])], key=GPT_KEY,
                        shape="6,6,384,1024,256")
            fixture.add(["pytorch-fused"], [gpt([40.0], "pytorch-fused")],
                        key=GPT_KEY, shape="6,6,384,1024,256")
            lines, merged = self.build(fixture)
        headline = lines[:lines.index("## Memory and skipped steps")]
        rows = [l for l in headline if l.startswith("| gpt (")]
        self.assertEqual(len(rows), 2, headline)
        self.assertTrue(rows[0].startswith("| gpt (2 layers, 32 heads, "
                                           "width 4096"), rows[0])
        self.assertIn("| 30720 ", rows[0])
        self.assertTrue(rows[1].startswith("| gpt (6 layers, 6 heads, "
                                           "width 384"), rows[1])
        self.assertIn("| 51200 ", rows[1])
        self.assertEqual([sorted(t for t in r if t in report.TOOLS)
                          for r in merged["rows"]],
                         [["lamp"], ["lamp", "pytorch-fused"]])

    def test_without_a_recorded_context_the_unit_is_sequences(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [dict(result([30.0]), model="gpt",
                                        batch_size=16, precision="amp-bf16",
                                        channels_last=False,
                                        cudnn_benchmark=False)],
                        key=GPT_KEY)
            lines, merged = self.build(fixture)
        self.assertIn("| gpt | 16 | amp-bf16 | sequences/s | 30 |",
                      "\n".join(lines))
        self.assertEqual(merged["rows"][0]["unit"], "sequences/s")


def built(fixture):
    """The markdown (one string) and JSON of the fixture's report."""
    headers, runs, order = report.read_manifest(fixture.manifest())
    lines, merged, _ = report.build(
        headers, runs, order, "cpu", "python3",
        report.datetime.datetime(2026, 11, 24, 12, 0))
    return "\n".join(lines), merged


class Statuses(unittest.TestCase):
    def test_not_run_skipped_and_failed_cells(self):
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [LAMP])
            fixture.add(["pytorch-eager"], [], status="not run (no torch)")
            fixture.add(["pytorch-graph"], [dict(
                result([1.0]), tool="pytorch-graph", images_per_second=None,
                skipped="the whole-step CUDA graph needs a CUDA device")])
            text, merged = built(fixture)
        self.assertIn("| not run (no torch) | skipped [1] | - | - | - | "
                      "lamp | - | - |", text)
        self.assertIn("[1] the whole-step CUDA graph needs a CUDA device",
                      text)
        self.assertIsNone(merged["rows"][0]["ratios"]["best_pytorch"])

    def test_a_failed_tool_of_the_peer_is_its_own_cell(self):
        # One tool of the peer's process failed (a torch.compile that cannot
        # build): its cell says so with the reason, the others keep theirs.
        with tempfile.TemporaryDirectory() as tmp:
            fixture = Fixture(tmp)
            fixture.add(["lamp"], [LAMP])
            fixture.add(["pytorch-eager", "pytorch-compile-fused"], [
                PEERS[0],
                dict(result([1.0]), tool="pytorch-compile-fused",
                     images_per_second=None,
                     failed="InductorError: InvalidCxxCompiler")])
            text, merged = built(fixture)
        self.assertIn("failed [1]", text)
        self.assertIn("[1] InductorError: InvalidCxxCompiler", text)
        ratios = merged["rows"][0]["ratios"]
        self.assertEqual(ratios["best_pytorch"], "pytorch-eager")
        # The headline is against the tools that ran, and says which did
        # not: the failed one might have been the best.
        self.assertEqual(ratios["pytorch_unusable"], ["pytorch-compile-fused"])
        self.assertRegex(text, r"\*\*[0-9.]+x\*\* \(without [^)]*compile[^)]*\)")

    def test_rows_not_run_head_the_report_and_a_rewrite_keeps_its_stem(self):
        # run.sh writes the report after each row (the rows so far, and that
        # the run had not ended), then at the end: one stem, replaced.
        with tempfile.TemporaryDirectory() as tmp:
            manifest = standard(tmp).manifest()
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            stem_file = os.path.join(tmp, "stem")
            first = run_main(manifest, out, "cpu", "", stem_file,
                             ["the GPT-2 124M rows: skipped by the time budget",
                              "the rows after these: the run had not ended"])
            with open(first + ".md") as f:
                text = f.read()
            self.assertIn("**Not run:**\n\n- the GPT-2 124M rows: skipped by "
                          "the time budget\n- the rows after these", text)
            with open(first + ".json") as f:
                self.assertEqual(len(json.load(f)["not_run"]), 2)
            last = run_main(manifest, out, "cpu", "", stem_file)
            self.assertEqual(last, first)
            with open(last + ".md") as f:
                self.assertNotIn("Not run", f.read())
            self.assertEqual(len(os.listdir(out)), 2)

    def test_main_writes_json_markdown_and_stem(self):
        with tempfile.TemporaryDirectory() as tmp:
            manifest = standard(tmp).manifest()
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            stem = run_main(manifest, out, "cuda", "-quick",
                            os.path.join(tmp, "stem"))
            self.assertTrue(os.path.basename(stem).startswith("test-gpu-"))
            self.assertTrue(stem.endswith("-quick"))
            with open(stem + ".json") as f:
                merged = json.load(f)
            self.assertTrue(os.path.exists(stem + ".md"))
        # What scripts/plot.py --bench reads: tools, and rows holding them.
        self.assertEqual(list(merged["tools"]), list(report.TOOLS[:2]) + [
            t for t in report.PYTORCH_TOOLS
            if t in {p["tool"] for p in PEERS}])
        self.assertEqual(merged["noisy_spread"], 0.05)
        self.assertEqual(merged["repeats"], 5)

    def test_a_second_run_of_the_day_keeps_the_first(self):
        # The same device and day: the second run's results go beside the
        # first's (-2), never over them; no temporary file is left.
        with tempfile.TemporaryDirectory() as tmp:
            manifest = standard(tmp).manifest()
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            stems = []
            for run in range(2):
                stems.append(run_main(manifest, out, "cpu", "",
                                      os.path.join(tmp, "stem%d" % run)))
            self.assertEqual(stems[1], stems[0] + "-2")
            self.assertEqual(sorted(os.listdir(out)), sorted(
                os.path.basename(stem) + ext for stem in stems
                for ext in (".json", ".md")))


if __name__ == "__main__":
    unittest.main()
