#!/usr/bin/env python3
"""Checks the relative links of lamp's Markdown files.

  check_links.py FILE.md...

Every link that is not to a web address ([text](path), [text](path#anchor),
[text](#anchor), and reference definitions "[name]: path") must name a file
or folder that exists, relative to the file that links; an #anchor must be a
heading of the Markdown file it points into, spelled as GitHub spells it
(lower case, punctuation dropped, spaces as '-', repeats numbered -1, -2).
Code blocks and `code spans` are not read. Exits 1 naming each broken link.

Python 3 standard library only.
"""

import os
import re
import sys

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose_lines(path):
    """(line number, text) of the lines outside code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fence = None
    for number, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = None
            continue
        yield number, line


def slug(heading):
    text = re.sub(r"<[^>]+>", "", heading)          # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        found, seen = set(), {}
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        for m in re.finditer(r'<a\s+(?:id|name)="([^"]+)"',
                             open(path, encoding="utf-8").read()):
            found.add(m.group(1))
        _anchors[path] = found
    return _anchors[path]


def links(path):
    for number, line in prose_lines(path):
        text = CODE_SPAN.sub("", line)
        for m in INLINE_LINK.finditer(text):
            yield number, m.group(1)
        m = REFERENCE.match(text)
        if m:
            yield number, m.group(1)


def check(path):
    problems = []
    count = 0
    for number, target in links(path):
        if not target or EXTERNAL.match(target):
            continue
        count += 1
        where = f"{path}:{number}: link '{target}'"
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if not os.path.exists(dest):
            problems.append(f"{where}: {dest} does not exist")
            continue
        if anchor:
            if not dest.endswith(".md") or os.path.isdir(dest):
                problems.append(f"{where}: an anchor into a file that is not "
                                "Markdown")
            elif anchor not in anchors(dest):
                near = sorted(a for a in anchors(dest)
                              if a.split("-")[0] == anchor.split("-")[0])
                problems.append(f"{where}: {dest} has no heading "
                                f"#{anchor}" + (f" (similar: {', '.join(near)})"
                                                if near else ""))
    return count, problems


def main(argv):
    files = argv[1:]
    if not files:
        print(__doc__)
        return 2
    total, problems = 0, []
    for path in files:
        count, found = check(path)
        total += count
        problems += found
    for problem in problems:
        print("FAILED: " + problem)
    if problems:
        return 1
    print(f"{total} relative links in {len(files)} files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
