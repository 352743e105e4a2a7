#!/usr/bin/env python3
"""Checks that lamp's folders only include the layers below them.

lamp's sources live in folders that are layers (README, "Layout"): each may
include its own folder and the ones listed for it below, never one above.
Reads every #include "..." of include/lamp/<folder>/ and src/<folder>/, prints
the arrows between folders, and exits 1 naming each include that points
where its folder may not.

Usage: scripts/check_layers.py [--root DIR] [--list]
"""
import argparse
import pathlib
import re
import sys

# The folders each folder may include, besides itself.
# ops/ (fused kernels) stands beside optim/ and data/ on platform/ alone, so
# that amp/ and everything above it may call a kernel, and a kernel never
# depends on training policy.
ALLOWED = {
    "platform": set(),
    "nn": {"platform"},
    "ops": {"platform"},
    "optim": {"platform", "nn"},
    "amp": {"platform", "nn", "ops", "optim"},
    "distributed": {"platform", "optim", "amp"},
    "data": {"platform"},
    "models": {"platform", "nn", "ops", "amp"},
    "training": {"platform", "nn", "ops", "amp", "optim", "distributed",
                 "data", "models"},
}
# Top-level headers of include/lamp/ (the umbrella lamp.h, distributed.h and
# version.h) belong to the layers they include: including one is an arrow to
# each of those.

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folders_of_include(name, top_level):
    """The layers an #include "..." names (none for a file of no layer)."""
    parts = name.split("/")
    if parts[0] == "lamp":
        parts = parts[1:]
    if len(parts) >= 2 and parts[0] in ALLOWED:
        return {parts[0]}
    if len(parts) == 1 and name.startswith("lamp/"):
        return top_level.get(parts[0], set())
    return set()


def top_level_layers(root):
    """Each include/lamp/*.h with the layers it includes."""
    layers = {}
    for path in sorted((root / "include" / "lamp").glob("*.h")):
        found = set()
        for name in INCLUDE.findall(path.read_text()):
            found |= folders_of_include(name, {})
        layers[path.name] = found
    return layers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent,
                        type=pathlib.Path)
    parser.add_argument("--list", action="store_true", help="print every arrow")
    args = parser.parse_args()
    arrows = {}
    bad = []
    files = 0
    top_level = top_level_layers(args.root)
    for base in (args.root / "include" / "lamp", args.root / "src"):
        for path in sorted(base.rglob("*")):
            if path.suffix not in (".h", ".cpp") or not path.is_file():
                continue
            rel = path.relative_to(base).parts
            if len(rel) < 2:
                continue  # include/lamp/*.h: the umbrellas and version.h
            layer = rel[0]
            if layer not in ALLOWED:
                bad.append(f"{path.relative_to(args.root)}: folder '{layer}' "
                           f"is not a layer; add it to ALLOWED in {__file__}")
                continue
            files += 1
            for name in INCLUDE.findall(path.read_text()):
                for target in sorted(folders_of_include(name, top_level)):
                    if target == layer:
                        continue
                    arrows.setdefault((layer, target), []).append(
                        f"{path.relative_to(args.root)} -> {name}")
                    if target not in ALLOWED[layer]:
                        bad.append(
                            f"{path.relative_to(args.root)} includes \"{name}\": "
                            f"{layer}/ may include only "
                            f"{', '.join(sorted(ALLOWED[layer])) or 'itself'}")
    if files == 0:
        print(f"check_layers: no sources under {args.root}", file=sys.stderr)
        return 1
    for (a, b), where in sorted(arrows.items()):
        print(f"{a} -> {b}: {len(where)}")
        if args.list:
            for w in where:
                print(f"    {w}")
    if bad:
        print(f"check_layers: {len(bad)} include(s) point up a layer:",
              file=sys.stderr)
        for b in bad:
            print(f"  {b}", file=sys.stderr)
        return 1
    print(f"check_layers: {files} files, every include within its layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
