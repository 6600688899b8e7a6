"""The GPU kit's probe step (`run --steps probe`): what decides how uploads reach the link
(docs/gpu.md, "The GPU probe"), in one bench_cpp process per file (`--items probe,ranks`:
benchmark/gpu/probe.hpp, and the multi-rank loads beside one rank), every variant timed beside the
same baseline on the same machine; then the decision rule, applied to what was measured. Only run
when named: `run --steps probe` (gpt2 and the ~4.7 GB file 1b, generated here when missing; with
--files, those files instead). About 3-4 minutes on an H200 machine with the files generated."""
import json
import os

from runner import FILE_NAMES, bin_path, command, read_json, remaining, tail

# Files the probe measures when --files is not given, and runs per file (the large one fewer).
PROBE_FILES = ["gpt2", "1b"]


def runs_for(path):
    return 5 if os.path.getsize(path) > (2 << 30) else 7


def probe_files(run):
    """The files to probe: --files as given, else gpt2 and 1b (gpt2 alone under the emulated
    driver: 4.7 GB through an emulator says nothing and takes long)."""
    if run.a.files_given or run.a.emulated_driver:
        return list(run.files)
    files_dir = os.path.join(run.a.work, "files")
    return [os.path.join(files_dir, FILE_NAMES[n]) for n in PROBE_FILES]


def step_probe(run, limit):
    import time
    step_end = time.time() + limit
    paths = probe_files(run)
    missing = [n for n, f in FILE_NAMES.items() if os.path.join(run.a.work, "files", f) in paths
               and not os.path.isfile(os.path.join(run.a.work, "files", f))]
    if missing:
        rc, out = command(run, "probe", [bin_path("make_bench_files"), os.path.join(run.a.work, "files")] + missing,
                          remaining(run, step_end), echo=True)
        if rc != 0:
            return "failed", f"make_bench_files {' '.join(missing)}: exit code {rc}: {tail(out)}", {}
    data = {"files": {}}
    for path in paths:
        name = os.path.basename(path)
        left = remaining(run, step_end)
        if left < 20:
            data["files"][name] = {"skipped": f"the step's time is spent ({left:.0f} s left)"}
            continue
        out_json = os.path.join(run.a.work, f"probe-{name}.json")
        if os.path.exists(out_json):
            os.remove(out_json)
        runs = str(run.a.runs or runs_for(path))
        # The multi-rank loads on a GPU only: through the emulator, thousands of collectives of a
        # small file's shared tensors take minutes and say nothing.
        items = "probe" if run.a.emulated_driver else "probe,ranks"
        rc, out = command(run, "probe", [bin_path("bench_cpp"), "--items", items, "--runs", runs,
                                         "--json", out_json, path], left, echo=True)
        result = read_json(out_json)
        if rc != 0 or not result:
            why = "timed out" if rc is None else f"exit code {rc}: {tail(out)}"
            data["files"][name] = {"skipped": why}
            continue
        entry = result["files"][0]
        data["files"][name] = {"probe": entry.get("probe", {}), "ranks": [
            it for it in entry.get("items", []) if "rank" in it.get("item", "")], "bytes": entry.get("bytes")}
    measured = {n: f for n, f in data["files"].items() if "probe" in f}
    if not measured:
        return "skipped", "; ".join(f"{n}: {f['skipped']}" for n, f in data["files"].items()) or "no file", data
    data["decision"] = decide(measured)
    data["lines"] = lines(measured, data["decision"])
    for line in data["lines"]:
        run.say("    " + line)
    skipped = [f"{n}: {f['skipped']}" for n, f in data["files"].items() if "skipped" in f]
    return "ran", ("not measured: " + "; ".join(skipped)) if skipped else None, data


def load(probe, variant):
    return next((l for l in probe.get("loads", []) if l.get("variant") == variant), {})


def decide(files):
    """The rule of docs/gpu.md ("The GPU probe"), applied to each file's figures: which path
    becomes the default, and what to build next. Each verdict says what it rests on."""
    out = []
    # 1. DRAM contention: the host copy falling to 40 GB/s or less beside the DMA loop.
    slow = []
    for name, f in files.items():
        c = f["probe"].get("contention", {})
        for n in (8, 16):
            g = c.get(f"host_{n}_with_dma_gbps")
            if isinstance(g, (int, float)) and g <= 40:
                slow.append(f"{name}: {n} threads {g:.1f} GB/s beside DMA")
    if slow:
        out.append(("dram", "the staged path is DRAM-bound (" + "; ".join(slow) + "): prioritise zero-copy (D2)"))
    else:
        out.append(("dram", "host copies keep above 40 GB/s beside DMA: the staged path is not DRAM-bound"))
    # 2. The best staged configuration of the sweep against the pinned copy, on every file.
    best = {}
    for name, f in files.items():
        pinned = load(f["probe"], "pinned H2D").get("median_s")
        sweep = [s for s in f["probe"].get("sweep", []) if isinstance(s, dict) and s.get("median_s")]
        if pinned and sweep:
            s = min(sweep, key=lambda s: s["median_s"])
            best[name] = (pinned / s["median_s"], s)
    if best and all(r >= 0.85 for r, _ in best.values()):
        out.append(("staged", "a staged configuration reaches >= 0.85x of pinned on every file (" + ", ".join(
            f"{n}: {r:.2f}x, {s['backend']} {s['readers']} readers {s['slot_bytes'] >> 20} MiB" for n, (r, s) in
            best.items()) + "): ship striped staging (D1) as the default; zero-copy stays the 8-GPU path"))
    elif best:
        out.append(("staged", "no staged configuration reaches 0.85x of pinned on every file (" + ", ".join(
            f"{n}: best {r:.2f}x" for n, (r, _) in best.items()) + ")"))
    # 3. Registration: stalls of the copy submissions, and scaling over threads.
    stall, flat = [], []
    for name, f in files.items():
        r = f["probe"].get("register", {})
        busy = r.get("longest_submission_ms_while_registering")
        if isinstance(busy, (int, float)) and busy > 2:
            stall.append(f"{name}: {busy:.1f} ms")
        passes = {(p["chunk_bytes"], p["threads"]): p.get("gbps") for p in r.get("passes", []) if "gbps" in p}
        one, four = passes.get((64 << 20, 1)), passes.get((64 << 20, 4))
        if one and four and four < 1.3 * one:
            flat.append(f"{name}: {one:.0f} -> {four:.0f} GB/s on 1 -> 4 threads")
    if stall or flat:
        out.append(("register", "registration stalls submissions for more than 2 ms per 64 MiB or does not "
                    "scale (" + "; ".join(stall + flat) + "): keep the hybrid, with a duty-cycle limit on the registrar"))
    else:
        out.append(("register", "registration neither stalls submissions beyond 2 ms nor stops scaling"))
    # 4. The defaults: stripes, and zero-copy.
    ratio = lambda f, a, b: (load(f["probe"], a).get("median_s") or 0) / (load(f["probe"], b).get("median_s") or 1)
    stripes_better = all(ratio(f, "default (2 MiB stripes)", "whole chunks (before)") <= 1.0 for f in files.values())
    out.append(("stripes", "keep 2 MiB stripes as the default" if stripes_better else
                "stripes were slower than whole chunks on some file: set the default stripe to 0 "
                "(PipelineOptions::from_env) until understood"))
    hybrid_better = all(ratio(f, "hybrid", "default (2 MiB stripes)") <= 0.95 for f in files.values())
    zc_used = all(t.get("zero_copy_chunks", 0) > 0 for f in files.values()
                  for t in f["probe"].get("trace", []) if isinstance(t, dict) and t.get("variant") == "hybrid")
    out.append(("zero_copy", "turn zero-copy on by default (ZeroCopy::from_env), once the tests step passes with "
                "SAFETENSORS_ZERO_COPY=1: the hybrid took <= 0.95x the default's time on every file" if hybrid_better and
                zc_used else "keep zero-copy off by default: the hybrid was not 5 % faster than the default on every "
                "file" + ("" if zc_used else " (or took no span zero-copy)")))
    return [{"topic": t, "verdict": v} for t, v in out]


def lines(files, decision):
    out = []
    if any(f["probe"].get("emulated") for f in files.values()):
        out.append("EMULATED DRIVER: these figures check the probe's code, not a GPU; so does the decision below.")
    for name, f in files.items():
        p = f["probe"]
        size = f.get("bytes") or 1
        out.append(f"{name} ({size / 1e6:,.0f} MB):")
        pinned = load(p, "pinned H2D").get("median_s")
        for l in p.get("loads", []):
            m = l.get("median_s") or 0
            if m:
                out.append(f"  {l['variant']:<26} {m * 1e3:9.2f} ms {size / m / 1e9:6.1f} GB/s" +
                           (f"  {pinned / m:.2f}x of pinned" if pinned and l["variant"] != "pinned H2D" else ""))
        for t in p.get("trace", []):
            if "link_busy" in t:
                out.append(f"  trace {t['variant']:<20} link busy {t['link_busy']:.2f}, first copy "
                           f"{t['first_copy_ms']:.2f} ms, drain {t['drain_ms']:.2f} ms, alloc {t['alloc_ms']:.2f} ms")
        for r in f.get("ranks", []):
            if "median_s" in r:
                out.append(f"  {r['item']:<26} {r['median_s'] * 1e3:9.2f} ms")
    out.append("Decision (docs/gpu.md, the probe's rule):")
    out += [f"  {d['topic']}: {d['verdict']}" for d in decision]
    return out


if __name__ == "__main__":  # the decision again, from a saved results.json
    import sys
    results = json.load(open(sys.argv[1]))
    step = next(s for s in results["steps"] if s["name"] == "probe")
    files = {n: f for n, f in step["data"]["files"].items() if "probe" in f}
    print("\n".join(lines(files, decide(files))))
