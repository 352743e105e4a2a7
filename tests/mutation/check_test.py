#!/usr/bin/env python3
"""scripts/mutate.py --check: a mutant must apply (its text found once in its
file), and one planted inside a LibTorch-version switch must name the
LibTorch that compiles its code (min_torch, or max_torch in the switch's
#else branch), or it would survive where its code is not compiled.
Standard library only."""

import os
import subprocess
import sys
import tempfile
import unittest

MUTATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "scripts", "mutate.py")

SOURCE = """int a = 1;
#if defined(__linux__)
#if LAMP_TORCH_FLOAT8
int b = 2;
#else
int c = 3;
#endif
#endif
int d = 4;
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

    def test_text_found_twice_or_never_is_refused(self):
        code, err = check(self.tmp.name, "int")
        self.assertNotEqual(code, 0)
        self.assertIn("occurs 4 times in src.cpp (must be exactly once)", err)
        self.assertIn("occurs 0 times", check(self.tmp.name, "int e = 5;")[1])


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    unittest.main()
