#!/usr/bin/env python3
"""Turns bench_cpp and bench.py JSON into a Markdown table and a chart.

    report.py --out DIR RESULT.json...

Several rounds of each tool may be given (benchmark/run alternates them, since this kind of
machine is noisy): each figure is the median over rounds of the per-round medians. Writes
DIR/results.md and DIR/chart.png (matplotlib), and prints the table. Cold results (bench_cpp
--cold, bench.py --cold) get a table of their own instead: each full read's median over every
run, its spread (min-max) and its rate as a fraction of the disk's, measured in the same run.
"""
import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

import checked_output

# The goals the issues set, checked in the table: (file, item) -> list of (kind, factor).
#   ("python", f): ours at least f times faster than Python; ("limit", f): ours at least f times
#   the speed of the limit (limit time / our time >= f). Each is judged on the median over at
#   least MIN_ROUNDS interleaved rounds of the per-round ratio, whose spread the table shows.
#   ("python_every", f): at least f times faster than Python in every one of those rounds.
GOALS = {
    ("gpt2.safetensors", "open"): [("python", 6), ("python_every", 5)],
    ("20k.safetensors", "open"): [("python", 6)],
    ("gpt2.safetensors", "load"): [("limit", 0.9)],
    ("gpt2.safetensors", "load_copy"): [("limit", 0.8)],
    ("gpt2.safetensors", "save"): [("limit", 0.8)],
    ("1b-mixed.safetensors", "gpu"): [("limit", 0.85), ("python", 10)],
    ("moe-deepseek-v3", "open"): [("python", 6), ("python_every", 5)],
    ("moe-deepseek-v3", "load"): [("limit", 0.5)],
}
MIN_ROUNDS = 3
# Which limit each item is compared with: like for like. `load_copy` copies into memory it owns,
# so beside one read() into memory already mapped (the goal's) it is also shown against one
# read() into fresh memory, which pays the same page faults, and one into fresh memory that
# asked for huge pages, as our large buffers do: the most one thread can do into new memory.
LIMIT_OF = {"load": "read()", "load_copy": "read()", "save": "write()+fsync", "save_nosync": "write()",
            "gpu": "pinned H2D"}
EXTRA_LIMIT_OF = {"load_copy": ["read() into new memory", "read() into new huge pages"]}
# Which Python item each of ours is compared with. Python's load_file copies every tensor, so it
# is compared with our owned copy (`load_copy`), never with `load`, which reads through the
# mapping and copies nothing. Our synced save has no Python counterpart (Python's save_file does
# not sync), so it is compared with save_nosync only.
PYTHON_OF = {"load": None, "load_copy": "load", "save": None}
ITEMS = ["open", "load", "load_copy", "slice", "save", "save_nosync", "gpu", "plan_ep", "plan_tp", "plan_upload"]


DISPLAY = {"model.safetensors": "all-MiniLM-L6-v2"}


def load(paths):
    """{tool: {file: {"items": {item: [medians]}, "limits": {...}, "bytes": n}}}, meta"""
    data = defaultdict(lambda: defaultdict(lambda: {"items": defaultdict(list), "limits": defaultdict(list),
                                                    "skipped": {}, "bytes": 0, "tensors": 0, "host_extra": []}))
    meta = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        tool = r["tool"]
        meta.setdefault(tool, r)
        for fe in r["files"]:
            d = data[tool][fe["name"]]
            d["bytes"], d["tensors"] = fe["bytes"], fe["tensors"]
            if fe.get("gpu_host_extra_bytes"):
                d["host_extra"].append(fe["gpu_host_extra_bytes"])
            for group in ("items", "limits"):
                for it in fe.get(group, []):
                    if "skipped" in it:
                        d["skipped"][it["item"]] = it["skipped"]
                    else:
                        d[group][it["item"]].append(it["median_s"])
    return data, meta


def med(v):
    return statistics.median(v) if v else None


def per_round(theirs, ours):
    """The ratio theirs ÷ ours of each round (lists of per-round medians, in round order)."""
    return [t / o for t, o in zip(theirs, ours) if t and o]


def spread(ratios):
    """"rounds 0.78–0.85×": the per-round spread a goal's median comes from."""
    if not ratios:
        return "no rounds"
    return f"{len(ratios)} rounds {min(ratios):.2f}–{max(ratios):.2f}×"


def fmt_time(s):
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def table(data, meta):
    cpp, py = data.get("bench_cpp", {}), data.get("bench.py", {})
    lines = []
    m = meta.get("bench_cpp") or meta.get("bench.py")
    lines.append(f"Measured {m['date']} on {m['machine']}, page cache {m['cache']}; medians over runs and "
                 f"over interleaved rounds of both programs. Python: safetensors "
                 f"{meta.get('bench.py', {}).get('safetensors', '?')} with NumPy "
                 f"{meta.get('bench.py', {}).get('numpy', '?')}.")
    lines.append("")
    lines.append("| file | work | ours (C++) | Python | limit | limit ÷ ours | Python ÷ ours | goal |")
    lines.append("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for name in sorted(cpp, key=lambda n: cpp[n]["bytes"]):
        c = cpp[name]
        p = py.get(name, {"items": {}, "skipped": {}})
        for item in ITEMS:
            if item in c["skipped"]:
                lines.append(f"| {DISPLAY.get(name, name)} | {item} | skipped: {c['skipped'][item]} | | | | | |")
                continue
            ours = med(c["items"].get(item, []))
            if ours is None:
                continue
            py_item = PYTHON_OF.get(item, item)
            theirs = med(p["items"].get(py_item, [])) if py_item else None
            py_cell = fmt_time(theirs) if theirs else (f"skipped: {p['skipped'][py_item]}" if py_item in p["skipped"] else "—")
            if item == "gpu" and p["items"].get("gpu_naive"):
                py_cell += f" (naive torch {fmt_time(med(p['items']['gpu_naive']))})"
            limit_name = LIMIT_OF.get(item)
            limit = med(c["limits"].get(limit_name, [])) if limit_name else None
            # Per round, then the median: both sides of a ratio come from the same round.
            rounds_limit = per_round(c["limits"].get(limit_name, []) if limit_name else [], c["items"].get(item, []))
            rounds_py = per_round(p["items"].get(py_item, []) if py_item else [], c["items"].get(item, []))
            ratio_limit = med(rounds_limit) if rounds_limit else (limit / ours if limit else None)
            ratio_py = med(rounds_py) if rounds_py else (theirs / ours if theirs else None)
            goal_cells = []
            for kind, factor in GOALS.get((name, item), []):
                if kind == "python_every":
                    value, rounds = (min(rounds_py) if rounds_py else None), rounds_py
                else:
                    value, rounds = (ratio_py, rounds_py) if kind == "python" else (ratio_limit, rounds_limit)
                enough = len(rounds) >= MIN_ROUNDS
                ok = value is not None and value >= factor and enough
                what = {"python": "Python", "python_every": "Python in every round"}.get(kind, "limit")
                verdict = "met" if ok else ("MISSED" if enough or value is None or value < factor
                                            else f"not judged ({len(rounds)} of {MIN_ROUNDS} rounds)")
                goal_cells.append(f"≥ {factor}× {what}: {verdict} ({spread(rounds)})")
                verdicts.append((name, item, kind, factor, value, verdict))
            for extra in EXTRA_LIMIT_OF.get(item, []):
                if c["limits"].get(extra):
                    goal_cells.append(f"{med(per_round(c['limits'][extra], c['items'][item])):.2f}× {extra}")
            gbps = c["bytes"] / ours / 1e9 if item in ("load", "load_copy", "save", "save_nosync", "gpu") else None
            ours_cell = fmt_time(ours) + (f" ({gbps:.1f} GB/s)" if gbps else "")
            if item == "gpu" and c["host_extra"]:
                ours_cell += f", +{med(c['host_extra']) / 2**20:.0f} MiB host memory"
            lines.append(f"| {DISPLAY.get(name, name)} | {item} | {ours_cell} | {py_cell} | "
                         f"{(limit_name + ' ' + fmt_time(limit)) if limit else '—'} | "
                         f"{f'{ratio_limit:.2f}×' if ratio_limit else '—'} | {f'{ratio_py:.1f}×' if ratio_py else '—'} | "
                         f"{'; '.join(goal_cells)} |")
        limits = ", ".join(f"{k} {fmt_time(med(v))}" for k, v in c["limits"].items())
        lines.append(f"| {DISPLAY.get(name, name)} | *limits* | {limits} | | | | | |")
    return "\n".join(lines), verdicts


# The cold reads, in the order of the table: (tool, item) -> what was read, and how.
COLD_ROWS = [
    ("bench_cpp", "disk", "the disk itself: fio, direct I/O, 16 MiB requests, the faster of 1 job x queue depth 8 and 4 jobs x depth 16"),
    ("bench_cpp", "direct", "ours, direct backend: O_DIRECT into aligned buffers the views own"),
    ("bench_cpp", "stream", "ours, TensorStream (direct backend, 256 MiB bound)"),
    ("bench_cpp", "read", "ours, read backend: pread into buffers the views own"),
    ("bench_cpp", "prefetch", "ours, prefetch (4 threads, 16 MiB requests), then the mapping"),
    ("bench_cpp", "mmap", "ours, mapped backend: page faults only"),
    ("bench.py", "load", "Python: safetensors.numpy.load_file"),
]
COLD_GOAL = 0.9


def cold_table(paths):
    """The cold reads of every file: median over all runs, spread, GB/s, fraction of the disk's rate."""
    runs = defaultdict(list)  # (file, tool, item) -> every run
    skipped, sizes, meta, disk_tool = {}, {}, {}, {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        meta.setdefault(r["tool"], r)
        for fe in r["files"]:
            sizes[fe["name"]] = fe["bytes"]
            if fe.get("disk"):
                disk_tool[fe["name"]] = fe["disk"]["tool"]
            for it in fe["items"]:
                key = (fe["name"], r["tool"], it["item"])
                if "skipped" in it:
                    skipped[key] = it["skipped"]
                else:
                    runs[key].extend(it["runs_s"])
    m = meta.get("bench_cpp") or meta.get("bench.py")
    lines = [f"Measured {m['date']} on {m['machine']}, page cache dropped before every run; medians "
             f"and spread (min-max) over every run. Python: safetensors "
             f"{meta.get('bench.py', {}).get('safetensors', '?')} with NumPy {meta.get('bench.py', {}).get('numpy', '?')}.",
             "",
             "| file | read | median | spread | GB/s | ÷ disk | goal |",
             "|---|---|---|---|---|---|---|"]
    for name in sorted(sizes, key=sizes.get):
        disk = med(runs.get((name, "bench_cpp", "disk"), []))
        for tool, item, label in COLD_ROWS:
            key = (name, tool, item)
            if item == "disk" and disk_tool.get(name, "fio") != "fio":
                label = "the disk itself: dd iflag=direct x 4 in parallel"
            if key in skipped:
                lines.append(f"| {DISPLAY.get(name, name)} | {label} | skipped: {skipped[key]} | | | | |")
                continue
            v = runs.get(key)
            if not v:
                continue
            t = med(v)
            ratio = disk / t if disk and item != "disk" else None
            goal = ""
            if ratio is not None and tool == "bench_cpp":
                goal = f"≥ {COLD_GOAL}× disk: {'met' if ratio >= COLD_GOAL else 'MISSED'}"
            lines.append(f"| {DISPLAY.get(name, name)} | {label} | {fmt_time(t)} | {fmt_time(min(v))}–{fmt_time(max(v))} | "
                         f"{sizes[name] / t / 1e9:.2f} | {f'{ratio:.2f}×' if ratio else '—'} | {goal} |")
    return "\n".join(lines)


def chart(data, meta, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cpp, py = data.get("bench_cpp", {}), data.get("bench.py", {})
    files = sorted(cpp, key=lambda n: cpp[n]["bytes"])
    if not files:
        print("(no chart: no bench_cpp figures)")
        return
    fig, axes = plt.subplots(len(files), 1, figsize=(9, 2.8 * len(files)), squeeze=False)
    for ax, name in zip(axes[:, 0], files):
        c, p = cpp[name], py.get(name, {"items": {}})
        items = [i for i in ITEMS if c["items"].get(i)]
        ours = [med(c["items"][i]) for i in items]
        theirs = [med(p["items"].get(PYTHON_OF.get(i, i) or "", [])) or 0 for i in items]
        limits = [med(c["limits"].get(LIMIT_OF.get(i, ""), [])) or 0 for i in items]
        ys = range(len(items))
        h = 0.27
        ax.barh([y - h for y in ys], ours, h, label="ours (C++)", color="#2a7ab9")
        ax.barh(list(ys), theirs, h, label="Python safetensors 0.8.0", color="#e39b3a")
        ax.barh([y + h for y in ys], limits, h, label="machine limit", color="#9a9a9a")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(items)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log scale, shorter is better)")
        ax.set_title(f"{DISPLAY.get(name, name)} ({c['bytes'] / 1e6:,.0f} MB, {c['tensors']:,} tensors)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, 0.985))
    m = meta.get("bench_cpp") or meta.get("bench.py")
    fig.suptitle(f"{m['machine']}, page cache {m['cache']}, {m['date']}", y=0.995, fontsize=9, color="#555")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(out, dpi=110)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("results", nargs="+")
    a = ap.parse_args(argv)
    cold = []
    for p in a.results:
        with open(p) as f:
            cold.append(json.load(f).get("cache") == "cold")
    if all(cold):
        text = cold_table(a.results)
        if not write_results(a.out, text):
            return 1
        print(text)
        return 0
    data, meta = load(a.results)
    text, verdicts = table(data, meta)
    if not write_results(a.out, text):
        return 1
    print(text)
    try:
        chart(data, meta, os.path.join(a.out, "chart.png"))
    except ImportError:
        print("(no chart: matplotlib is not installed)")
    except OSError as e:
        print(f"report.py: cannot write {os.path.join(a.out, 'chart.png')}: {e.strerror}", file=sys.stderr)
        return 1
    # A goal with too few rounds to judge is said to be so, not missed (the --quick run has one).
    for name, item, kind, factor, value, verdict in verdicts:
        if verdict == "met":
            continue
        said = "goal missed" if verdict == "MISSED" else f"goal {verdict}"
        print(f"{said}: {name} {item}: {value and round(value, 2)}x vs >= {factor}x {kind}")
    return 0


def write_results(out, text):
    """DIR/results.md, or False after saying why it cannot be written."""
    path = os.path.join(out, "results.md")
    try:
        os.makedirs(out, exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
        return True
    except OSError as e:
        print(f"report.py: cannot write {path}: {e.strerror}", file=sys.stderr)
        return False


if __name__ == "__main__":
    checked_output.run(main, sys.argv[1:], "report.py")
