#!/usr/bin/env python3
"""scripts/mutate.py --check: a mutant must apply (its text found once in its
file), and one planted inside a LibTorch-version switch must name the
LibTorch that compiles its code (min_torch, or max_torch in the switch's
#else branch), or it would survive where its code is not compiled. And a
run's warning about a mutant whose `tests` match no test of the build, and
the tests a run leaves out (given the build folder in LAMP_TEST_BUILD_DIR,
whose labels are read from its CTestTestfile.cmake files: a ctest call
would replace the LastTest.log of the suite running this test).
And what a run keeps between its parts: fresh timestamps on what it copies,
only "caught" verdicts reused, a ctest failure without a failed test judged
no verdict, an --only run that keeps the record. Standard library only."""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                       "scripts")
MUTATE = os.path.join(SCRIPTS, "mutate.py")
sys.dont_write_bytecode = True
sys.path.insert(0, SCRIPTS)
import mutate  # noqa: E402

SOURCE = """int a = 1;
#if defined(__linux__)
#if LAMP_TORCH_FLOAT8
int b = 2;
#else
int c = 3;
#endif
#endif
int d = 4;
#if !LAMP_TORCH_FLOAT8
int e = 5;
#else
int f = 6;
#endif
"""


def check(root, find, extra=""):
    """Runs --check on one mutant of src.cpp; returns (exit code, stderr)."""
    with open(os.path.join(root, "list.ini"), "w", encoding="utf-8") as f:
        f.write(f"[m]\nfile = src.cpp\nfind = {find}\nreplace = int x = 0;\n{extra}")
    done = subprocess.run([sys.executable, MUTATE, "--root", root, "--list",
                           os.path.join(root, "list.ini"), "--check"],
                          capture_output=True, text=True)
    return done.returncode, done.stderr


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(self.tmp.name, "src.cpp"), "w", encoding="utf-8") as f:
            f.write(SOURCE)

    def tearDown(self):
        self.tmp.cleanup()

    def test_code_outside_a_switch_needs_no_version(self):
        self.assertEqual(check(self.tmp.name, "int a = 1;")[0], 0)
        self.assertEqual(check(self.tmp.name, "int d = 4;")[0], 0)

    def test_code_compiled_from_2_5_needs_min_torch(self):
        code, err = check(self.tmp.name, "int b = 2;")
        self.assertNotEqual(code, 0)
        self.assertIn("compiled only with LAMP_TORCH_FLOAT8", err)
        self.assertIn("add 'min_torch = 2.5'", err)
        self.assertNotEqual(check(self.tmp.name, "int b = 2;", "min_torch = 2.4\n")[0], 0)
        self.assertEqual(check(self.tmp.name, "int b = 2;", "min_torch = 2.5\n")[0], 0)

    def test_code_in_the_else_branch_needs_max_torch(self):
        code, err = check(self.tmp.name, "int c = 3;")
        self.assertNotEqual(code, 0)
        self.assertIn("compiled only without LAMP_TORCH_FLOAT8", err)
        self.assertNotEqual(check(self.tmp.name, "int c = 3;", "max_torch = 2.5\n")[0], 0)
        self.assertEqual(check(self.tmp.name, "int c = 3;", "max_torch = 1.13\n")[0], 0)

    def test_a_negated_switch_reads_the_other_way(self):
        self.assertIn("compiled only without", check(self.tmp.name, "int e = 5;")[1])
        self.assertEqual(check(self.tmp.name, "int e = 5;", "max_torch = 1.13\n")[0], 0)
        self.assertIn("add 'min_torch = 2.5'", check(self.tmp.name, "int f = 6;")[1])
        self.assertEqual(check(self.tmp.name, "int f = 6;", "min_torch = 2.5\n")[0], 0)

    def test_text_found_twice_or_never_is_refused(self):
        code, err = check(self.tmp.name, "int")
        self.assertNotEqual(code, 0)
        self.assertIn("occurs 6 times in src.cpp (must be exactly once)", err)
        self.assertIn("occurs 0 times", check(self.tmp.name, "int g = 7;")[1])


def mutant(tests, min_torch="", max_torch=""):
    return {"name": tests or "none", "tests": tests, "min_torch": min_torch,
            "max_torch": max_torch}


class HintTest(unittest.TestCase):
    NAMES = ["AddressSpace.ReadsTheSoftLimitAndWhatIsMapped",
             "faults.address_space", "Float8.TrainStepConvertsUpdatesSavesAndLoads"]

    def unmatched(self, mutants, torch_version="2.15.0"):
        return [m["name"] for m in mutate.unmatched_hints(mutants, self.NAMES, torch_version)]

    def test_a_regex_matching_no_test_is_named(self):
        self.assertEqual(self.unmatched([mutant("lamp_tests"), mutant("AddressSpace"),
                                         mutant("Nothing|faults.address")]),
                         ["lamp_tests"])

    def test_mutants_without_hints_or_for_another_libtorch_are_left_out(self):
        self.assertEqual(self.unmatched([mutant(""), mutant("Gone", max_torch="1.13"),
                                         mutant("Float9", min_torch="2.5")]),
                         ["Float9"])
        self.assertEqual(self.unmatched([mutant("Float9", min_torch="2.5")], "1.13.1"), [])
        self.assertEqual(self.unmatched([mutant("Gone", max_torch="1.13")], "1.13.1"),
                         ["Gone"])


class RunTest(unittest.TestCase):
    """What a run keeps between its parts, and how it judges a mutant."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_copied_file_is_newer_than_what_was_built_from_a_mutant(self):
        root, dest = (os.path.join(self.tmp.name, d) for d in ("root", "dest"))
        for d in (root, dest):
            os.makedirs(d)
        for name, text in (("changed.cpp", "int a = 1;"), ("same.cpp", "int b = 2;")):
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
            os.utime(os.path.join(root, name), (1000, 1000))
        # The scratch copy as a killed run leaves it: a mutant still planted.
        with open(os.path.join(dest, "changed.cpp"), "w", encoding="utf-8") as f:
            f.write("int a = 0;")
        with open(os.path.join(dest, "same.cpp"), "w", encoding="utf-8") as f:
            f.write("int b = 2;")
        os.utime(os.path.join(dest, "same.cpp"), (2000, 2000))
        mutate.sync_tree(root, ["changed.cpp", "same.cpp"], dest)
        with open(os.path.join(dest, "changed.cpp"), encoding="utf-8") as f:
            self.assertEqual(f.read(), "int a = 1;")
        self.assertGreater(os.path.getmtime(os.path.join(dest, "changed.cpp")),
                           time.time() - 60)
        self.assertEqual(os.path.getmtime(os.path.join(dest, "same.cpp")), 2000)

    def test_only_caught_verdicts_are_reused(self):
        path = os.path.join(self.tmp.name, "results.tsv")
        rows = [("k1", "1.13.1", "a", "caught", "20", "T.A|T.B"),
                ("k2", "1.13.1", "b", "SURVIVED", "900", ""),
                ("k3", "1.13.1", "c", "no-build", "30", "(does not compile)"),
                ("k4", "1.13.1", "d", "error", "7200", "(ctest exit 124)"),
                ("k5", "1.13.1", "e", "caught", "20", "T.E"),
                ("k5", "1.13.1", "e", "SURVIVED", "900", ""),
                ("k6", "1.13.1", "f", "SURVIVED", "900", ""),
                ("k6", "1.13.1", "f", "caught", "25", "T.F"),
                ("k7", "2.15.0", "g", "caught", "20", "T.G")]
        with open(path, "w", encoding="utf-8") as f:
            f.writelines("\t".join(r) + "\n" for r in rows)
        recorded = mutate.load_recorded(path, "1.13.1")
        self.assertEqual(sorted(recorded), ["k1", "k6"])
        self.assertEqual(recorded["k1"], ("caught", ["T.A", "T.B"], 20.0))
        self.assertEqual(recorded["k6"][1], ["T.F"])

    def test_a_ctest_failure_without_a_failed_test_is_no_verdict(self):
        m = {"tests": "Hint"}

        def runs(*answers):
            calls = []

            def run_tests(part, args):
                calls.append((part, args))
                return answers[len(calls) - 1]
            return calls, run_tests
        calls, run_tests = runs((8, ["Hint.A"]))
        self.assertEqual(mutate.judge(m, run_tests), ("caught", ["Hint.A"]))
        self.assertEqual(calls, [("hinted", ["-R", "Hint"])])
        calls, run_tests = runs((0, []), (8, ["Other.B"]))
        self.assertEqual(mutate.judge(m, run_tests), ("caught", ["Other.B"]))
        self.assertEqual([c[0] for c in calls], ["hinted", "all"])
        calls, run_tests = runs((0, []), (0, []))
        self.assertEqual(mutate.judge(m, run_tests), ("SURVIVED", []))
        calls, run_tests = runs((124, []))
        verdict, by = mutate.judge(m, run_tests)
        self.assertEqual(verdict, "error")
        self.assertIn("ctest exit 124", by[0])
        calls, run_tests = runs((0, []))
        self.assertEqual(mutate.judge({"tests": ""}, run_tests), ("SURVIVED", []))
        self.assertEqual(calls, [("all", [])])

    def test_a_run_with_only_keeps_the_record(self):
        self.assertTrue(mutate.starts_afresh(resume=False, only=""))
        self.assertFalse(mutate.starts_afresh(resume=False, only="fp8-"))
        self.assertFalse(mutate.starts_afresh(resume=True, only=""))

    def test_every_libtorch_switch_of_compat_h_is_known(self):
        compat = os.path.join(SCRIPTS, "..", "src", "platform", "compat.h")
        with open(compat, encoding="utf-8") as f:
            defined = set(re.findall(r"#define (LAMP_TORCH_[A-Z0-9_]+) 1", f.read()))
        self.assertTrue(defined)
        self.assertEqual(defined, set(mutate.GUARD_MIN_TORCH))
        with open(os.path.join(self.tmp.name, "src.cpp"), "w", encoding="utf-8") as f:
            f.write("#if LAMP_TORCH_SDP_CUDNN\nint a = 1;\n#endif\n")
        self.assertIn("add 'min_torch = 2.3'", check(self.tmp.name, "int a = 1;")[1])


def test_labels(build):
    """Each test's labels, read from the build's CTestTestfile.cmake files
    (not from ctest, which would write the build's LastTest.log while the
    suite that runs this test is writing it)."""
    labels = {}
    pattern = re.compile(r'^set_tests_properties\((?:\[=\[)?(.+?)(?:\]=\])? PROPERTIES (.*)\)$')
    for folder, _, names in os.walk(build):
        if "CTestTestfile.cmake" not in names:
            continue
        with open(os.path.join(folder, "CTestTestfile.cmake"), encoding="utf-8") as f:
            for line in f:
                m = pattern.match(line.strip())
                if m:
                    found = re.search(r'LABELS "([^"]*)"', m.group(2))
                    labels[m.group(1)] = set(found.group(1).split(";")) if found else set()
    return labels


class LeftOutTest(unittest.TestCase):
    @unittest.skipUnless(os.environ.get("LAMP_TEST_BUILD_DIR"),
                         "no build folder given (LAMP_TEST_BUILD_DIR)")
    def test_tests_that_fail_on_any_mutant_are_left_out_of_runs(self):
        # Each fails on a planted mutant without testing behaviour: a run that
        # kept it would count a surviving bug as caught.
        labels = test_labels(os.environ["LAMP_TEST_BUILD_DIR"])
        self.assertIn("mutants.list_applies", labels)
        for name in ("mutants.list_applies", "format.clang_format"):
            if name in labels:  # format.clang_format needs clang-format
                self.assertTrue(labels[name] & set(mutate.LEFT_OUT_LABELS),
                                f"{name} carries none of {mutate.LEFT_OUT_LABELS}")

    def test_labels_are_read_from_either_cmake_layout(self):
        with tempfile.TemporaryDirectory() as build:
            os.makedirs(os.path.join(build, "tests"))
            with open(os.path.join(build, "tests", "CTestTestfile.cmake"), "w",
                      encoding="utf-8") as f:
                f.write('set_tests_properties(a.b PROPERTIES  LABELS "x;y" TIMEOUT "60")\n'
                        'set_tests_properties([=[c.d]=] PROPERTIES  LABELS "z" '
                        '_BACKTRACE_TRIPLES "t;1;add_test")\n'
                        'set_tests_properties(e.f PROPERTIES  TIMEOUT "60")\n')
            self.assertEqual(test_labels(build),
                             {"a.b": {"x", "y"}, "c.d": {"z"}, "e.f": set()})


if __name__ == "__main__":
    unittest.main()
