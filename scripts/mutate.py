#!/usr/bin/env python3
"""Measures the test suite's strength: plants each bug of a mutant list in a
scratch copy of the repository, one at a time, rebuilds incrementally and
reports which bugs the suite caught. Run it through scripts/mutate.sh, which
installs what the build needs and picks the LibTorch."""

import argparse
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"mutate: error: {msg}", file=sys.stderr)
    sys.exit(2)


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True,
                             capture_output=True).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        die(f"{root} is not a git checkout; the scratch copy takes its tracked files")


def sync_tree(root, files, dest):
    """Copies the tracked files into dest, leaving unchanged files (and their
    timestamps) alone so that the scratch build stays incremental. A copied
    file gets the time of the copy, not its source's: a run killed with a
    mutant planted leaves objects built from it, newer than the source, and
    a copy that kept the source's time would leave them in the build."""
    for rel in files:
        src, dst = os.path.join(root, rel), os.path.join(dest, rel)
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        with open(src, "rb") as f:
            data = f.read()
        if os.path.isfile(dst):
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        shutil.copymode(src, dst)
        os.utime(dst)


def load_mutants(path, only):
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=("#",),
                                       inline_comment_prefixes=None)
    parser.optionxform = str
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as e:
        die(f"cannot read the mutant list {path}: {e}")
    mutants = []
    for name in parser.sections():
        section = parser[name]
        missing = [k for k in ("file", "find", "replace") if k not in section]
        if missing:
            die(f"{path}: [{name}] lacks {', '.join(missing)}")
        if only and not re.search(only, name):
            continue
        mutants.append({"name": name, "file": section["file"],
                        "find": section["find"], "replace": section["replace"],
                        "tests": section.get("tests", ""),
                        "min_torch": section.get("min_torch", ""),
                        "max_torch": section.get("max_torch", "")})
    if not mutants:
        die(f"no mutant in {path}" + (f" matches --only '{only}'" if only else ""))
    return mutants


def version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def run(cmd, log_path, cwd=None, timeout=None):
    with open(log_path, "w", encoding="utf-8") as out:
        try:
            return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\nmutate: timed out after {timeout} s\n")
            return 124


def failed_tests(build):
    path = os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log")
    try:
        with open(path, encoding="utf-8") as f:
            # Parameterised tests carry "  # GetParam() = ..." in their names.
            return [line.strip().split(":", 1)[-1].split("  #")[0]
                    for line in f if line.strip()]
    except OSError:
        return []


# Tests a run leaves out, by label: the consumer builds (minutes, and no test
# of lamp's behaviour), mutants.list_applies (fails on every planted mutant by
# design) and format.clang_format (fails on any mutant whose line is laid out
# otherwise): none would tell a caught bug from a surviving one.
LEFT_OUT_LABELS = ("consumer", "mutants", "format")


def ctest(build, args, log_path, jobs, test_timeout, run_timeout=None):
    failed_log = os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log")
    if os.path.exists(failed_log):
        os.remove(failed_log)
    cmd = ["ctest", "--test-dir", build, "-j", str(jobs), "--timeout",
           str(test_timeout), "--stop-on-failure",
           "-LE", "|".join(LEFT_OUT_LABELS)] + args
    rc = run(cmd, log_path, timeout=run_timeout)
    return rc, failed_tests(build)


def test_names(build):
    """The names of the tests registered in a build folder (ctest -N)."""
    listed = subprocess.run(["ctest", "--test-dir", build, "-N"],
                            capture_output=True, text=True)
    return re.findall(r"^\s*Test\s+#\d+: (\S+)", listed.stdout, re.M)


def judge(m, run_tests):
    """Mutant m's verdict and the tests that failed: its hinted tests first,
    then (if they pass) the whole suite; run_tests(part, ctest_args) returns
    (exit code, failed test names). A ctest that fails without naming a
    failed test (killed by --run-timeout, a broken build folder) proves
    nothing either way: the verdict "error", which --resume does not reuse."""
    parts = ([("hinted", ["-R", m["tests"]])] if m["tests"] else []) + [("all", [])]
    for part, args in parts:
        rc, by = run_tests(part, args)
        if by:
            return "caught", by
        if rc != 0:
            return "error", [f"(ctest exit {rc}, no failed test named)"]
    return "SURVIVED", []


def starts_afresh(resume, only):
    """Whether a run deletes the record of earlier runs first: a run of the
    whole list without --resume does; one with --only adds to the record
    (a few mutants checked again must not wipe a long run's verdicts)."""
    return not resume and not only


def applies_to(m, torch_version):
    """Whether mutant m's code runs with this LibTorch (its min/max_torch)."""
    if not torch_version:
        return True
    v = version_tuple(torch_version)
    return not (m["min_torch"] and v < version_tuple(m["min_torch"])) and \
        not (m["max_torch"] and v > version_tuple(m["max_torch"]))


def unmatched_hints(mutants, names, torch_version):
    """The mutants (applicable with this LibTorch) whose `tests` regex matches
    none of the build's tests: each would run the whole suite for nothing
    first, so its `tests` is most likely a typo or a test since renamed."""
    return [m for m in mutants
            if m["tests"] and applies_to(m, torch_version)
            and not any(re.search(m["tests"], n) for n in names)]


def mutant_key(m):
    """Identifies a mutant by its name and text, so that a verdict recorded for
    an older version of a mutant is not reused."""
    text = "\0".join((m["name"], m["file"], m["find"], m["replace"]))
    return hashlib.sha1(text.encode()).hexdigest()


def load_recorded(path, torch_version):
    """The "caught" verdicts of earlier parts of a run, keyed by mutant_key
    (the last one recorded for a key); those recorded against another
    LibTorch are ignored. Other verdicts are not reused: a mutant that
    survived or did not build (a test added since, a build that ran out of
    memory) runs again."""
    recorded = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 6 or fields[1] != torch_version:
                    continue
                key, _, _, verdict, elapsed, by = fields
                if verdict == "caught":
                    recorded[key] = (verdict, [b for b in by.split("|") if b], float(elapsed))
                else:
                    recorded.pop(key, None)
    except OSError:
        pass
    return recorded


def record(path, torch_version, m, verdict, by, elapsed):
    with open(path, "a", encoding="utf-8") as f:
        f.write("\t".join((mutant_key(m), torch_version, m["name"], verdict,
                           f"{elapsed:.0f}", "|".join(by))) + "\n")


# Preprocessor switches that compile code with some LibTorch only, and the
# oldest LibTorch that compiles it (src/platform/compat.h): a mutant inside
# one needs min_torch (or, in its #else branch, max_torch), or it survives
# where its code is not compiled.
GUARD_MIN_TORCH = {"LAMP_TORCH_FLOAT8": "2.5",
                   "LAMP_TORCH_DEVICE_GENERIC_AUTOCAST": "2.4",
                   "LAMP_TORCH_CPU_CAPABILITIES": "2.11",
                   "LAMP_TORCH_CPU_MIXED_DTYPE_NORMS": "2.0",
                   "LAMP_TORCH_SDP_CUDNN": "2.3",
                   "LAMP_TORCH_FOREACH_COPY": "2.1"}


def enclosing_guards(text, pos):
    """The GUARD_MIN_TORCH switches around offset pos of a C++ source, as
    (switch, off): off where the code there is compiled when the switch is
    off (its #else branch, or an #if !SWITCH), outermost first."""
    stack = []
    for line in text[:pos].split("\n"):
        t = line.strip()
        if t.startswith("#if"):
            g = next((g for g in GUARD_MIN_TORCH if g in t), None)
            negated = bool(g) and (t.startswith("#ifndef") or
                                   re.search(r"!\s*(defined\s*\(?\s*)?" + g, t))
            stack.append([g, bool(negated)])
        elif t.startswith(("#else", "#elif")) and stack:
            stack[-1][1] = not stack[-1][1]
        elif t.startswith("#endif") and stack:
            stack.pop()
    return [(g, off) for g, off in stack if g]


def check_applies(m, root):
    """Stops with a message unless mutant m's text is in its file exactly once,
    and, inside a LibTorch-version switch, m names the LibTorch it needs."""
    path = os.path.join(root, m["file"])
    if not os.path.isfile(path):
        die(f"[{m['name']}]: no file {m['file']}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    count = text.count(m["find"])
    if count != 1:
        die(f"[{m['name']}]: '{m['find']}' occurs {count} times in {m['file']} "
            "(must be exactly once); update the mutant list for the current code")
    for guard, in_else in enclosing_guards(text, text.find(m["find"])):
        need = GUARD_MIN_TORCH[guard]
        if in_else:
            if not m["max_torch"] or \
                    version_tuple(m["max_torch"]) >= version_tuple(need):
                die(f"[{m['name']}]: its code is compiled only without {guard} "
                    f"(LibTorch older than {need}); add 'max_torch = ...' below {need}")
        elif not m["min_torch"] or version_tuple(m["min_torch"]) < version_tuple(need):
            die(f"[{m['name']}]: its code is compiled only with {guard} "
                f"(LibTorch {need} or newer); add 'min_torch = {need}'")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", help="scratch folder (copy and build); not needed "
                                  "with --check")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutant applies to the sources "
                         "under --root (its text found exactly once), and exit")
    ap.add_argument("--list", required=True, help="mutant list (INI)")
    ap.add_argument("--only", default="", help="regex of mutant names to run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--test-timeout", type=int, default=300,
                    help="ctest's --timeout: the limit of a test without a TIMEOUT property "
                         "of its own (default 300 s)")
    ap.add_argument("--run-timeout", type=int, default=7200,
                    help="the limit of one ctest call, in seconds (default 7200): a call "
                         "past it gives the mutant the verdict 'error'")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the 'caught' verdicts recorded in WORK/results.tsv for "
                         "mutants whose text is unchanged, and run only the others (a long "
                         "run in parts); without it, a run of the whole list starts the "
                         "record afresh, a run with --only adds to it")
    ap.add_argument("--torch-version", default="",
                    help="the LibTorch's version: mutants whose min_torch is newer or max_torch older "
                         "are listed as not applicable")
    ap.add_argument("cmake_args", nargs="*")
    a = ap.parse_args()

    mutants = load_mutants(a.list, a.only)
    if a.check:
        for m in mutants:
            check_applies(m, a.root)
        print(f"mutate.py: all {len(mutants)} mutants of {a.list} apply to {a.root}")
        return 0
    if not a.work:
        ap.error("--work is required (except with --check)")
    src = os.path.join(a.work, "src")
    build = os.path.join(a.work, "build")
    logs = os.path.join(a.work, "logs")
    os.makedirs(logs, exist_ok=True)
    files = tracked_files(a.root)
    log(f"Copying the repository into {src}")
    sync_tree(a.root, files, src)
    for m in mutants:  # every mutant must apply to the current sources
        check_applies(m, src)

    ctest_jobs = min(a.jobs, 2)
    # Configured on every run, not only the first: a scratch folder from an
    # earlier run then takes up the options this run passes (a changed
    # linker relinks, a changed compiler launcher recompiles once).
    log(f"Configuring {build}")
    # One process per googletest test: a mutant names the tests that catch it.
    if run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
            "-DLAMP_CTEST_PER_TEST=ON"]
           + a.cmake_args, os.path.join(logs, "configure.log")) != 0:
        die(f"configure failed; see {logs}/configure.log")
    build_cmd = ["cmake", "--build", build, "--parallel", str(a.jobs)]
    log("Building the unmutated sources")
    if run(build_cmd, os.path.join(logs, "baseline-build.log")) != 0:
        die(f"the unmutated build failed; see {logs}/baseline-build.log")
    if not a.no_baseline:
        log("Running the whole suite on the unmutated sources")
        rc, failed = ctest(build, [], os.path.join(logs, "baseline-test.log"),
                           ctest_jobs, a.test_timeout)
        if rc != 0:
            die(f"the suite fails without any mutant ({', '.join(failed) or 'see log'}); "
                f"fix that first. Log: {logs}/baseline-test.log")

    for m in unmatched_hints(mutants, test_names(build), a.torch_version):
        log(f"warning: [{m['name']}]: its tests '{m['tests']}' match no test of "
            "this build, so it runs the whole suite; name the tests that catch it")

    recorded_path = os.path.join(a.work, "results.tsv")
    recorded = load_recorded(recorded_path, a.torch_version) if a.resume else {}
    if starts_afresh(a.resume, a.only) and os.path.exists(recorded_path):
        os.remove(recorded_path)
    results = []
    for i, m in enumerate(mutants, 1):
        if m["min_torch"] and a.torch_version and \
                version_tuple(a.torch_version) < version_tuple(m["min_torch"]):
            log(f"[{i}/{len(mutants)}] {m['name']}: not applicable "
                f"(the code runs with LibTorch >= {m['min_torch']} only)")
            results.append((m["name"], "n/a", [f"(needs LibTorch >= {m['min_torch']})"], 0.0))
            continue
        if m["max_torch"] and a.torch_version and \
                version_tuple(a.torch_version) > version_tuple(m["max_torch"]):
            log(f"[{i}/{len(mutants)}] {m['name']}: not applicable "
                f"(the code runs with LibTorch <= {m['max_torch']} only)")
            results.append((m["name"], "n/a", [f"(needs LibTorch <= {m['max_torch']})"], 0.0))
            continue
        if mutant_key(m) in recorded:
            verdict, by, elapsed = recorded[mutant_key(m)]
            log(f"[{i}/{len(mutants)}] {m['name']}: {verdict} (recorded in {recorded_path})")
            results.append((m["name"], verdict, by, elapsed))
            continue
        path = os.path.join(src, m["file"])
        with open(path, encoding="utf-8") as f:
            original = f.read()
        log(f"[{i}/{len(mutants)}] {m['name']}: {m['file']}")
        start = time.time()
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(m["find"], m["replace"], 1))
            if run(build_cmd, os.path.join(logs, f"{m['name']}-build.log")) != 0:
                verdict, by = "no-build", ["(does not compile: fix the mutant)"]
            else:
                verdict, by = judge(m, lambda part, args: ctest(
                    build, args, os.path.join(logs, f"{m['name']}-{part}.log"),
                    ctest_jobs, a.test_timeout, a.run_timeout))
        finally:
            # Writing the original back gives it a new timestamp, so the next
            # build recompiles it.
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
        elapsed = time.time() - start
        results.append((m["name"], verdict, by, elapsed))
        record(recorded_path, a.torch_version, m, verdict, by, elapsed)
        log(f"    {verdict} in {elapsed:.0f} s" + (f" by {', '.join(by[:3])}" if by else ""))

    caught = sum(1 for r in results if r[1] == "caught")
    errors = sum(1 for r in results if r[1] == "error")
    applicable = sum(1 for r in results if r[1] != "n/a")
    lines = [f"{'mutant':38} {'verdict':9} {'s':>5}  caught by"]
    for name, verdict, by, elapsed in results:
        shown = ", ".join(by[:2]) + (f" (+{len(by) - 2})" if len(by) > 2 else "")
        lines.append(f"{name:38} {verdict:9} {elapsed:5.0f}  {shown}")
    lines.append(f"mutants: {caught} caught, {applicable - caught - errors} not caught, "
                 + (f"{errors} with a ctest error (no verdict), " if errors else "")
                 + f"of {applicable} applicable ({len(results) - applicable} need "
                 f"another LibTorch); LibTorch {a.torch_version or '?'}")
    report = "\n".join(lines)
    print(report)
    with open(os.path.join(a.work, "report.txt"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    return 0 if caught == applicable else 1


if __name__ == "__main__":
    sys.exit(main())
