#!/usr/bin/env python3
"""Rewrites one of lamp's CUDA sources for the host compiler and the CUDA
emulator (tests/emulated_cuda/prelude.h, which the result is compiled with).

Three rewrites, each of a construct no C++ compiler other than nvcc parses
or that means something else outside a GPU:

  kernel<<<grid, block, bytes, stream>>>(args)
      -> kernel ^ ::lamp_emu::Config(grid, block, bytes, stream)(args)
  extern __shared__ T name[];
      -> T* name = ::lamp_emu::dynamic_shared<T>();
  __shared__ T name[N]...;
      -> static T name[N]...; ::lamp_emu::shared_variable(&name, sizeof(name));

Everything else (the kernels' arithmetic, indexing and control flow) is
left as it is, and so is every // comment; a #line directive keeps the
compiler's messages on the original file's lines. What these rewrites do not
know (a launch split over lines, two names in one __shared__ declaration) is
refused with its line, never mistranslated.

Usage: translate.py SOURCE.cu OUTPUT.cpp
"""
import pathlib
import re
import sys

LAUNCH_OPEN = re.compile(r"<<<")
LAUNCH_CLOSE = re.compile(r">>>")
DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?P<type>[^;\[\]=,]+?)\s+(?P<name>\w+)\s*\[\s*\]\s*;")
STATIC_SHARED = re.compile(
    r"__shared__\s+(?P<type>[^;()=,\[\]]+?)\s+(?P<name>\w+)\s*"
    r"(?P<dims>(?:\[[^\];]*\]\s*)*);")


def rewrite_code(code: str) -> str:
    """One line's code (its // comment split off): the three rewrites."""
    code = LAUNCH_OPEN.sub(" ^ ::lamp_emu::Config(", code)
    code = LAUNCH_CLOSE.sub(")", code)
    code = DYNAMIC_SHARED.sub(
        lambda m: f"{m['type']}* {m['name']} = "
        f"::lamp_emu::dynamic_shared<{m['type']}>();", code)
    return STATIC_SHARED.sub(
        lambda m: f"static {m['type']} {m['name']}{m['dims'].rstrip()}; "
        f"::lamp_emu::shared_variable(&{m['name']}, sizeof({m['name']}));",
        code)


def translate(text: str) -> str:
    """Rewrites line by line, code only: a // comment is left as it is. A
    construct the rewrites do not know (a launch split over lines, a
    __shared__ declaration of several names or over several lines, a /* */
    comment around either) is refused, never mistranslated."""
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        code, sep, comment = line.partition("//")
        if "/*" in code:
            if "<<<" in code or "__shared__" in code:
                raise ValueError(f"line {number}: a /* */ comment beside a "
                                 "launch or __shared__ this script does not "
                                 "read")
        if code.count("<<<") != code.count(">>>"):
            raise ValueError(f"line {number}: a <<< without its >>> on the "
                             "same line (or the other way round)")
        code = rewrite_code(code)
        if "__shared__" in code:
            raise ValueError(f"line {number}: a __shared__ declaration this "
                             "script does not know how to rewrite (one name "
                             "a declaration, on one line)")
        out.append(code + sep + comment)
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    source = pathlib.Path(sys.argv[1])
    try:
        body = translate(source.read_text())
    except ValueError as error:
        print(f"translate.py: {source}: {error}", file=sys.stderr)
        return 1
    out = pathlib.Path(sys.argv[2])
    out.parent.mkdir(parents=True, exist_ok=True)
    text = f'#line 1 "{source.resolve()}"\n{body}'
    # Unchanged output keeps its time stamp: nothing recompiles.
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
