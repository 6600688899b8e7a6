#!/usr/bin/env python3
"""Checks that every relative link of the given Markdown pages leads somewhere, so that moving or
renaming a page or a heading cannot leave a dead link behind.

    check_links.py PAGE.md...

A link is `[text](target)` or `![alt](target)` outside code (fenced blocks and `inline code`).
Links with a scheme (`https:`, `mailto:`) are left alone. A relative target must name an existing
file or directory, relative to the page; a `#fragment` must name a heading of the page it points
to (a Markdown file: the page itself when the target is only `#fragment`), spelt as GitHub makes
heading anchors: lower case, punctuation dropped, spaces as `-`, and `-1`, `-2`, ... for repeated
headings. Prints each dead link as `PAGE:LINE: target: why`; exit code 0 when there is none, 1
otherwise.
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks, with inline code blanked."""
    inside = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                inside = not inside
                continue
            if not inside:
                yield n, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line.rstrip("\n"))


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a Markdown file."""
    seen, out = {}, set()
    inside = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                inside = not inside
                continue
            m = None if inside else HEADING.match(line)
            if m:
                base = slug(m.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                out.add(base if count == 0 else f"{base}-{count}")
    return out


def dead_links(page):
    """(line, target, why) for every link of `page` that leads nowhere."""
    out = []
    here = os.path.dirname(os.path.abspath(page))
    for n, line in prose_lines(page):
        for m in LINK.finditer(line):
            target = m.group(1)
            if not target or SCHEME.match(target):
                continue
            path, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(here, path)) if path else os.path.abspath(page)
            if not os.path.exists(dest):
                out.append((n, target, "no such file"))
            elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                out.append((n, target, f"no heading with the anchor #{fragment} in {os.path.basename(dest)}"))
    return out


def main(pages):
    if not pages:
        print(__doc__.strip().splitlines()[0])
        return 2
    dead = 0
    for page in pages:
        for n, target, why in dead_links(page):
            print(f"{page}:{n}: {target}: {why}")
            dead += 1
    print(f"{len(pages)} pages checked, {dead} dead links")
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
