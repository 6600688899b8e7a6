#!/usr/bin/env python3
"""The GPU verification run: every GPU check and measurement of this project in one command, on
a machine with an NVIDIA GPU, from a kit that `benchmark/gpu-kit build DIR` made elsewhere (this
file is DIR/scripts/run.py; DIR/run starts it).

    DIR/run [--out DIR] [--work DIR] [--large] [--files NAMES] [--steps NAMES] [--skip NAMES]
            [--budget SECONDS] [--runs N] [--iterations 1,10,100] [--cpu-rounds N]
            [--emulated-driver DIR] [--cold]

Steps, in this order (each either runs or says why not, and the rest go on):
  environment  the device, driver, CUDA, Python and package versions, the work folder's disk
  files        the benchmark files, generated here (make_bench_files): gpt2 (548 MB) by default,
               1b-mixed (~4.7 GB) with --large, or --files gpt2,1b,20k
  fixtures     the sharded checkpoint a GPU test reads (tests/python/interop.py shards)
  tests        every GPU test program against this machine's driver, with the benchmark files
               checked byte for byte on both backends (SAFETENSORS_GPU_TEST_FILES)
  interop      a destination and a stream made by the CUDA runtime (PyTorch, CuPy; the driver
               API as the runtime uses it), loaded into by our library: bytes, and the caller's
               device and context unchanged (tests/python/runtime_interop.py)
  host_memory  the host memory an upload adds, beside its staging ring (gpu_host_memory)
  bench_warm   bench_cpp's gpu item (every tensor into one allocation) beside one copy from
               pinned memory, the page cache warm; and its ranks item (2 and 4 threads as ranks,
               the multi-rank device load via the host and the device, beside one rank)
  peers_warm   fastsafetensors and instanttensor (wheels in the kit), the page cache warm
  python_warm  Python's safetensors load_file(device="cuda:0") and a naive torch .to("cuda:0")
  bench_cold   the same as bench_warm with the page cache dropped before every run, beside the
               disk's own rate (needs root)
  peers_cold, python_cold   the same, cold
  cpu          the CPU goals on this machine's CPU, a second CPU model beside the one CI builds on:
               bench_cpp and bench.py in --cpu-rounds (default 3) interleaved rounds on gpt2 and
               the 20,000-tensor file (open, load, load_copy, slice, and syoyo/safetensors-cpp
               when bench_cpp was built with it), each round's opens again with both programs
               pinned to one CPU, both programs' conversions, load_copy on one core, and
               benchmark/report.py's table with the goals (WORK/cpu, packed in raw.tar.gz)
  sanitizer    compute-sanitizer memcheck, racecheck and synccheck over the GPU tests (at most
               240 s in a full run: what does not fit says so; --steps sanitizer runs it alone)
  iterations   the seed README's table: time per iteration over 1, 10 and 100 iterations
               (--iterations), Python and C++, CPU and CUDA, for each file
  probe        only when named (--steps probe): what decides how uploads reach the link, in one
               bench_cpp process per file (gpt2 and 1b, generated when missing; --files others):
               the pinned copy, whole chunks (the schedule before stripes), the default, the read
               backend, zero-copy and the hybrid, interleaved; one traced load of each (link busy,
               first copy, drain); host copies beside DMA; the ring sweep; registration rates and
               stalls; the multi-rank loads; then the decision rule (docs/gpu.md). --budget 400
               leaves room for one rerun in 15 minutes of device time
  report       summary.txt, results.md, chart.png, results.json, run.log and raw.tar.gz under --out

--steps runs only the steps named (and environment, files, fixtures and report, which the others
stand on; files already generated are kept); --skip leaves steps out. --budget (default 560 s)
bounds the whole run: each step gets at most what is left (less the report's share), and a step
with too little time left says so instead of running. Results are written after every step, so
a run stopped from outside still leaves them. --emulated-driver DIR runs everything against the
emulated driver in DIR instead (the kit's own test; cold steps then only with --cold, since they
drop the whole machine's page cache). Exit code 0 when every step ran or said why not; 1 when a
check failed; 2 for a bad argument.

This file holds the command line and the order of the steps; runner.py the run's state and its
commands; steps.py each step; report.py the goals, tables and chart.
"""
import argparse
import glob
import os
import shutil
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner import FILE_NAMES, KIT, REPORT_RESERVE, Run  # noqa: E402 (the kit's folder, first)
from steps import OPTIONAL_STEPS, STEP_FUNCTIONS, STEPS, step_report  # noqa: E402


def run_step(run, name, why_not=None):
    t0 = time.time()
    run.say(f"== {name}")
    if why_not:
        status, why, data = "skipped", why_not, {}
    else:
        left = run.left() - (0 if name == "report" else REPORT_RESERVE)
        if left < 10 and name != "report":
            status, why, data = "skipped", f"the run's time budget (--budget {run.a.budget:.0f} s) is spent", {}
        else:
            try:
                if name == "report":
                    status, why, data = step_report(run, max(left, 20))
                else:
                    fn, cap = STEP_FUNCTIONS[name]
                    args = (run, min(cap, left))
                    if name.endswith("_cold") or name.endswith("_warm"):
                        args += (name.endswith("_cold"),)
                    status, why, data = fn(*args)
            except Exception as e:  # a step's own defect: reported, and the rest go on
                import traceback
                status, why, data = "failed", f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()}
    step = {"name": name, "status": status, "seconds": round(time.time() - t0, 1), "data": data}
    if why:
        step["why"] = why
    run.steps = [s for s in run.steps if s["name"] != name] + [step]
    run.say(f"   {name}: {status}" + (f": {why}" if why else "") + f" ({step['seconds']} s)")
    if name != "report":
        run.save()
    return step


def pack_raw(run):
    """Every log and raw JSON of this run in one archive (the device tool returns at most 8 files)."""
    path = os.path.join(run.a.out, "raw.tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for f in sorted(glob.glob(os.path.join(run.a.work, "*.json")) + glob.glob(os.path.join(run.a.work, "tests", "*.json"))):
            t.add(f, arcname=os.path.relpath(f, run.a.work))
        if os.path.isdir(os.path.join(run.a.work, "cpu")):
            t.add(os.path.join(run.a.work, "cpu"), arcname="cpu")
        t.add(run.logs, arcname="logs")


def parse(argv):
    ap = argparse.ArgumentParser(prog="run", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(KIT, "out"))
    ap.add_argument("--work", default=os.path.join(os.path.dirname(KIT), os.path.basename(KIT) + "-work"))
    ap.add_argument("--large", action="store_true", help="the ~4.7 GB file (1b) instead of gpt2, sanitizer skipped")
    ap.add_argument("--files", help="comma-separated: gpt2, 1b, 20k")
    ap.add_argument("--steps", help="comma-separated steps to run (default: all)")
    ap.add_argument("--skip", help="comma-separated steps to leave out")
    ap.add_argument("--budget", type=float, default=560)
    ap.add_argument("--runs", type=int)
    ap.add_argument("--iterations", default="1,10,100", help="the iterations step's counts (default 1,10,100)")
    ap.add_argument("--cpu-rounds", type=int, default=3, help="the cpu step's interleaved rounds (default 3)")
    ap.add_argument("--emulated-driver", help="a folder holding the emulated libcuda.so.1 (the kit's own test)")
    ap.add_argument("--cold", action="store_true", help="with --emulated-driver: run the cold steps too")
    a = ap.parse_args(argv)
    a.files_given = a.files is not None
    files = (a.files or ("1b" if a.large else "gpt2")).split(",")
    for f in files:
        if f not in FILE_NAMES:
            ap.error(f"unknown file '{f}' in --files (gpt2, 1b, 20k)")
    a.files = files
    try:
        a.iterations = [int(n) for n in a.iterations.split(",")]
    except ValueError:
        ap.error(f"--iterations takes counts like 1,10,100, got '{a.iterations}'")
    if not all(1 <= n <= 100000 for n in a.iterations):
        ap.error("--iterations: each count from 1 to 100000")
    # What every other step stands on runs whatever --steps says (files already made are kept).
    a.only = (set(a.steps.split(",")) | {"environment", "files", "fixtures", "report"}) if a.steps else set(STEPS)
    a.leave = set(a.skip.split(",")) if a.skip else set()
    for s in sorted((a.only | a.leave) - set(STEPS) - set(OPTIONAL_STEPS)):
        ap.error(f"unknown step '{s}' (steps: {', '.join(STEPS + OPTIONAL_STEPS)})")
    a.large_leaves_sanitizer = a.large and "sanitizer" not in (a.only if a.steps else set()) and "sanitizer" not in a.leave
    if a.large_leaves_sanitizer:
        a.leave.add("sanitizer")
    if not 30 <= a.budget <= 86400:
        ap.error("--budget takes 30 to 86400 seconds")
    if not 1 <= a.cpu_rounds <= 20:
        ap.error("--cpu-rounds takes 1 to 20")
    if a.runs is not None and not 1 <= a.runs <= 1000:
        ap.error("--runs takes 1 to 1000")
    if a.emulated_driver and not os.path.exists(os.path.join(a.emulated_driver, "libcuda.so.1")):
        ap.error(f"--emulated-driver: no libcuda.so.1 in {a.emulated_driver}")
    a.out, a.work = os.path.abspath(a.out), os.path.abspath(a.work)
    return a


def main(argv):
    a = parse(argv)
    run = Run(a)
    run.say(f"safetensors GPU kit: {run.manifest.get('commit', '?')} built {run.manifest.get('built', '?')}; "
            f"files {', '.join(a.files)}; budget {a.budget:.0f} s; results in {a.out}")
    if a.emulated_driver:
        run.say(f"EMULATED DRIVER ({a.emulated_driver}): no figure of this run says anything about a GPU")
    for name in STEPS[:-1]:
        why_not = None
        if name not in a.only:
            why_not = "not among --steps"
        elif name in a.leave:
            why_not = ("--large: the sanitizer runs the tests' own small files, the same in the first run"
                       if name == "sanitizer" and a.large_leaves_sanitizer else "left out with --skip")
        run_step(run, name, why_not)
    for name in OPTIONAL_STEPS:
        if name in a.only and name not in a.leave:
            run_step(run, name)
    run_step(run, "report")
    run.save()
    run.console.flush()
    shutil.copyfile(os.path.join(run.logs, "console.log"), os.path.join(a.out, "run.log"))
    try:
        pack_raw(run)
    except OSError as e:
        run.say(f"(raw.tar.gz not written: {e})")
    run.save()
    summary = os.path.join(a.out, "summary.txt")
    if os.path.exists(summary):
        with open(summary) as f:
            print("\n" + f.read(), flush=True)
    failed = [s["name"] for s in run.steps if s["status"] in ("failed", "timed out")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
