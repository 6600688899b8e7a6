#!/usr/bin/env python3
"""Our uploads into a destination and a stream the CUDA runtime made: PyTorch or CuPy allocates
the device memory and creates the stream, our library (tests/cpp/runtime_interop.cpp, loaded with
ctypes) loads every tensor of a file into it with Uploader::load_into, and the runtime checks:

  - bytes: a copy the runtime enqueues on the same stream right after load_into returns (so it
    is ordered after our copies only through the stream) equals the file's bytes, tensor by
    tensor, read back by the runtime and compared with the file read here (its own header);
  - the caller's state: the current device and the thread's current CUDA context are the same
    after the call as before it, also on a thread with no current context at all (which must
    still have none after), and with another device current when there are two;
  - a capacity one byte short of the plan is refused.

    runtime_interop.py --lib LIBRARY [--provider NAME|all] [--json OUT] [FILE...]

Providers: torch (caching allocator; the stream is made busy first with torch.cuda._sleep),
torch-expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: memory the allocator maps
with the virtual-memory API), cupy (its memory pool, cudaMalloc), cupy-async (cudaMallocAsync),
driver (no runtime: cuDevicePrimaryCtxRetain + cuCtxSetCurrent, cuMemAlloc, cuStreamCreate,
exactly as the runtime does it; what runs against the emulated driver). `all` runs each in a
process of its own and reports each: ran and passed, failed (why), or skipped (why).

Every provider checks a file the script writes itself (assorted dtypes and odd sizes, one tensor
larger than a staging slot), then each FILE. Exit code 0: every provider that could run passed; 1: a check failed;
77: no provider could run.
"""
import argparse
import ctypes
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading

PROVIDERS = ["torch", "torch-expandable", "cupy", "cupy-async", "driver"]


class Skip(Exception):
    """The provider cannot run here (not installed, no GPU); the message says why."""


class Failed(Exception):
    """A check failed; the message says which and how."""


# ---- the driver, for what no runtime exposes: the thread's current context -------------------

class Driver:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise Skip(f"no CUDA driver (libcuda.so.1): {e}")
        self.call("cuInit", 0)

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise Failed(f"{name} returned CUDA error {rc}")

    def current_context(self):
        ctx = ctypes.c_void_p()
        self.call("cuCtxGetCurrent", ctypes.byref(ctx))
        return ctx.value

    def version(self):
        v = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return f"{v.value // 1000}.{v.value % 1000 // 10}"


# ---- the providers: who allocates, who owns the stream, who reads back -----------------------

class DriverRuntime:
    """The runtime's behaviour with driver calls: primary contexts, current per thread."""

    name = "driver"

    def __init__(self, drv):
        self.drv = drv
        n = ctypes.c_int()
        drv.call("cuDeviceGetCount", ctypes.byref(n))
        if n.value < 1:
            raise Skip("the driver reports no CUDA device")
        self.count = n.value
        self.lib = drv.lib
        self.lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
        self.lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.versions = {"driver": drv.version()}

    def device_count(self):
        return self.count

    def set_device(self, i):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.drv.call("cuDeviceGet", ctypes.byref(dev), i)
        self.drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.drv.call("cuCtxSetCurrent", ctx)

    def current_device(self):
        d = ctypes.c_int()
        self.drv.call("cuCtxGetDevice", ctypes.byref(d))
        return d.value

    def alloc(self, n):
        p = ctypes.c_uint64()
        self.drv.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(max(n, 1)))
        return p.value

    def ptr(self, buf):
        return buf

    def stream(self):
        s = ctypes.c_void_p()
        self.drv.call("cuStreamCreate", ctypes.byref(s), 1)  # non-blocking, like cudaStreamNonBlocking
        return s.value

    def stream_handle(self, s):
        return s

    def busy(self, s):
        """About 50 ms of host work queued on `s` (cuLaunchHostFunc) before our copies."""
        import time
        callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(0.05))
        self.keep = callback  # the driver calls it later, from its own thread
        self.lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.drv.call("cuLaunchHostFunc", s, ctypes.cast(callback, ctypes.c_void_p), None)
        return True

    def copy_after(self, s, buf, n):
        out = self.alloc(n)
        self.drv.call("cuMemcpyDtoDAsync_v2", out, buf, n, s)
        return out

    def sync(self, s):
        self.drv.call("cuStreamSynchronize", s)

    def to_host(self, buf, n):
        host = ctypes.create_string_buffer(max(n, 1))
        self.drv.call("cuMemcpyDtoH_v2", host, buf, n)
        return memoryview(host)[:n]

    def free(self, buf):
        self.drv.call("cuMemFree_v2", buf)

    def free_stream(self, s):
        self.drv.call("cuStreamDestroy_v2", s)


class TorchRuntime:
    name = "torch"

    def __init__(self, expandable):
        if expandable:
            self.name = "torch-expandable"
        try:
            import torch
        except ImportError as e:
            raise Skip(f"torch is not installed: {e}")
        if not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} sees no CUDA device")
        self.torch = torch
        torch.cuda.init()
        self.versions = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
        if expandable:
            settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            self.versions["PYTORCH_CUDA_ALLOC_CONF"] = settings

    def device_count(self):
        return self.torch.cuda.device_count()

    def set_device(self, i):
        self.torch.cuda.set_device(i)

    def current_device(self):
        return self.torch.cuda.current_device()

    def alloc(self, n):
        return self.torch.empty(max(n, 1), dtype=self.torch.uint8, device="cuda:0")

    def ptr(self, buf):
        return buf.data_ptr()

    def stream(self):
        return self.torch.cuda.Stream(device=0)

    def stream_handle(self, s):
        return s.cuda_stream

    def busy(self, s):
        """About 50 ms of GPU work queued on `s` before our copies."""
        sleep = getattr(self.torch.cuda, "_sleep", None)
        if sleep is None:
            return False
        with self.torch.cuda.stream(s):
            sleep(100_000_000)
        return True

    def copy_after(self, s, buf, n):
        with self.torch.cuda.stream(s):
            out = buf[:n].clone()
        return out

    def sync(self, s):
        s.synchronize()

    def to_host(self, buf, n):
        return memoryview(buf[:n].cpu().numpy())

    def free(self, buf):
        pass

    def free_stream(self, s):
        pass


class CupyRuntime:
    name = "cupy"

    def __init__(self, use_async):
        try:
            import cupy
        except ImportError as e:
            raise Skip(f"cupy is not installed: {e}")
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # cupy raises its own CUDARuntimeError
            raise Skip(f"cupy sees no CUDA device: {e}")
        if n < 1:
            raise Skip("cupy sees no CUDA device")
        self.cupy = cupy
        if use_async:
            self.name = "cupy-async"
            try:
                cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
            except Exception as e:
                raise Skip(f"cudaMallocAsync pools are not supported here: {e}")
        self.versions = {"cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion()}

    def device_count(self):
        return self.cupy.cuda.runtime.getDeviceCount()

    def set_device(self, i):
        self.cupy.cuda.Device(i).use()

    def current_device(self):
        return self.cupy.cuda.runtime.getDevice()

    def alloc(self, n):
        with self.cupy.cuda.Device(0):
            return self.cupy.empty(max(n, 1), dtype=self.cupy.uint8)

    def ptr(self, buf):
        return buf.data.ptr

    def stream(self):
        with self.cupy.cuda.Device(0):
            return self.cupy.cuda.Stream(non_blocking=True)

    def stream_handle(self, s):
        return s.ptr

    def busy(self, s):
        return False

    def copy_after(self, s, buf, n):
        with self.cupy.cuda.Device(0), s:
            return buf[:n].copy()

    def sync(self, s):
        s.synchronize()

    def to_host(self, buf, n):
        return memoryview(self.cupy.asnumpy(buf[:n]))

    def free(self, buf):
        pass

    def free_stream(self, s):
        pass


def make_runtime(name, drv):
    if name == "driver":
        return DriverRuntime(drv)
    if name.startswith("torch"):
        return TorchRuntime(expandable=name == "torch-expandable")
    return CupyRuntime(use_async=name == "cupy-async")


# ---- the library, through ctypes --------------------------------------------------------------

class Library:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.st_interop_last_error.restype = ctypes.c_char_p
        self.lib.st_interop_uploader.restype = ctypes.c_void_p
        self.lib.st_interop_uploader.argtypes = [ctypes.c_int]
        self.lib.st_interop_free.argtypes = [ctypes.c_void_p]
        self.lib.st_interop_plan.restype = ctypes.c_long
        self.lib.st_interop_plan.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.st_interop_load_into.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.c_size_t]

    def error(self):
        return self.lib.st_interop_last_error().decode(errors="replace")

    def plan(self, path):
        need = self.lib.st_interop_plan(path.encode(), None, 0)
        if need < 0:
            raise Failed(f"plan of {path}: {self.error()}")
        out = ctypes.create_string_buffer(need + 1)
        self.lib.st_interop_plan(path.encode(), out, need + 1)
        return json.loads(out.value.decode())

    def uploader(self, device):
        up = self.lib.st_interop_uploader(device)
        if not up:
            raise Failed(f"Uploader({device}): {self.error()}")
        return up

    def load_into(self, up, path, dst, capacity, stream):
        """0 once enqueued, else the error text."""
        rc = self.lib.st_interop_load_into(up, path.encode(), ctypes.c_void_p(dst), capacity, stream)
        return None if rc == 0 else self.error()


# ---- the file, read here ----------------------------------------------------------------------

def file_tensors(path):
    """{name: (begin, end)} absolute byte ranges in the file, from its own header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"}


def compare(path, plan, host):
    """Every placed tensor's bytes in `host` against the file's; raises Failed on the first mismatch."""
    host = host.cast("B") if host.format != "B" else host  # ctypes' buffers are char ('c') items
    ranges = file_tensors(path)
    if sorted(p["name"] for p in plan["placements"]) != sorted(ranges):
        raise Failed(f"{path}: the plan's tensors differ from the header's")
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(path) else b""
        for p in plan["placements"]:
            begin, end = ranges[p["name"]]
            if end - begin != p["bytes"]:
                raise Failed(f"{path}: {p['name']}: planned {p['bytes']} bytes, the file holds {end - begin}")
            if host[p["offset"]:p["offset"] + p["bytes"]] != data[begin:end]:
                raise Failed(f"{path}: {p['name']}: device bytes differ from the file's")


def write_test_file(path):
    """A file of assorted dtypes and odd sizes, one tensor larger than a 16 MiB staging slot."""
    specs = [("F32", [3, 5], 4), ("BF16", [7], 2), ("U8", [5, 3], 1), ("F64", [2, 2], 8), ("I8", [0], 1),
             ("F32", [1100, 4099], 4), ("F16", [257], 2)]
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for i, (dtype, shape, width) in enumerate(specs):
        n = width
        for s in shape:
            n *= s
        blobs.append(bytes((j * 13 + i * 7) & 0xFF for j in range(min(n, 1 << 16))) * (n // (1 << 16) + 1))
        blobs[-1] = blobs[-1][:n]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


# ---- the checks -------------------------------------------------------------------------------

def check_file(rt, lib, drv, path, notes):
    plan = lib.plan(path)
    total = plan["total"]
    rt.set_device(0)
    dst, s = rt.alloc(total), rt.stream()
    up = lib.uploader(0)
    try:
        # The caller's own state, before and after.
        device, ctx = rt.current_device(), drv.current_context()
        busy = rt.busy(s)
        err = lib.load_into(up, path, rt.ptr(dst), total, rt.stream_handle(s))
        if err:
            raise Failed(f"load_into: {err}")
        copy = rt.copy_after(s, dst, total)  # ordered after our copies only through the stream
        if (rt.current_device(), drv.current_context()) != (device, ctx):
            raise Failed(f"the caller's device/context changed: {device}/{ctx:#x} before, "
                         f"{rt.current_device()}/{drv.current_context() or 0:#x} after")
        rt.sync(s)
        compare(path, plan, rt.to_host(copy, total))
        rt.free(copy)
        notes.append(f"{os.path.basename(path)}: {total} bytes, {len(plan['placements'])} tensors"
                     + (" (stream busy first)" if busy else ""))

        # A thread on which the runtime never made a context current keeps none.
        outcome = {}

        def bare_thread():
            try:
                outcome["before"] = drv.current_context()
                outcome["err"] = lib.load_into(up, path, rt.ptr(dst), total, rt.stream_handle(s))
                outcome["after"] = drv.current_context()
            except Exception as e:  # reported below, on the main thread
                outcome["exc"] = e

        t = threading.Thread(target=bare_thread)
        t.start()
        t.join()
        if "exc" in outcome:
            raise outcome["exc"]
        if outcome["err"]:
            raise Failed(f"load_into from a thread without a context: {outcome['err']}")
        if outcome["after"] != outcome["before"]:
            raise Failed(f"a thread's current context went from {outcome['before']} to {outcome['after']}")
        rt.sync(s)
        compare(path, plan, rt.to_host(dst, total))
        notes.append("thread without a current context: bytes equal, still none current after")

        # Another device current: it stays current.
        if rt.device_count() >= 2:
            rt.set_device(1)
            before = (rt.current_device(), drv.current_context())
            err = lib.load_into(up, path, rt.ptr(dst), total, rt.stream_handle(s))
            after = (rt.current_device(), drv.current_context())
            rt.set_device(0)
            if err:
                raise Failed(f"load_into with device 1 current: {err}")
            if after != before:
                raise Failed(f"device 1 was current; after the call {after[0]} is")
            rt.sync(s)
            compare(path, plan, rt.to_host(dst, total))
            notes.append("device 1 current during the upload to device 0: unchanged")

        # One byte short of the plan is refused.
        if total > 0:
            err = lib.load_into(up, path, rt.ptr(dst), total - 1, rt.stream_handle(s))
            rt.sync(s)
            if not err:
                raise Failed("load_into accepted a capacity one byte short of the plan")
            notes.append(f"capacity one byte short refused: {err.splitlines()[0][:120]}")
    finally:
        lib.lib.st_interop_free(up)
        rt.free(dst)
        rt.free_stream(s)


def run_provider(name, library, files):
    """One provider in this process: {"provider", "status", "why"/"notes", "versions"}."""
    try:
        drv = Driver()
        rt = make_runtime(name, drv)
        lib = Library(library)
        notes = []
        for path in files:
            check_file(rt, lib, drv, path, notes)
        return {"provider": name, "status": "passed", "notes": notes, "versions": rt.versions}
    except Skip as e:
        return {"provider": name, "status": "skipped", "why": str(e)}
    except Failed as e:
        return {"provider": name, "status": "failed", "why": str(e)}
    except Exception as e:  # a runtime's own error (cupy, torch): a failure, with its text
        return {"provider": name, "status": "failed", "why": f"{type(e).__name__}: {e}"}


def run_all(library, files):
    """Each provider in a process of its own (fresh CUDA state, its own allocator settings)."""
    results = []
    for name in PROVIDERS:
        env = dict(os.environ)
        if name == "torch-expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        cmd = [sys.executable, os.path.abspath(__file__), "--lib", library, "--provider", name, "--json", "-"] + files
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            r = json.loads(lines[-1][7:]) if lines else {
                "provider": name, "status": "failed",
                "why": f"exit code {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}"}
        except subprocess.TimeoutExpired:
            r = {"provider": name, "status": "failed", "why": "timed out after 300 s"}
        results.append(r)
    return results


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="the runtime_interop shared library")
    ap.add_argument("--provider", default="all", choices=PROVIDERS + ["all"])
    ap.add_argument("--json", help="write the results here ('-': one RESULT line on stdout)")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        own = os.path.join(tmp, "interop.safetensors")
        write_test_file(own)
        files = [own] + [os.path.abspath(f) for f in a.files]
        results = run_all(a.lib, files) if a.provider == "all" else [run_provider(a.provider, a.lib, files)]
    if a.json == "-":
        print("RESULT " + json.dumps(results[0]))
    else:
        for r in results:
            detail = "; ".join(r.get("notes", [])) if r["status"] == "passed" else r["why"]
            print(f"{r['provider']:<17} {r['status']}: {detail}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"files": ["interop.safetensors (written by the check)"] + a.files, "providers": results}, f,
                          indent=1)
    statuses = {r["status"] for r in results}
    if "failed" in statuses:
        return 1
    return 0 if "passed" in statuses else 77


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
