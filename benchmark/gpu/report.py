#!/usr/bin/env python3
"""The GPU kit's report: goals met and missed, tables and a chart, from one or more runs.

    report.py --out DIR RESULTS.json...

Reads what benchmark/gpu/run.py wrote (one results.json per run; a second run, say the large
file's, adds its files to the first's) and writes DIR/results.md (the goals, the warm and cold
tables, the seed README's iterations table, every check), DIR/chart.png (matplotlib, when
installed) and DIR/summary.txt (one screen: each goal met, missed or not measured and why, each
step's outcome). The goals are issue 28's:

  every GPU test passes against the real driver; compute-sanitizer clean; warm whole-file load
  >= 0.85x the pinned host-to-device copy and >= 1.0x the faster of fastsafetensors and
  instanttensor; cold >= 0.9x the disk's read rate; host memory added during a load <= the
  staging ring + 64 MiB; device bytes equal file bytes.

Under the emulated driver the speed goals are not measured (its figures say nothing about a GPU).
"""
import argparse
import json
import os
import statistics
import sys

PINNED_GOAL, PEERS_GOAL, COLD_GOAL = 0.85, 1.0, 0.9


def med(v):
    return statistics.median(v) if v else None


def fmt_time(s):
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def mib(b):
    return f"{b / 2**20:.0f} MiB"


class Runs:
    """Every step of every run given, by name; the first run's environment."""

    def __init__(self, results):
        self.results = results
        self.emulated = any(r.get("run", {}).get("driver") == "emulated" for r in results)
        self.env = {}
        for r in results:
            for s in r.get("steps", []):
                if s["name"] == "environment" and s.get("data"):
                    self.env = self.env or s["data"]

    def steps(self, name, file=None):
        """Every run's step `name`; with `file`, only of the runs that had that file."""
        return [s for r in self.results if file is None or file in r.get("run", {}).get("files", [])
                for s in r.get("steps", []) if s["name"] == name]

    def ran(self, name, file=None):
        return [s for s in self.steps(name, file) if s["status"] in ("passed", "ran", "failed") and s.get("data")]

    def files(self):
        names = []
        for r in self.results:
            for f in r.get("run", {}).get("files", []):
                if f not in names:
                    names.append(f)
        return names

    def why_not(self, name, named=True, file=None):
        """Why a step gave nothing (for `file`): its own reason (after its name and outcome), or
        that it did not run."""
        steps = self.steps(name, file)
        if not steps:
            return f"the {name} step did not run" + (f" with {file}" if file else "")
        s = steps[-1]
        why = s.get("why") or (f"nothing for {file}" if file else "no data")
        return f"{name} {s['status']}: {why}" if named else why


def bench_items(runs, step, file):
    """{item: entry} of one file from every run of a bench_cpp/bench.py/peers.py step, limits too."""
    out = {}
    for s in runs.ran(step, file):
        for fe in s["data"].get("files", []):
            if fe["name"] != file:
                continue
            for it in fe.get("items", []) + fe.get("limits", []):
                out[it["item"]] = it
    return out


# ---- goals ----------------------------------------------------------------------------------------

def goal(name, status, detail, file=None, value=None, target=None):
    return {"goal": name, "file": file, "status": status, "detail": detail, "value": value, "target": target}


def speed_goal(runs, name, file, ours, theirs, target, what):
    """ratio = theirs' time / ours (>= target is met), or not measured with why."""
    if runs.emulated:
        return goal(name, "not measured", "emulated driver: its figures say nothing about a GPU", file)
    if ours is None or theirs is None:
        return goal(name, "not measured", what, file)
    ratio = theirs / ours
    return goal(name, "met" if ratio >= target else "missed", f"{ratio:.2f}× (ours {fmt_time(ours)}, {what})", file,
                round(ratio, 3), target)


def goals(runs):
    out = []
    # Every GPU test passes.
    tests = [s for s in runs.steps("tests") if s["status"] != "skipped"]
    if not tests:
        out.append(goal("every GPU test passes against the real driver", "not measured", runs.why_not("tests")))
    else:
        progs = {}
        for s in tests:
            progs.update(s.get("data", {}).get("programs", {}))
        n = sum(p.get("tests", 0) for p in progs.values())
        failed = [f for p in progs.values() for f in p.get("failed", [])]
        bad = [f"{k}: {p['status']} ({p.get('why', '')})" for k, p in progs.items()
               if p["status"] not in ("passed",) and not p.get("why", "").startswith("not in the kit")]
        status = "met" if all(s["status"] == "passed" for s in tests) else "missed"
        reasons = failed or bad or [s["why"] for s in tests if s.get("why")]
        detail = f"{len(progs)} programs, {n} tests, {len(failed)} failed"
        if status == "missed":
            detail += ": " + "; ".join(reasons[:3])
        name = "every GPU test passes against " + ("the emulated driver" if runs.emulated else "the real driver")
        out.append(goal(name, status, detail))
    # compute-sanitizer clean.
    san = runs.steps("sanitizer")
    if not san or san[-1]["status"] in ("skipped",):
        out.append(goal("compute-sanitizer clean (memcheck, racecheck, synccheck)", "not measured", runs.why_not("sanitizer")))
    else:
        s = san[-1]
        status = {"passed": "met", "failed": "missed"}.get(s["status"], "not measured")
        runs_ = s.get("data", {}).get("runs", {})
        clean = sum(1 for r in runs_.values() if r["status"] == "passed")
        out.append(goal("compute-sanitizer clean (memcheck, racecheck, synccheck)", status,
                        f"{clean} of {len(runs_)} tool runs clean" + (f": {s.get('why')}" if s.get("why") else "")))
    for file in runs.files():
        warm = bench_items(runs, "bench_warm", file)
        gpu = med(warm["gpu"]["runs_s"]) if "runs_s" in warm.get("gpu", {}) else None
        pinned = med(warm["pinned H2D"]["runs_s"]) if "runs_s" in warm.get("pinned H2D", {}) else None
        why = runs.why_not("bench_warm", file=file) if gpu is None else f"pinned H2D {fmt_time(pinned)}"
        if gpu is not None and pinned is None:
            why = "no pinned H2D figure"
        out.append(speed_goal(runs, f"warm load ≥ {PINNED_GOAL}× the pinned host-to-device copy", file, gpu, pinned,
                              PINNED_GOAL, why))
        peers = bench_items(runs, "peers_warm", file)
        times = {k: med(v["runs_s"]) for k, v in peers.items() if "runs_s" in v}
        best = min(times.items(), key=lambda kv: kv[1]) if times else None
        if best:
            why = f"{best[0]} {fmt_time(best[1])}"
            missing = [k for k in ("fastsafetensors", "instanttensor") if k not in times]
            if missing:
                why += f"; {', '.join(missing)} not measured: " + "; ".join(peers[k].get("skipped", "") for k in missing if k in peers)
        else:
            why = ("; ".join(f"{k}: {v.get('skipped')}" for k, v in peers.items()) or
                   runs.why_not("peers_warm", file=file))
        out.append(speed_goal(runs, f"warm load ≥ {PEERS_GOAL}× the faster of fastsafetensors and instanttensor", file,
                              gpu if best else None, best[1] if best else None, PEERS_GOAL, why))
        cold = bench_items(runs, "bench_cold", file)
        cgpu = med(cold["gpu"]["runs_s"]) if "runs_s" in cold.get("gpu", {}) else None
        disk = med(cold["disk"]["runs_s"]) if "runs_s" in cold.get("disk", {}) else None
        why = runs.why_not("bench_cold", file=file) if cgpu is None or disk is None else f"disk {fmt_time(disk)}"
        out.append(speed_goal(runs, f"cold load ≥ {COLD_GOAL}× the disk's read rate", file, cgpu, disk, COLD_GOAL, why))
        out.append(memory_goal(runs, file))
        out.append(bytes_goal(runs, file))
    return out


def memory_goal(runs, file):
    name = "host memory added during a load ≤ the staging ring + 64 MiB"
    for s in runs.ran("host_memory", file):
        for fe in s["data"].get("files", []):
            if fe["name"] == file and fe.get("backends"):
                worst = max(fe["backends"], key=lambda b: b["added"] - b["limit"])
                detail = ", ".join(f"{b['backend']} +{mib(b['added'])}" for b in fe["backends"]) + \
                    f" (ring {mib(worst['staging_bytes'])}, limit {mib(worst['limit'])})"
                ok = all(b["within"] for b in fe["backends"])
                if runs.emulated:
                    detail += "; emulated driver (its device memory is host memory, counted here)"
                return goal(name, "met" if ok else "missed", detail, file, worst["added"], worst["limit"])
    return goal(name, "not measured", runs.why_not("host_memory", file=file), file)


def bytes_goal(runs, file):
    name = "device bytes equal file bytes"
    evidence, missing = [], []
    for s in runs.steps("tests", file):
        entry = s.get("data", {}).get("programs", {}).get("cuda_test", {})
        checked = [l for l in entry.get("bytes_checked", []) if file in l]
        if checked and entry.get("status") == "passed":
            evidence.append(f"cuda_test: both backends ({checked[0].split(':', 1)[-1].strip()})")
        elif checked:
            missing.append(f"cuda_test {entry.get('status')}")
    for s in runs.steps("interop", file):
        provs = s.get("data", {}).get("providers", [])
        good = [p["provider"] for p in provs if p["status"] == "passed" and any(file in n for n in p.get("notes", []))]
        bad = [p["provider"] for p in provs if p["status"] == "failed"]
        if good:
            evidence.append("runtime interop: " + ", ".join(good))
        if bad:
            missing.append("runtime interop failed: " + ", ".join(bad))
    if missing:
        return goal(name, "missed", "; ".join(missing + evidence), file)
    if not evidence:
        return goal(name, "not measured", runs.why_not("tests", file=file) + "; " + runs.why_not("interop", file=file),
                    file)
    return goal(name, "met", "; ".join(evidence) + ("; emulated driver" if runs.emulated else ""), file)


# ---- tables ---------------------------------------------------------------------------------------

WARM_ROWS = [("bench_warm", "pinned H2D", "limit: one copy from pinned host memory (cuda::pinned_copy_seconds)"),
             ("bench_warm", "gpu", "ours: Uploader::load, every tensor into one allocation"),
             ("bench_warm", "gpu one-shot", "ours: cuda::load (the shared uploader)"),
             ("bench_warm", "gpu (read backend)", "ours: Uploader::load, Backend::Read"),
             ("bench_warm", "gpu (direct backend)", "ours: Uploader::load, Backend::Direct"),
             ("bench_warm", "gpu (file kept open)", "ours: Uploader::load, the file opened once (faults paid once)"),
             ("bench_warm", "gpu (a reader per core)", "ours: Uploader::load, readers = the machine's cores"),
             ("bench_warm", "registered mapping H2D", "no host copy: the mapping registered read-only, one copy, unregistered"),
             ("bench_warm", "register + unregister the mapping", "the registration alone"),
             ("bench_warm", "host copy, ring's readers", "host limit: the ring's readers copying the mapped file, no GPU"),
             ("bench_warm", "host copy, every core", "host limit: every core copying the mapped file, no GPU"),
             ("bench_warm", "ranks 1 (Uploader::load, the whole file)", "multi-rank reference: Uploader::load, timed beside the rows below"),
             ("bench_warm", "ranks 2, via the host", "ours: multi-rank device load, 2 threads as ranks, via the host"),
             ("bench_warm", "ranks 2, via the device", "ours: multi-rank device load, 2 threads as ranks, device broadcast"),
             ("bench_warm", "ranks 4, via the host", "ours: multi-rank device load, 4 threads as ranks, via the host"),
             ("bench_warm", "ranks 4, via the device", "ours: multi-rank device load, 4 threads as ranks, device broadcast"),
             ("peers_warm", "fastsafetensors", "fastsafetensors"),
             ("peers_warm", "instanttensor", "instanttensor"),
             ("python_warm", "gpu", "Python safetensors: load_file(device=\"cuda:0\")"),
             ("python_warm", "gpu_naive", "torch: load_file, then .to(\"cuda:0\") per tensor")]
COLD_ROWS = [("bench_cold", "disk", "limit: the disk's sequential read rate"),
             ("bench_cold", "gpu", "ours: Uploader::load"),
             ("bench_cold", "gpu one-shot", "ours: cuda::load"),
             ("bench_cold", "gpu (read backend)", "ours: Uploader::load, Backend::Read"),
             ("bench_cold", "gpu (direct backend)", "ours: Uploader::load, Backend::Direct"),
             ("bench_cold", "gpu (a reader per core)", "ours: Uploader::load, readers = the machine's cores"),
             ("peers_cold", "fastsafetensors", "fastsafetensors"),
             ("peers_cold", "instanttensor", "instanttensor"),
             ("python_cold", "gpu", "Python safetensors: load_file(device=\"cuda:0\")"),
             ("python_cold", "gpu_naive", "torch: load_file, then .to(\"cuda:0\")")]


def load_rows(runs, file, rows, limit_item):
    """[(item, label, entry or None, why not)] of one file, and the limit's median."""
    out, limit = [], None
    for step, item, label in rows:
        entries = bench_items(runs, step, file)
        e = entries.get(item)
        if e is None:
            out.append((item, label, None, runs.why_not(step, False, file) if not entries else "not measured"))
        elif "skipped" in e:
            out.append((item, label, None, e["skipped"]))
        else:
            out.append((item, label + (f" ({e['options']})" if e.get("options") else ""), e, None))
            if item == limit_item:
                limit = med(e["runs_s"])
    return out, limit


def load_table(runs, file, rows, limit_item, limit_name, size):
    entries, limit = load_rows(runs, file, rows, limit_item)
    ours = next((med(e["runs_s"]) for (item, label, e, _) in entries if e and label.startswith("ours: Uploader")), None)
    lines = [f"| loader | median | spread | GB/s | ÷ {limit_name} | its time ÷ ours |", "|---|---|---|---|---|---|"]
    for item, label, e, why in entries:
        if e is None:
            lines.append(f"| {label} | skipped: {why} | | | | |")
            continue
        t = med(e["runs_s"])
        spread = f"{fmt_time(min(e['runs_s']))}–{fmt_time(max(e['runs_s']))}"
        frac = f"{limit / t:.2f}×" if limit and not label.startswith("limit") else "—"
        vs = f"{t / ours:.2f}×" if ours and not label.startswith(("limit", "ours")) else "—"
        check = f" — check: {e['check']}" if e.get("check") else ""
        lines.append(f"| {label}{check} | {fmt_time(t)} | {spread} | {size / t / 1e9:.2f} | {frac} | {vs} |")
    return "\n".join(lines)


def iteration_table(runs, file):
    """The seed README's shape: a row per iteration count (1, 10, 100); Python CPU, C++ CPU,
    Python CUDA, C++ CUDA."""
    cells = {}
    for s in runs.steps("iterations", file):
        for key, entry in s.get("data", {}).items():
            name, tool, n = key.rsplit(" ", 2)
            if name != file:
                continue
            if "skipped" in entry:
                cells[(tool, n)] = {"*": f"not measured: {entry['skipped']}"}
                continue
            cells[(tool, n)] = {it["item"]: it for it in entry["files"][0]["items"]}
    if not cells:
        return None

    def cell(tool, n, item):
        c = cells.get((tool, n))
        if c is None:
            return "—"
        if "*" in c:
            return c["*"]
        it = c.get(item)
        if it is None:
            return "—"
        return f"skipped: {it['skipped']}" if "skipped" in it else f"{it['per_iteration_s']:.4f} s"

    lines = ["| Iterations | Python CPU | C++ CPU (load; open) | Python CUDA | C++ CUDA |", "|---|---|---|---|---|"]
    for n in sorted({n for _, n in cells}, key=int):
        cpp_cpu = cell("bench_cpp", n, "load")
        if cell("bench_cpp", n, "open").endswith(" s"):
            cpp_cpu += f"; {cell('bench_cpp', n, 'open')}"
        lines.append(f"| {n} | {cell('bench.py', n, 'load')} | {cpp_cpu} | {cell('bench.py', n, 'gpu')} | "
                     f"{cell('bench_cpp', n, 'gpu')} |")
    return "\n".join(lines)


def checks_section(runs):
    lines = []
    for s in runs.steps("tests"):
        lines += ["**GPU tests** (`" + ("emulated driver" if runs.emulated else "this machine's driver") + "`):", "",
                  "| program | outcome | tests | failed | skipped | seconds |", "|---|---|---|---|---|---|"]
        for prog, p in s.get("data", {}).get("programs", {}).items():
            outcome = p["status"] + (f": {p['why']}" if p.get("why") and p["status"] != "passed" else "")
            lines.append(f"| {prog} | {outcome} | {p.get('tests', '—')} | {len(p.get('failed', []))} | "
                         f"{p.get('skipped', '—')} | {p.get('seconds', '—')} |")
            for f in p.get("failed", [])[:10]:
                lines.append(f"| | FAILED {f} | | | | |")
        lines.append("")
    for s in runs.steps("sanitizer"):
        if not s.get("data", {}).get("runs"):
            continue
        lines += ["**compute-sanitizer**:", "", "| tool and program | outcome |", "|---|---|"]
        for key, r in s["data"]["runs"].items():
            lines.append(f"| {key} | {r['status']}" + (f": {r['why']}" if r.get("why") else "") + " |")
        lines += ["", s["data"].get("note", ""), ""]
    for s in runs.steps("interop"):
        provs = s.get("data", {}).get("providers", [])
        if not provs:
            continue
        lines += ["**Runtime interop** (a destination and a stream the runtime made):", "",
                  "| provider | outcome | versions |", "|---|---|---|"]
        for p in provs:
            detail = "; ".join(p.get("notes", [])) if p["status"] == "passed" else p.get("why", "")
            versions = ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items())
            lines.append(f"| {p['provider']} | {p['status']}: {detail} | {versions} |")
        lines.append("")
    for s in runs.ran("host_memory"):
        lines += ["**Host memory added during one load** (resident set peak; allocated = RssAnon + RssShmem "
                  "sampled every 200 µs):", "", "| file | backend | added | peak resident | allocated | ring | within |",
                  "|---|---|---|---|---|---|---|"]
        for fe in s["data"].get("files", []):
            for b in fe.get("backends", []):
                lines.append(f"| {fe['name']} | {b['backend']} | {mib(b['added'])} | +{mib(b['peak_rss_added'])} | "
                             f"+{mib(b['peak_anon_added'])} | {mib(b['staging_bytes'])} | {'yes' if b['within'] else 'NO'} |")
        lines.append("")
    return "\n".join(lines)


def environment_line(runs):
    e = runs.env
    gpus = e.get("gpus")
    gpu = gpus[0] if isinstance(gpus, list) and gpus else (gpus or "no GPU found")
    parts = [f"GPU: {gpu}", f"CUDA driver API {e.get('cuda_driver_api', '?')}"]
    if e.get("nvidia_smi_header"):
        parts.append(e["nvidia_smi_header"])
    if isinstance(e.get("torch"), str) and not e["torch"].startswith("not"):
        parts.append(f"torch {e['torch']} (CUDA {e.get('torch_cuda')})")
    parts.append(f"{e.get('cpu', '?')} ({e.get('cores', '?')} cores), {e.get('memory_gib', '?')} GiB")
    parts.append(f"Python {e.get('python', '?')}")
    return "; ".join(parts)


def markdown(runs, gl):
    started = [r.get("run", {}).get("started", "?") for r in runs.results]
    kit = runs.results[0].get("kit", {})
    lines = [f"Measured {', '.join(started)} with the GPU kit (commit {kit.get('commit', '?')}, "
             f"{kit.get('build_type', '?')} build). {environment_line(runs)}.", ""]
    if runs.emulated:
        lines += ["**Emulated driver: this run checks the kit, not a GPU. No figure here is a GPU's.**", ""]
    lines += ["| goal | file | verdict | measured |", "|---|---|---|---|"]
    for g in gl:
        lines.append(f"| {g['goal']} | {g['file'] or 'all'} | {g['status']} | {g['detail']} |")
    for file in runs.files():
        size = next((fe["bytes"] for s in runs.ran("bench_warm") + runs.ran("bench_cold")
                     for fe in s["data"].get("files", []) if fe["name"] == file), None)
        if size is None:
            files = [s["data"]["files"] for s in runs.steps("files") if s.get("data", {}).get("files")]
            size = next((f[file] for f in files if file in f), 0)
        lines += ["", f"### {file} ({size / 1e6:,.0f} MB)", "",
                  "Warm page cache: medians over runs (after one warm-up run), device memory freed between runs.", "",
                  load_table(runs, file, WARM_ROWS, "pinned H2D", "pinned H2D", size or 1), "",
                  "Cold: the page cache dropped before every run.", "",
                  load_table(runs, file, COLD_ROWS, "disk", "disk", size or 1)]
        it = iteration_table(runs, file)
        if it:
            lines += ["", "Time per iteration over 1, 10 and 100 iterations, the first included (the seed README's "
                      "table; each count a fresh process):", "", it]
    for s in runs.ran("cpu"):
        if s["data"].get("table"):
            lines += ["", "**The CPU goals on this machine's CPU** (the cpu step: bench_cpp and bench.py, interleaved "
                      "rounds; conversions and load_copy on one core in raw.tar.gz, cpu/raw):", ""] + s["data"]["table"]
    for s in runs.ran("probe"):
        lines += ["", "**The probe** (the probe step: every upload variant beside the same pinned copy, and the "
                  "decision rule of docs/gpu.md):", "", "```"] + s["data"].get("lines", []) + ["```"]
    lines += ["", checks_section(runs), "**Steps**:", "", "| step | outcome | seconds |", "|---|---|---|"]
    for r in runs.results:
        for s in r.get("steps", []):
            lines.append(f"| {s['name']} | {s['status']}" + (f": {s['why']}" if s.get("why") else "") +
                         f" | {s['seconds']} |")
    return "\n".join(lines) + "\n"


def cpu_goal_lines(runs):
    """One line per goal of the cpu step's table (file, work, the goal's cell), for the summary."""
    out = []
    for s in runs.ran("cpu"):
        for row in s["data"].get("table", []):
            cells = [c.strip() for c in row.strip("|").split("|")]
            if len(cells) == 8 and "≥" in cells[7]:
                out.append(f"  {cells[0]} {cells[1]}: {cells[7]}"[:230])
    return out


def summary(runs, gl, out_dir):
    e = runs.env
    head = "safetensors GPU kit"
    if runs.emulated:
        head += " — EMULATED DRIVER: checks the kit, no figure is a GPU's"
    lines = [head, environment_line(runs), ""]
    mark = {"met": "[met]    ", "missed": "[MISSED] ", "not measured": "[not measured] "}
    lines.append("Goals:")
    for g in gl:
        lines.append(f"  {mark[g['status']]}{g['goal']}" + (f" — {g['file']}" if g["file"] else "") + f": {g['detail']}"[:230])
    for s in runs.ran("probe"):
        lines += ["", "The probe (its figures: results.md; raw: raw.tar.gz, probe-*.json):"]
        lines += [f"  {d['topic']}: {d['verdict']}"[:230] for d in s["data"].get("decision", [])]
    cpu = cpu_goal_lines(runs)
    if cpu:
        lines += ["", "CPU goals on this machine's CPU (the cpu step; its table: raw.tar.gz, cpu/results.md):"] + cpu
    lines += ["", "Steps:"]
    for i, r in enumerate(runs.results):
        if len(runs.results) > 1:
            lines.append(f" run {i + 1} ({', '.join(r.get('run', {}).get('files', []))}):")
        for s in r.get("steps", []):
            lines.append(f"  {s['name']:<12} {s['status']}" + (f": {s['why']}" if s.get("why") else "")[:200] +
                         f" ({s['seconds']} s)")
    made = [f for f in ("results.md", "chart.png") if os.path.exists(os.path.join(out_dir, f))]
    lines += ["", "Files: " + ", ".join(["summary.txt"] + made + ["results.json", "run.log", "raw.tar.gz (every log and raw JSON)"])]
    if e.get("wheels_note"):
        lines.append(f"Note: {e['wheels_note']}")
    return "\n".join(lines) + "\n"


def chart(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = runs.files()
    fig, axes = plt.subplots(len(files), 2, figsize=(13, 3.2 * len(files)), squeeze=False)
    for row, file in zip(axes, files):
        size = next((fe["bytes"] for s in runs.ran("bench_warm") + runs.ran("bench_cold") + runs.ran("peers_warm")
                     for fe in s["data"].get("files", []) if fe["name"] == file), None)
        for ax, rows, title, limit_item in ((row[0], WARM_ROWS, "warm page cache", "pinned H2D"),
                                            (row[1], COLD_ROWS, "page cache dropped", "disk")):
            entries, _ = load_rows(runs, file, rows, limit_item)
            shown = [(label.split(" (")[0], size / med(e["runs_s"]) / 1e9) for _, label, e, _ in entries if e and size]
            if not shown:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="#777")
                ax.set_axis_off()
                ax.set_title(f"{file}: {title}", fontsize=10)
                continue
            colors = ["#9a9a9a" if l.startswith("limit") else "#2a7ab9" if l.startswith("ours") else "#e39b3a"
                      for l, _ in shown]
            ax.barh(range(len(shown)), [v for _, v in shown], color=colors)
            ax.set_yticks(range(len(shown)))
            ax.set_yticklabels([l for l, _ in shown], fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("GB/s (longer is better)")
            ax.set_title(f"{file}: {title}", fontsize=10)
            ax.grid(axis="x", alpha=0.3)
    title = environment_line(runs)
    if runs.emulated:
        title = "EMULATED DRIVER (not a GPU) — " + title
    fig.suptitle(title[:160], fontsize=8, color="#555")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("results", nargs="+")
    a = ap.parse_args(argv)
    results = []
    for p in a.results:
        with open(p) as f:
            results.append(json.load(f))
    runs = Runs(results)
    gl = goals(runs)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(markdown(runs, gl))
    why_no_chart = None
    try:
        chart(runs, os.path.join(a.out, "chart.png"))
    except ImportError as e:
        why_no_chart = f"no chart: matplotlib is not installed ({e})"
    text = summary(runs, gl, a.out)
    if why_no_chart:
        text += why_no_chart + "\n"
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    if why_no_chart:
        print(why_no_chart)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
