#!/usr/bin/env python3
"""Checks the command-line conventions of lamp's programs (ctest runs it).

  check_cli.py conventions PROGRAM...     usage errors, --help, --version
  check_cli.py flag-table PAGE PROGRAM...  the flag table of the Markdown
                                          PAGE (docs/programs.md), under its
                                          "Flags" heading, lists exactly the
                                          flags of the programs' --help
  check_cli.py logs TRAIN_MNIST DATA_DIR WORK_DIR
                                          --log-every lines, the JSON log's
                                          run/step/epoch records
  check_cli.py tty TRAIN_MNIST DATA_DIR   on a terminal, an error starts on
                                          a clean line after the progress bar
  check_cli.py numerics TRAIN_MNIST DATA_DIR
                                          --check-numerics: a clean run
                                          passes, a diverging one stops
                                          naming the first module

Each check prints what it ran and exits 1 at the first mismatch.
"""

import json
import os
import re
import subprocess
import sys
import tempfile


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def run(args, **kwargs):
    print("$ " + " ".join(args))
    result = subprocess.run(args, capture_output=True, text=True, timeout=600,
                            **kwargs)
    return result


def expect_usage_error(program, args, pattern):
    """Exit 2, nothing on stdout, one line on stderr: 'NAME: error: ...'."""
    name = os.path.basename(program)
    r = run([program] + args)
    lines = r.stderr.splitlines()
    if r.returncode != 2:
        fail(f"{name} {args}: exit {r.returncode}, expected 2 (usage error); "
             f"stderr: {r.stderr!r}")
    if r.stdout:
        fail(f"{name} {args}: printed to stdout: {r.stdout!r}")
    if len(lines) != 1:
        fail(f"{name} {args}: {len(lines)} lines on stderr, expected one: "
             f"{r.stderr!r}")
    if not lines[0].startswith(f"{name}: error: "):
        fail(f"{name} {args}: the message does not start with "
             f"'{name}: error: ': {lines[0]!r}")
    if not re.search(pattern, lines[0]):
        fail(f"{name} {args}: {lines[0]!r} does not match {pattern!r}")
    print("  " + lines[0])


def conventions(programs):
    for program in programs:
        name = os.path.basename(program)
        trainer = name in ("train_mnist", "train_cifar10")
        # --version: one line naming lamp's and LibTorch's versions.
        r = run([program, "--version"])
        if r.returncode != 0 or not re.fullmatch(
                rf"{name} lamp \d+\.\d+\.\d+, LibTorch \d+\.\d+\.\d+"
                r"( \(Debian package libtorch-dev [^)]+\))?"
                r"(, CUDA \d+\.\d+(, cuDNN \d+\.\d+\.\d+)?)?\n", r.stdout):
            fail(f"{name} --version: exit {r.returncode}, {r.stdout!r}")
        print("  " + r.stdout.strip())
        # --help: exit 0, defaults shown as values, never as {false}.
        r = run([program, "--help"])
        if r.returncode != 0 or "Usage:" not in r.stdout:
            fail(f"{name} --help: exit {r.returncode}")
        if re.search(r"\{(true|false)\}", r.stdout):
            fail(f"{name} --help shows a flag's value in braces:\n{r.stdout}")
        if "--version" not in r.stdout:
            fail(f"{name} --help does not list --version")
        if trainer and not re.search(r"--max-steps INT=0 ", r.stdout):
            fail(f"{name} --help shows no default for --max-steps:\n{r.stdout}")
        # Usage errors, each one line with exit 2.
        cases = [
            (["--precision", "fp8"],
             r"--precision: fp8 not in .*\(see " + name + r" --help\)$"),
            (["surplus"], r"not expected: surplus"),
            (["--batch-size"], r"--batch-size"),
            (["--batch-size", "abc"], r"--batch-size: 'abc' is not an integer"),
            (["--batch-size", "0"],
             r"--batch-size: 0 is out of range: give an integer (of at least 1|in 1\.\.)"),
            (["--batch-size", "99999999999999999999"],
             r"is not an integer that fits in 64 bits"),
            (["--no-such-flag"], r"--no-such-flag"),
        ]
        if name != "lamp_bench":
            cases += [
                (["--lr", "-1"], r"--lr: -1 is out of range: give a number > 0"),
                (["--lr", "nan"], r"--lr: 'nan' is not a finite number"),
                (["--seed", "-1"],
                 r"--seed: '-1' is not an integer in 0\.\.18446744073709551615"),
            ]
        if trainer:
            cases += [
                (["--epochs", "0"],
                 r"--epochs: 0 is out of range: give an integer in 1\.\.1000000 \(see"),
                (["--epochs", "abc"], r"--epochs: 'abc' is not an integer \(see"),
                (["--momentum", "1.5"],
                 r"--momentum: 1\.5 is out of range: give a number in \[0, 1\]"),
                (["--accumulation-steps", "0"],
                 r"--accumulation-steps: 0 is out of range"),
                (["--cuda-graph", "yes"], r"--cuda-graph: yes not in \{auto,on,off\}"),
                (["--cuda-graph"], r"--cuda-graph"),
            ]
        for args, pattern in cases:
            expect_usage_error(program, args, pattern)
        # A runtime error: one line "NAME: error: ..." and exit 1.
        r = run([program, "--device", "tpu"] +
                (["--data", "/nonexistent-lamp-data"] if trainer else []))
        if r.returncode != 1 or not r.stderr.startswith(f"{name}: error: "):
            fail(f"{name} --device tpu: exit {r.returncode}, expected 1 with "
                 f"'{name}: error: ...'; stderr {r.stderr!r}")
        print("  " + r.stderr.strip().splitlines()[0])


def help_flags(program):
    r = run([program, "--help"])
    flags = set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9-]+)", r.stdout, re.M))
    flags |= set(re.findall(r"^\s+-h,(--help)", r.stdout, re.M))
    return flags


def flag_table_section(page):
    """The text under the page's "Flags" heading, up to the next heading of
    the same or a higher level (lines in code blocks are no headings)."""
    level, section, fence = None, [], None
    for line in open(page, encoding="utf-8").read().splitlines():
        m = re.match(r"^(`{3,}|~{3,})", line)
        if m and (fence is None or line.startswith(fence)):
            fence = None if fence else m.group(1)
        heading = None if fence else re.match(r"^(#{1,6}) (.*?)\s*$", line)
        if level is None:
            if heading and heading.group(2) == "Flags":
                level = len(heading.group(1))
        elif heading and len(heading.group(1)) <= level:
            break
        else:
            section.append(line)
    if level is None:
        fail(f"{page} has no 'Flags' heading")
    return "\n".join(section)


def flag_table(page, programs):
    name = os.path.basename(page)
    table = set()
    for row in re.findall(r"^\| (.*?) \|", flag_table_section(page), re.M):
        table |= set(re.findall(r"`(--[a-z0-9-]+)", row))
    if not table:
        fail(f"the 'Flags' section of {page} has no table of flags")
    flags = set()
    for program in programs:
        flags |= help_flags(program)
    if not flags:
        fail("no flags found in --help")
    missing = sorted(flags - table)
    extra = sorted(table - flags)
    if missing or extra:
        fail(f"{name}'s flag table and --help differ: not in the table "
             f"{missing}, not in --help {extra}")
    print(f"  {len(flags)} flags, the same in {name} and --help")


def read_records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def logs(train_mnist, data, work):
    log = os.path.join(work, "log_every.jsonl")
    if os.path.exists(log):
        os.remove(log)
    args = [train_mnist, "--data", data, "--epochs", "2", "--batch-size", "32",
            "--log-every", "3", "--log-json", log]
    for _ in range(2):  # two runs into one file
        r = run(args)
        if r.returncode != 0:
            fail(f"exit {r.returncode}: {r.stderr}")
    lines = re.findall(r"^epoch (\d)/2  step (\d+)/7  loss (\S+)  \d+ img/s  lr \S+$",
                       r.stdout, re.M)
    # 7 batches per epoch, a line every 3rd step of the run: 3, 6 | 9, 12.
    if [(e, s) for e, s, _ in lines] != [("1", "3"), ("1", "6"), ("2", "2"), ("2", "5")]:
        fail(f"--log-every 3 printed {lines}:\n{r.stdout}")
    if any(not (0 < float(loss) < 10) for _, _, loss in lines):
        fail(f"a progress line's loss is not a plausible mean: {lines}")
    records = read_records(log)
    kinds = [r["record"] for r in records]
    one_run = ["run", "step", "step", "epoch", "step", "step", "epoch"]
    if kinds != one_run * 2:
        fail(f"records {kinds}, expected {one_run} twice")
    ids = [r["run_id"] for r in records]
    if len(set(ids[:7])) != 1 or len(set(ids[7:])) != 1 or ids[0] == ids[7]:
        fail(f"run ids {ids}: one per run, different between runs")
    for r in records:
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]):
            fail(f"time {r['time']!r} is not ISO 8601 UTC")
    header = records[0]
    for key in ("command_line", "lamp_version", "torch_version", "cuda",
                "device", "model", "precision", "optimizer", "batch_size",
                "epochs", "lr", "schedule", "seed", "train_images",
                "test_images", "cuda_graph"):
        if key not in header:
            fail(f"the run record has no '{key}': {header}")
    if header["cuda_graph"] is not False:  # a CPU run: eager steps
        fail(f"cuda_graph {header['cuda_graph']!r} on the CPU")
    if header["command_line"][1:] != args[1:]:
        fail(f"command_line {header['command_line']} is not {args}")
    steps = [r for r in records[:7] if r["record"] == "step"]
    if [s["global_step"] for s in steps] != [3, 6, 9, 12]:
        fail(f"step records at {[s['global_step'] for s in steps]}")
    for s in steps:
        for key in ("epoch", "loss", "images_per_second", "loss_scale", "lr"):
            if key not in s:
                fail(f"a step record has no '{key}': {s}")
    epoch = records[3]
    if epoch["epoch"] != 1 or not 0 <= epoch["test_accuracy"] <= 1:
        fail(f"the epoch record is wrong: {epoch}")
    print(f"  {len(records)} records, two runs, lines at steps 3, 6, 9, 12")


def tty(train_mnist, data):
    # A run that diverges, on a pseudo-terminal (script(1)) so that the bar
    # is drawn: the error must start on a line of its own.
    command = (f"'{train_mnist}' --data '{data}' --epochs 1 --batch-size 32 "
               f"--precision amp-bf16 --lr 1e12 --schedule constant")
    with tempfile.NamedTemporaryFile() as typescript:
        r = run(["script", "-qec", command, typescript.name],
                env=dict(os.environ, COLUMNS="100"))
        out = open(typescript.name, "rb").read().decode("utf-8", "replace")
    if r.returncode != 1:
        fail(f"exit {r.returncode}, expected 1:\n{out!r}")
    if "[" not in out or "img/s" not in out:
        fail(f"no progress bar was drawn:\n{out!r}")
    at = out.find("train_mnist: error: ")
    if at < 0:
        fail(f"no error message:\n{out!r}")
    if at > 0 and out[at - 1] not in "\r\n":
        line_start = max(out.rfind("\r", 0, at), out.rfind("\n", 0, at)) + 1
        fail(f"the error shares a line with {out[line_start:at]!r}")
    print("  the error starts a clean line: " + out[at:].splitlines()[0][:100])


def numerics(train_mnist, data):
    name = os.path.basename(train_mnist)
    base = [train_mnist, "--data", data, "--epochs", "1", "--batch-size", "32",
            "--no-progress"]
    r = run(base + ["--max-steps", "3", "--check-numerics"])
    if r.returncode != 0:
        fail(f"a clean run with --check-numerics: exit {r.returncode}: "
             f"{r.stderr}")
    # A learning rate that overflows the weights: the check stops at the
    # first module whose output or gradient is inf/NaN, and names it.
    r = run(base + ["--lr", "1e30", "--schedule", "constant", "--momentum", "0",
                    "--check-numerics"])
    lines = r.stderr.splitlines()
    if r.returncode != 1 or len(lines) != 1:
        fail(f"a diverging run: exit {r.returncode}, expected 1 with one "
             f"line: {r.stderr!r}")
    pattern = (rf"^{name}: error: lamp::NumericsCheck: step (\d+), "
               r"(forward|backward): .*module '(conv1|conv2|fc)' \(.*\) holds "
               r"inf/NaN \(largest magnitude (inf|nan), Float\)\. .*"
               r"--max-grad-norm")
    if not re.search(pattern, lines[0]):
        fail(f"{lines[0]!r} does not match {pattern!r}")
    print("  " + lines[0][:160])
    # With CUDA graphs forced on, a contradiction named by both flags.
    r = run(base + ["--check-numerics", "--cuda-graph", "on"])
    if r.returncode != 1 or ("--check-numerics observes eager steps, but "
                             "--cuda-graph is on") not in r.stderr:
        fail(f"--check-numerics --cuda-graph on: exit {r.returncode}: "
             f"{r.stderr!r}")
    # A flag: a value is a usage error.
    expect_usage_error(train_mnist, ["--check-numerics=often"],
                       r"check-numerics")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    what, args = argv[1], argv[2:]
    if what == "conventions":
        conventions(args)
    elif what == "flag-table":
        flag_table(args[0], args[1:])
    elif what == "logs":
        logs(*args)
    elif what == "tty":
        tty(*args)
    elif what == "numerics":
        numerics(*args)
    else:
        print(__doc__)
        return 2
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
