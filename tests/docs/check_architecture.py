#!/usr/bin/env python3
"""Checks that docs/architecture.md names every source file of the library and names no file
that is gone, so that the map of where each behaviour lives cannot fall behind the code.

    check_architecture.py SOURCE_DIR

The source files: `rust/*/src/**/*.rs` (unit-test modules, `tests.rs` and `*_tests.rs`, aside),
`rust/*/build.rs`, `include/safetensors.h`, `include/safetensors/**/*.hpp` and `cpp/*.hpp`,
`cpp/*.cpp`. A file is named when the page holds its name (`fill.rs`) or its path below its
part (`upload/fill.rs`). A name the page holds, ending in `.rs`, `.hpp`, `.h` or `.cpp`, must be
the name of a file of the project (generated headers excepted: `cxx.h` and the bridges' `*.rs.h`).
Prints each problem as `docs/architecture.md: ...`; exit code 0 when there is none, 1 otherwise.
"""
import os
import re
import sys

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.(?:rs|hpp|h|cpp)\b")
# Not in the tree: made by the build (cxx's runtime header, the bridges' generated headers).
GENERATED = {"cxx.h", "rs.h"}  # "rs.h": of `<area>.rs.h`, the bridges' headers
SKIP_DIRS = {".git", "build", "target", "node_modules", ".venv", "__pycache__"}


def source_files(root):
    """(path relative to root, path below its part) of every file the page must name."""
    out = []
    rust = os.path.join(root, "rust")
    for crate in sorted(os.listdir(rust)):
        src = os.path.join(rust, crate, "src")
        build = os.path.join(rust, crate, "build.rs")
        if os.path.isfile(build):
            out.append((os.path.relpath(build, root), "build.rs"))
        for d, dirs, files in os.walk(src):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            for f in sorted(files):
                if not f.endswith(".rs") or f == "tests.rs" or f.endswith("_tests.rs"):
                    continue
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root), os.path.relpath(p, src)))
    inc = os.path.join(root, "include", "safetensors")
    out.append(("include/safetensors.h", "safetensors.h"))
    for d, dirs, files in os.walk(inc):
        dirs[:] = sorted(dirs)
        for f in sorted(files):
            if f.endswith(".hpp"):
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root), os.path.relpath(p, inc)))
    cpp = os.path.join(root, "cpp")
    for f in sorted(os.listdir(cpp)):
        if f.endswith((".hpp", ".cpp")):
            out.append((f"cpp/{f}", f))
    return out


def project_names(root):
    """The file names of the project (any folder but build trees)."""
    names = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        names.update(files)
    return names


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = argv[1]
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        page = f.read()
    held = set(NAME.findall(page))
    held_names = {os.path.basename(h) for h in held}
    problems = []
    for path, below in source_files(root):
        if os.path.basename(below) not in held_names and below not in held:
            problems.append(f"names nowhere {path}")
    names = project_names(root)
    for h in sorted(held):
        base = os.path.basename(h)
        if base in GENERATED or base.endswith(".rs.h") or base in names:
            continue
        problems.append(f"names {h}, which is no file of the project")
    for p in problems:
        print(f"docs/architecture.md: {p}")
    if not problems:
        print(f"docs/architecture.md names all {len(source_files(root))} source files, and no file that is gone")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
