#!/usr/bin/env python3
"""Compiles the C++ examples of the README, of the documentation pages and of the public headers,
and the C examples of the documentation pages, so they cannot drift.

    compile_examples.py --cxx C++ --out DIR [--cc CC] [--mpi-flags FLAGS] [--dlpack-flags FLAGS]
                        [--eigen-flags FLAGS] [--torch-flags FLAGS]
                        README.md HEADER... [docs/PAGE.md...] -- COMPILER FLAGS...

Examples are the ```cpp blocks of Markdown files (the README, docs/*.md), and in headers every
run of comment lines that start with `///` or `//` followed by three spaces (the doc-comment
examples). Each becomes a function whose parameters are the objects examples take as given
(tests/docs/example_context.hpp), with the example's code in a nested block, preceded by `#line`
so that the compiler's messages point into the page or the header. Within an example:
  - `#include` lines move to the top of the translation unit (a header's own examples include
    that header);
  - `...` outside comments and strings stands for the reader's own code: `= ...` becomes `= {}`,
    any other `...` is left out;
  - an example that names something the context does not give gets a preamble of declarations
    in PREAMBLES below, keyed by its file's name (`writing.md`, `gpu.md`) and a piece of its
    text (a key that matches no example is an error, so stale entries are noticed).
Examples that include mpi.hpp, Eigen (<Eigen/...>), libtorch (<torch/...>, <ATen/...>) or
dlpack.hpp are compiled in translation units of their own, with --mpi-flags, --eigen-flags,
--torch-flags or --dlpack-flags (the include directories of mpi.h, Eigen, libtorch, dlpack.h;
an example that includes libtorch's and dlpack.hpp belongs to libtorch's, which brings a
dlpack.h); without those flags they are reported as skipped. The ```c blocks of Markdown files (docs/c.md) are complete
translation units, each compiled on its own by --cc as C99 with warnings as errors (-std=c99
-pedantic-errors -Wall -Wextra -Werror); without --cc they are reported as skipped. Everything
is compiled with -fsyntax-only: nothing is linked or run. Exit code 0 when every example
compiles, 1 otherwise.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

CONTEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "example_context.hpp")

# (file name, a piece of the example's text) -> declarations the example takes as given.
PREAMBLES = {
    ("writing.md", "{rows, cols}"): "std::size_t rows = 2, cols = 3;",
    ("gpu.md", "repack("): "void repack(void*, std::size_t, void*);\n"
    "void quantize(void*, std::string_view, void*);",
    ("streaming_writer.hpp", "first_half"): "std::span<const std::byte> first_half, second_half;",
    ("streaming_writer.hpp", "make_streaming_writer("): "std::vector<TensorSpec> specs;",
    ("streaming_writer.hpp", "std::span(bytes)"): "std::vector<std::uint8_t> bytes(4);",
    ("streaming_writer.hpp", "bytes_of("): "std::vector<TensorSpec> specs;\n"
    "std::span<const std::byte> bytes_of(const std::string&);",
    ("streaming_writer.hpp", "save_sharded(\"ckpt\""): "std::map<std::string, TensorView> tensors;",
    ("cuda.hpp", "nothrow::cuda::save("): "std::vector<cuda::DeviceTensorView> tensors;",
    ("cuda.hpp", "w_device_ptr"): "const void* w_device_ptr = nullptr;",
    ("cuda.hpp", "dev_ptr}}"): "std::size_t n = 1;\nconst void* dev_ptr = nullptr;",
}

HEADER_EXAMPLE = re.compile(r"^\s*///? {3}(.*)$")


class Example:
    def __init__(self, path, line, lines):
        self.path, self.line, self.lines = path, line, lines
        self.name = os.path.basename(path)
        self.includes = [l.strip() for l in lines if l.strip().startswith("#include")]

    @property
    def text(self):
        return "\n".join(self.lines)

    def group(self):
        own = " ".join(self.includes)
        if "mpi.hpp" in own:
            return "mpi"
        if "<Eigen/" in own:
            return "eigen"
        if "<torch/" in own or "<ATen/" in own:
            return "torch"
        return "dlpack" if "dlpack.hpp" in own else "core"


def readme_examples(path, fence="```cpp"):
    out, block, start = [], None, 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if block is None and line.strip() == fence:
                block, start = [], n + 1
            elif block is not None and line.strip() == "```":
                out.append(Example(path, start, block))
                block = None
            elif block is not None:
                block.append(line)
    return out


def header_examples(path):
    out, block, start = [], None, 0
    include = "#include <" + path[path.index("safetensors/"):] + ">" if "safetensors/" in path else None
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines + [""], 1):
        m = HEADER_EXAMPLE.match(line)
        if m:
            if block is None:
                block, start = [], n
            block.append(m.group(1))
        elif block is not None:
            example = Example(path, start, block)
            if include and include not in example.includes:
                example.includes.append(include)
            out.append(example)
            block = None
    return out


def code_and_comment(line):
    """Splits a line at its `//` comment, ignoring `//` inside string and character literals."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == "\\":
                continue
            if c == quote and line[i - 1] != "\\":
                quote = None
        elif c in "\"'":
            quote = c
        elif line.startswith("//", i):
            return line[:i], line[i:]
    return line, ""


def body_line(line):
    if line.strip().startswith("#include"):
        return ""  # moved to the top; the blank keeps the line numbers
    code, comment = code_and_comment(line)
    code = re.sub(r"=\s*\.\.\.", "= {}", code).replace("...", "")
    return code + comment


def translation_unit(examples, used):
    includes, functions = [], []
    for i, ex in enumerate(examples):
        for inc in ex.includes:
            if inc not in includes:
                includes.append(inc)
        preamble = []
        for (name, key), decls in PREAMBLES.items():
            if name == ex.name and key in ex.text:
                preamble.append(decls)
                used.add((name, key))
        functions.append(
            f"void example_{i}(SAFETENSORS_EXAMPLE_GIVEN) {{\n  {{\n" + "".join(p + "\n" for p in preamble) +
            f'#line {ex.line} "{ex.path}"\n' + "\n".join(body_line(l) for l in ex.lines) + "\n  }\n}\n")
    # The examples' own includes first: the context's `using namespace safetensors` would make
    # names such as `Backend` ambiguous inside other libraries' headers (libtorch's c10::Backend).
    head = "\n".join(includes) + f'\n#include "{CONTEXT}"\n\n'
    return head + "\n".join(functions)


def main(argv):
    if "--" in argv:
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    else:
        flags = []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cxx", required=True)
    p.add_argument("--cc")
    p.add_argument("--out", required=True)
    p.add_argument("--mpi-flags")
    p.add_argument("--dlpack-flags")
    p.add_argument("--eigen-flags")
    p.add_argument("--torch-flags")
    p.add_argument("sources", nargs="+")
    a = p.parse_args(argv)
    examples = []
    for src in a.sources:
        examples += readme_examples(src) if src.endswith(".md") else header_examples(src)
    groups = {"core": [], "mpi": [], "dlpack": [], "eigen": [], "torch": []}
    for ex in examples:
        groups[ex.group()].append(ex)
    extra = {"core": "", "mpi": a.mpi_flags, "dlpack": a.dlpack_flags, "eigen": a.eigen_flags,
             "torch": a.torch_flags}
    os.makedirs(a.out, exist_ok=True)
    used, failed, compiled = set(), False, 0
    for group, members in groups.items():
        if not members:
            continue
        if extra[group] is None:
            print(f"skipped: {len(members)} examples need {group} headers ({', '.join(sorted({e.name for e in members}))})")
            continue
        unit = os.path.join(a.out, f"examples_{group}.cpp")
        with open(unit, "w", encoding="utf-8") as f:
            f.write(translation_unit(members, used))
        # -w: an example may ignore a [[nodiscard]] result to show a call; only errors count.
        cmd = [a.cxx, "-std=c++20", "-fsyntax-only", "-w", *flags, *shlex.split(extra[group]), unit]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            failed = True
            sys.stdout.write(r.stdout + r.stderr)
            print(f"FAILED: the {group} examples ({unit}); command: {shlex.join(cmd)}")
        else:
            compiled += len(members)
    c_examples = [ex for src in a.sources if src.endswith(".md") for ex in readme_examples(src, "```c")]
    if c_examples and not a.cc:
        print(f"skipped: {len(c_examples)} C examples (no --cc)")
    for i, ex in enumerate(c_examples if a.cc else []):
        unit = os.path.join(a.out, f"example_c_{i}.c")
        with open(unit, "w", encoding="utf-8") as f:
            f.write(f'#line {ex.line} "{ex.path}"\n' + "\n".join(ex.lines) + "\n")
        cmd = [a.cc, "-std=c99", "-pedantic-errors", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *flags, unit]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            failed = True
            sys.stdout.write(r.stdout + r.stderr)
            print(f"FAILED: the C example at {ex.path}:{ex.line}; command: {shlex.join(cmd)}")
        else:
            compiled += 1
    examples += c_examples
    for key in PREAMBLES:
        if key not in used and any(ex.name == key[0] for ex in examples):
            print(f"error: the preamble for {key} matches no example: update PREAMBLES")
            failed = True
    print(f"{compiled} of {len(examples)} examples compiled" + (" (some failed)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
