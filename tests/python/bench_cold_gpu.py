#!/usr/bin/env python3
"""bench.py --cold drops the page cache before every timed run of its gpu items too, as it does
for every other item: each load_file(device="cuda:0") and each naive load is preceded by a drop.
torch is stood in for by a module that records the calls (no GPU or torch needed); the drops are
recorded instead of made.

    bench_cold_gpu.py BENCH_PY
"""
import importlib.util
import os
import sys
import tempfile
import types

import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

events = []


def fake_torch():
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: events.append("sync"))

    class Tensor:
        def to(self, device):
            return self

    st_torch = types.ModuleType("safetensors.torch")

    def torch_load(path, device="cpu"):
        events.append(f"load {device}")
        return {"w": Tensor()}

    st_torch.load_file = torch_load
    return torch, st_torch


def main(bench_py):
    spec = importlib.util.spec_from_file_location("bench", bench_py)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.np, bench.safetensors, bench.safe_open, bench.load_file, bench.save_file = (
        np, safetensors, safe_open, load_file, save_file)
    sys.modules["torch"], sys.modules["safetensors.torch"] = fake_torch()
    bench.drop_caches = lambda: events.append("drop") or True
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.safetensors")
        save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, path)
        entry = bench.bench_file(path, 3, {"gpu"}, cold=True)
    items = {r["item"]: r for r in entry["items"]}
    if sorted(items) != ["gpu", "gpu_naive"] or any("skipped" in r for r in items.values()):
        sys.exit(f"expected the gpu and gpu_naive items to run, got {entry['items']}")
    loads = [i for i, e in enumerate(events) if e.startswith("load")]
    if len(loads) != 8:  # a warm-up and 3 timed runs of each item
        sys.exit(f"expected 8 loads, got {len(loads)}: {events}")
    for i, at in enumerate(loads):
        since = events[(loads[i - 1] + 1) if i else 0:at]
        if "drop" not in since:
            sys.exit(f"load {i + 1} ({events[at]}) ran without the page cache dropped first: {events}")
    print(f"ok: {len(loads)} gpu loads, each after a drop of the page cache")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
