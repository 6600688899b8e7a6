#!/usr/bin/env python3
"""The peer of benchmark/bench_remote: time Run:ai Model Streamer (`runai-model-streamer`, as
vLLM's `--load-format runai_streamer` uses it) bringing every tensor of a safetensors object on
an S3-compatible server into CPU memory. benchmark/remote runs it beside ours; it needs its own
Python environment (the streamer requires PyTorch): `.ci/setup model-streamer` makes one.

  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
  python benchmark/model_streamer.py --url s3://models/model.safetensors \
      --endpoint http://127.0.0.1:9123 --concurrency 16 --runs 5 [--local PATH]

Prints one JSON line per mode. Modes:
  streamer  runai_model_streamer.SafetensorsStreamer (default)
  plain     N threads doing ranged GETs with boto3 (a dependency of
            runai-model-streamer-s3) into one preallocated buffer: a baseline
  both      streamer, then plain

Each timed run starts before the streamer (and its S3 clients) is created, and
ends when the last tensor has been received and copied into memory that this
script owns (tensor.clone(), unless --no-copy is given). Teardown is not timed.
After each run, outside the timing, every tensor is checked byte for byte
against a reference: the --local file if given (its header must equal the
remote one), or else one whole-object GET made before the runs.

Exit codes: 2 bad arguments or missing credentials, 3 package missing,
4 server or object unreachable, 5 verification failed.
"""
import argparse
import json
import mmap
import os
import socket
import statistics
import struct
import sys
import time
from urllib.parse import urlparse


def die(code, msg):
    print(f"model_streamer: error: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="s3://bucket/key of a .safetensors object")
    p.add_argument("--endpoint", required=True, help="e.g. http://127.0.0.1:9123 (http or https)")
    p.add_argument("--concurrency", type=int, default=16, help="streamer S3 workers / plain-mode threads")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--local", help="local copy of the same file, used as the verification reference")
    p.add_argument("--mode", choices=["streamer", "plain", "both"], default="streamer")
    p.add_argument("--no-copy", action="store_true",
                   help="keep the streamer's own tensors instead of cloning each into fresh memory")
    p.add_argument("--not-owned", action="store_true",
                   help="stream_file(owned=False): tensors are views into reused ring buffers (copy required)")
    p.add_argument("--memory-limit", type=int, default=None,
                   help="RUNAI_STREAMER_MEMORY_LIMIT bytes (-1 unlimited, 0 min); default: package default")
    p.add_argument("--chunk-bytes", type=int, default=None,
                   help="RUNAI_STREAMER_CHUNK_BYTESIZE (min 5 MiB for S3; package default 8 MiB); also plain-mode part size")
    p.add_argument("--region", default=None, help="AWS_REGION to sign with if none is set (default us-east-1)")
    a = p.parse_args()
    u = urlparse(a.url)
    if u.scheme != "s3" or not u.netloc or not u.path.strip("/"):
        die(2, f"--url must be s3://bucket/key, got {a.url!r}")
    a.bucket, a.key = u.netloc, u.path.lstrip("/")
    e = urlparse(a.endpoint)
    if e.scheme not in ("http", "https") or not e.hostname:
        die(2, f"--endpoint must be http(s)://host[:port], got {a.endpoint!r}")
    a.host, a.port = e.hostname, e.port or (443 if e.scheme == "https" else 80)
    if a.concurrency < 1 or a.runs < 1:
        die(2, "--concurrency and --runs must be >= 1")
    if a.not_owned and a.no_copy:
        die(2, "--not-owned needs the copy: tensors are reused views")
    return a


def set_env(a):
    """Everything the streamer reads from the environment. Must happen before
    runai_model_streamer is imported (the C++ library reads it on start)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if not os.environ.get(var):
            die(2, f"{var} is not set; the streamer and this script take S3 credentials from the environment")
    env = {
        # custom endpoint, scheme included; http is accepted (docs/src/env-vars.md, s3_wrapper.cc log)
        "AWS_ENDPOINT_URL": a.endpoint,
        # path-style addressing (http://host:port/bucket/key): "should be 0 for S3 compatible"
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        # skip the IMDS probe of the AWS SDK's default credential chain (a few seconds' delay otherwise)
        "AWS_EC2_METADATA_DISABLED": "true",
        # object-storage workers; RUNAI_STREAMER_OBJ_CONCURRENCY wins, else CONCURRENCY, else 8
        "RUNAI_STREAMER_CONCURRENCY": str(a.concurrency),
        "RUNAI_STREAMER_OBJ_CONCURRENCY": str(a.concurrency),
    }
    if a.memory_limit is not None:
        env["RUNAI_STREAMER_MEMORY_LIMIT"] = str(a.memory_limit)
    if a.chunk_bytes is not None:
        env["RUNAI_STREAMER_CHUNK_BYTESIZE"] = str(a.chunk_bytes)
    os.environ.update(env)
    if not os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        os.environ["AWS_REGION"] = os.environ["AWS_DEFAULT_REGION"] = a.region or "us-east-1"
    os.environ.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")
    return env


def check_server(a):
    try:
        socket.create_connection((a.host, a.port), timeout=3).close()
    except OSError as ex:
        die(4, f"no S3 server at {a.endpoint}: {ex}")


def s3_client(a, pool=None):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        die(3, "boto3 missing (it comes with runai-model-streamer-s3): pip install runai-model-streamer-s3")
    return boto3.client(
        "s3", endpoint_url=a.endpoint,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=max(10, pool or 0),
                      retries={"max_attempts": 3}))


def read_header(client, a):
    """Ranged GETs of the 8-byte length and the JSON header: returns
    (object size, data offset, header dict, expected tensor bytes)."""
    try:
        size = client.head_object(Bucket=a.bucket, Key=a.key)["ContentLength"]
        (n,) = struct.unpack("<Q", client.get_object(Bucket=a.bucket, Key=a.key, Range="bytes=0-7")["Body"].read())
        raw = client.get_object(Bucket=a.bucket, Key=a.key, Range=f"bytes=8-{8 + n - 1}")["Body"].read()
    except Exception as ex:  # botocore errors, connection errors
        die(4, f"cannot read {a.url} from {a.endpoint}: {ex}")
    header = json.loads(raw)
    header.pop("__metadata__", None)
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())
    return size, 8 + n, header, total, raw


def reference(a, client, size, raw_header):
    """Bytes to verify against: the --local file (mmap), else one whole GET."""
    if a.local:
        f = open(a.local, "rb")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(m) != size or m[8:8 + len(raw_header)] != raw_header:
            die(5, f"--local {a.local} is not the same file as {a.url} (size or header differ)")
        return m
    return client.get_object(Bucket=a.bucket, Key=a.key)["Body"].read()


DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
          "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "C64": "complex64"}


def verify_tensors(tensors, header, data_off, ref):
    import numpy as np
    import torch
    if set(tensors) != set(header):
        return f"tensor names differ: missing {sorted(set(header) - set(tensors))[:5]}, extra {sorted(set(tensors) - set(header))[:5]}"
    refv = np.frombuffer(ref, dtype=np.uint8)
    for name, t in tensors.items():
        h = header[name]
        want = DTYPES.get(h["dtype"])
        if list(t.shape) != h["shape"] or (want and str(t.dtype) != "torch." + want):
            return f"{name}: shape/dtype {list(t.shape)} {t.dtype} != header {h['shape']} {h['dtype']}"
        b, e = h["data_offsets"]
        got = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        if got.size != e - b or not np.array_equal(got, refv[data_off + b:data_off + e]):
            return f"{name}: bytes differ from the reference"
    return None


def run_streamer(a, header, data_off, expected, ref):
    try:
        import torch
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as ex:
        die(3, f"runai-model-streamer (and torch) not importable: {ex}. pip install runai-model-streamer runai-model-streamer-s3")
    import importlib.util
    if importlib.util.find_spec("runai_model_streamer_s3") is None:
        die(3, "runai-model-streamer-s3 is not installed; the streamer cannot read s3:// without it")
    times = []
    for _ in range(a.runs):
        tensors = {}
        nbytes = 0
        t0 = time.perf_counter()
        with SafetensorsStreamer() as s:
            s.stream_file(a.url, owned=not a.not_owned)
            for name, t in s.get_tensors():
                if not a.no_copy:
                    t = t.clone()
                tensors[name] = t
                nbytes += t.numel() * t.element_size()
            t1 = time.perf_counter()
        times.append(t1 - t0)
        if nbytes != expected:
            die(5, f"streamer delivered {nbytes} bytes, header says {expected}")
        err = verify_tensors(tensors, header, data_off, ref)
        if err:
            die(5, f"streamer: {err}")
        del tensors
    from importlib.metadata import version
    return {"tool": "model_streamer", "version": version("runai-model-streamer"),
            "s3_plugin_version": version("runai-model-streamer-s3"), "torch": torch.__version__,
            "copy": not a.no_copy, "owned": not a.not_owned}, times, nbytes


def run_plain(a, size, data_off, expected, ref):
    """Baseline: the tensor data region split into parts, fetched by N threads with
    ranged GETs (one client per run), each part copied into one bytearray."""
    from concurrent.futures import ThreadPoolExecutor
    part = a.chunk_bytes or 8 * 1024 * 1024
    begin, end = data_off, data_off + expected
    ranges = [(o, min(end, o + part)) for o in range(begin, end, part)]
    times = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        client = s3_client(a, a.concurrency)
        buf = bytearray(expected)
        mv = memoryview(buf)

        def get(r):
            o, e = r
            body = client.get_object(Bucket=a.bucket, Key=a.key, Range=f"bytes={o}-{e - 1}")["Body"].read()
            if len(body) != e - o:
                raise IOError(f"short read at {o}: {len(body)} != {e - o}")
            mv[o - begin:e - begin] = body

        with ThreadPoolExecutor(a.concurrency) as ex:
            list(ex.map(get, ranges))
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if buf != ref[begin:end]:
            die(5, "plain: bytes differ from the reference")
        del buf, mv
    import boto3
    return {"tool": "plain_boto3_ranged_get", "version": boto3.__version__, "part_bytes": part}, times, expected


def main():
    a = parse_args()
    env = set_env(a)
    check_server(a)
    client = s3_client(a)
    size, data_off, header, expected, raw = read_header(client, a)
    if data_off + expected != size:
        print(f"model_streamer: note: header covers {expected} bytes, object has {size - data_off} after the header",
              file=sys.stderr)
    ref = reference(a, client, size, raw)
    modes = ["streamer", "plain"] if a.mode == "both" else [a.mode]
    for mode in modes:
        if mode == "streamer":
            info, times, nbytes = run_streamer(a, header, data_off, expected, ref)
        else:
            info, times, nbytes = run_plain(a, size, data_off, expected, ref)
        med = statistics.median(times)
        out = dict(info)
        out.update({"runs_s": [round(t, 4) for t in times], "median_s": round(med, 4), "bytes": nbytes,
                    "tensors": len(header), "gbps": round(nbytes * 8 / med / 1e9, 3),
                    "gb_per_s": round(nbytes / med / 1e9, 3),
                    "concurrency": a.concurrency, "verified": True,
                    "reference": "local" if a.local else "whole_get"})
        if mode == "streamer":
            out["env"] = env
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
