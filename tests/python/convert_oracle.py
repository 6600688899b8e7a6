#!/usr/bin/env python3
"""Expected results of dtype conversion and dequantization, computed by the oracle: ml_dtypes'
astype (NumPy's for F16, F32, F64 and integers) and NumPy references for dequantization.

    convert_oracle.py OUTDIR

Writes raw little-endian input and expected-output files plus OUTDIR/manifest.json:
  {"cases": [{"name", "from", "to", "numel", "input", "expected"}...],
   "fp8_blocks": [{"name", "weight_shape", "scale_shape", "weight", "scale", "expected"}...],
   "mxfp4": [{"name", "blocks_shape", "scales_shape", "blocks", "scales", "expected"}...]}
Sub-byte inputs are packed as the library documents: F4 two per byte, element 0 in the low
nibble; F6 a little-endian bit stream, four elements in three bytes, element 0 in the low bits.

Exit code 77 (skipped) without numpy or ml_dtypes, unless SAFETENSORS_REQUIRE_PYTHON=1.
"""
import hashlib
import json
import os
import sys

try:
    import ml_dtypes as md
    import numpy as np
except ImportError as e:  # pragma: no cover - environment check
    print(f"skipped: {e} (pip install -r tests/python/requirements.txt)")
    sys.exit(1 if os.environ.get("SAFETENSORS_REQUIRE_PYTHON") == "1" else 77)

NARROW = {
    "F16": np.float16,
    "BF16": md.bfloat16,
    "F8_E5M2": md.float8_e5m2,
    "F8_E4M3": md.float8_e4m3fn,
    "F8_E8M0": md.float8_e8m0fnu,
    "F8_E4M3FNUZ": md.float8_e4m3fnuz,
    "F8_E5M2FNUZ": md.float8_e5m2fnuz,
    "F4": md.float4_e2m1fn,
    "F6_E2M3": md.float6_e2m3fn,
    "F6_E3M2": md.float6_e3m2fn,
}
BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "F16": 16, "BF16": 16}
WIDE = {"F32": np.float32, "F64": np.float64}
INTS = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
        "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64}
rng = np.random.default_rng(20261123)


def bits_of(name):
    return BITS.get(name, 8)


def codes_dtype(name):
    return np.uint16 if bits_of(name) == 16 else np.uint8


def pack(name, codes):
    """Raw codes (one per uint8/uint16) to the file layout."""
    codes = np.asarray(codes)
    if name == "F4":
        c = codes.astype(np.uint8) & 15
        return (c[0::2] | (c[1::2] << 4)).astype(np.uint8).tobytes()
    if name.startswith("F6"):
        c = codes.astype(np.uint32).reshape(-1, 4) & 63
        w = c[:, 0] | c[:, 1] << 6 | c[:, 2] << 12 | c[:, 3] << 18
        return np.stack([w & 255, (w >> 8) & 255, (w >> 16) & 255], 1).astype(np.uint8).tobytes()
    return codes.astype(codes_dtype(name)).tobytes()


def raw(name, arr):
    """An array of dtype `name` (NumPy/ml_dtypes typed) to the file layout."""
    if name in NARROW:
        return pack(name, arr.view(codes_dtype(name)))
    return arr.tobytes()


class Writer:
    def __init__(self, out):
        self.out, self.cases, self.n, self.seen = out, [], 0, {}

    def blob(self, data):
        """Writes `data` once; identical inputs (the random sets) share a file."""
        key = hashlib.sha256(data).hexdigest()
        if key in self.seen:
            return self.seen[key]
        self.n += 1
        fname = f"b{self.n:04d}.bin"
        with open(os.path.join(self.out, fname), "wb") as f:
            f.write(data)
        self.seen[key] = fname
        return fname

    def case(self, name, frm, to, inp_bytes, numel, expected_bytes):
        self.cases.append({"name": name, "from": frm, "to": to, "numel": int(numel),
                           "input": self.blob(inp_bytes), "expected": self.blob(expected_bytes)})


def all_codes(name):
    n = 1 << bits_of(name)
    return np.arange(n, dtype=np.uint32).astype(codes_dtype(name))


def values_of(name, codes):
    """Typed array of the codes (sub-byte types live one per byte in ml_dtypes)."""
    return codes.astype(codes_dtype(name)).view(NARROW[name])


def boundaries(name, wide):
    """Every representable value of `name`, every midpoint between neighbours, each ±1 and
    ±2 ulp of the wide type, plus the extremes and specials."""
    with np.errstate(all="ignore"):
        v = values_of(name, all_codes(name)).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mids = (v[:-1] + v[1:]) / 2
    pts = np.concatenate([v, mids, -v, -mids]).astype(wide)
    big = np.finfo(wide)
    extra = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, big.max, -big.max,
                      big.tiny, -big.tiny, big.smallest_subnormal, -big.smallest_subnormal,
                      2.0 ** 128 if wide == np.float64 else big.max], dtype=wide)
    near = [pts, extra]
    for k in (1, 2):
        up, down = pts, pts
        for _ in range(k):
            up = np.nextafter(up, wide(np.inf))
            down = np.nextafter(down, wide(-np.inf))
        near += [up, down]
    out = np.concatenate(near).astype(wide)
    # NaN payloads, quiet and signalling, both signs.
    if wide == np.float32:
        nans = np.array([0x7FC00000, 0x7F800001, 0x7FA00000, 0xFFC00001, 0x7F900000, 0x7F800100,
                         0xFFFFFFFF], np.uint32).view(np.float32)
    else:
        nans = np.array([0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8000000000001,
                         0x7FF4000000000000, 0x7FF0000020000000], np.uint64).view(np.float64)
    return np.concatenate([out, nans])


def random_wide(wide, n):
    ibits = np.uint32 if wide == np.float32 else np.uint64
    raw_bits = rng.integers(0, np.iinfo(ibits).max, size=n, dtype=ibits, endpoint=True).view(wide)
    scaled = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 20, n))).astype(wide)
    return np.concatenate([raw_bits, scaled])


def astype(x, to):
    target = NARROW.get(to) or WIDE[to]
    with np.errstate(all="ignore"):
        try:
            return x.astype(target)
        except TypeError:
            # ml_dtypes registers no direct cast between some narrow pairs: F32 holds every
            # narrow value exactly, so going through it rounds once, like a direct cast.
            return x.astype(np.float32).astype(target)


def even(n, name):
    """Element counts must fill whole bytes: round down to a multiple of 4 (F4 and F6)."""
    return n - n % 4 if name in ("F4", "F6_E2M3", "F6_E3M2", 4) else n


def conversions(w, n_random):
    # Every code of every narrow type, decoded to F32 and F64 (and to every other narrow type).
    for frm in NARROW:
        codes = all_codes(frm)
        vals = values_of(frm, codes)
        for to in list(WIDE) + list(NARROW):
            if to == frm:
                continue
            m = even(len(codes), to)
            w.case(f"codes {frm}->{to}", frm, to, pack(frm, codes[:m]), m, raw(to, astype(vals[:m], to)))
    # F32 and F64 boundaries ±1 ulp and random inputs, into every narrow type.
    for wname, wide in WIDE.items():
        rnd = random_wide(wide, n_random)
        for to in NARROW:
            for label, x in (("boundaries", boundaries(to, wide)), ("random", rnd)):
                x = x[: even(len(x), 4)]
                w.case(f"{label} {wname}->{to}", wname, to, x.tobytes(), len(x), raw(to, astype(x, to)))
    x = random_wide(np.float64, n_random // 4)
    w.case("random F64->F32", "F64", "F32", x.tobytes(), len(x), astype(x, "F32").tobytes())
    x = random_wide(np.float32, n_random // 4)
    w.case("random F32->F64", "F32", "F64", x.tobytes(), len(x), astype(x, "F64").tobytes())
    # Integers and BOOL, with their extremes, into every float target.
    for iname, it in INTS.items():
        if it == np.bool_:
            # NumPy's astype gives 1 for any nonzero byte, ml_dtypes' the byte's value: only 0
            # and 1 are valid booleans, so the fixture holds those (the Rust tests pin the rest).
            x = rng.integers(0, 2, 4096, dtype=np.uint8)
            typed = x.view(np.bool_)
        else:
            info = np.iinfo(it)
            x = np.concatenate([np.array([info.min, info.max, 0, 1, info.max - 1], it),
                                rng.integers(info.min, info.max, 4091, dtype=it, endpoint=True),
                                rng.integers(-300 if info.min < 0 else 0, 300, 4096).astype(it)])
            typed = x
        for to in list(WIDE) + list(NARROW):
            m = even(len(x), to)
            w.case(f"ints {iname}->{to}", iname, to, x[:m].tobytes(), m, raw(to, astype(typed[:m], to)))


def fp8_blocks(w, shape, name):
    m, n = shape
    sm, sn = -(-m // 128), -(-n // 128)
    codes = rng.integers(0, 256, m * n, dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0x3C  # the checkpoints hold no NaN; keep a few elsewhere
    codes[:3] = [0x7F, 0xFF, 0x80]
    weight = codes.view(md.float8_e4m3fn).reshape(m, n)
    scale = (rng.random((sm, sn)) * 2e-3 + 1e-5).astype(np.float32)
    # NumPy reference of DeepSeek-V3 weight_dequant: F32 tile times its block's scale.
    full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:m, :n]
    y = weight.astype(np.float32) * full
    return {"name": name, "weight_shape": [m, n], "scale_shape": [sm, sn],
            "weight": w.blob(codes.tobytes()), "scale": w.blob(scale.tobytes()),
            "expected": w.blob(y.astype(np.float32).tobytes()),
            "expected_bf16": w.blob(y.astype(md.bfloat16).tobytes())}


def mxfp4(w, shape, name):
    *lead, g, b = shape
    blocks = rng.integers(0, 256, int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    scales = rng.integers(110, 140, int(np.prod(lead)) * g, dtype=np.uint8).reshape(*lead, g)
    scales.flat[:4] = [0, 1, 254, 255]
    # NumPy reference of transformers' convert_moe_packed_tensors (without its transpose).
    lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    out = np.empty((*lead, g, b * 2), np.float32)
    out[..., 0::2] = lut[blocks & 0x0F]
    out[..., 1::2] = lut[blocks >> 4]
    with np.errstate(all="ignore"):
        out = np.ldexp(out, (scales.astype(np.int32) - 127)[..., None])
    out = out.reshape(*lead, g * b * 2)
    return {"name": name, "blocks_shape": list(shape), "scales_shape": [*lead, g],
            "blocks": w.blob(blocks.tobytes()), "scales": w.blob(scales.tobytes()),
            "expected": w.blob(out.tobytes())}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    w = Writer(out)
    conversions(w, n_random=int(os.environ.get("SAFETENSORS_CONVERT_RANDOM", "500000")))
    # DeepSeek-V3 kv_a_proj_with_mqa is [576, 7168]: 4.5 row blocks, a ragged edge.
    fp8 = [fp8_blocks(w, (576, 7168), "kv_a_proj_with_mqa [576, 7168]"),
           fp8_blocks(w, (129, 257), "ragged both ways [129, 257]")]
    # gpt-oss-20b mlp2 blocks are [32, 2880, 90, 16]; one expert keeps the fixture small.
    mx = [mxfp4(w, (1, 2880, 90, 16), "mlp2 blocks, one expert [1, 2880, 90, 16]"),
          mxfp4(w, (3, 5, 2, 16), "small [3, 5, 2, 16]")]
    manifest = {"cases": w.cases, "fp8_blocks": fp8, "mxfp4": mx}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    # The same, as tab-separated lines for the C++ tests (which have no JSON parser):
    #   case  FROM TO NUMEL INPUT EXPECTED NAME
    #   fp8   ROWS,COLS SROWS,SCOLS WEIGHT SCALE EXPECTED_F32 EXPECTED_BF16 NAME
    #   mxfp4 BLOCKS_SHAPE SCALES_SHAPE BLOCKS SCALES EXPECTED_F32 NAME
    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    with open(os.path.join(out, "manifest.tsv"), "w") as f:
        for c in w.cases:
            print("case", c["from"], c["to"], c["numel"], c["input"], c["expected"], c["name"], sep="\t", file=f)
        for t in fp8:
            print("fp8", dims(t["weight_shape"]), dims(t["scale_shape"]), t["weight"], t["scale"], t["expected"],
                  t["expected_bf16"], t["name"], sep="\t", file=f)
        for t in mx:
            print("mxfp4", dims(t["blocks_shape"]), dims(t["scales_shape"]), t["blocks"], t["scales"], t["expected"],
                  t["name"], sep="\t", file=f)
    print(f"{len(w.cases)} conversion cases, {len(fp8)} fp8 block and {len(mx)} MXFP4 tensors in {out}")


if __name__ == "__main__":
    main()
