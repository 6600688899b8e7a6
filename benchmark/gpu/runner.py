"""What every step of the GPU kit's run shares (benchmark/gpu/run.py): the run's state and
results file, commands with a time limit whose output goes to a log, and where the kit's programs
and this machine's tools are."""
import datetime
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KIT = os.path.dirname(HERE)
FILE_NAMES = {"gpt2": "gpt2.safetensors", "1b": "1b-mixed.safetensors", "20k": "20k.safetensors"}
REPORT_RESERVE = 25  # seconds kept for the report


class Run:
    """The run's state: options, deadline, every step's outcome, the results file."""

    def __init__(self, a):
        self.a = a
        self.start = time.time()
        self.deadline = self.start + a.budget
        self.steps = []
        self.env = dict(os.environ)
        self.python = sys.executable
        os.makedirs(a.work, exist_ok=True)
        self.logs = os.path.join(a.work, "logs")
        shutil.rmtree(self.logs, ignore_errors=True)
        os.makedirs(self.logs)
        os.makedirs(a.out, exist_ok=True)
        # The kit's own libraries (GoogleTest, when the programs link it shared), after the
        # emulated driver when one is asked for.
        paths = [os.path.join(KIT, "lib")] + [p for p in self.env.get("LD_LIBRARY_PATH", "").split(":") if p]
        if a.emulated_driver:
            paths.insert(0, a.emulated_driver)
            self.env.setdefault("SAFETENSORS_FAKE_CUDA_DEVICES", "2")
        self.env["LD_LIBRARY_PATH"] = ":".join(paths)
        self.files = [os.path.join(a.work, "files", FILE_NAMES[n]) for n in a.files]
        self.manifest = read_json(os.path.join(KIT, "MANIFEST.json")) or {}
        self.console = open(os.path.join(self.logs, "console.log"), "w")
        for program in glob.glob(os.path.join(KIT, "bin", "*")):  # a copy that lost the modes
            if not os.access(program, os.X_OK):
                os.chmod(program, 0o755)

    def left(self):
        return self.deadline - time.time()

    def say(self, text):
        print(text, flush=True)
        self.console.write(text + "\n")
        self.console.flush()

    def results(self):
        out = {"kit": self.manifest, "run": {
            "started": datetime.datetime.fromtimestamp(self.start, datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "budget_s": self.a.budget, "files": [os.path.basename(f) for f in self.files],
            "driver": "emulated" if self.a.emulated_driver else "real", "seconds": round(time.time() - self.start, 1)},
            "steps": self.steps}
        try:
            if HERE not in sys.path:
                sys.path.insert(0, HERE)
            import report
            out["goals"] = report.goals(report.Runs([out]))
        except Exception as e:  # the results come first; the report says what went wrong
            out["goals_error"] = f"{type(e).__name__}: {e}"
        return out

    def save(self):
        path = os.path.join(self.a.out, "results.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.results(), f, indent=1)
        os.replace(path + ".tmp", path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def command(run, name, cmd, timeout, env=None, echo=False):
    """Runs `cmd` (its output into logs/NAME.log, and to the console with `echo`), killing its
    whole process group after `timeout` seconds. Returns (exit code, or None when it was killed;
    its output)."""
    log = open(os.path.join(run.logs, name + ".log"), "a")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or run.env,
                             start_new_session=True, text=True, errors="replace")
    except OSError as e:
        log.write(f"could not start: {e}\n")
        log.close()
        return -1, f"could not start {cmd[0]}: {e}"
    out = []

    def pump():  # a thread, so that a line never finished cannot hold up the timeout
        for line in p.stdout:
            out.append(line)
            if not log.closed:
                log.write(line)
            if echo:
                run.say("    " + line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = p.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        rc = None
    reader.join(10)  # a child that outlives the program may hold the pipe open: not for long
    log.write(f"(killed after {timeout:.0f} s)\n" if rc is None else f"(exit code {rc})\n")
    log.close()
    return rc, "".join(out)


def tail(text, n=6):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-700:]


def tool(*names):
    """The first of `names` on PATH or in the usual CUDA folders, else None."""
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    for n in names:
        for d in sorted(glob.glob("/usr/local/cuda*/bin") + glob.glob("/opt/nvidia/*/bin") +
                        glob.glob("/usr/local/cuda*/compute-sanitizer"), reverse=True):
            if os.access(os.path.join(d, n), os.X_OK):
                return os.path.join(d, n)
    return None


def can_drop_caches():
    """None when this process may drop the page cache, else why not."""
    if os.geteuid() != 0:
        return "dropping the page cache needs root"
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "/proc/sys/vm/drop_caches is not writable here"
    return None


def remaining(run, step_end):
    """Seconds a step's next command may take: its own share, and the run's less the report's."""
    return min(step_end, run.deadline - REPORT_RESERVE) - time.time()


def bin_path(name):
    return os.path.join(KIT, "bin", name)


# ---- the steps: each returns (status, why, data) --------------------------------------------------
# status: passed / failed (checks), ran (measurements), skipped (with why), timed out.
