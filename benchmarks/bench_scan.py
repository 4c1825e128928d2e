"""hfcheck's speed and memory, measured side by side in one run, printed as ratios to their floors.

    .venv/bin/python benchmarks/bench_scan.py            # everything (about 3 minutes on 2 cores)
    .venv/bin/python benchmarks/bench_scan.py --skip-sweep

(a) cold ``hfcheck scan Qwen/Qwen3-4B`` (a fresh process, an empty HF cache, offline) against
    the bare import floor ``python -c "import torch, transformers; from transformers import
    AutoModelForCausalLM, PreTrainedModel"``, alternating runs, medians; target <= 1.5x.
(b) warm analysis of one architecture (Qwen/Qwen3-4B, in one process after a first run):
    median of resolve + analyse + build_report; target <= 0.5 s. Also the median over every
    causal-LM type, for context.
(c) ``hfcheck sweep`` of every causal-LM type with 2 workers on (at most) 2 cores and an empty
    result cache; target <= 120 s. Then the same command again, cached, in fresh processes:
    wall clock as a user sees it (imports included), median; target <= 10 s.
(d) peak RSS of ``hfcheck scan Qwen/Qwen3-235B-A22B-FP8`` against ``hfcheck scan Qwen/Qwen3-0.6B``
    (both bundled, offline); target within 1.15x and under 1.5 GB.

Not a test: it prints the figures (and PASS/MISS against each target) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORT_FLOOR = "import torch, transformers; from transformers import AutoModelForCausalLM, PreTrainedModel"
ROOT = Path(__file__).resolve().parents[1]


def offline_env(tmp: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_CACHE": str(tmp / "hf" / "hub"),
        "HFCHECK_CACHE_DIR": str(tmp / "hfcheck-cache"),
        "TRANSFORMERS_VERBOSITY": "error",
        **extra,
    }


def two_cores():
    """preexec_fn pinning a child to (at most) two CPUs, where the OS allows it."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= 2:
        return None
    return lambda: os.sched_setaffinity(0, cpus[:2])


def timed(cmd: list[str], env: dict, preexec=None, keep_stderr: bool = False):
    """(wall seconds, peak RSS in bytes, exit code) of one child process; its stderr too, with ``keep_stderr``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=preexec, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode not in (0, 1):
        sys.stderr.write(f"  ! {' '.join(cmd)} exited {proc.returncode}: {err.strip()[-500:]}\n")
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return (wall, rss, proc.returncode, err) if keep_stderr else (wall, rss, proc.returncode)


def line(label: str, value: str, ratio: str, target: str, ok: bool) -> None:
    print(f"{label:<52} {value:>14} {ratio:>10}   target {target:<18} {'PASS' if ok else 'MISS'}", flush=True)


def bench_cold(runs: int, tmp: Path) -> None:
    floor, scan = [], []
    for i in range(runs):  # alternate, so machine noise hits both alike
        floor.append(timed([sys.executable, "-c", IMPORT_FLOOR], offline_env(tmp))[0])
        scan.append(timed([sys.executable, "-m", "hfcheck", "scan", "Qwen/Qwen3-4B", "--format", "json"], offline_env(tmp / f"cold{i}"))[0])
    f, s = statistics.median(floor), statistics.median(scan)
    print(f"(a) import floor median {f:.2f} s, scan median {s:.2f} s over {runs} runs each")
    line("(a) cold scan Qwen/Qwen3-4B / import floor", f"{s:.2f} s", f"{s / f:.2f}x", "<= 1.5x", s / f <= 1.5)


def bench_warm(runs: int) -> None:
    code = f"""
import os, statistics, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
from hfcheck.analyzer.analysis import analyse
from hfcheck.analyzer.report import build_report
from hfcheck.analyzer.sources import resolve
from hfcheck.analyzer.sources.model_types import causal_lm_types, type_source
def once(ref):
    t = time.perf_counter(); build_report(analyse(resolve(ref))); return time.perf_counter() - t
once("Qwen/Qwen3-4B")
times = [once("Qwen/Qwen3-4B") for _ in range({runs})]
per_type = []
for t in causal_lm_types():
    try:
        src = type_source(t.model_type)
    except Exception:
        continue
    s = time.perf_counter()
    try:
        build_report(analyse(src))
    except Exception:
        continue
    per_type.append(time.perf_counter() - s)
print(statistics.median(times), max(times), statistics.median(per_type), max(per_type), len(per_type))
"""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", code], env=offline_env(Path(tmp)), capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        print(f"(b) failed: {out.stderr.strip()[-500:]}")
        return
    med, worst, type_med, type_max, n = (float(x) for x in out.stdout.split())
    print(f"(b) Qwen/Qwen3-4B warm: median {med * 1000:.0f} ms, max {worst * 1000:.0f} ms over {runs}; every type once: median {type_med * 1000:.0f} ms, max {type_max * 1000:.0f} ms ({int(n)} types)")
    line("(b) warm analysis of one architecture (median)", f"{med:.3f} s", f"{med / 0.5:.2f}x", "<= 0.5 s", med <= 0.5)


def bench_sweep(tmp: Path, runs: int) -> None:
    """The real command, ``hfcheck sweep`` (atlas written to a temporary path), each run a fresh
    process timed from the outside: wall clock, imports included. The sweep's own timer (the
    "in N s" it prints) is shown beside it; it starts after the imports."""
    env = offline_env(tmp / "sweep")
    cmd = [sys.executable, "-m", "hfcheck", "sweep", "--jobs", "2", "--format", "json", "--atlas", str(tmp / "atlas.md")]
    pin = two_cores()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cold, _, rc, cold_err = timed(cmd, env, pin, keep_stderr=True)
    warm = [timed(cmd, env, pin, keep_stderr=True) for _ in range(max(3, runs))]
    wall = statistics.median(w[0] for w in warm)
    rc2 = max(w[2] for w in warm)
    own = statistics.median(_own_seconds(w[3]) for w in warm)
    print(f"(c) full sweep: {cold:.1f} s cold (its own timer {_own_seconds(cold_err):.1f} s), 2 workers, {min(2, cpus or 2)} of {cpus} CPUs")
    print(f"(c) cached re-run, wall clock of `hfcheck sweep` in a fresh process: median {wall:.2f} s over {len(warm)} "
          f"(runs {', '.join(f'{w[0]:.2f}' for w in warm)} s; its own timer {own:.2f} s)")
    line("(c) full sweep, 2 cores", f"{cold:.1f} s", f"{cold / 120:.2f}x", "<= 120 s", cold <= 120 and rc == 0)
    line("(c) cached re-run (wall clock)", f"{wall:.2f} s", f"{wall / 10:.2f}x", "<= 10 s", wall <= 10 and rc2 == 0)


def _own_seconds(stderr: str) -> float:
    match = re.search(r"targets in ([0-9.]+) s", stderr)
    return float(match.group(1)) if match else float("nan")


def bench_rss(runs: int, tmp: Path) -> None:
    big, small = [], []
    for i in range(runs):
        small.append(timed([sys.executable, "-m", "hfcheck", "scan", "Qwen/Qwen3-0.6B", "--format", "json"], offline_env(tmp / f"s{i}"))[1])
        big.append(timed([sys.executable, "-m", "hfcheck", "scan", "Qwen/Qwen3-235B-A22B-FP8", "--format", "json"], offline_env(tmp / f"b{i}"))[1])
    b, s = max(big), max(small)
    gb = 1024**3
    print(f"(d) peak RSS: Qwen3-235B-A22B-FP8 {b / gb:.3f} GiB, Qwen3-0.6B {s / gb:.3f} GiB (max of {runs} runs each)")
    line("(d) peak RSS 235B-FP8 / 0.6B", f"{b / gb:.3f} GiB", f"{b / s:.3f}x", "<= 1.15x, < 1.5 GB", b / s <= 1.15 and b < 1.5e9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per cold measurement (default 5)")
    parser.add_argument("--skip-sweep", action="store_true", help="skip (c), the full sweep")
    args = parser.parse_args()
    import platform

    import torch
    import transformers

    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, {os.cpu_count()} CPUs, {platform.platform()}")
    with tempfile.TemporaryDirectory(prefix="hfcheck-bench-") as tmp:
        t = Path(tmp)
        bench_cold(args.runs, t)
        bench_warm(max(10, args.runs * 3))
        if not args.skip_sweep:
            bench_sweep(t, args.runs)
        bench_rss(max(1, args.runs // 2), t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
