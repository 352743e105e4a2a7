#!/usr/bin/env python3
"""Extracts the complete programs from lamp's Markdown documentation.

A complete program is a ```cpp code block that defines `int main`. Each one is
written to OUT/<name>.cpp, where <name> is docs_<page>_<n> (the page's file
name without .md, lower case, '-' as '_'; n counts that page's programs from
1). A `#line` directive makes the compiler's messages name the Markdown file
and line. An HTML comment on the line before the fence,

    <!-- compile-only: why it cannot run in a test -->

marks a program that is built but not run (it needs a dataset or a GPU).

  extract_examples.py --root DIR --out OUT FILE.md...
      writes the programs (a file is rewritten only when its text changed, and
      files of programs that are gone are removed) and OUT/examples.cmake,
      which lists them for tests/docs/CMakeLists.txt; exits 1 when a block
      could not be extracted (the other programs are still written)
  extract_examples.py --root DIR --check OUT FILE.md...
      extracts again in memory and checks that there is at least one program,
      that every block could be extracted and that OUT holds exactly these
      programs (the build is not stale); exits 1 naming what differs

Python 3 standard library only.
"""

import argparse
import os
import re
import sys

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
CPP = {"cpp", "c++", "cxx", "cc"}
MAIN = re.compile(r"\bint\s+main\s*\(")
COMPILE_ONLY = re.compile(r"^\s*<!--\s*compile-only:\s*(?P<why>.*?)\s*-->\s*$")


class Program:
    def __init__(self, name, path, line, code, run, why):
        self.name = name
        self.path = path  # the Markdown file, absolute
        self.line = line  # 1-based line of the opening fence
        self.code = code
        self.run = run
        self.why = why

    def origin(self, root):
        return f"{os.path.relpath(self.path, root)}:{self.line}"

    def source(self, root):
        rel = os.path.relpath(self.path, root)
        return (f"// Extracted from {rel}, line {self.line}; edit it there.\n"
                f'#line {self.line + 1} "{self.path}"\n' + self.code)


def page_name(path):
    stem = os.path.splitext(os.path.basename(path))[0].lower()
    return re.sub(r"[^a-z0-9]+", "_", stem).strip("_")


def extract(path):
    """The complete programs of one Markdown file, and its errors."""
    programs, errors = [], []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"{path}: cannot be read: {e}"]
    page = page_name(path)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        info = m.group("info").lower()
        start = i
        body = []
        i += 1
        closed = False
        while i < len(lines):
            close = re.match(r"^ {0,3}(`{3,}|~{3,})\s*$", lines[i])
            if close and close.group(1)[0] == fence[0] and \
                    len(close.group(1)) >= len(fence):
                closed = True
                break
            text = lines[i]
            # Strip the opening fence's indentation, as CommonMark does.
            body.append(text[min(indent, len(text) - len(text.lstrip(" "))):])
            i += 1
        i += 1
        code = "\n".join(body) + "\n"
        is_program = info in CPP and MAIN.search(code)
        if not closed:
            if info in CPP:
                errors.append(f"{path}:{start + 1}: the ```{info} block is "
                              "never closed")
            continue
        if not is_program:
            continue
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = COMPILE_ONLY.match(lines[previous]) if previous >= 0 else None
        if previous >= 0 and "compile-only" in lines[previous] and not marker:
            errors.append(f"{path}:{previous + 1}: malformed marker "
                          f"{lines[previous].strip()!r}; write "
                          "<!-- compile-only: REASON -->")
            continue
        if marker and not marker.group("why"):
            errors.append(f"{path}:{previous + 1}: a compile-only marker "
                          "must say why the program cannot run")
            continue
        if len(MAIN.findall(code)) > 1:
            errors.append(f"{path}:{start + 1}: the block defines main twice")
            continue
        name = f"docs_{page}_{len(programs) + 1}"
        programs.append(Program(name, os.path.abspath(path), start + 1, code,
                                run=marker is None,
                                why=marker.group("why") if marker else ""))
    return programs, errors


def extract_all(files):
    programs, errors = [], []
    for path in files:
        found, errs = extract(path)
        programs += found
        errors += errs
    names = [p.name for p in programs]
    for name in sorted(set(n for n in names if names.count(n) > 1)):
        errors.append(f"two pages give the program name {name}: rename one")
    return programs, errors


def cmake_quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') \
        .replace("$", "\\$").replace(";", "\\;") + '"'


def write_if_changed(path, text):
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write(root, out, programs, errors):
    os.makedirs(out, exist_ok=True)
    keep = set()
    for p in programs:
        write_if_changed(os.path.join(out, p.name + ".cpp"), p.source(root))
        keep.add(p.name + ".cpp")
    for name in os.listdir(out):
        if name.endswith(".cpp") and name not in keep:
            os.remove(os.path.join(out, name))
    manifest = ["# Written by tests/docs/extract_examples.py; do not edit.",
                "set(LAMP_DOC_EXAMPLES " +
                " ".join(p.name for p in programs) + ")"]
    for p in programs:
        manifest += [
            f"set(LAMP_DOC_EXAMPLE_{p.name}_SOURCE "
            f"{cmake_quote(os.path.join(out, p.name + '.cpp'))})",
            f"set(LAMP_DOC_EXAMPLE_{p.name}_ORIGIN {cmake_quote(p.origin(root))})",
            f"set(LAMP_DOC_EXAMPLE_{p.name}_RUN {'ON' if p.run else 'OFF'})",
        ]
    manifest.append("set(LAMP_DOC_EXAMPLE_ERRORS " +
                    " ".join(cmake_quote(e) for e in errors) + ")")
    write_if_changed(os.path.join(out, "examples.cmake"),
                     "\n".join(manifest) + "\n")


def check(root, out, programs, errors):
    problems = list(errors)
    if not programs:
        problems.append("no complete program (a ```cpp block with int main) "
                        "was found")
    for p in programs:
        path = os.path.join(out, p.name + ".cpp")
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read() == p.source(root)
        except OSError:
            current = False
        if not current:
            problems.append(f"{p.origin(root)}: {path} is missing or stale; "
                            "configure the build again")
    wanted = {p.name + ".cpp" for p in programs}
    if os.path.isdir(out):
        for name in sorted(os.listdir(out)):
            if name.endswith(".cpp") and name not in wanted:
                problems.append(f"{os.path.join(out, name)} is no longer in "
                                "the documentation; configure the build again")
    return problems


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True,
                        help="the repository root (names in messages)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", help="folder to write the programs into")
    what.add_argument("--check", metavar="OUT",
                      help="folder whose programs to check")
    parser.add_argument("files", nargs="+", metavar="FILE.md")
    args = parser.parse_args(argv[1:])
    root = os.path.abspath(args.root)
    programs, errors = extract_all(args.files)
    for p in programs:
        how = "built and run" if p.run else f"built only ({p.why})"
        print(f"{p.name}: {p.origin(root)}, {how}")
    if args.out:
        write(root, os.path.abspath(args.out), programs, errors)
        for e in errors:
            print("error: " + e, file=sys.stderr)
        print(f"{len(programs)} complete programs in {len(args.files)} files")
        return 1 if errors else 0
    problems = check(root, os.path.abspath(args.check), programs, errors)
    for problem in problems:
        print("FAILED: " + problem)
    if problems:
        return 1
    print(f"{len(programs)} complete programs in {len(args.files)} files, "
          f"{sum(p.run for p in programs)} of them run; all extracted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
