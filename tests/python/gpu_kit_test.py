#!/usr/bin/env python3
"""The GPU kit end to end without a GPU: `benchmark/gpu-kit build` from this build tree's programs
(--from-build, no wheels), then the kit's `run` against the emulated driver on the 20,000-tensor
file, and checks that every step ran or said why not, that what could run here did (tests,
runtime interop through the driver, host memory, the gpu benchmark, the seed's iterations), that
the peers' and sanitizer's steps say why they cannot, and that the JSON, the Markdown table and
the summary hold every goal. The cold steps drop the machine's page cache: they run only under CI
(CI=true), and say why not elsewhere. Also: a bad argument is exit code 2, and a step that cannot
finish in the run's budget says so while the rest go on.

    gpu_kit_test.py --source SRC --build BUILD --emulated-driver DIR --work DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

GOALS = ["every GPU test passes", "compute-sanitizer clean", "the pinned host-to-device copy",
         "the faster of fastsafetensors and instanttensor", "the disk's read rate",
         "host memory added during a load", "device bytes equal file bytes"]
STATUSES = {"passed", "ran", "skipped", "failed", "timed out"}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    print(p.stdout[-6000:], p.stderr[-3000:], sep="\n", flush=True)
    return p


def step(results, name):
    return next((s for s in results["steps"] if s["name"] == name), None)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--emulated-driver", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args(argv)
    shutil.rmtree(a.work, ignore_errors=True)
    kit, out, work = (os.path.join(a.work, d) for d in ("kit", "out", "work"))
    cold = os.environ.get("CI") == "true"
    can_drop = os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)

    p = run([sys.executable, os.path.join(a.source, "benchmark", "gpu-kit"), "build", kit, "--from-build", a.build,
             "--no-wheels"])
    if not check(p.returncode == 0, f"gpu-kit build: exit code {p.returncode}"):
        return finish()
    for f in ("run", "MANIFEST.json", "bin/cuda_test", "bin/bench_cpp", "bin/make_bench_files", "bin/gpu_host_memory",
              "lib/libruntime_interop.so", "scripts/run.py", "scripts/report.py", "scripts/load_report.py", "scripts/peers.py",
              "scripts/bench.py", "scripts/runtime_interop.py", "scripts/interop.py"):
        check(os.path.exists(os.path.join(kit, f)), f"the kit has no {f}")
    # Every GPU test program CMake declares runs in the kit (a program left out runs on no GPU).
    sys.path.insert(0, os.path.join(a.source, "benchmark", "gpu"))
    from steps import EXPECTED_API_ERRORS, TEST_PROGRAMS  # noqa: E402 (found through the source tree given)
    with open(os.path.join(a.source, "tests", "CMakeLists.txt")) as f:
        declared = re.findall(r"^\s*safetensors_gpu_test\((\w+)", f.read(), re.M)
    check(sorted(declared) == sorted(TEST_PROGRAMS),
          f"benchmark/gpu/steps.py TEST_PROGRAMS {sorted(TEST_PROGRAMS)} != tests/CMakeLists.txt's {sorted(declared)}")
    for prog in TEST_PROGRAMS:
        check(os.path.exists(os.path.join(kit, "bin", prog)) or prog == "dlpack_device_test", f"the kit has no bin/{prog}")
    for prog, name in EXPECTED_API_ERRORS.items():  # the sanitizer step names these tests
        listed = subprocess.run([os.path.join(kit, "bin", prog), "--gtest_list_tests"], capture_output=True,
                                text=True).stdout
        suite, _, test = name.partition(".")
        check(f"{suite}." in listed and f"  {test}" in listed, f"{prog} has no test {name}: {listed}")
    manifest = json.load(open(os.path.join(kit, "MANIFEST.json")))
    check(manifest.get("wheels_why") == "the kit was built with --no-wheels", f"manifest wheels_why: {manifest}")
    check(manifest.get("kit_bytes", 0) > 0, "the manifest gives the kit's size")

    env = dict(os.environ, SAFETENSORS_KIT_PYTHON=sys.executable)
    bad = run([os.path.join(kit, "run"), "--steps", "nonsense"], env=env)
    check(bad.returncode == 2 and "unknown step" in bad.stderr, f"a bad step name: exit code {bad.returncode}")

    cmd = [os.path.join(kit, "run"), "--emulated-driver", a.emulated_driver, "--files", "20k", "--runs", "2", "--iterations", "1,10", "--cpu-rounds", "1",
           "--out", out, "--work", work, "--budget", "800"] + (["--cold"] if cold else [])
    p = run(cmd, env=env)
    check(p.returncode == 0, f"the kit's run: exit code {p.returncode}")
    for f in ("results.json", "results.md", "summary.txt", "run.log", "raw.tar.gz"):
        check(os.path.exists(os.path.join(out, f)), f"the run wrote no {f}")
    try:
        results = json.load(open(os.path.join(out, "results.json")))
    except (OSError, ValueError) as e:
        check(False, f"results.json: {e}")
        return finish()

    names = [s["name"] for s in results["steps"]]
    check(names == ["environment", "files", "fixtures", "tests", "interop", "host_memory", "bench_warm", "peers_warm",
                    "python_warm", "bench_cold", "peers_cold", "python_cold", "cpu", "sanitizer", "iterations", "report"],
          f"steps in order: {names}")
    for s in results["steps"]:
        check(s["status"] in STATUSES, f"{s['name']}: unknown status {s['status']}")
        check(s["status"] not in ("failed", "timed out"), f"{s['name']}: {s['status']}: {s.get('why')}")
        if s["status"] == "skipped":
            check(len(s.get("why", "")) > 10, f"{s['name']} skipped without saying why")

    env_data = step(results, "environment")["data"]
    check(env_data.get("emulated_driver") is True, f"the environment step sees the emulated driver: {env_data}")
    check(step(results, "files")["data"].get("files", {}).get("20k.safetensors", 0) > 1_000_000, "the 20k file")
    programs = step(results, "tests")["data"].get("programs", {})
    for prog in ("cuda_test", "cuda_upload_test", "cuda_stream_test", "cuda_save_test", "distributed_cuda_test"):
        entry = programs.get(prog, {})
        check(entry.get("status") == "passed" and entry.get("tests", 0) > 0, f"tests {prog}: {entry}")
    checked = programs.get("cuda_test", {}).get("bytes_checked", [])
    check(len([l for l in checked if "20k.safetensors" in l]) == 2, f"20k checked on both backends: {checked}")
    interop = step(results, "interop")
    provs = {p["provider"]: p for p in interop["data"].get("providers", [])}
    check(interop["status"] == "passed" and provs.get("driver", {}).get("status") == "passed", f"interop: {interop}")
    check(any("20k.safetensors" in n for n in provs.get("driver", {}).get("notes", [])), "interop checked the 20k file")
    mem = step(results, "host_memory")["data"].get("files", [{}])[0].get("backends", [])
    check(sorted(b["backend"] for b in mem) == ["mmap", "read"] and all(b["staging_bytes"] > 0 for b in mem),
          f"host memory of both backends beside a ring: {mem}")
    warm = {it["item"]: it for it in step(results, "bench_warm")["data"]["files"][0]["items"] +
            step(results, "bench_warm")["data"]["files"][0]["limits"]}
    check(all(k in warm and warm[k].get("median_s", 0) > 0 for k in ("gpu", "gpu one-shot", "pinned H2D")),
          f"bench_warm measured gpu, gpu one-shot and pinned H2D: {sorted(warm)}")
    for name in ("peers_warm", "peers_cold", "sanitizer"):
        s = step(results, name)
        check(s["status"] == "skipped", f"{name} cannot run under the emulated driver: {s}")
    # Cold: run under CI where the page cache may be dropped (bench.py's gpu items then say they
    # need torch), else skipped saying why.
    for name in ("bench_cold", "python_cold"):
        s = step(results, name)
        why = s.get("why", "")
        if not cold:
            ok = s["status"] == "skipped" and "--cold" in why
        elif not can_drop:
            ok = s["status"] == "skipped" and "root" in why
        else:
            ok = s["status"] == "ran" or (name == "python_cold" and s["status"] == "skipped" and "torch" in why)
        check(ok, f"{name} (CI={os.environ.get('CI')}, may drop the page cache: {can_drop}): {s['status']} ({why})")
    # The CPU goals on this machine's CPU: both files, the conversions, the table with its goals.
    cpu = step(results, "cpu")
    measured = cpu.get("data", {}).get("measured", [])
    check(cpu["status"] == "ran" and {"round1-cpp", "convert1-cpp"} <= set(measured), f"the cpu step: {cpu}")
    cpu_md = os.path.join(work, "cpu", "results.md")
    table = open(cpu_md).read() if os.path.exists(cpu_md) else ""
    check("| gpt2.safetensors | open |" in table and "| 20k.safetensors | load_copy |" in table,
          f"the cpu step's table ({cpu_md}) has gpt2's and the 20k file's rows")
    check(os.path.exists(os.path.join(work, "cpu", "raw", "round1-cpp.json")), "the cpu step keeps its raw JSON")
    check(any("| gpt2.safetensors | open |" in l for l in cpu.get("data", {}).get("table", [])),
          "results.json carries the cpu step's table")
    if shutil.which("taskset"):
        pinned = [l for l in cpu.get("data", {}).get("table", []) if " | open, both on CPU " in l]
        check("open1-cpp" in measured and any(l.startswith("| gpt2.safetensors | open, both on CPU ") for l in pinned),
              f"the cpu step's opens with both programs on one CPU: {pinned}")
    iters = step(results, "iterations")["data"]
    for n in (1, 10):
        entry = iters.get(f"20k.safetensors bench_cpp {n}", {})
        items = {it["item"]: it for it in entry.get("files", [{}])[0].get("items", [])}
        check(items.get("gpu", {}).get("per_iteration_s", 0) > 0, f"bench_cpp gpu over {n} iterations: {entry}")
    goals = results.get("goals", [])
    for g in GOALS:
        check(any(g in x["goal"] for x in goals), f"results.json has no goal like '{g}'")
    check(any(x["status"] == "met" and "every GPU test passes" in x["goal"] for x in goals), "the tests goal is met")
    check(any(x["status"] == "met" and x["goal"] == "device bytes equal file bytes" for x in goals), "the bytes goal")
    speed = [x for x in goals if "×" in x["goal"]]
    check(len(speed) == 3 and all(x["status"] == "not measured" and "emulated" in x["detail"] for x in speed),
          f"no speed goal is judged under the emulated driver: {speed}")

    md = open(os.path.join(out, "results.md")).read()
    check("| goal | file | verdict | measured |" in md, "results.md has the goals table")
    check("| Iterations | Python CPU |" in md, "results.md has the seed's iterations table")
    check("ours: Uploader::load" in md and "limit: one copy from pinned host memory" in md, "results.md warm table")
    summary = open(os.path.join(out, "summary.txt")).read()
    check("EMULATED DRIVER" in summary and "Goals:" in summary, "the summary says it is emulated, and the goals")
    check(len(summary.splitlines()) <= 60, f"the summary is one screen: {len(summary.splitlines())} lines")

    # A budget too small for a step: it says so, the rest still run, and the report is written.
    small = os.path.join(a.work, "small")
    p = run([os.path.join(kit, "run"), "--emulated-driver", a.emulated_driver, "--files", "20k", "--out", small,
             "--work", small + "-work", "--steps", "iterations", "--budget", "30"], env=env)
    check(p.returncode == 0, f"a run whose steps are skipped for time: exit code {p.returncode}")
    r = json.load(open(os.path.join(small, "results.json")))
    it = step(r, "iterations")
    check(step(r, "report")["status"] == "passed", f"the report of a short budget: {step(r, 'report')}")
    check(it["status"] in ("skipped", "ran") and "budget" in json.dumps(it), f"iterations on a 30 s budget: {it}")
    check(step(r, "tests")["why"] == "not among --steps", f"a step left out says so: {step(r, 'tests')}")
    return finish()


def finish():
    for f in failures:
        print("FAILED: " + f)
    print("ok" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
