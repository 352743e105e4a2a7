#!/usr/bin/env python3
"""Checks the command-line conventions of lamp's programs (ctest runs it).

  check_cli.py conventions PROGRAM...     usage errors, --help, --version;
                                          train_step_demo --precision auto
  check_cli.py flag-table PAGE PROGRAM...  the flag table of the Markdown
                                          PAGE (docs/programs.md), under its
                                          "Flags" heading, lists exactly the
                                          flags of the programs' --help
  check_cli.py message-flags SRC_DIR PROGRAM...
                                          every --flag that a message of the
                                          library (a string literal under
                                          SRC_DIR) names is a flag of the
                                          programs, and its value there
                                          ("--fused-bn off") one they accept
  check_cli.py logs TRAIN_MNIST DATA_DIR WORK_DIR
                                          --log-every lines, the JSON log's
                                          run/step/epoch records
  check_cli.py tty TRAIN_MNIST DATA_DIR   on a terminal, an error starts on
                                          a clean line after the progress bar
  check_cli.py precision TRAIN_MNIST DATA_DIR WORK_DIR
                                          --precision-support's table,
                                          --precision auto's header and run
                                          record, the warnings for modes and
                                          flags that are slow or do nothing
  check_cli.py smoke TRAIN_MNIST DATA_DIR WORK_DIR
                                          --max-steps and --limit-eval-batches
                                          runs say what they did: bar totals,
                                          evaluation progress, partial epochs,
                                          test subsets, the checkpoint skipped
  check_cli.py continue TRAIN_MNIST DATA_DIR WORK_DIR
                                          --resume with more --epochs (a
                                          constant schedule continues, the
                                          others are refused), a --steps run
                                          lengthened by --steps (--epochs
                                          refused), --init-from and its
                                          usage and model errors, the best
                                          checkpoint never the --init-from
                                          file; --eval-only's figures those
                                          of the checkpoint's last epoch
  check_cli.py numerics TRAIN_MNIST DATA_DIR
                                          --check-numerics: a clean run
                                          passes, a diverging one stops
                                          naming the first module
  check_cli.py resume TRAIN_MNIST DATA_DIR WORK_DIR
                                          --resume PATH alone continues the
                                          run as it was; flags that differ
                                          from the checkpoint are refused,
                                          all listed in one message
  check_cli.py settings-file TRAIN_MNIST DATA_DIR WORK_DIR
                                          --config: a key = value file's run
                                          is its flags' run, to the bit; the
                                          command line wins; --resume alone
                                          continues it; bad files refused
  check_cli.py messages TRAIN_MNIST DATA_DIR
                                          a file given as --data, an unknown
                                          flag's nearest flag, Lightning's
                                          precision names, empty paths
                                          refused, integers read as decimal
                                          ("010" is 10), a --device cuda:N
                                          beyond the GPUs
  check_cli.py signals TRAIN_MNIST DATA_DIR WORK_DIR LIBLAMP_FAIL_IO
                                          SIGINT/SIGTERM at the start, mid-
                                          epoch, in evaluation, during a
                                          checkpoint write, and a second
                                          signal: exit 130/143, one line, an
                                          "interrupted" record, no lock left,
                                          and the resume command it gives
                                          continues bit-identically (without
                                          the --init-from a run began with)

Each check prints what it ran and exits 1 at the first mismatch.
"""

import json
import gzip
import os
import re
import shlex
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# The programs keep a signal they inherit ignored, as Python does: nohup's
# SIGHUP, the SIGINT of a shell script's background job. The checks send
# both, so the programs they start must not inherit them ignored from
# whatever started the checks: each is set to its default here, which the
# programs inherit (check_gpt.py imports this module).
for _signal in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, signal.SIG_DFL)


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
            (["--precision", "fp4"],
             r"--precision: fp4 not in .*\(see " + name + r" --help\)$"),
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
                (["--limit-eval-batches", "-1"],
                 r"--limit-eval-batches: -1 is out of range: give an integer "
                 r"of at least 0"),
                (["--limit-eval-batches", "two"],
                 r"--limit-eval-batches: 'two' is not an integer"),
            ]
        for args, pattern in cases:
            expect_usage_error(program, args, pattern)
        if name == "train_step_demo":
            # "auto" is resolved for the device before the model is
            # converted: the summary names the mode it became.
            r = run([program, "--precision", "auto", "--steps", "2"])
            if r.returncode != 0 or not re.search(
                    r"^(fp32|tf32|amp|amp-bf16|half|bf16) \(auto\) on cpu ",
                    r.stdout, re.M):
                fail(f"{name} --precision auto: exit {r.returncode}, "
                     f"{r.stdout!r} {r.stderr!r}")
            print("  " + r.stdout.strip().splitlines()[-1][:100])
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


# Flags of other programs that lamp's messages name: torchrun's.
NOT_OURS = {"--master-port", "--nnodes", "--nproc-per-node"}


def flags_taking_values(program):
    """The flags whose --help line shows a value (CLI11: "--flag TEXT ...")."""
    r = run([program, "--help"])
    return set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9-]+)[ =][A-Z]", r.stdout,
                          re.M))


def named_flags(src):
    """{(flag, value or ""): "file:line"} for each --flag in a string literal
    of the C++ sources under src (comments left out)."""
    literal = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
    flag = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?: ([a-z0-9][a-z0-9.-]*))?")
    named = {}
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith((".cpp", ".h")):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.lstrip().startswith("//"):
                        continue
                    for text in literal.findall(line):
                        for found in flag.findall(text):
                            if found[0] not in NOT_OURS:
                                named.setdefault(
                                    found, f"{os.path.relpath(path, src)}:{number}")
    return named


def message_flags(src, programs):
    named = named_flags(src)
    if not named:
        fail(f"no message under {src} names a flag; is {src} lamp's src/?")
    helps = {p: help_flags(p) for p in programs}
    valued = {p: flags_taking_values(p) for p in programs}
    for (flag, value), where in sorted(named.items()):
        having = [p for p in programs if flag in helps[p]]
        if not having:
            fail(f"{where} names {flag}, which none of the programs has")
        for program in having:
            if not value or flag not in valued[program]:
                continue
            # CLI11 checks the values before it answers --help.
            r = run([program, flag, value, "--help"])
            if r.returncode != 0:
                fail(f"{where} names '{flag} {value}', which "
                     f"{os.path.basename(program)} refuses: "
                     f"{r.stderr.strip()}")
        print(f"  {where}: {flag} {value}".rstrip() + " exists in " +
              ", ".join(os.path.basename(p) for p in having))


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
    if epoch.get("train_eval", "missing") is not None:
        fail(f"train_eval without --eval-train: {epoch}")
    # --eval-train: the epoch line's "(eval mode L)" is the record's
    # train_eval, over the whole training data (no --limit-eval-batches).
    eval_log = os.path.join(work, "eval_train.jsonl")
    if os.path.exists(eval_log):
        os.remove(eval_log)
    r = run([train_mnist, "--data", data, "--epochs", "1", "--no-progress",
             "--eval-train", "--log-json", eval_log])
    line = re.search(r"^epoch 1/1  train loss \S+ \(eval mode (\S+)\)  test "
                     r"loss ", r.stdout, re.M)
    train_eval = [x for x in read_records(eval_log)
                  if x["record"] == "epoch"][-1]["train_eval"]
    images = header["train_images"]
    if r.returncode != 0 or not line or not train_eval or \
            f"{train_eval['loss']:.4f}" != line.group(1) or \
            train_eval["images"] != images or \
            train_eval["batches"] != train_eval["batches_in_set"]:
        fail(f"--eval-train: exit {r.returncode}, {r.stdout[-400:]!r}, "
             f"{train_eval!r}")
    print(f"  {len(records)} records, two runs, lines at steps 3, 6, 9, 12; "
          f"--eval-train: {line.group(0).strip()} ({images} images)")


def degenerate(train_mnist, data):
    """Training data of identical, nearly blank images all labelled 0 (the
    test data's mnist-degenerate, beside `data`): the run ends normally but
    says, once each, what is wrong with the data."""
    folder = os.path.join(os.path.dirname(data), "mnist-degenerate")
    r = run([train_mnist, "--data", folder, "--epochs", "1", "--batch-size", "8",
             "--eval-batch-size", "10", "--no-progress",
             "--precision", "fp32"])
    if r.returncode != 0:
        fail(f"exit {r.returncode}: {r.stderr}")
    expected = [r"train_mnist: warning: the training images of '[^']*' are "
                r"nearly blank: channel 0 varies by a standard deviation of "
                r"0\.000\d+ .*magnifies every pixel's noise \d+-fold",
                r"train_mnist: warning: every one of the 40 examples of the "
                r"training data is the same: there is nothing to learn",
                r"train_mnist: warning: every label of the training data is "
                r"0: the model can only learn to answer that"]
    for pattern in expected:
        if len(re.findall(pattern, r.stderr)) != 1:
            fail(f"not once on stderr: {pattern!r}\n{r.stderr}")
    print("  three warnings, exit 0")


def closed_stdout(train_mnist, data, work):
    """Started with stdout and stderr closed (`>&- 2>&-`), the program's
    console lines must not land in its --log-json file (opened as the lowest
    free descriptor, 1, it would take them): every line of the log is a JSON
    record."""
    log = os.path.join(work, "closed_stdout.jsonl")
    if os.path.exists(log):
        os.remove(log)
    args = [train_mnist, "--data", data, "--epochs", "1", "--batch-size", "32",
            "--max-steps", "2", "--log-json", log]
    print("$ " + " ".join(args) + " >&- 2>&-")

    def close_standard_output():
        os.close(1)
        os.close(2)

    code = subprocess.run(args, stdin=subprocess.DEVNULL, timeout=600,
                          preexec_fn=close_standard_output).returncode
    if code != 0:
        fail(f"with stdout and stderr closed: exit {code}")
    with open(log) as f:
        lines = f.read().splitlines()
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            fail(f"the log holds a line that is not JSON: {line!r}")
    if not lines or json.loads(lines[0])["record"] != "run":
        fail(f"the log does not start with the run record: {lines[:1]}")
    print(f"  {len(lines)} records, every line JSON")


def on_terminal(command, columns):
    """Runs the shell `command` on a pseudo-terminal (script(1)), `columns`
    wide, so that progress bars are drawn: its result and everything it
    wrote there."""
    with tempfile.NamedTemporaryFile() as typescript:
        r = run(["script", "-qec", command, typescript.name],
                env=dict(os.environ, COLUMNS=str(columns)))
        out = open(typescript.name, "rb").read().decode("utf-8", "replace")
    return r, out


def tty(train_mnist, data):
    # A run that diverges, on a pseudo-terminal (script(1)) so that the bar
    # is drawn: the error must start on a line of its own.
    command = (f"'{train_mnist}' --data '{data}' --epochs 1 --batch-size 32 "
               f"--precision amp-bf16 --lr 1e12 --schedule constant")
    r, out = on_terminal(command, 100)
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


def precision(train_mnist, data, work):
    r = run([train_mnist, "--precision-support", "--device", "cpu"])
    if r.returncode != 0 or r.stderr:
        fail(f"--precision-support: exit {r.returncode}, stderr {r.stderr!r}")
    levels = dict(re.findall(r"^  (\S+) +(native|emulated|unavailable) ",
                             r.stdout, re.M))
    modes = ["fp32", "tf32", "amp", "amp-bf16", "half", "bf16", "fp8"]
    if sorted(levels) != sorted(modes):
        fail(f"the table lists {sorted(levels)}, expected {modes}:\n{r.stdout}")
    chosen = re.search(r"^auto: (\S+) \(", r.stdout, re.M)
    if not chosen or levels.get(chosen.group(1)) != "native":
        fail(f"auto's choice is missing or not native:\n{r.stdout}")
    chosen = chosen.group(1)
    print(f"  auto picks {chosen}; levels {levels}")

    log = os.path.join(work, "precision_auto.jsonl")
    if os.path.exists(log):
        os.remove(log)
    base = [train_mnist, "--data", data, "--epochs", "1", "--batch-size", "32",
            "--no-progress", "--device", "cpu"]
    r = run(base + ["--precision", "auto", "--log-json", log])
    if r.returncode != 0 or "warning" in r.stderr:
        fail(f"--precision auto: exit {r.returncode}, stderr {r.stderr!r}")
    # Where BF16 is native, the run times fp32 and amp-bf16 on its model and
    # takes the faster, saying what it measured in the line after the
    # header; elsewhere it takes the table's choice.
    line = re.search(r"^train_mnist: auto: (\S+) \((.*)\)$", r.stdout, re.M)
    if not line:
        fail(f"no line says what auto chose: {r.stdout!r}")
    run_choice = chosen
    if chosen == "amp-bf16":
        timed = re.search(r"gave fp32 ([0-9.]+) ms, amp-bf16 ([0-9.]+) ms",
                          line.group(2))
        if not timed:
            fail(f"auto's line does not give the times: {line.group(0)!r}")
        faster = "amp-bf16" if float(timed.group(2)) < float(timed.group(1)) \
            else "fp32"
        if line.group(1) != faster:
            fail(f"auto took {line.group(1)}, the slower: {line.group(0)!r}")
        run_choice = faster
    elif line.group(1) != chosen:
        fail(f"auto took {line.group(1)}, the table says {chosen}")
    print("  " + line.group(0)[:200])
    if not r.stdout.startswith(
            f"train_mnist: cnn, {run_choice} (auto) on cpu, "):
        fail(f"the header does not name auto's choice {run_choice}: "
             f"{r.stdout!r}")
    header = read_records(log)[0]
    if header["precision"] != run_choice or \
            header["precision_auto"] is not True:
        fail(f"the run record says {header['precision']!r}, "
             f"precision_auto {header.get('precision_auto')!r}")
    # A resume with --precision auto keeps the mode its checkpoint was
    # trained in (a new measurement could choose the other).
    ck = os.path.join(work, "precision_auto.pt")
    for path in (ck, ck + ".lock"):
        if os.path.exists(path):
            os.remove(path)
    expect_success(base + ["--precision", "auto", "--max-steps", "2",
                           "--checkpoint", ck], [r"\ntrain_mnist: auto: "])
    r = run(base + ["--precision", "auto", "--resume", ck])
    kept = re.search(r"^train_mnist: auto: (\S+) \(the mode .*precision_auto"
                     r"\.pt was trained in, chosen when its run began\)$",
                     r.stdout, re.M)
    if r.returncode != 0 or not kept:
        fail(f"--precision auto on a resume: exit {r.returncode}, "
             f"{r.stdout!r} {r.stderr!r}")
    print("  resumed: " + kept.group(0)[:120])
    # --eval-only --resume says the checkpoint's path too.
    r = run([train_mnist, "--data", data, "--no-progress", "--eval-only",
             "--precision", "auto", "--resume", ck])
    if r.returncode != 0 or not re.search(
            r"^train_mnist: auto: \S+ \(the mode \S*precision_auto\.pt was "
            r"trained in", r.stdout, re.M):
        fail(f"--eval-only --precision auto --resume: exit {r.returncode}, "
             f"{r.stdout!r} {r.stderr!r}")

    # A mode without effect and a flag without effect: one warning each, in
    # the programs' form, and the run goes on.
    r = run(base + ["--precision", "tf32", "--cudnn-benchmark"])
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    expected = [r"^train_mnist: warning: --cudnn-benchmark has no effect on cpu",
                r"^train_mnist: warning: lamp: precision 'tf32' has no effect "
                r"on cpu .*computes in FP32"]
    if r.returncode != 0 or len(warnings) != 2 or not all(
            re.search(p, w) for p, w in zip(expected, warnings)):
        fail(f"tf32 --cudnn-benchmark: exit {r.returncode}, warnings {warnings}")
    print("  " + "\n  ".join(warnings))

    # An emulated mode (where this CPU has one): warned with its cost and the
    # faster mode.
    for mode in [m for m in modes if levels[m] == "emulated" and m != "fp8"]:
        r = run(base + ["--precision", mode, "--max-steps", "2"])
        pattern = (rf"^train_mnist: warning: lamp: precision '{mode}' is "
                   rf"emulated on cpu .*slower than fp32.*Precision '{chosen}' "
                   rf"is faster here")
        if r.returncode != 0 or not re.search(pattern, r.stderr, re.M):
            fail(f"{mode}: exit {r.returncode}, stderr {r.stderr!r}")
        print("  " + r.stderr.splitlines()[0][:120])
    for mode in [m for m in modes if levels[m] == "unavailable"]:
        r = run(base + ["--precision", mode])
        if r.returncode != 1 or "cannot run on cpu" not in r.stderr:
            fail(f"{mode}: exit {r.returncode}, stderr {r.stderr!r}")
    # fp8 where it runs (emulated): the CNN's one Linear (1568 -> 10) is not
    # a multiple of 16, so the run is refused before training, naming it.
    if levels["fp8"] == "emulated":
        r = run(base + ["--precision", "fp8", "--max-steps", "2"])
        pattern = (r"^train_mnist: error: lamp::TrainStep: precision 'fp8' is "
                   r"set but no Linear layer of the model can compute in FP8 "
                   r"\('fc': its weight is \[10, 1568\]")
        if r.returncode != 1 or not re.search(pattern, r.stderr, re.M) or \
                "precision 'fp8' is emulated on cpu" not in r.stderr:
            fail(f"fp8: exit {r.returncode}, stderr {r.stderr!r}")
        print("  " + r.stderr.splitlines()[-1][:120])


def smoke(train_mnist, data, work):
    """7 training batches of 32 per epoch, 4 test batches of 30 (100 images):
    --max-steps 10 stops 3 steps into epoch 2, --limit-eval-batches 2
    evaluates 60 of the 100 test images."""
    log = os.path.join(work, "smoke.jsonl")
    checkpoint = os.path.join(work, "smoke.pt")
    for path in (log, checkpoint):
        if os.path.exists(path):
            os.remove(path)
    args = [train_mnist, "--data", data, "--epochs", "2", "--batch-size", "32",
            "--eval-batch-size", "30", "--max-steps", "10", "--log-every", "1",
            "--limit-eval-batches", "2", "--log-json", log, "--checkpoint",
            checkpoint]
    r = run(args)
    if r.returncode != 0:
        fail(f"exit {r.returncode}: {r.stderr}")
    out = r.stdout
    # Progress lines count up to where the epoch stops: 7, then 3 (not 7).
    totals = re.findall(r"^epoch (\d)/2  step (\d+)/(\d+)  loss", out, re.M)
    expected = [("1", str(s), "7") for s in range(1, 8)] + \
        [("2", str(s), "3") for s in range(1, 4)]
    if totals != expected:
        fail(f"progress lines {totals}, expected {expected}:\n{out}")
    # Evaluation shows its own progress, saying it is a subset.
    evals = re.findall(r"^epoch (\d)/2  evaluating  batch (\d)/(\d) "
                       r"\(first 2 of 4 batches\)$", out, re.M)
    if evals != [("1", "1", "2"), ("1", "2", "2"), ("2", "1", "2"),
                 ("2", "2", "2")]:
        fail(f"evaluation lines {evals}:\n{out}")
    first = re.search(r"^epoch 1/2  train loss \S+  test loss \S+  test acc "
                      r"\d+\.\d\d% \(first 2 of 4 batches\)  .* warm-up "
                      r"\d+\.\d\d s$", out, re.M)
    second = re.search(r"^epoch 2/2 \(partial: 3 of 7 steps\)  train loss "
                       r"\S+  test loss \S+  test acc \d+\.\d\d% \(first 2 of "
                       r"4 batches\)  ", out, re.M)
    if not first or not second:
        fail(f"epoch lines not as expected (whole epoch 1, partial epoch 2, "
             f"both over a test subset):\n{out}")
    if "no checkpoint" in out:
        fail(f"a line says a checkpoint was skipped, but the partial epoch "
             f"writes its position:\n{out}")
    epochs = [x for x in read_records(log) if x["record"] == "epoch"]
    want = [
        {"epoch": 1, "steps": 7, "steps_in_epoch": 7, "partial": False,
         "test_subset": True, "test_batches": 2, "test_batches_in_set": 4,
         "test_images": 60, "checkpoint_written": True},
        {"epoch": 2, "steps": 3, "steps_in_epoch": 7, "partial": True,
         "test_subset": True, "test_batches": 2, "test_batches_in_set": 4,
         "test_images": 60, "checkpoint_written": True}]
    got = [{k: e.get(k) for k in want[0]} for e in epochs]
    if got != want:
        fail(f"epoch records {got}, expected {want}")
    for e in epochs:
        if not e.get("eval_seconds", 0) > 0:
            fail(f"no eval_seconds in {e}")
    print("  bar totals 7 then 3, evaluation lines, partial epoch 2, "
          "test subset, checkpoint skipped: said")
    # The whole test set: nothing said of a subset.
    os.remove(log)
    r = run([train_mnist, "--data", data, "--epochs", "1", "--batch-size",
             "32", "--eval-batch-size", "30", "--no-progress", "--log-json",
             log])
    if r.returncode != 0 or "(first" in r.stdout or "partial" in r.stdout:
        fail(f"a whole run says subset or partial (exit {r.returncode}):\n"
             f"{r.stdout}{r.stderr}")
    epoch = [x for x in read_records(log) if x["record"] == "epoch"][0]
    if (epoch["test_subset"], epoch["test_batches"], epoch["test_images"],
            epoch["partial"]) != (False, 4, 100, False):
        fail(f"the whole run's epoch record: {epoch}")
    print("  a whole run: no subset, no partial epoch")
    # On a terminal: the bar's total is where --max-steps stops the epoch,
    # and the evaluation draws a bar of its own.
    command = (f"'{train_mnist}' --data '{data}' --epochs 1 --batch-size 32 "
               f"--max-steps 3 --eval-batch-size 30 --limit-eval-batches 2")
    r, out = on_terminal(command, 120)
    if r.returncode != 0:
        fail(f"exit {r.returncode}:\n{out!r}")
    if not re.search(r"epoch 1/1 \[[=> ]+\] 3/3 loss", out) or \
            re.search(r"\] \d/7 loss", out):
        fail(f"the bar does not count to 3 (--max-steps 3):\n{out!r}")
    if not re.search(r"epoch 1/1 test \[[=> ]+\] 2/2 \(first 2 of 4 "
                     r"batches\)", out):
        fail(f"no evaluation bar:\n{out!r}")
    print("  on a terminal: the bar counts to 3, the evaluation has its bar")


def expect_runtime_error(args, patterns):
    """Exit 1 with a 'NAME: error: ...' message matching every pattern."""
    name = os.path.basename(args[0])
    r = run(args)
    if r.returncode != 1 or not r.stderr.startswith(f"{name}: error: "):
        fail(f"exit {r.returncode}, expected 1 with '{name}: error: ...'; "
             f"stderr {r.stderr!r}")
    for pattern in patterns:
        if not re.search(pattern, r.stderr):
            fail(f"{r.stderr!r} does not match {pattern!r}")
    print("  " + r.stderr.strip()[:160])


def expect_success(args, patterns):
    r = run(args)
    if r.returncode != 0:
        fail(f"exit {r.returncode}: {r.stderr}")
    for pattern in patterns:
        if not re.search(pattern, r.stdout):
            fail(f"the output does not match {pattern!r}:\n{r.stdout}")
    return r


def continue_and_init_from(train_mnist, data, work):
    def path(name):
        p = os.path.join(work, name)
        if os.path.exists(p):
            os.remove(p)
        return p

    base = [train_mnist, "--data", data, "--batch-size", "32", "--no-progress"]
    constant, onecycle = path("continue_constant.pt"), path("continue_onecycle.pt")
    # Usage errors: exit 2, one line.
    expect_usage_error(train_mnist, ["--init-from", onecycle, "--resume", constant],
                       r"--(init-from excludes --resume|resume excludes --init-from)")
    expect_usage_error(train_mnist, ["--init-from"], r"--init-from")
    # A constant schedule continues with more epochs.
    expect_success(base + ["--epochs", "1", "--schedule", "constant",
                           "--checkpoint", constant], [r"epoch 1/1"])
    continued = expect_success(
        base + ["--epochs", "2", "--schedule", "constant", "--checkpoint",
                constant, "--resume", constant],
        [r", 2 epochs, resuming at epoch 2 \(continuing the "
         r"1-epoch run\)", r"epoch 2/2"])
    # --eval-only: the checkpoint's test figures, as its last epoch printed
    # them; nothing written.
    figures = re.search(r"epoch 2/2 .*(test loss \S+  test acc \S+%)",
                        continued.stdout).group(1)
    with open(constant, "rb") as f:
        written = f.read()
    expect_success([train_mnist, "--eval-only", "--resume", constant],
                   [r"^train_mnist: evaluating .*continue_constant\.pt: cnn, "
                    r"fp32 on cpu, \d+ test images, batch \d+, ",
                    r"\ntrain_mnist: " + re.escape(figures) +
                    r"  \d+ images in \S+ s\n$"])
    # On another folder whose training images are another set's (here
    # inverted) and whose test images are the same: the checkpoint's own
    # mean and std normalise them, so the figures are the run's, and a line
    # says whose statistics were used.
    other = os.path.join(work, "eval_other_stats")
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(data, other)
    images = os.path.join(other, "train-images-idx3-ubyte.gz")
    with gzip.open(images, "rb") as f:
        raw = f.read()
    with gzip.open(images, "wb") as f:
        f.write(raw[:16] + bytes(255 - b for b in raw[16:]))
    expect_success([train_mnist, "--eval-only", "--resume", constant,
                    "--data", other],
                   [r"normalising with the mean \(\S+\) and std \(\S+\) "
                    r".*continue_constant\.pt was trained with, not those of "
                    r".*eval_other_stats's training images",
                    r"\ntrain_mnist: " + re.escape(figures) + r"  \d+ images"])
    expect_success(base + ["--eval-only", "--init-from", constant,
                           "--precision", "bf16", "--eval-batch-size", "10",
                           "--eval-batches", "2"],
                   [r"cnn, bf16 on cpu, \d+ test images, batch 10, ",
                    r"test acc \S+% \(first 2 of \d+ batches\)  20 images "])
    expect_runtime_error(base + ["--eval-only", "--resume", constant,
                                 "--epochs", "3"],
                         [r"--eval-only trains and writes nothing: leave out "
                          r"--epochs\."])
    expect_runtime_error(base + ["--eval-only"],
                         [r"--eval-only evaluates trained weights: give "
                          r"--resume CHECKPOINT"])
    with open(constant, "rb") as f:
        if f.read() != written:
            fail("--eval-only wrote the checkpoint")
    # onecycle cannot: its curve depends on the run's length.
    expect_success(base + ["--epochs", "1", "--checkpoint", onecycle],
                   [r"epoch 1/1"])
    expect_runtime_error(
        base + ["--epochs", "3", "--resume", onecycle],
        [r"was trained for 1 epochs with --schedule onecycle, whose learning "
         r"rates depend on the run's length",
         r"start a new run with --init-from .*continue_onecycle\.pt",
         r"or resume with --epochs 1\."])
    # --init-from: a new run from the weights, in another precision, lr,
    # schedule and length.
    expect_success(base + ["--epochs", "2", "--precision", "bf16", "--lr",
                           "0.01", "--schedule", "cosine", "--init-from",
                           onecycle],
                   [r"bf16 on cpu, .*, 2 epochs, from the weights of "
                    r".*continue_onecycle\.pt", r"epoch 1/2", r"epoch 2/2"])
    # ... of the same model only, and never written over.
    expect_runtime_error(
        base + ["--model", "resnet18", "--epochs", "1", "--init-from", onecycle],
        [r"holds the weights of another model \('cnn', \d+ tensors\) than "
         r"this one \(\d+ tensors\): 'conv1\.weight' is \[\d+, 1, 5, 5\] "
         r"there but \[64, 1, 3, 3\] here",
         r"Start from a checkpoint of this model"])
    expect_runtime_error(
        base + ["--epochs", "1", "--init-from", onecycle, "--checkpoint",
                onecycle],
        [r"--checkpoint .*continue_onecycle\.pt and --init-from "
         r".*continue_onecycle\.pt are the same file"])
    expect_runtime_error(base + ["--init-from", path("nowhere.pt")],
                         [r"no checkpoint at .*nowhere\.pt"])
    # Nor written over by the best copy of --checkpoint (--eval-every).
    best = path("continue_best.best.pt")
    with open(onecycle, "rb") as f:
        weights = f.read()
    with open(best, "wb") as f:
        f.write(weights)
    expect_runtime_error(
        base + ["--epochs", "1", "--eval-every", "2", "--init-from", best,
                "--checkpoint", path("continue_best.pt")],
        [r"--checkpoint's best copy .*continue_best\.best\.pt and --init-from "
         r".*continue_best\.best\.pt are the same file, which the run would "
         r"write over while reading it"])
    with open(best, "rb") as f:
        if f.read() != weights:
            fail("the --init-from file was written over by the best copy")
    # A run of --steps is lengthened by --steps; --epochs, which its stored
    # --steps would override, is refused.
    steps = path("continue_steps.pt")
    expect_success(base + ["--steps", "4", "--schedule", "constant",
                           "--checkpoint", steps], [r"steps 4 \(1 epoch\)"])
    expect_runtime_error(
        base + ["--resume", steps, "--epochs", "3"],
        [r"continue_steps\.pt is a run of --steps 4 \(its length in batches\), "
         r"which --epochs 3 cannot change: leave --epochs out, and give a "
         r"larger --steps"])
    expect_success(base + ["--resume", steps, "--checkpoint", steps, "--steps",
                           "6"], [r"steps 6 \(1 epoch\), resuming at epoch 1"])
    # An earlier run's checkpoint is not written over by a new run: refused
    # before training, the file left as it was; --resume continues it (as
    # above), --overwrite-checkpoint starts anew over it.
    with open(constant, "rb") as f:
        before = f.read()
    earlier = (r"--checkpoint .*continue_constant\.pt is there already "
               r"\(\d+\.\d KiB, written \d{4}-\d\d-\d\d \d\d:\d\d UTC\): this "
               r"run would write over it, and it does not resume it\. Give "
               r"--resume .*continue_constant\.pt to continue the run that "
               r"wrote it, another --checkpoint, or --overwrite-checkpoint to "
               r"start anew over it\.")
    expect_runtime_error(base + ["--epochs", "1", "--checkpoint", constant],
                         [earlier])
    # Nor by a run resuming another checkpoint.
    expect_runtime_error(base + ["--steps", "8", "--resume", steps,
                                 "--checkpoint", constant],
                         [earlier])
    with open(constant, "rb") as f:
        if f.read() != before:
            fail("a refused run wrote over the earlier run's checkpoint")
    expect_success(base + ["--epochs", "1", "--max-steps", "2", "--checkpoint",
                           constant, "--overwrite-checkpoint"], [r"2 of \d+ steps"])
    with open(constant, "rb") as f:
        if f.read() == before:
            fail("--overwrite-checkpoint did not write the checkpoint")
    # The best copy (--eval-every) of another run, its checkpoint gone.
    other = path("continue_other.pt")
    expect_success(base + ["--epochs", "1", "--max-steps", "2", "--eval-every",
                           "1", "--checkpoint", other], [r"2 of \d+ steps"])
    os.remove(other)
    expect_runtime_error(
        base + ["--epochs", "1", "--eval-every", "1", "--checkpoint", other],
        [r"--checkpoint's best copy .*continue_other\.best\.pt is there "
         r"already \(\d+\.\d KiB, written [^)]*\): this run would write over it\. "
         r"Give another --checkpoint, or --overwrite-checkpoint"])
    for p in (constant, onecycle, best, steps,
              os.path.join(work, "continue_other.best.pt")):
        os.remove(p)
    print("  continued, refused, started from weights, evaluated, "
          "an earlier run's checkpoint kept")


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


def fresh(work, name):
    """A path in WORK_DIR with nothing at it (nor at its lock)."""
    p = os.path.join(work, name)
    for q in (p, p + ".lock"):
        if os.path.exists(q):
            os.remove(q)
    return p


def epoch_losses(log):
    """{epoch: (train_loss, test_loss)} of the log's epoch records."""
    return {r["epoch"]: (r["train_loss"], r["test_loss"])
            for r in read_records(log) if r["record"] == "epoch"}


def resume_defaults(train_mnist, data, work):
    flags = ["--batch-size", "32", "--lr", "0.02", "--seed", "5",
             "--momentum", "0.8", "--schedule", "cosine"]
    base = [train_mnist, "--data", data, "--no-progress"]
    straight_log = fresh(work, "resume_straight.jsonl")
    expect_success(base + flags + ["--epochs", "2", "--log-json", straight_log],
                   [r"epoch 2/2"])
    ck = fresh(work, "resume_defaults.pt")
    expect_success(base + flags + ["--epochs", "2", "--max-steps", "7",
                                   "--checkpoint", ck], [r"epoch 1/2"])
    # --resume alone: the checkpoint's settings, epoch 2 as the straight
    # run's; it saves the run to the file it resumes (a copy of the
    # checkpoint, by the same name, which the checks below do not use).
    log = fresh(work, "resume_alone.jsonl")
    os.makedirs(os.path.join(work, "alone"), exist_ok=True)
    alone = os.path.join(work, "alone", os.path.basename(ck))
    shutil.copyfile(ck, alone)
    expect_success(base + ["--resume", alone, "--log-json", log],
                   [r"batch 32, 2 epochs, resuming at epoch 2",
                    rf"resumed from {re.escape(alone)}: checkpoints to "
                    rf"{re.escape(alone)}\n", r"epoch 2/2"])
    r = run(base + ["--resume", alone])
    if r.returncode != 0 or "the run is complete" not in r.stdout:
        fail(f"--resume alone did not save the run to {alone}: "
             f"{r.stdout[:400]!r}")
    header = read_records(log)[0]
    want = {"batch_size": 32, "lr": 0.02, "seed": 5, "momentum": 0.8,
            "schedule": "cosine", "epochs": 2}
    got = {k: header[k] for k in want}
    if got != want:
        fail(f"the resumed run's settings {got}, expected {want}")
    if epoch_losses(log)[2] != epoch_losses(straight_log)[2]:
        fail(f"epoch 2 resumed {epoch_losses(log)[2]} differs from epoch 2 "
             f"straight {epoch_losses(straight_log)[2]}")
    print("  --resume alone: the stored settings, epoch 2 bit-identical")
    # The same values given again are no difference.
    expect_success(base + ["--resume", ck, "--batch-size", "32", "--lr",
                           "2e-2", "--max-steps", "8"], [r"resuming at epoch 2"])
    # One difference, then several: all named in one message.
    expect_runtime_error(
        base + ["--resume", ck, "--lr", "0.1"],
        [r"was trained with other settings than this command line gives: "
         r"--lr 0\.02 there, 0\.1 here\. ",
         r"leave these flags out \(--resume alone takes the checkpoint's "
         r"values\) or resume with --lr 0\.02;",
         r"--init-from .*resume_defaults\.pt\.$"])
    expect_runtime_error(
        base + ["--resume", ck, "--lr", "0.1", "--batch-size", "64",
                "--momentum", "0.8", "--seed", "1", "--no-bias-decay",
                "--epochs", "1"],
        [r"--batch-size 32 there, 64 here; --epochs 2 there, 1 here; "
         r"--lr 0\.02 there, 0\.1 here; --no-bias-decay off there, given "
         r"here; --seed 5 there, 1 here\.",
         r"resume with --batch-size 32 --epochs 2 --lr 0\.02 without "
         r"--no-bias-decay --seed 5;"])
    r = run(base + ["--resume", ck, "--lr", "0.1", "--batch-size", "64"])
    if "--momentum" in r.stderr or len(r.stderr.splitlines()) != 1:
        fail(f"a flag given with its stored value is listed, or the message "
             f"is not one line: {r.stderr!r}")
    os.remove(ck)


def messages(train_mnist, data):
    # A file where a folder is expected.
    expect_usage_error(train_mnist, ["--data", "/etc/hostname"],
                       r"--data: /etc/hostname is a file, not a folder; give "
                       r"the folder that holds the dataset's files")
    # An unknown flag: the nearest one.
    expect_usage_error(train_mnist, ["--epoch", "1"],
                       r"not expected: .*--epoch: did you mean --epochs\? "
                       r"\(see train_mnist --help\)$")
    expect_usage_error(train_mnist, ["--batchsize=3"],
                       r"--batchsize: did you mean --batch-size\?")
    r = run([train_mnist, "--no-such-flag"])
    if "did you mean" in r.stderr:
        fail(f"a flag far from every flag got a suggestion: {r.stderr!r}")
    # An empty path is no path: refused, not a run that reads or writes
    # nothing (a program that took it would run one step).
    for flag in ("--checkpoint", "--resume", "--init-from", "--log-json",
                 "--export-state-dict"):
        expect_usage_error(train_mnist, [flag, "", "--data", data, "--epochs",
                                         "1", "--max-steps", "1"],
                           rf"^train_mnist: error: {flag}: the path is empty; "
                           r"give the \w")
    # A GPU index beyond the GPUs there are (a CPU-only machine has none).
    expect_runtime_error(
        [train_mnist, "--data", data, "--device", "cuda:99"],
        [r"^train_mnist: error: --device cuda:99: (no CUDA GPU is available "
         r"to this process|this process sees \d+ CUDA GPUs?, cuda:0.*; give "
         r"one of them)"])
    # Integers are decimal, whatever their leading zeros (CLI11 alone reads
    # "010" as octal 8 and refuses "08").
    with tempfile.TemporaryDirectory() as work:
        log = os.path.join(work, "decimal.jsonl")
        expect_success([train_mnist, "--data", data, "--batch-size", "010",
                        "--epochs", "08", "--seed", "010", "--max-steps", "1",
                        "--no-progress", "--log-json", log],
                       [r", batch 10, 8 epochs, "])
        header = read_records(log)[0]
        if (header["batch_size"], header["epochs"], header["seed"]) != \
                (10, 8, 10):
            fail(f"--batch-size 010 --epochs 08 --seed 010 ran with "
                 f"batch_size {header['batch_size']}, epochs "
                 f"{header['epochs']}, seed {header['seed']}")
    # Lightning's precision names are lamp's modes.
    base = [train_mnist, "--data", data, "--epochs", "1", "--batch-size", "32",
            "--no-progress", "--max-steps", "1", "--device", "cpu"]
    for lightning, lamp_mode in [("bf16-mixed", "amp-bf16"),
                                 ("bf16-true", "bf16"), ("32-true", "fp32"),
                                 ("32", "fp32")]:
        expect_success(base + ["--precision", lightning],
                       [rf"^train_mnist: cnn, {lamp_mode} on cpu"])
    for lightning, lamp_mode in [("16-mixed", "amp"), ("16-true", "half")]:
        r = run(base + ["--precision", lightning])
        if r.returncode == 0:
            if not re.match(rf"train_mnist: cnn, {lamp_mode} on cpu", r.stdout):
                fail(f"--precision {lightning}: {r.stdout!r}")
        elif f"precision '{lamp_mode}'" not in r.stderr:
            fail(f"--precision {lightning} is not {lamp_mode}: {r.stderr!r}")
    print("  a file as --data, did you mean, Lightning's names, empty paths, "
          "decimal integers: said")



def settings_file(train_mnist, data, work):
    """--config: a key = value file trains the run its flags typed train,
    to the bit; the command line wins over it; a run it started resumes
    with --resume alone; a key that is no flag, a bad value and a Python
    file are usage errors naming the file."""
    base = [train_mnist, "--data", data, "--no-progress"]
    flags = ["--batch-size", "32", "--lr", "0.02", "--seed", "5",
             "--momentum", "0.8", "--schedule", "cosine", "--epochs", "2"]
    typed_log = fresh(work, "settings_typed.jsonl")
    expect_success(base + flags + ["--log-json", typed_log], [r"epoch 2/2"])
    settings = os.path.join(work, "settings.toml")
    log = fresh(work, "settings_file.jsonl")
    with open(settings, "w") as f:
        f.write("# the run of the flags above\n"
                "batch_size = 32\nlr = 2e-2   # = 0.02\nseed = 5\n"
                "momentum = 0.8\nschedule = \"cosine\"\nepochs = 2\n"
                f"log-json = '{log}'\n")
    expect_success(base + ["--config", settings],
                   [rf"--config {re.escape(settings)} gives --batch-size=32 "
                    r"--lr=2e-2 --seed=5 --momentum=0\.8 --schedule=cosine "
                    r"--epochs=2 --log-json=", r"epoch 2/2"])
    if epoch_losses(log) != epoch_losses(typed_log):
        fail(f"the settings file's run {epoch_losses(log)} differs from the "
             f"typed flags' {epoch_losses(typed_log)}")
    print("  the settings file's run is the typed flags' run, bit for bit")
    # The command line wins, by any of a flag's names.
    over = fresh(work, "settings_over.jsonl")
    expect_success(base + ["--config", settings, "--lr", "0.05",
                           "--log-json", over, "--max-steps", "2"],
                   [r"gives --batch-size=32 --seed=5 "])
    header = read_records(over)[0]
    if header["lr"] != 0.05 or header["batch_size"] != 32:
        fail(f"--lr 0.05 over the file's 2e-2: {header}")
    # A run it started resumes with --resume alone.
    ck = fresh(work, "settings.pt")
    expect_success(base + ["--config", settings, "--max-steps", "7",
                           "--checkpoint", ck, "--log-json",
                           fresh(work, "settings_part.jsonl")],
                   [r"epoch 1/2"])
    expect_success(base + ["--resume", ck],
                   [r"batch 32, 2 epochs, resuming at epoch 2",
                    r"epoch 2/2"])
    # Refusals: usage errors naming the file and line.
    with open(settings, "a") as f:
        f.write("epoch = 3\n")
    expect_usage_error(train_mnist, ["--config", settings],
                       r"settings\.toml line 9 \(epoch = 3\): --epoch is not "
                       r"a flag of this program; did you mean --epochs\?")
    with open(settings, "w") as f:
        f.write("epochs = 0\n")
    expect_usage_error(train_mnist, ["--config", settings],
                       r"--epochs: 0 is out of range: .*\(set by "
                       rf"{re.escape(settings)} line 1 \(epochs = 0\)\)")
    # Refused after parsing, the file's lines still named: two flags that
    # contradict each other (a usage error, both lines in the message's
    # order) and a value the data refuses (a runtime error, the line inside
    # the sentence).
    with open(settings, "w") as f:
        f.write("steps = 10\nschedule = warmup-cosine\nwarmup-steps = 20\n")
    # (After the line saying what the file gave, on stdout.)
    r = run([train_mnist, "--config", settings])
    wanted = (f"train_mnist: error: --warmup-steps 20 is not shorter than "
              f"--steps 10; give fewer warm-up steps or a longer run (set by "
              f"{settings} line 3 (warmup-steps = 20); {settings} line 1 "
              f"(steps = 10)) (see train_mnist --help)\n")
    if r.returncode != 2 or r.stderr != wanted:
        fail(f"a warm-up the file makes too long: exit {r.returncode}, "
             f"stderr {r.stderr!r}, expected {wanted!r}")
    with open(settings, "w") as f:
        f.write("batch-size = 99999\n")
    expect_runtime_error(base + ["--config", settings, "--epochs", "1"],
                         [r"--batch-size 99999 is larger than the \d+ "
                          r"training images; use --batch-size \d+ or less "
                          rf"\(set by {re.escape(settings)} line 1 "
                          r"\(batch-size = 99999\)\)\.$"])
    python = os.path.join(work, "settings.py")
    with open(python, "w") as f:
        f.write("n_layer = 2\n")
    expect_usage_error(train_mnist, ["--config", python],
                       r"settings files of key = value lines .*not Python")
    expect_usage_error(train_mnist, ["--config", settings, "--config",
                                     settings], r"--config is given 2 times")


def catches_signal(p, signum, timeout):
    """Waits until process `p` catches signal `signum` (installed a handler
    for it: its bit in /proc/PID/status's SigCgt mask); False when `p` ends
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as status:
                for line in status:
                    if line.startswith("SigCgt:") and \
                            int(line.split()[1], 16) >> (int(signum) - 1) & 1:
                        return True
        except OSError:
            return False
        time.sleep(0.05)
    return False

def signals(train_mnist, data, work, shim):
    """7 training steps of 32 images per epoch, 3 epochs; the signals come
    from liblamp_fail_io (LAMP_FAULT_RAISE_ON) at exact points."""
    base = [train_mnist, "--data", data, "--batch-size", "32",
            "--eval-batch-size", "30", "--no-progress", "--log-every", "1",
            "--epochs", "3"]
    straight_log = fresh(work, "signals_straight.jsonl")
    expect_success(base + ["--log-json", straight_log], [r"epoch 3/3"])
    straight = epoch_losses(straight_log)
    first = fresh(work, "signals_epoch1.pt")
    expect_success(base + ["--checkpoint", first, "--max-steps", "7"],
                   [r"epoch 1/3"])
    epoch1 = open(first, "rb").read()

    def interrupted(name, args, env, rc, line, record):
        """Runs `args` under the shim; checks exit `rc`, the one line on
        stderr, the "interrupted" record, no lock; resumes with the command
        the record gives and compares the epochs with the straight run's."""
        log = fresh(work, name + ".jsonl")
        ck = fresh(work, name + ".pt")
        open(ck, "wb").write(epoch1)
        env = dict(os.environ, LD_PRELOAD=shim, **env)
        env.setdefault("LAMP_FAULT_PATH", log)
        cmd = [a.replace("CK", ck).replace("LOG", log) for a in args]
        r = run(base + cmd, env=env)
        lines = r.stderr.splitlines()
        if r.returncode != rc or len(lines) != 1 or not re.search(line, lines[0]):
            fail(f"{name}: exit {r.returncode} (expected {rc}), stderr "
                 f"{r.stderr!r} (expected one line matching {line!r})")
        print("  " + lines[0][:200])
        if os.path.exists(ck + ".lock"):
            fail(f"{name}: the checkpoint's lock was left behind")
        last = read_records(log)[-1]
        if any(last.get(k) != v for k, v in record.items()):
            fail(f"{name}: the last record {last}, expected {record}")
        command = shlex.split(last["resume_command"])
        if "continue with: " + last["resume_command"] not in lines[0]:
            fail(f"{name}: the line does not give the record's command")
        # One --resume, whichever form the run was given (--resume F or
        # --resume=F).
        if sum(1 for a in command if a.startswith("--resume")) != 1:
            fail(f"{name}: the command {command} does not give one --resume")
        before = len(read_records(log))
        expect_success(command, [r"epoch 3/3"])
        resumed = {r["epoch"]: (r["train_loss"], r["test_loss"])
                   for r in read_records(log)[before:] if r["record"] == "epoch"}
        for epoch, losses in resumed.items():
            if losses != straight[epoch]:
                fail(f"{name}: epoch {epoch} resumed {losses}, straight "
                     f"{straight[epoch]}")
        print(f"  {name}: resumed epochs {sorted(resumed)} bit-identical")

    resume = ["--checkpoint", "CK", "--resume", "CK", "--log-json", "LOG"]
    # The closed terminal's case gives --resume=CK, the other form.
    resume_joined = ["--checkpoint", "CK", "--resume=CK", "--log-json", "LOG"]
    cases = [
        # At the start: before a step of this run; the file holds its step.
        ("signal_at_start", {"LAMP_FAULT_RAISE_ON": '"record":"run"'}, 130,
         r"^train_mnist: interrupted \(SIGINT\) before epoch 2 began; "
         r".*signal_at_start\.pt holds step 7: nothing trained is lost; "
         r"continue with: ",
         {"record": "interrupted", "signal": "SIGINT", "epoch": 2,
          "steps": 0, "checkpoint_step": 7, "phase": "training"}),
        # Mid-epoch: after step 3 of epoch 2 (the run's 10th), written at
        # the stop.
        ("signal_mid_epoch", {"LAMP_FAULT_RAISE_ON": '"global_step":10,'}, 130,
         r"interrupted \(SIGINT\) in epoch 2 after 3 of 7 steps; "
         r".*signal_mid_epoch\.pt holds step 10: nothing trained is lost",
         {"epoch": 2, "steps": 3, "global_step": 10, "checkpoint_step": 10}),
        # In evaluation: after epoch 2's last step; SIGTERM.
        ("signal_in_evaluation", {"LAMP_FAULT_RAISE_ON": '"global_step":14,',
                                  "LAMP_FAULT_RAISE_SIGNAL": "15"}, 143,
         r"interrupted \(SIGTERM\) while evaluating at step 14 \(epoch 2\); "
         r".*signal_in_evaluation\.pt holds step 14: nothing trained is "
         r"lost; continue with: ",
         {"signal": "SIGTERM", "epoch": 2, "steps": 7,
          "phase": "evaluation", "checkpoint_step": 14}),
        # A closed terminal (SIGHUP) stops as SIGTERM does: the record, the
        # lock removed, exit 128 + 1.
        ("signal_hangup", {"LAMP_FAULT_RAISE_ON": '"global_step":10,',
                           "LAMP_FAULT_RAISE_SIGNAL": "1"}, 129,
         r"interrupted \(SIGHUP\) in epoch 2 after 3 of 7 steps; "
         r".*signal_hangup\.pt holds step 10: nothing trained is lost",
         {"signal": "SIGHUP", "epoch": 2, "steps": 3, "global_step": 10,
          "checkpoint_step": 10}),
        # During the epoch-2 checkpoint's write: it is finished, then the
        # run stops before epoch 3.
        ("signal_mid_write", {"LAMP_FAULT_PATH": "signal_mid_write.pt.tmp-",
                              "LAMP_FAULT_RAISE_ON": "*"}, 130,
         r"interrupted \(SIGINT\) before epoch 3 began; "
         r".*signal_mid_write\.pt holds step 14",
         {"epoch": 3, "steps": 0, "checkpoint_step": 14}),
    ]
    for name, env, rc, line, record in cases:
        interrupted(name, resume_joined if name == "signal_hangup" else resume,
                    env, rc, line, record)
    # Under nohup (SIGHUP ignored by the parent) a hangup is ignored, as
    # nohup asks: the run goes on to its end. (It stopped the run.)
    log = fresh(work, "signal_nohup.jsonl")
    r = run(base + ["--log-json", log],
            env=dict(os.environ, LD_PRELOAD=shim, LAMP_FAULT_PATH=log,
                     LAMP_FAULT_RAISE_ON='"global_step":10,',
                     LAMP_FAULT_RAISE_SIGNAL="1"),
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    if r.returncode != 0 or "epoch 3/3" not in r.stdout or \
            read_records(log)[-1].get("record") == "interrupted":
        fail(f"SIGHUP under nohup: exit {r.returncode}, stderr {r.stderr!r}")
    print("  SIGHUP inherited as ignored (nohup): the run trains to its end")
    # A run started from weights (--init-from): the command it gives resumes
    # from its checkpoint, without the --init-from that --resume excludes.
    log = fresh(work, "signal_init_from.jsonl")
    ck = fresh(work, "signal_init_from.pt")
    r = run(base + ["--init-from", first, "--checkpoint", ck, "--log-json", log],
            env=dict(os.environ, LD_PRELOAD=shim, LAMP_FAULT_PATH=log,
                     LAMP_FAULT_RAISE_ON='"global_step":3,'))
    last = read_records(log)[-1]
    command = shlex.split(last.get("resume_command") or "")
    if r.returncode != 130 or last.get("record") != "interrupted" or \
            last.get("checkpoint_step") != 3 or \
            any(a.startswith("--init-from") for a in command) or \
            command[-2:] != ["--resume", ck]:
        fail(f"a run from --init-from stopped: exit {r.returncode}, the last "
             f"record {last}")
    expect_success(command, [r"resuming at epoch 1 step 4", r"epoch 3/3"])
    print("  a run from --init-from stopped: its command resumes without it")
    # A new run stopped before its first step: nothing trained, so nothing
    # written (a checkpoint of step 0 would resume nothing); the line says
    # to start over.
    log = fresh(work, "signal_fresh.jsonl")
    ck = fresh(work, "signal_fresh.pt")
    r = run(base + ["--checkpoint", ck, "--log-json", log],
            env=dict(os.environ, LD_PRELOAD=shim, LAMP_FAULT_PATH=log,
                     LAMP_FAULT_RAISE_ON='"record":"run"'))
    if r.returncode != 130 or os.path.exists(ck) or not re.search(
            r"interrupted \(SIGINT\) before epoch 1 began; .*signal_fresh\.pt "
            r"was not written; run the command again to start over", r.stderr):
        fail(f"a new run stopped before its first step: exit {r.returncode}, "
             f"{'a checkpoint written, ' if os.path.exists(ck) else ''}"
             f"stderr {r.stderr!r}")
    elif read_records(log)[-1].get("checkpoint_step", 0) is not None:
        fail(f"a new run stopped before its first step: the record "
             f"{read_records(log)[-1]} names a checkpoint step")
    else:
        print("  " + r.stderr.strip().splitlines()[-1][:200])
    # A second signal during that write: out at once, the epoch-1
    # checkpoint whole; a resume continues from it.
    ck = fresh(work, "signal_twice.pt")
    open(ck, "wb").write(epoch1)
    r = run(base + ["--checkpoint", ck, "--resume", ck],
            env=dict(os.environ, LD_PRELOAD=shim,
                     LAMP_FAULT_PATH="signal_twice.pt.tmp-",
                     LAMP_FAULT_RAISE_ON="*", LAMP_FAULT_RAISE_COUNT="2"))
    if r.returncode != 130 or "second signal: stopping at once" not in r.stderr:
        fail(f"a second signal: exit {r.returncode}, stderr {r.stderr!r}")
    if open(ck, "rb").read() != epoch1:
        fail("a second signal during a checkpoint write changed the last one")
    log = fresh(work, "signal_twice.jsonl")
    expect_success(base + ["--checkpoint", ck, "--resume", ck, "--log-json", log],
                   [r"resuming at epoch 2"])
    if epoch_losses(log) != {e: straight[e] for e in (2, 3)}:
        fail(f"after a second signal: {epoch_losses(log)} vs {straight}")
    print("  a second signal: exit 130 at once, the last checkpoint whole, "
          "resumed bit-identically")

    # Rank 1 of 2 waiting at the rendezvous for a rank 0 that never comes:
    # the first SIGINT stops it within the stop poll (0.1 s), not the
    # timeout, saying where it was; no second signal needed.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    p = subprocess.Popen(base + ["--dist-timeout", "60"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    # Once the program catches SIGINT (its handler is installed just before
    # the rendezvous), not after a fixed time: a loaded machine takes
    # longer than any such time to load LibTorch, and the signal's default
    # action would end the program unheard.
    catching = catches_signal(p, signal.SIGINT, timeout=60)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    start = time.monotonic()
    try:
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("SIGINT at the rendezvous: still running 20 s later")
    took = time.monotonic() - start
    wanted = ("train_mnist: interrupted (SIGINT) while waiting for the other "
              "ranks at the rendezvous; nothing was trained or written")
    if p.returncode != 130 or wanted not in err or took > 5 or not catching:
        fail(f"SIGINT at the rendezvous: exit {p.returncode} after {took:.1f}"
             f" s{'' if catching else ' (it never caught SIGINT)'}, "
             f"stderr {err!r}")
    print(f"  SIGINT at the rendezvous: exit 130 after {took:.1f} s")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    what, args = argv[1], argv[2:]
    checks = {"logs": logs, "tty": tty, "precision": precision,
              "smoke": smoke, "continue": continue_and_init_from,
              "numerics": numerics, "resume": resume_defaults,
              "messages": messages, "signals": signals,
              "closed-stdout": closed_stdout, "degenerate": degenerate,
              "settings-file": settings_file}
    if what == "conventions":
        conventions(args)
    elif what == "flag-table":
        flag_table(args[0], args[1:])
    elif what == "message-flags":
        message_flags(args[0], args[1:])
    elif what in checks:
        checks[what](*args)
    else:
        print(__doc__)
        return 2
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
