#!/usr/bin/env python3
"""bench.py: the same work items as bench_cpp, with Python's safetensors 0.8.0 and NumPy.

    bench.py [--runs N] [--items open,load,load_copy,slice,save,gpu] [--cold] [--json OUT] FILE...
    bench.py [--items open,load,load_copy,gpu] [--cold] [--json OUT] MODEL... ITERATIONS

    open       safe_open(path, "np"), keys(), get_slice(k).get_shape() for every key
    load       safetensors.numpy.load_file(path): every tensor into NumPy arrays
    load_copy  the same work as load (Python has one way to load); kept so the rows line up
    slice      get_slice(k)[:, :cols // 2] for every 2-D tensor
    save_nosync  safetensors.numpy.save_file of the file's tensors to a new file (it does not
               fsync, so it compares with bench_cpp's save_nosync)
    gpu        safetensors.torch.load_file(path, device="cuda:0"), synchronized (torch + CUDA)
    gpu_naive  a naive torch baseline: load_file on the CPU, then .to("cuda:0") per tensor

A FILE that is a checkpoint index (`.json`, make_bench_files' moe-deepseek-v3) gets bench_cpp's
checkpoint `open` item, named by its directory: json.load of the index, then for every shard
safe_open, keys() and get_slice(k).get_shape() for each key (what Python code does with a
sharded checkpoint), runs taking turns as bench_cpp's.

Files with dtypes NumPy lacks (bf16, fp8) go through safetensors.torch when torch is installed,
else those items are reported as skipped. Writes the same JSON schema as bench_cpp (tool
"bench.py"). Medians of --runs runs after one warm-up, with the spread (min, max); the page
cache is warm, unless --cold: then the page cache is dropped before every run (sync, then
`echo 3 > /proc/sys/vm/drop_caches`: needs root; without it, a message and exit code 1), the
default item is `load` (Python's load_file from the disk, to set beside bench_cpp --cold) and
the default --runs is 5. With a number ITERATIONS after the files instead (the seed README's
`bench.py MODEL ITERATIONS`): the time per iteration of each load over ITERATIONS iterations,
the first one included, as bench_cpp's same form. A bad argument or a missing file is a usage message and exit code 2; a file that is not
valid safetensors, exit code 1. Arguments are checked before NumPy and safetensors are imported.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

# checked_output.py lives beside this script, which is also loaded by path (the GPU kit's copy,
# the tests' importlib): look for it here whatever the caller's sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checked_output  # noqa: E402

ITEMS = {"open", "load", "load_copy", "slice", "save", "save_nosync", "gpu", "convert"}
ITERATION_ITEMS = {"open", "load", "load_copy", "gpu"}
# Runs of the open item at least, as bench_cpp (kOpenRuns): an open takes microseconds, and with
# 21 runs one stall of the machine could move a round's median.
OPEN_RUNS = 201


def timings(n, body, setup=lambda: None):
    """Timings of `n` calls of `body`, each after `setup` (untimed), with no warm-up."""
    out = []
    for _ in range(n):
        setup()
        t = time.perf_counter()
        body()
        out.append(time.perf_counter() - t)
    return out


def timed(runs, body, setup=lambda: None):
    """Timings of `runs` calls of `body` after one untimed warm-up call, as bench_cpp does."""
    setup()
    body()
    return timings(runs, body, setup)


def result(item, runs, nbytes=0, skipped=None):
    if skipped:
        return {"item": item, "skipped": skipped}
    return {"item": item, "median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs),
            "bytes": nbytes, "runs_s": runs}


def drop_caches():
    """Drops the page cache (--cold); False without the permission (root) to."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def machine():
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0.0
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(l.split()[1]) for l in f if l.startswith("MemTotal")) / 1024 / 1024
    except (OSError, StopIteration):
        pass
    return f"{cpu} ({os.cpu_count()} cores), {mem:.1f} GiB"


NUMPY_DTYPES = {"BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32", "F64", "I64", "U64", "C64"}


def header_dtypes(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def frameworks(path):
    """(load_file, save_file, framework) able to hold every dtype of the file, or a reason."""
    if header_dtypes(path) <= NUMPY_DTYPES:
        return load_file, save_file, "np"
    try:
        import safetensors.torch as st_torch
    except ImportError:
        return "NumPy has no bfloat16/fp8 and torch is not installed"
    return st_torch.load_file, st_torch.save_file, "pt"


def warm(path):
    """Puts `path` in the page cache as one sequential read leaves it, as bench_cpp's warm-up
    does (cpp/measure.hpp `warm`): its cached pages dropped first (a mapping's are left alone),
    then read, so that both programs' runs find it in the same shape whichever touched it first."""
    with open(path, "rb") as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while f.read(1 << 24):
            pass


def open_all(path):
    """The `open` item: open the file, list keys, take every tensor's slice shape."""
    with safe_open(path, framework="np") as f:
        for k in f.keys():
            f.get_slice(k).get_shape()


def open_checkpoint(index):
    """The checkpoint `open` item: the index read, then every shard opened, its keys listed and
    each tensor's shape taken."""
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    folder = os.path.dirname(index)
    n = 0
    for shard in sorted(set(weight_map.values())):
        with safe_open(os.path.join(folder, shard), framework="np") as f:
            for k in f.keys():
                f.get_slice(k).get_shape()
                n += 1
    return n


def bench_checkpoint(index, runs, items):
    """The checkpoint items of an index (`open`), named by its directory."""
    out = []
    tensors = open_checkpoint(index)
    if "open" in items:
        out.append(result("open", timed(runs, lambda: open_checkpoint(index))))
    with open(index) as f:
        size = int(json.load(f).get("metadata", {}).get("total_size", 0))
    name = os.path.basename(os.path.dirname(os.path.abspath(index)))
    return {"name": name, "bytes": size, "tensors": tensors, "items": out, "limits": []}


def bench_file(path, runs, items, cold=False):
    """Every item of one file; with `cold`, the page cache is dropped before every run."""
    if path.lower().endswith(".json"):
        return bench_checkpoint(path, runs, items)
    size = os.path.getsize(path)
    setup = drop_caches if cold else (lambda: None)
    if not cold:
        warm(path)
    with safe_open(path, framework="np") as f:
        keys = list(f.keys())
    out = []
    fw = frameworks(path)
    if isinstance(fw, str):
        for item in ("load", "load_copy", "slice", "save_nosync"):
            if item in items:
                out.append(result(item, None, skipped=fw))
        items = items & {"open", "gpu"}
    else:
        load_file_fw, save_file_fw, framework = fw

    if "open" in items:
        out.append(result("open", timed(max(runs, OPEN_RUNS), lambda: open_all(path), setup)))
    if "load" in items or "load_copy" in items:
        held = []
        t = timed(runs, lambda: held.append(load_file_fw(path)), lambda: (held.clear(), setup()))
        held.clear()
        for item in ("load", "load_copy"):
            if item in items:
                out.append(result(item, t, size))
    if "slice" in items:
        shapes = {}
        with safe_open(path, framework="np") as f:
            for k in keys:
                shapes[k] = f.get_slice(k).get_shape()
        two_d = [k for k in keys if len(shapes[k]) == 2]
        nbytes = 0

        def slice_all():
            held = []
            with safe_open(path, framework=framework) as f:
                for k in two_d:
                    held.append(f.get_slice(k)[:, : shapes[k][1] // 2])
            return held

        out.append(result("slice", timed(runs, slice_all, setup), nbytes))
    if "save_nosync" in items and size < (2 << 30):
        tensors = load_file_fw(path)
        with safe_open(path, framework="np") as f:
            meta = f.metadata()
        target = os.path.join(os.path.dirname(path), ".bench-save-py.safetensors")
        remove = lambda: os.path.exists(target) and os.remove(target)
        # Python's save_file does not fsync: it is the like-for-like figure for save_nosync.
        t = timed(runs, lambda: save_file_fw(tensors, target, metadata=meta), lambda: (remove(), setup()))
        out.append(result("save_nosync", t, size))
        remove()
    if "gpu" in items:
        out.extend(gpu_items(path, runs, size, setup))
    return {"name": os.path.basename(path), "bytes": size, "tensors": len(keys), "items": out, "limits": []}


def gpu_loaders(path):
    """(safetensors.torch.load_file(path, device="cuda:0"), a naive torch baseline: load_file on
    the CPU, then .to("cuda:0") per tensor), both synchronized, or why they cannot run."""
    try:
        import torch
        from safetensors.torch import load_file as torch_load
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"

    def load():
        tensors = torch_load(path, device="cuda:0")
        torch.cuda.synchronize()
        return tensors

    def naive():
        tensors = {k: t.to("cuda:0") for k, t in torch_load(path).items()}
        torch.cuda.synchronize()
        return tensors

    return load, naive


def gpu_items(path, runs, size, setup=lambda: None):
    """The `gpu` and `gpu_naive` items, each run after `setup` (with --cold, the page cache dropped)."""
    loaders = gpu_loaders(path)
    if isinstance(loaders, str):
        return [result("gpu", None, skipped=loaders)]
    load, naive = loaders
    return [result("gpu", timed(runs, load, setup), size), result("gpu_naive", timed(runs, naive, setup), size)]


CONVERT_CASES = [("F8_E4M3", "F32"), ("F8_E5M2", "F32"), ("F8_E4M3FNUZ", "F32"), ("F8_E5M2FNUZ", "F32"),
                 ("F8_E8M0", "F32"), ("F4", "F32"), ("F6_E2M3", "F32"), ("F6_E3M2", "F32"), ("F16", "F32"),
                 ("BF16", "F32"), ("U8", "F32"), ("I32", "F32"), ("F64", "F32"), ("F32", "BF16"), ("F32", "F16"),
                 ("F32", "F8_E4M3")]


def convert_items(runs, elements=64 << 20):
    """The `convert` item: ml_dtypes' (NumPy's for F16, integers and F64) casts on the data
    bench_cpp converts (benchmark/bench_convert.hpp has the same generators), written into a
    preallocated output as bench_cpp's are (`np.copyto`), so neither side pays for fresh memory.
    F4 and F6 are one element per byte in ml_dtypes, so they are timed unpacked."""
    try:
        import ml_dtypes as md
    except ImportError as e:
        print(f"  convert: skipped: no ml_dtypes ({e}); pip install ml_dtypes")
        return [result("convert", [], skipped=f"no ml_dtypes: {e}")]
    types = {"F8_E4M3": md.float8_e4m3fn, "F8_E5M2": md.float8_e5m2, "F8_E4M3FNUZ": md.float8_e4m3fnuz,
             "F8_E5M2FNUZ": md.float8_e5m2fnuz, "F8_E8M0": md.float8_e8m0fnu, "F4": md.float4_e2m1fn,
             "F6_E2M3": md.float6_e2m3fn, "F6_E3M2": md.float6_e3m2fn, "F16": np.float16, "BF16": md.bfloat16,
             "U8": np.uint8, "I32": np.int32, "F64": np.float64, "F32": np.float32}
    i = np.arange(elements, dtype=np.uint64)
    hashed = (i * np.uint64(2654435761)) >> np.uint64(13)
    f32 = ((hashed & np.uint64(0xFFFF)).astype(np.float32) / np.float32(4096) - np.float32(8))
    out = []
    for frm, to in CONVERT_CASES:
        if frm == "F32":
            src = f32
        elif frm == "F64":
            src = f32.astype(np.float64)
        else:
            width = np.dtype(types[frm]).itemsize
            raw_bytes = (((np.arange(elements * width, dtype=np.uint64) * np.uint64(2654435761)) >> np.uint64(13))
                         & np.uint64(0xFF)).astype(np.uint8)
            if frm == "F4":
                raw_bytes &= 0x0F
            elif frm.startswith("F6"):
                raw_bytes &= 0x3F
            src = raw_bytes.view(types[frm])
        target = types[to]
        dst = np.ones(elements, dtype=target)  # faulted in before timing, as bench_cpp's
        with np.errstate(all="ignore"):
            times = timed(runs, lambda: np.copyto(dst, src, casting="unsafe"))
        r = result(f"convert {frm}->{to}", times, elements * np.dtype(target).itemsize)
        r["elements"] = elements
        out.append(r)
        print(f"  convert {frm:>11} -> {to:<7} {np.median(times) * 1e3:8.1f} ms  (ml_dtypes/NumPy cast into a preallocated output)")
    return out


def iterate_file(path, iterations, items, cold=False):
    """`MODEL ITERATIONS`: each load's timings over `iterations` iterations, the first included;
    with `cold`, the page cache is dropped before every iteration."""
    size = os.path.getsize(path)
    setup = drop_caches if cold else (lambda: None)
    if not cold:
        warm(path)
    with safe_open(path, framework="np") as f:
        tensors = len(f.keys())
    out = []
    if "open" in items:
        out.append(result("open", timings(iterations, lambda: open_all(path), setup)))
    if "load" in items or "load_copy" in items:
        fw = frameworks(path)
        held = []
        t = None if isinstance(fw, str) else timings(iterations, lambda: held.append(fw[0](path)),
                                                     lambda: (held.clear(), setup()))
        for item in ("load", "load_copy"):
            if item in items:
                out.append(result(item, t, size, skipped=fw if t is None else None))
    if "gpu" in items:
        loaders = gpu_loaders(path)
        out.append(result("gpu", None, skipped=loaders) if isinstance(loaders, str)
                   else result("gpu", timings(iterations, loaders[0], setup), size))
    for r in out:
        if "skipped" not in r:
            r["per_iteration_s"] = statistics.mean(r["runs_s"])
    return {"name": os.path.basename(path), "bytes": size, "tensors": tensors, "iterations": iterations, "items": out}


def print_medians(entry, runs):
    print(f"{entry['name']} ({entry['bytes']} bytes, {entry['tensors']} tensors, {runs} runs)")
    for r in entry["items"]:
        if "skipped" in r:
            print(f"  {r['item']:<10} skipped: {r['skipped']}")
        else:
            line = f"  {r['item']:<10} {r['median_s'] * 1e3:10.3f} ms ({r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f})"
            if r["bytes"]:
                line += f"  {r['bytes'] / r['median_s'] / 1e9:6.2f} GB/s"
            print(line)


def print_iterations(entry):
    print(f"{entry['name']} ({entry['bytes']} bytes, {entry['tensors']} tensors, "
          f"{entry['iterations']} iterations): time per iteration")
    for r in entry["items"]:
        if "skipped" in r:
            print(f"  {r['item']:<14} skipped: {r['skipped']}")
            continue
        line = f"  {r['item']:<14} {r['per_iteration_s']:12.6f} s"
        if r["bytes"]:
            line += f"  {r['bytes'] / r['per_iteration_s'] / 1e9:6.2f} GB/s"
        print(line)


def parse(argv):
    """The command line, checked as a whole (argparse's usage message and exit code 2)."""
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0],
                                usage="%(prog)s [--runs N] [--items ITEM,...] [--cold] [--json OUT] FILE...\n"
                                      "       %(prog)s [--items ITEM,...] [--cold] [--json OUT] MODEL... ITERATIONS")
    p.add_argument("files", nargs="*", help="safetensors files; a last argument made of digits is ITERATIONS")
    p.add_argument("--runs", type=int)
    p.add_argument("--items")
    p.add_argument("--json")
    p.add_argument("--cold", action="store_true")
    a = p.parse_args(argv)
    numbers = [f for f in a.files if f.isdigit()]
    a.files = [f for f in a.files if not f.isdigit()]
    if len(numbers) > 1:
        p.error(f"ITERATIONS is given twice ({', '.join(numbers)}); name a file like ./{numbers[1]}")
    a.iterations = int(numbers[0]) if numbers else 0
    if numbers and not 1 <= a.iterations <= 1_000_000:
        p.error(f"ITERATIONS takes a number from 1 to 1000000, got '{numbers[0]}'")
    if a.runs is not None and not 1 <= a.runs <= 1_000_000:
        p.error(f"--runs takes a number from 1 to 1000000, got '{a.runs}'")
    default = (ITERATION_ITEMS if a.iterations else {"load"} if a.cold
               else {"open", "load", "load_copy", "slice", "save_nosync", "gpu"})
    a.items = set(a.items.split(",")) if a.items else default
    for item in sorted(a.items - ITEMS):
        p.error(f"unknown item '{item}' in --items")
    if a.iterations:
        if a.runs is not None:
            p.error("give either --runs N or ITERATIONS, not both")
        if not a.files:
            p.error("ITERATIONS needs a MODEL file before it")
        for item in sorted(a.items - ITERATION_ITEMS):
            p.error(f"item '{item}' is not timed per iteration")
    if not a.files and "convert" not in a.items:
        p.error("no file given")
    for f in a.files:
        if not os.path.isfile(f):
            p.error(f"no such file '{f}'")
    return a


def main(argv):
    a = parse(argv)
    try:
        global np, safetensors, safe_open, load_file, save_file
        import numpy as np
        import safetensors
        from safetensors import safe_open
        from safetensors.numpy import load_file, save_file
    except ImportError as e:
        print(f"bench.py: {e}: needs safetensors==0.8.0 and NumPy (pip install -r benchmark/requirements.txt)",
              file=sys.stderr)
        return 1
    # Opened now: a path that cannot be written fails before the measurements, not after.
    try:
        out = open(a.json, "w") if a.json else None
    except OSError as e:
        print(f"bench.py: cannot create {a.json}: {e.strerror}", file=sys.stderr)
        return 1
    cache = "cold" if a.cold else "warm"
    if a.cold and not drop_caches():
        print("bench.py: --cold drops the page cache before every run (sync, then echo 3 > "
              "/proc/sys/vm/drop_caches), which needs root and a writable /proc/sys/vm/drop_caches: "
              "run it as root, or without --cold", file=sys.stderr)
        return 1
    report = {"tool": "bench.py", "safetensors": safetensors.__version__, "numpy": np.__version__,
              "date": datetime.date.today().isoformat(), "machine": machine(), "cache": cache, "files": []}
    print(f"bench.py | safetensors {safetensors.__version__} | {report['machine']} | page cache {cache}")
    for path in a.files:
        try:
            if a.iterations:
                entry = iterate_file(path, a.iterations, a.items, a.cold)
                print_iterations(entry)
            else:
                runs = a.runs or (5 if a.cold else 3 if os.path.getsize(path) > (2 << 30) else 7)
                entry = bench_file(path, runs, a.items, a.cold)
                print_medians(entry, runs)
        except (safetensors.SafetensorError, OSError, ValueError) as e:
            print(f"bench.py: {path}: {e}", file=sys.stderr)
            return 1
        report["files"].append(entry)
    if "convert" in a.items:
        print("convert (64 Mi elements)")
        report["convert"] = convert_items(a.runs or 3)
    text = json.dumps(report)
    if out is None:
        print("JSON", text)
        return 0
    try:
        with out:
            out.write(text + "\n")
    except OSError as e:
        print(f"bench.py: cannot write {a.json}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    checked_output.run(main, sys.argv[1:], "bench.py")
