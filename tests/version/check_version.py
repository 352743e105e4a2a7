#!/usr/bin/env python3
"""lamp's version is told in one story.

usage: check_version.py SOURCE_DIR CMAKE_PROJECT_VERSION [PROGRAM...]

Fails, naming each disagreement, unless these all give the same version:
include/lamp/version.h, CMake's project version, CHANGELOG.md's newest
released heading ("## X.Y.Z (YYYY-MM-DD)") and each PROGRAM's --version. Also
fails when CHANGELOG.md calls a version up to this one unreleased, and when
README.md or docs/*.md name another version where they name the current one
(`find_package(lamp X.Y ...)` in a code block, `liblamp-dev_X.Y.Z_...deb`,
a program's `--version` line).
"""
import pathlib
import re
import subprocess
import sys

RELEASED = re.compile(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)\s*$")
ANY_VERSION_HEADING = re.compile(r"^## (\d+\.\d+\.\d+)\b(.*)$")


def as_tuple(version):
    return tuple(int(part) for part in version.split("."))


def header_version(source):
    text = (source / "include/lamp/version.h").read_text()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"^#define LAMP_VERSION_{name} (\d+)$", text, re.M)
        if not match:
            sys.exit(f"check_version: no LAMP_VERSION_{name} in version.h")
        parts.append(match.group(1))
    return ".".join(parts)


def changelog_problems(source, version):
    """The newest released heading, and what is wrong with the headings."""
    problems = []
    newest = None
    for number, line in enumerate((source / "CHANGELOG.md").read_text().splitlines(), 1):
        heading = ANY_VERSION_HEADING.match(line)
        if not heading:
            continue
        released = RELEASED.match(line)
        if released and newest is None:
            newest = released.group(1)
        if not released and as_tuple(heading.group(1)) <= as_tuple(version):
            problems.append(
                f"CHANGELOG.md:{number}: '{line}': version {heading.group(1)} is "
                f"not after version.h's {version}, so it must be a released "
                "heading '## X.Y.Z (YYYY-MM-DD)'")
    if newest is None:
        problems.append("CHANGELOG.md has no released heading '## X.Y.Z (YYYY-MM-DD)'")
    elif newest != version:
        problems.append(f"CHANGELOG.md's newest released heading is {newest}, "
                        f"version.h says {version}")
    return problems


def docs_problems(source, version):
    major_minor = ".".join(version.split(".")[:2])
    patterns = [
        (re.compile(r"^find_package\(lamp (\d+\.\d+)\b"), major_minor,
         "find_package(lamp ...)"),
        (re.compile(r"liblamp-dev_(\d+\.\d+\.\d+)_"), version, "the package's file name"),
        (re.compile(r"^\w+ lamp (\d+\.\d+\.\d+), LibTorch"), version, "a --version line"),
    ]
    problems = []
    for page in [source / "README.md", *sorted((source / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for pattern, expected, what in patterns:
                for found in pattern.findall(line):
                    if found != expected:
                        problems.append(f"{page.relative_to(source)}:{number}: {what} "
                                        f"says {found}, lamp is {version}")
    return problems


def program_problems(programs, version):
    problems = []
    for program in programs:
        result = subprocess.run([program, "--version"], capture_output=True, text=True,
                                timeout=60)
        name = pathlib.Path(program).name
        if result.returncode != 0:
            problems.append(f"{name} --version: exit {result.returncode}: {result.stderr}")
            continue
        match = re.search(r"\blamp (\d+\.\d+\.\d+)\b", result.stdout)
        if not match:
            problems.append(f"{name} --version names no lamp version: {result.stdout!r}")
        elif match.group(1) != version:
            problems.append(f"{name} --version says lamp {match.group(1)}, "
                            f"version.h says {version}")
    return problems


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source = pathlib.Path(sys.argv[1])
    cmake_version = sys.argv[2]
    version = header_version(source)
    problems = []
    if cmake_version != version:
        problems.append(f"CMake's project version is {cmake_version}, "
                        f"version.h says {version}")
    problems += changelog_problems(source, version)
    problems += docs_problems(source, version)
    problems += program_problems(sys.argv[3:], version)
    for problem in problems:
        print(f"check_version: {problem}")
    if problems:
        return 1
    print(f"check_version: lamp {version} in version.h, CMake, CHANGELOG.md, the docs "
          f"and {len(sys.argv) - 3} programs' --version")
    return 0


if __name__ == "__main__":
    sys.exit(main())
