"""The steps of the GPU kit's run (benchmark/gpu/run.py says what each does): each takes the run
and the seconds it may use, and returns (status, why, data). Status: passed or failed (checks),
ran (measurements), skipped (with why), timed out."""
import glob
import json
import os
import platform
import re
import shutil
import time
import zipfile

from probe import step_probe
from runner import FILE_NAMES, HERE, KIT, bin_path, can_drop_caches, command, read_json, remaining, tail, tool

# In the order they run: correctness first, then the measurements, the slow and optional last.
STEPS = ["environment", "files", "fixtures", "tests", "interop", "host_memory", "bench_warm", "peers_warm",
         "python_warm", "bench_cold", "peers_cold", "python_cold", "cpu", "sanitizer", "iterations", "report"]
# Steps that run only when --steps names them, after the others (before the report): the probe
# (probe.py) decides between upload paths on a GPU, a few minutes of device time of its own.
OPTIONAL_STEPS = ["probe"]
# Every program tests/CMakeLists.txt declares with safetensors_gpu_test (the kit's test checks
# that the two lists agree, and that benchmark/gpu-kit packs each).
TEST_PROGRAMS = ["cuda_test", "cuda_upload_test", "cuda_stream_test", "cuda_save_test", "distributed_cuda_test",
                 "dlpack_device_test"]
# Each program's GPU tests (the rest are CPU tests, run by ctest elsewhere).
GPU_FILTER = {"cuda_test": "CudaGpu*"}
# Tests that hand the driver a bad address on purpose (the library must turn the driver's
# refusal into an Error): memcheck reports each refused call as an error, so they run under it
# on their own with API-error reports off (memory errors are still reported). The kit's test
# checks that each name exists.
EXPECTED_API_ERRORS = {"cuda_save_test": "CudaGpuSave.AFailureMidWayOrABadAddressLeavesNoFileAndTheTargetAsItWas"}


def step_environment(run, limit):
    d = {"machine": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
         "python_executable": run.python, "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            d["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        with open("/proc/cpuinfo") as f:  # what the conversions choose between at run time
            flags = next(l.split(":", 1)[1].split() for l in f if l.startswith("flags"))
        d["cpu_flags"] = " ".join(f for f in flags if f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                                             "avx512_bf16", "avx512_fp16", "amx_tile")) or "none of note"
        with open("/proc/meminfo") as f:
            d["memory_gib"] = round(next(int(l.split()[1]) for l in f if l.startswith("MemTotal")) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    smi = tool("nvidia-smi")
    if smi:
        rc, out = command(run, "environment", [smi, "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,"
                                               "pcie.link.width.max,pcie.link.gen.current,pcie.link.width.current",
                                               "--format=csv,noheader"], 30)
        d["gpus"] = [l.strip() for l in out.splitlines() if l.strip()] if rc == 0 else f"nvidia-smi failed: {tail(out)}"
        rc, out = command(run, "environment", [smi], 30)
        for line in out.splitlines():
            if "CUDA Version" in line:
                d["nvidia_smi_header"] = " ".join(line.strip("| ").split())
        # NUMA: the nodes online and each GPU's node, as the library finds it (numa.rs).
        rc, out = command(run, "environment", [smi, "--query-gpu=pci.bus_id", "--format=csv,noheader"], 30)
        try:
            with open("/sys/devices/system/node/online") as f:
                numa = [f"nodes online {f.read().strip()}"]
        except OSError:
            numa = ["no /sys/devices/system/node"]
        for bus in (l.strip() for l in out.splitlines() if rc == 0 and l.strip()):
            addr = bus.lower()[-12:]  # 00000000:3B:00.0 -> 0000:3b:00.0
            try:
                with open(f"/sys/bus/pci/devices/{addr}/numa_node") as f:
                    numa.append(f"GPU {addr}: node {f.read().strip()}")
            except OSError as e:
                numa.append(f"GPU {addr}: {e.strerror}")
        d["numa"] = "; ".join(numa)
    else:
        d["gpus"] = "nvidia-smi not found"
    probe = ("import ctypes, json\n"
             "out = {}\n"
             "try:\n"
             "    cu = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); cu.cuInit(0)\n"
             "    cu.cuDriverGetVersion(ctypes.byref(v)); out['cuda_driver_api'] = f'{v.value // 1000}.{v.value % 1000 // 10}'\n"
             "    out['emulated_driver'] = hasattr(cu, 'fakecuda_hold')\n"
             "except OSError as e:\n"
             "    out['cuda_driver_api'] = f'no libcuda.so.1: {e}'\n"
             "for m in ('numpy', 'safetensors', 'torch', 'cupy', 'matplotlib'):\n"
             "    try:\n"
             "        mod = __import__(m); out[m] = getattr(mod, '__version__', '?')\n"
             "    except Exception as e:\n"
             "        out[m] = f'not importable: {type(e).__name__}: {e}'[:200]\n"
             "try:\n"
             "    import torch\n"
             "    out['torch_cuda'] = torch.version.cuda\n"
             "    out['torch_sees_gpu'] = torch.cuda.is_available()\n"
             "    if out['torch_sees_gpu']: out['torch_device'] = torch.cuda.get_device_name(0)\n"
             "except Exception:\n"
             "    pass\n"
             "print('PROBE ' + json.dumps(out))\n")
    if run.a.emulated_driver:  # PyTorch and CuPy would meet the emulated driver
        probe = probe.replace("'torch', 'cupy', ", "").replace("    import torch\n", "    raise ImportError\n")
    rc, out = command(run, "environment", [run.python, "-c", probe], min(limit, 120))
    for line in out.splitlines():
        if line.startswith("PROBE "):
            d.update(json.loads(line[6:]))
    for name, args in (("nvcc", ["--version"]), ("compute-sanitizer", ["--version"])):
        path = tool(name)
        if path:
            rc, out = command(run, "environment", [path] + args, 30)
            d[name] = tail(out, 2)
        else:
            d[name] = "not found"
    rc, out = command(run, "environment", ["df", "-PTh", run.a.work], 30)
    d["work_disk"] = out.strip().splitlines()[-1] if rc == 0 and out.strip() else "df failed"
    d["drop_caches"] = can_drop_caches() or "allowed"
    d["driver_under_test"] = f"emulated ({run.a.emulated_driver})" if run.a.emulated_driver else "this machine's"
    wheel_python = run.manifest.get("wheels_python")
    if wheel_python and platform.python_version().rsplit(".", 1)[0] != wheel_python:
        d["wheels_note"] = f"the kit's wheels are for Python {wheel_python}; this is {platform.python_version()}"
    for k in ("cpu", "cpu_flags", "gpus", "numa", "nvidia_smi_header", "cuda_driver_api", "torch", "torch_cuda", "torch_device", "cupy", "nvcc",
              "compute-sanitizer", "python", "work_disk", "drop_caches", "driver_under_test", "wheels_note"):
        if k in d:
            run.say(f"    {k}: {d[k]}")
    return "ran", None, d


def step_files(run, limit):
    os.makedirs(os.path.join(run.a.work, "files"), exist_ok=True)
    rc, out = command(run, "files", [bin_path("make_bench_files"), os.path.join(run.a.work, "files")] + run.a.files,
                      limit, echo=True)
    if rc is None:
        return "timed out", f"make_bench_files did not finish in {limit:.0f} s", {}
    missing = [f for f in run.files if not os.path.isfile(f)]
    if rc != 0 or missing:
        return "failed", f"make_bench_files exit code {rc}: {tail(out)}", {}
    return "passed", None, {"files": {os.path.basename(f): os.path.getsize(f) for f in run.files}}


def step_fixtures(run, limit):
    out_dir = os.path.join(run.a.work, "fixtures", "shards")
    rc, out = command(run, "fixtures", [run.python, os.path.join(HERE, "interop.py"), "shards", out_dir], limit)
    if rc == 0:
        return "passed", None, {"dir": out_dir}
    why = f"tests/python/interop.py shards: exit code {rc}: {tail(out, 2)}"
    return "skipped", why + " (the sharded-checkpoint GPU test will say it is skipped)", {}


def gtest_counts(report):
    """(tests, failed names with their first message, skipped names) from a GoogleTest JSON report."""
    tests, failed, skipped = 0, [], []
    for suite in (report or {}).get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite['name']}.{t['name']}"
            tests += 1
            if t.get("failures"):
                failed.append(f"{name}: {t['failures'][0].get('failure', '').splitlines()[0][:200]}")
            elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                skipped.append(name)
    return tests, failed, skipped


def step_tests(run, limit):
    env = dict(run.env)
    env["SAFETENSORS_GPU_TEST_FILES"] = ":".join(run.files)
    env["SAFETENSORS_FIXTURES"] = os.path.join(run.a.work, "fixtures")
    data, failed_any, no_gpu = {}, False, []
    out_dir = os.path.join(run.a.work, "tests")
    os.makedirs(out_dir, exist_ok=True)
    step_end = time.time() + limit
    for prog in TEST_PROGRAMS:
        path = bin_path(prog)
        if not os.path.exists(path):
            data[prog] = {"status": "skipped", "why": "not in the kit (not built: dlpack_device_test needs dlpack.h "
                                                      "where the kit was built)"}
            continue
        left = remaining(run, step_end)
        if left < 20:
            data[prog] = {"status": "skipped", "why": f"the step's time is spent ({left:.0f} s left)"}
            failed_any = True
            continue
        report = os.path.join(out_dir, prog + ".json")
        if os.path.exists(report):
            os.remove(report)
        cmd = [path, f"--gtest_output=json:{report}"]
        t0 = time.time()
        rc, out = command(run, "tests-" + prog, cmd, min(300, left), env=env)
        tests, failed, skipped = gtest_counts(read_json(report))
        entry = {"exit_code": rc, "tests": tests, "failed": failed, "skipped": len(skipped),
                 "skipped_names": skipped[:40], "seconds": round(time.time() - t0, 1),
                 "bytes_checked": [l.strip() for l in out.splitlines() if "bytes checked" in l]}
        if "no usable GPU" in out:
            no_gpu.append(prog)
            entry["why"] = next(l.strip() for l in out.splitlines() if "no usable GPU" in l)[:300]
        if rc is None:
            entry["status"], entry["why"] = "timed out", f"killed after {min(300, left):.0f} s"
        elif prog in no_gpu:
            entry["status"] = "failed"  # on the machine this kit is for, a GPU test that skips is a failure
        elif rc != 0 or failed:
            entry["status"] = "failed"
            entry.setdefault("why", tail(out, 3) if not failed else f"{len(failed)} failed")
        else:
            entry["status"] = "passed"
        failed_any |= entry["status"] != "passed"
        data[prog] = entry
        run.say(f"    {prog}: {entry['status']}, {tests} tests, {len(failed)} failed, {len(skipped)} skipped "
                f"({entry['seconds']} s)" + (f": {entry.get('why')}" if entry["status"] != "passed" else ""))
        for f in failed[:5]:
            run.say(f"      FAILED {f}")
    if no_gpu:
        return "failed", f"the GPU tests skipped in {', '.join(no_gpu)}: no usable GPU", {"programs": data}
    if failed_any:
        bad = [p for p, e in data.items() if e["status"] not in ("passed",) and not e.get("why", "").startswith("not in")]
        return "failed", "not passed: " + ", ".join(f"{p} ({data[p]['status']})" for p in bad), {"programs": data}
    return "passed", None, {"programs": data}


def step_interop(run, limit):
    lib = os.path.join(KIT, "lib", "libruntime_interop.so")
    if not os.path.exists(lib):
        return "skipped", "the kit has no lib/libruntime_interop.so", {}
    # Against the emulated driver only the driver provider can run: PyTorch and CuPy would meet it.
    provider = "driver" if run.a.emulated_driver else "all"
    out_json = os.path.join(run.a.work, "interop.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    rc, out = command(run, "interop", [run.python, os.path.join(HERE, "runtime_interop.py"), "--lib", lib,
                                       "--provider", provider, "--json", out_json] + run.files, limit, echo=True)
    data = read_json(out_json) or {}
    if rc is None:
        return "timed out", f"killed after {limit:.0f} s", data
    if rc == 1:
        bad = [p for p in data.get("providers", []) if p["status"] == "failed"]
        return "failed", "; ".join(f"{p['provider']}: {p['why']}" for p in bad) or tail(out), data
    if rc == 77:
        return "skipped", "no provider could run: " + "; ".join(
            f"{p['provider']}: {p.get('why')}" for p in data.get("providers", [])), data
    if rc != 0:
        return "failed", f"exit code {rc}: {tail(out)}", data
    return "passed", None, data


def step_host_memory(run, limit):
    out_json = os.path.join(run.a.work, "host_memory.json")
    rc, out = command(run, "host_memory", [bin_path("gpu_host_memory"), "--json", out_json] + run.files, limit,
                      echo=True)
    data = read_json(out_json) or {}
    if rc is None:
        return "timed out", f"killed after {limit:.0f} s", data
    if rc != 0:
        return "failed", f"exit code {rc}: {tail(out)}", data
    if "skipped" in data:
        return "skipped", data["skipped"], data
    return "ran", None, data


def runs_args(run, cold):
    if run.a.runs:
        return ["--runs", str(run.a.runs)]
    large = any(os.path.getsize(f) > (2 << 30) for f in run.files if os.path.exists(f))
    return ["--runs", "3" if large else ("5" if cold else "7")]


def cold_refusal(run):
    if run.a.emulated_driver and not run.a.cold:
        return ("under the emulated driver the cold steps run only with --cold: they drop the page cache of "
                "the whole machine")
    return can_drop_caches()


def bench_json(run, name, rc, out, out_json, limit):
    data = read_json(out_json) or {}
    if rc is None:
        return "timed out", f"killed after {limit:.0f} s", data
    if rc != 0:
        return "failed", f"exit code {rc}: {tail(out)}", data
    items = [it for fe in data.get("files", []) for it in fe.get("items", [])]
    ran = [it for it in items if "skipped" not in it]
    if not ran:
        whys = sorted({it["skipped"] for it in items if "skipped" in it})
        return "skipped", "; ".join(whys) or "nothing measured", data
    return "ran", None, data


def step_bench(run, limit, cold):
    if cold and cold_refusal(run):
        return "skipped", cold_refusal(run), {}
    name = "bench_cold" if cold else "bench_warm"
    out_json = os.path.join(run.a.work, name + ".json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd = [bin_path("bench_cpp"), "--items", "disk,gpu" if cold else "gpu,ranks"] + (["--cold"] if cold else [])
    env = None
    if run.a.emulated_driver:
        # Its figures say nothing about a GPU, and its cost model's 100 µs a copy made the ranks
        # item (a copy per tensor and rank: 20,000 tensors, 2 and 4 ranks, two ways) take minutes
        # on a 2-core machine, past the step's limit: no latency unless one is asked for.
        env = dict(run.env)
        env.setdefault("SAFETENSORS_FAKE_CUDA_LATENCY_US", "0")
    rc, out = command(run, name, cmd + runs_args(run, cold) + ["--json", out_json] + run.files, limit, env=env,
                      echo=True)
    return bench_json(run, name, rc, out, out_json, limit)


def step_python(run, limit, cold):
    if cold and cold_refusal(run):
        return "skipped", cold_refusal(run), {}
    name = "python_cold" if cold else "python_warm"
    out_json = os.path.join(run.a.work, name + ".json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd = [run.python, os.path.join(HERE, "bench.py"), "--items", "gpu"] + (["--cold"] if cold else [])
    rc, out = command(run, name, cmd + runs_args(run, cold) + ["--json", out_json] + run.files, limit, echo=True)
    if rc == 1 and "needs safetensors" in out:
        return "skipped", tail(out, 1), {}
    return bench_json(run, name, rc, out, out_json, limit)


def install_wheels(run):
    """Unpacks the kit's wheels into WORK/site (a wheel is a zip of its package and dist-info);
    returns (site folder or None, why not)."""
    wheels = sorted(glob.glob(os.path.join(KIT, "wheels", "*.whl")))
    if not wheels:
        return None, run.manifest.get("wheels_why", "the kit holds no wheels")
    want = run.manifest.get("wheels_python")
    have = platform.python_version().rsplit(".", 1)[0]
    if want and want != have:
        return None, f"the kit's wheels are built for CPython {want} and this Python is {have}"
    site = os.path.join(run.a.work, "site")
    if not os.path.isdir(site):
        os.makedirs(site + ".tmp", exist_ok=True)
        for w in wheels:
            with zipfile.ZipFile(w) as z:
                z.extractall(site + ".tmp")
        os.replace(site + ".tmp", site)
    return site, None


def step_peers(run, limit, cold):
    if cold and cold_refusal(run):
        return "skipped", cold_refusal(run), {}
    if run.a.emulated_driver:
        return "skipped", "fastsafetensors and instanttensor need the CUDA runtime, which the emulated driver is not", {}
    site, why = install_wheels(run)
    if not site:
        return "skipped", why, {}
    name = "peers_cold" if cold else "peers_warm"
    out_json = os.path.join(run.a.work, name + ".json")
    if os.path.exists(out_json):
        os.remove(out_json)
    env = dict(run.env)
    env["PYTHONPATH"] = site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [run.python, os.path.join(HERE, "peers.py")] + (["--cold"] if cold else ["--check"])
    rc, out = command(run, name, cmd + runs_args(run, cold) + ["--json", out_json] + run.files, limit, env=env,
                      echo=True)
    return bench_json(run, name, rc, out, out_json, limit)


SANITIZER_TOOLS = ["memcheck", "racecheck", "synccheck"]


def parse_sanitizer(out):
    """(errors, API errors, hazards) that compute-sanitizer reported."""
    errors = api = 0
    for line in out.splitlines():
        s = line.strip()
        if "ERROR SUMMARY:" in s or "RACECHECK SUMMARY:" in s:
            words = s.split(":", 1)[1].split()
            if words and words[0].isdigit():
                errors += int(words[0])
        if "Program hit" in s and "on CUDA API call" in s:
            api += 1
    return errors, api


def step_sanitizer(run, limit):
    if run.a.emulated_driver:
        return "skipped", "compute-sanitizer needs a real GPU and driver (the emulated driver is in use)", {}
    cs = tool("compute-sanitizer")
    if not cs:
        return "skipped", "compute-sanitizer not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/*/bin)", {}
    env = dict(run.env)
    env["SAFETENSORS_FIXTURES"] = os.path.join(run.a.work, "fixtures")
    env.pop("SAFETENSORS_GPU_TEST_FILES", None)  # the tests' own small files: the tools slow every copy
    data, problems, incomplete = {}, [], []
    step_end = time.time() + limit
    for t in SANITIZER_TOOLS:
        for prog in TEST_PROGRAMS:
            path = bin_path(prog)
            if not os.path.exists(path):
                continue
            left = remaining(run, step_end)
            key = f"{t} {prog}"
            if left < 15:
                data[key] = {"status": "skipped", "why": f"the step's time is spent ({left:.0f} s left): "
                                                         f"run it alone with --steps sanitizer"}
                incomplete.append(key)
                continue
            cap = min(150, left)
            base = [cs, "--tool", t, "--error-exitcode", "99", "--print-limit", "20"]
            expected = EXPECTED_API_ERRORS.get(prog)
            gfilter = GPU_FILTER.get(prog, "*") + (f"-{expected}" if expected else "")
            rc, out = command(run, f"sanitizer-{t}-{prog}", base + [path, "--gtest_filter=" + gfilter], cap, env=env)
            if expected and rc == 0 and t == "memcheck":
                rc, more = command(run, f"sanitizer-{t}-{prog}-expected-api-errors",
                                   base + ["--report-api-errors", "no", path, "--gtest_filter=" + expected],
                                   max(10, remaining(run, step_end)), env=env)
                out += more
            errors, api = parse_sanitizer(out)
            entry = {"exit_code": rc, "errors": errors, "api_errors": api}
            if rc is None:
                entry.update(status="timed out", why=f"killed after {cap:.0f} s")
                incomplete.append(key)
            elif rc == 99 or errors:
                entry.update(status="failed", why=f"{errors} errors reported ({api} on CUDA API calls)")
                problems.append(key)
            elif rc != 0:
                entry.update(status="failed", why=f"exit code {rc} (a test failed under the tool): {tail(out, 2)}")
                problems.append(key)
            else:
                entry["status"] = "passed"
            data[key] = entry
            run.say(f"    {key}: {entry['status']}" + (f" ({entry['why']})" if "why" in entry else ""))
    note = ("racecheck and synccheck check device code (shared memory, barriers); this library launches no "
            "kernels, so they only show that the tests run cleanly under them")
    if problems:
        return "failed", "errors under " + ", ".join(problems), {"runs": data, "note": note}
    if incomplete:
        return "timed out", "did not finish: " + ", ".join(incomplete), {"runs": data, "note": note}
    return "passed", None, {"runs": data, "note": note}


def step_iterations(run, limit):
    """The seed README's form, MODEL ITERATIONS, for 1, 10 and 100 iterations: each count a
    fresh process. A count whose estimate (from the previous count) does not fit in the time
    left is skipped, saying so."""
    data, skipped = {}, []
    step_end = time.time() + limit
    for path in run.files:
        # (seconds a process takes besides its iterations, seconds per iteration): from the last
        # count measured, for the next count's estimate
        cost = {"bench_cpp": (0.0, 0.0), "bench.py": (0.0, 0.0)}
        for n in run.a.iterations:
            for tool_name, cmd in (("bench_cpp", [bin_path("bench_cpp"), "--items", "open,load,gpu"]),
                                   ("bench.py", [run.python, os.path.join(HERE, "bench.py"), "--items", "load,gpu"])):
                key = f"{os.path.basename(path)} {tool_name} {n}"
                left = remaining(run, step_end)
                estimate = cost[tool_name][0] + cost[tool_name][1] * n * 1.2 + 5
                if estimate > left:
                    data[key] = {"skipped": f"would take about {estimate:.0f} s, {left:.0f} s left in the run's budget"}
                    skipped.append(key)
                    continue
                out_json = os.path.join(run.a.work, f"iter-{tool_name}-{os.path.basename(path)}-{n}.json")
                t0 = time.time()
                rc, out = command(run, "iterations", cmd + ["--json", out_json, path, str(n)], left)
                took = time.time() - t0
                result = read_json(out_json)
                if rc != 0 or not result:
                    why = "timed out" if rc is None else f"exit code {rc}: {tail(out, 2)}"
                    if rc == 1 and "needs safetensors" in out:
                        why = tail(out, 1)
                    data[key] = {"skipped": why}
                    skipped.append(key)
                    continue
                data[key] = result
                items = {it["item"]: it for it in result["files"][0]["items"]}
                per = sum(it.get("per_iteration_s", 0) for it in items.values())
                cost[tool_name] = (max(0.0, took - per * n), per)
                cells = [f"{k} {v['per_iteration_s']:.4f} s" if "per_iteration_s" in v else f"{k} skipped"
                         for k, v in items.items()]
                run.say(f"    {key}: " + ", ".join(cells))
    if len(skipped) == len(data):
        return "skipped", "nothing measured: " + "; ".join(f"{k}: {data[k]['skipped']}" for k in skipped[:3]), data
    return "ran", ("not measured: " + ", ".join(skipped)) if skipped else None, data


# The cpu step's work: what benchmark/run measures (open, every byte through the mapping, owned
# copies, slices; syoyo/safetensors-cpp where bench_cpp was built with it) and the conversions,
# both programs. Not save: it measures the work folder's disk, not the CPU.
CPU_CPP_ITEMS = "open,load,load_copy,slice,peer"
CPU_PY_ITEMS = "open,load,load_copy,slice"
CPU_FILES = ["gpt2", "20k"]


def step_cpu(run, limit):
    """The CPU goals on this machine's CPU (the machine that lends a GPU is a second CPU model):
    bench_cpp and bench.py in --cpu-rounds interleaved rounds on gpt2 and the 20,000-tensor file,
    each round also both programs' opens with both pinned to one CPU (the table's "open, both on
    CPU N" rows), then the conversions of both programs, then load_copy on one core, then benchmark/report.py's
    table. Everything lands in WORK/cpu (raw JSON under WORK/cpu/raw), which raw.tar.gz carries
    (the device tool brings back few files); the table and the goals' verdicts are also in the
    step's data. A round whose estimate does not fit in the time left is not started, saying so."""
    out_dir = os.path.join(run.a.work, "cpu")
    raw = os.path.join(out_dir, "raw")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(raw)
    step_end = time.time() + limit
    files_dir = os.path.join(run.a.work, "files")
    paths = [os.path.join(files_dir, FILE_NAMES[n]) for n in CPU_FILES]
    missing = [n for n, p in zip(CPU_FILES, paths) if not os.path.isfile(p)]
    if missing:
        rc, out = command(run, "cpu", [bin_path("make_bench_files"), files_dir] + missing, remaining(run, step_end))
        if rc != 0:
            return "failed", f"make_bench_files {' '.join(missing)}: exit code {rc}: {tail(out)}", {}
    runs = ["--runs", str(run.a.runs)] if run.a.runs else []
    has_py = os.path.exists(os.path.join(HERE, "bench.py"))
    plan = []  # (name, command): one round is bench_cpp, bench.py, both opens on one CPU, conversions
    taskset = tool("taskset")
    # The opens again with both programs on one CPU, the last this process may use (CPU 0 takes
    # most interrupts): on a virtual machine whose CPUs run at different speeds (the lent Xeon: the
    # same open of gpt2 took 37 us in one process and 56 us in the next, every phase slower, the
    # ones that touch no file too), two programs left to the scheduler can each land on a
    # different one, and their ratio says where they ran more than what they did.
    pin = ([taskset, "-c", str(max(os.sched_getaffinity(0)))]
           if taskset and hasattr(os, "sched_getaffinity") else None)
    for r in range(1, run.a.cpu_rounds + 1):
        plan.append((f"round{r}-cpp", [bin_path("bench_cpp"), "--items", CPU_CPP_ITEMS] + runs))
        if has_py:
            plan.append((f"round{r}-py", [run.python, os.path.join(HERE, "bench.py"), "--items", CPU_PY_ITEMS] + runs))
        if pin:
            # --runs 3 bounds the limits bench_cpp measures beside; an open always takes 201 runs.
            plan.append((f"open{r}-cpp", pin + [bin_path("bench_cpp"), "--items", "open", "--runs", "3"]))
            if has_py:
                plan.append((f"open{r}-py", pin + [run.python, os.path.join(HERE, "bench.py"), "--items", "open",
                                                   "--runs", "3"]))
        plan.append((f"convert{r}-cpp", [bin_path("bench_cpp"), "--items", "convert"] + (runs or ["--runs", "5"])))
        if has_py:
            plan.append((f"convert{r}-py", [run.python, os.path.join(HERE, "bench.py"), "--items", "convert"] +
                         (runs or ["--runs", "5"])))
    if taskset:
        plan.append(("load_copy-one-core", [taskset, "-c", "0", bin_path("bench_cpp"), "--items", "load_copy",
                                            "--runs", str(run.a.runs or 9)]))
    data, skipped, took = {}, [], {}
    for name, cmd in plan:
        kind = re.sub(r"\d+", "", name)
        left = remaining(run, step_end)
        estimate = took.get(kind, 0) * 1.3 + 3
        if estimate > left:
            skipped.append(f"{name} (about {estimate:.0f} s, {left:.0f} s left)")
            continue
        out_json = os.path.join(raw, name + ".json")
        t0 = time.time()
        # The conversions' buffers are their own (the file only names the run); load_copy on one
        # core is gpt2's goal.
        target = paths if name.startswith(("round", "open")) else paths[:1]
        rc, out = command(run, "cpu", cmd + ["--json", out_json] + target, left, echo=True)
        took[kind] = time.time() - t0
        if rc != 0 or not read_json(out_json):
            why = "timed out" if rc is None else f"exit code {rc}: {tail(out, 2)}"
            if rc == 1 and "needs safetensors" in out:
                why = tail(out, 1)
            skipped.append(f"{name}: {why}")
            continue
        data[name] = read_json(out_json)
    rounds = sorted(glob.glob(os.path.join(raw, "round*.json")))
    report = os.path.join(HERE, "load_report.py")
    result = {"measured": sorted(data), "out": out_dir}
    if rounds and os.path.exists(report):
        rc, out = command(run, "cpu", [run.python, report, "--out", out_dir] + rounds, max(remaining(run, step_end), 20))
        if rc != 0:
            skipped.append(f"load_report.py: exit code {rc}: {tail(out, 2)}")
        else:
            result["table"] = [l for l in out.splitlines() if l.startswith("|")]
            result["goals_missed"] = [l for l in out.splitlines() if l.startswith("goal ")]
            for line in result["table"]:
                if "goal" not in line and "≥" in line:
                    run.say("    " + line)
            for line in result["goals_missed"]:
                run.say("    " + line)
    pinned = sorted(glob.glob(os.path.join(raw, "open*.json")))
    if pinned and os.path.exists(report):
        where = f"open, both on CPU {pin[2]}"
        rc, out = command(run, "cpu", [run.python, report, "--out", os.path.join(out_dir, "pinned")] + pinned,
                          max(remaining(run, step_end), 20))
        if rc != 0:
            skipped.append(f"load_report.py (pinned opens): exit code {rc}: {tail(out, 2)}")
        else:
            # Figures beside the goals, not goals: pinned, Python's own open of the 20,000-tensor
            # file was bimodal on the Xeon (36 or 60 ms a run), which flatters the ratio.
            rows = ["|".join(l.replace(" | open | ", f" | {where} | ", 1).split("|")[:-2] + [" (not a goal) ", ""])
                    for l in out.splitlines() if l.startswith("|") and " | open | " in l]
            result.setdefault("table", []).extend(rows)
            result["pinned_goals_missed"] = [l for l in out.splitlines() if l.startswith("goal ")]
            for line in rows:
                run.say("    " + line)
    if not data:
        return "skipped", "nothing measured: " + "; ".join(skipped[:3]), result
    return "ran", ("not measured: " + "; ".join(skipped)) if skipped else None, result


def step_report(run, limit):
    run.save()
    rc, out = command(run, "report", [run.python, os.path.join(HERE, "report.py"), "--out", run.a.out,
                                      os.path.join(run.a.out, "results.json")], max(limit, 20), echo=False)
    if rc != 0:
        return "failed", f"report.py exit code {rc}: {tail(out)}", {}
    made = [f for f in ("results.md", "chart.png", "summary.txt") if os.path.exists(os.path.join(run.a.out, f))]
    why = None if "chart.png" in made else "no chart: " + (tail(out, 1) or "matplotlib missing")
    return "passed", why, {"made": made}


STEP_FUNCTIONS = {
    "environment": (step_environment, 150),
    "files": (step_files, 240),
    "fixtures": (step_fixtures, 60),
    "tests": (step_tests, 600),
    "interop": (step_interop, 240),
    "host_memory": (step_host_memory, 120),
    "bench_warm": (step_bench, 200),
    "peers_warm": (step_peers, 240),
    "python_warm": (step_python, 200),
    "bench_cold": (step_bench, 300),
    "peers_cold": (step_peers, 240),
    "python_cold": (step_python, 240),
    "cpu": (step_cpu, 420),
    "sanitizer": (step_sanitizer, 240),
    "iterations": (step_iterations, 600),
    "probe": (step_probe, 420),
}
