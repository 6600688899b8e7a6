#!/usr/bin/env python3
"""Our sharded checkpoints as huggingface_hub makes and Python reads them.

    sharded_interop.py SAFETENSORS_CLI

Saves tensors with Python's `safetensors`, reshards the file with `safetensors reshard` (the
ShardedWriter), and checks the result against huggingface_hub's own rule and writer:
- the split, the file names and the index's weight map are those of
  `huggingface_hub.serialization.split_state_dict_into_shards_factory` for the same tensors in
  the same order (the order they lie in the file, which reshard keeps);
- the index file is byte for byte what `save_torch_state_dict` writes
  (`json.dump({"metadata": {**split.metadata, **metadata}, "weight_map": ...}, f, indent=2)`);
- each shard is byte for byte Python's `save_file` of its tensors with `{"format": "pt"}`, as
  `save_torch_state_dict` saves each shard;
- every tensor read through the index with Python's `safe_open` equals the original, for the
  default layout and for shards whose data starts on a 4096-byte boundary (--align 4096);
- an in-place reshard back to one file leaves only `model.safetensors`, as huggingface_hub clears
  the files of an earlier save.
Exit code 77 (skipped) without numpy, safetensors or huggingface_hub, unless
SAFETENSORS_REQUIRE_PYTHON=1 (.ci/setup installs them from tests/python/requirements.txt).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from huggingface_hub.serialization import split_state_dict_into_shards_factory
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:
    print(f"skipped: {e} (pip install -r tests/python/requirements.txt)")
    sys.exit(1 if os.environ.get("SAFETENSORS_REQUIRE_PYTHON") == "1" else 77)

MAX_SHARD = "10KB"  # as huggingface_hub's parse_size_to_int reads it: 10,000 bytes
METADATA = {"format": "pt"}

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def tensors():
    """Tensors of several dtypes and sizes: one larger than a shard, an empty one, a scalar, a
    name outside ASCII (escaped in the index as Python escapes it)."""
    rng = np.random.default_rng(29)
    out = {
        "embed.weight": rng.standard_normal((40, 80)).astype(np.float32),  # 12,800 bytes: a shard alone
        "norm.bias": np.zeros(0, dtype=np.float32),
        "step": np.array(7, dtype=np.int64),
        "head.bias": rng.standard_normal(300).astype(np.float16),
        "mask": rng.integers(0, 2, 700).astype(np.bool_),
        "poids.\u00e9t\u00e9": rng.integers(-100, 100, (30, 30)).astype(np.int8),
    }
    for i in range(6):
        out[f"layers.{i}.weight"] = rng.standard_normal((20 + i, 40)).astype(np.float32)
    return out


def file_order(path):
    """The tensors' names in the order their bytes lie in `path`."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda name: header[name]["data_offsets"])


def data_start(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return 8 + n


def reshard(cli, src, out, *more):
    r = subprocess.run([cli, "reshard", src, out, *more], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"safetensors reshard {src} {out} {' '.join(more)} failed ({r.returncode})")


def check_checkpoint(out, state, split, exact):
    """`out` holds `split`'s files, its index as huggingface_hub writes it, and every tensor."""
    files = sorted(split.filename_to_tensors)
    expected = files + (["model.safetensors.index.json"] if split.is_sharded else [])
    check(sorted(os.listdir(out)) == sorted(expected), f"{out}: files {sorted(os.listdir(out))} != {expected}")
    if split.is_sharded:
        with open(os.path.join(out, "model.safetensors.index.json"), "rb") as f:
            ours = f.read()
        index = {"metadata": {**split.metadata, **METADATA}, "weight_map": split.tensor_to_filename}
        check(ours == json.dumps(index, indent=2).encode(), f"{out}: the index differs from huggingface_hub's")
        weight_map = json.loads(ours)["weight_map"]
    else:
        weight_map = split.tensor_to_filename
    for filename, names in split.filename_to_tensors.items():
        path = os.path.join(out, filename)
        with safe_open(path, framework="np") as f:
            check(sorted(f.keys()) == sorted(names), f"{filename}: tensors {sorted(f.keys())} != {sorted(names)}")
            check(f.metadata() == METADATA, f"{filename}: metadata {f.metadata()}")
        if exact:
            with tempfile.TemporaryDirectory() as tmp:
                theirs = os.path.join(tmp, filename)
                save_file({n: state[n] for n in names}, theirs, metadata=METADATA)
                with open(theirs, "rb") as a, open(path, "rb") as b:
                    check(a.read() == b.read(), f"{filename}: not the bytes Python's save_file writes")
        else:
            check(data_start(path) % 4096 == 0, f"{filename}: data at {data_start(path)}, not on 4096")
    # Through the index, as a loader does: each name to its shard, each tensor read there.
    for name, value in state.items():
        with safe_open(os.path.join(out, weight_map[name]), framework="np") as f:
            got = f.get_tensor(name)
        check(got.dtype == value.dtype and got.shape == value.shape and np.array_equal(got, value), f"{name} differs")


def main():
    cli = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.safetensors")
        save_file(tensors(), src, metadata=METADATA)
        state = {}
        with safe_open(src, framework="np") as f:
            for name in file_order(src):
                state[name] = f.get_tensor(name)
        split = split_state_dict_into_shards_factory(
            state,
            get_storage_size=lambda a: a.nbytes,
            filename_pattern="model{suffix}.safetensors",
            max_shard_size=MAX_SHARD,
        )
        check(len(split.filename_to_tensors) >= 3, f"the test wants several shards: {split.filename_to_tensors}")

        out = os.path.join(tmp, "out")
        reshard(cli, src, out, "--max-shard-size", MAX_SHARD, "--no-sync")
        check_checkpoint(out, state, split, exact=True)

        aligned = os.path.join(tmp, "aligned")
        reshard(cli, src, aligned, "--max-shard-size", MAX_SHARD, "--align", "4096", "--no-sync")
        check_checkpoint(aligned, state, split, exact=False)

        # Back into one file, in place: the old shards and index make way.
        one = split_state_dict_into_shards_factory(
            state, get_storage_size=lambda a: a.nbytes, filename_pattern="model{suffix}.safetensors"
        )
        reshard(cli, os.path.join(out, "model.safetensors.index.json"), out, "--no-sync")
        check_checkpoint(out, state, one, exact=True)

    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)
    print(f"checked {len(split.filename_to_tensors)} shards and one file against huggingface_hub and safetensors")


if __name__ == "__main__":
    main()
