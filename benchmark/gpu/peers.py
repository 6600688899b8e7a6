#!/usr/bin/env python3
"""peers.py: other loaders' whole-file uploads to cuda:0, timed like bench_cpp's gpu item, for
the GPU kit (benchmark/gpu/run.py) to set beside ours.

    peers.py [--cold] [--check] [--runs N] [--json OUT] FILE...

    fastsafetensors  fastsafetensors.fastsafe_open(path, framework="pt", device="cuda:0",
                     nogds=True): pread into pinned bounce buffers, then copies, into one device
                     buffer (GPUDirect Storage off: it needs nvidia-fs, which a VM rarely has)
    instanttensor    instanttensor.safe_open(path, framework="pt", device=0): its default I/O
                     (direct I/O) cold, BackendPolicy.BUFFERED (the page cache) warm; every
                     tensor taken, as the default copy=True yields them (each its own memory)

Each run opens the file, takes every tensor and synchronizes the device; the tensors are dropped
and torch's cached device memory returned (torch.cuda.empty_cache) before the next run, untimed,
as bench_cpp frees its allocation between runs. Medians of --runs runs (default 7; 5 cold) after
one warm-up run, the page cache warm, unless --cold: then it is dropped before every run (root).
--check compares every tensor of one load with safetensors.torch.load_file's, byte for byte.
Writes bench.py's JSON schema (tool "peers.py"); a loader that cannot run is reported skipped,
with why. fastsafetensors opens "libcudart.so" by that name: when none is on the library path,
this script points it at the CUDA runtime torch uses, and starts itself again.
"""
import argparse
import ctypes
import datetime
import glob
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time

READY = "SAFETENSORS_PEERS_CUDART"


def ensure_cudart():
    """Makes dlopen("libcudart.so") find torch's CUDA runtime: a folder with that link, on
    LD_LIBRARY_PATH, read only at start, hence the new start. Returns a note, or None."""
    if os.environ.get(READY):
        return os.environ[READY]
    try:
        ctypes.CDLL("libcudart.so")
        return None
    except OSError:
        pass
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.origin:
        return "no libcudart.so on the library path, and no torch to take one from"
    site = os.path.dirname(os.path.dirname(spec.origin))
    major = ""
    try:
        with open(os.path.join(site, "torch", "version.py")) as f:
            m = re.search(r"cuda\s*(?::\s*\w+\s*)?=\s*'(\d+)", f.read())
            major = m.group(1) if m else ""
    except OSError:
        pass
    found = sorted(glob.glob(os.path.join(site, "nvidia", "**", "libcudart.so*"), recursive=True) +
                   glob.glob(os.path.join(site, "torch", "lib", "libcudart*.so*")) +
                   glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    found.sort(key=lambda p: not p.endswith(f".so.{major}"))
    if not found:
        return "no libcudart.so anywhere torch's packages or /usr/local/cuda keep it"
    folder = tempfile.mkdtemp(prefix="peers-cudart-")
    os.symlink(found[0], os.path.join(folder, "libcudart.so"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = folder + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env[READY] = f"libcudart.so -> {found[0]}"
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def result(item, runs, nbytes=0, skipped=None, **extra):
    if skipped:
        return {"item": item, "skipped": skipped}
    r = {"item": item, "median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "bytes": nbytes,
         "runs_s": runs}
    r.update(extra)
    return r


def loaders(torch, cold):
    """{name: (make(path) -> load(), options text) or why it cannot run}."""
    out = {}
    try:
        from fastsafetensors import fastsafe_open
        import fastsafetensors

        def fst(path):
            def load():
                with fastsafe_open(path, framework="pt", device="cuda:0", nogds=True) as f:
                    tensors = {k: f.get_tensor(k) for k in f.keys()}
                torch.cuda.synchronize()
                return tensors
            return load

        out["fastsafetensors"] = (fst, f"fastsafetensors {fastsafetensors.__version__}, nogds=True")
    except Exception as e:
        out["fastsafetensors"] = f"cannot import fastsafetensors: {type(e).__name__}: {e}"
    try:
        import instanttensor
        from instanttensor import BackendPolicy, safe_open

        def it(path):
            backend = None if cold else BackendPolicy.BUFFERED

            def load():
                tensors = {}
                with safe_open(path, framework="pt", device=0, backend=backend) as f:
                    for name, t in f.tensors():
                        tensors[name] = t
                torch.cuda.synchronize()
                return tensors
            return load

        version = getattr(instanttensor, "__version__", None)
        if version is None:
            from importlib.metadata import version as dist_version
            version = dist_version("instanttensor")
        out["instanttensor"] = (it, f"instanttensor {version}, backend " + ("default (direct I/O)" if cold else "BUFFERED"))
    except Exception as e:
        out["instanttensor"] = f"cannot import instanttensor: {type(e).__name__}: {e}"
    return out


def same_bytes(torch, loaded, path):
    """None when every tensor equals safetensors.torch.load_file's byte for byte, else which differs."""
    from safetensors.torch import load_file
    want = load_file(path)
    if sorted(want) != sorted(loaded):
        return f"tensor names differ ({len(loaded)} loaded, {len(want)} in the file)"
    for name, w in want.items():
        got = loaded[name]
        if got.dtype != w.dtype or tuple(got.shape) != tuple(w.shape):
            return f"{name}: {got.dtype}{tuple(got.shape)}, expected {w.dtype}{tuple(w.shape)}"
        a = got.contiguous().reshape(-1).view(torch.uint8)
        b = w.contiguous().reshape(-1).view(torch.uint8).to(a.device)
        if not torch.equal(a, b):
            return f"{name}: device bytes differ from the file's"
    return None


def bench_file(torch, path, runs, cold, check):
    size = os.path.getsize(path)
    setup_cold = drop_caches if cold else (lambda: True)
    if not cold:
        with open(path, "rb") as f:  # warm the page cache
            while f.read(1 << 24):
                pass
    items = []
    for name, entry in loaders(torch, cold).items():
        if isinstance(entry, str):
            items.append(result(name, None, skipped=entry))
            print(f"  {name:<16} skipped: {entry}")
            continue
        make, options = entry
        load = make(path)
        held = []

        def setup():
            held.clear()
            torch.cuda.empty_cache()
            setup_cold()

        try:
            setup()
            held.append(load())  # warm-up, and the tensors for --check
            verdict = same_bytes(torch, held[0], path) if check else None
            times = []
            for _ in range(runs):
                setup()
                t = time.perf_counter()
                held.append(load())
                times.append(time.perf_counter() - t)
            setup()
        except Exception as e:  # the loader's own error: reported, and the others go on
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            items.append(result(name, None, skipped=f"{options}: {why}"))
            print(f"  {name:<16} failed: {why}")
            continue
        extra = {"options": options}
        if check:
            extra["check"] = verdict or "every tensor equal to the file's"
        r = result(name, times, size, **extra)
        items.append(r)
        print(f"  {name:<16} {r['median_s'] * 1e3:10.1f} ms ({r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f})  "
              f"{size / r['median_s'] / 1e9:6.2f} GB/s  [{options}]" + (f"  check: {extra['check']}" if check else ""))
    return {"name": os.path.basename(path), "bytes": size, "items": items, "limits": []}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--json")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    for f in a.files:
        if not os.path.isfile(f):
            ap.error(f"no such file '{f}'")
    if a.cold and not drop_caches():
        print("peers.py: --cold drops the page cache before every run, which needs root", file=sys.stderr)
        return 1
    cudart = ensure_cudart()
    report = {"tool": "peers.py", "date": datetime.date.today().isoformat(), "cache": "cold" if a.cold else "warm",
              "files": []}
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        report["torch"] = torch.__version__
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        for path in a.files:
            report["files"].append({"name": os.path.basename(path), "bytes": os.path.getsize(path), "limits": [],
                                    "items": [result(n, None, skipped=why) for n in ("fastsafetensors", "instanttensor")]})
        print(f"peers.py: skipped: {why}")
    else:
        if cudart:
            report["cudart"] = cudart
            print(f"peers.py: {cudart}")
        for path in a.files:
            runs = a.runs or (5 if a.cold else 7)
            print(f"{os.path.basename(path)} ({os.path.getsize(path)} bytes, {runs} runs, page cache {report['cache']})")
            report["files"].append(bench_file(torch, path, runs, a.cold, a.check))
    text = json.dumps(report)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    else:
        print("JSON", text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
