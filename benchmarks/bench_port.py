"""``hfcheck port`` on every real remote-code folder in ``../shared/fixtures/remote-real``.

For each model, two runs of the real command line (a fresh process each, wall clock and the
peak resident memory of its whole process tree, reference and proof children included):

- ``full``: the published folder (full-size config, no weights): the original runs in its own
  transformers release at a shrunk size with seeded random weights, the output is proven
  against it;
- ``ckpt``: a small copy with a random checkpoint in the original's own tensor names (made by
  the original code in its own release), so the checkpoint is converted and the proof also
  runs on those "real" weights;
- ``inpl``: the published folder again with ``--path rewrite``: no retarget, the remote code is
  rewritten in place (attention regions and packed projections located by the original's
  recorded dataflow), proven the same way, and re-scanned.

Reference environments are built first (once; their build time is printed apart), so the
port times are what a user with a warm cache sees.

    .venv/bin/python benchmarks/bench_port.py [--models internlm-20b,qwen-7b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "remote-real"
MEASURE = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "peak_rss_bytes": peak, "stdout": proc.stdout, "stderr": proc.stderr[-2000:]}))
"""


def measured(argv: list[str]) -> dict:
    """Run ``argv`` under a fresh measuring process: its wall clock and the largest resident
    set among all its descendants (``RUSAGE_CHILDREN`` of a process that did nothing else)."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def port(src: Path, out: Path, *extra: str) -> dict:
    run = measured([sys.executable, "-m", "hfcheck", "port", str(src), "--out", str(out), "--format", "json", *extra])
    try:
        result = json.loads(run["stdout"])
    except ValueError:
        result = {"status": "error", "path": "-", "message": run["stderr"].strip().splitlines()[-1] if run["stderr"].strip() else "?"}
    checks = (result.get("proof") or {}).get("checks") or []
    rels = [c["max_rel_error"] for c in checks if isinstance(c.get("max_rel_error"), float)]
    served = result.get("served") or {}
    return {
        "status": result.get("status"), "path": result.get("path"), "target": (result.get("retarget") or {}).get("target"),
        "max_rel_error": max(rels) if rels else None, "checks": len(checks), "checks_ok": sum(1 for c in checks if c.get("ok")),
        "served": (served.get("how") or ("-" if result.get("status") != "refused" else "refused"))
        + (f" {served['verdict']} {served['score']}" if served.get("how") == "transformers-backend" else ""),
        "served_summary": served.get("summary") or result.get("message", "")[:200],
        "seconds": round(run["wall_s"], 1), "peak_rss_mib": round(run["peak_rss_bytes"] / 2**20), "rc": run["rc"],
        "reference": (result.get("reference") or {}).get("transformers"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated folder names (default: all)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else sorted(p.name for p in REAL.iterdir() if (p / "config.json").is_file())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.environments import EnvSpec, ensure_env
    from hfcheck.porter.reference.establish import candidate_releases, required_packages

    print("reference environments (built once, then cached):")
    for name in names:
        source = resolve(str(REAL / name))
        release = candidate_releases(source.config, None)[0][0]
        packages, _ = required_packages(source.code_files, source.config.get("auto_map") or {})
        t0 = time.perf_counter()
        env = ensure_env(EnvSpec(release, packages))
        print(f"  {name:24} transformers {release:8} {'built in %.0f s' % (time.perf_counter() - t0) if env.built_seconds else 'cached'}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="hfcheck-bench-port-") as tmp:
        from hfcheck.porter.reference.sample import write_sample

        for name in names:
            rows.append({"model": name, "run": "full", **port(REAL / name, Path(tmp) / f"{name}-out")})
            sample = write_sample(REAL / name, Path(tmp) / f"{name}-small")
            rows.append({"model": name, "run": "ckpt", **port(sample, Path(tmp) / f"{name}-small-out")})
            rows.append({"model": name, "run": "inpl", **port(REAL / name, Path(tmp) / f"{name}-inplace-out", "--path", "rewrite")})
    head = f"{'model':24} {'run':4} {'path':9} {'target':18} {'max rel err':>11} {'proof':>6} {'vLLM serves':31} {'seconds':>7} {'peak RSS':>9}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        rel = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else "-"
        print(f"{r['model']:24} {r['run']:4} {r['path'] or '-':9} {r['target'] or '-':18} {rel:>11} {r['checks_ok']}/{r['checks']:<4} "
              f"{r['served']:31} {r['seconds']:>7.1f} {r['peak_rss_mib']:>6} MiB")
    worst = max(r["peak_rss_mib"] for r in rows)
    ported = [r for r in rows if r["status"] == "ported"]
    print(f"\n{len(ported)}/{len(rows)} runs ported and proven; worst max relative error "
          f"{max((r['max_rel_error'] or 0) for r in ported):.1e} (budget 1e-4); peak RSS at most {worst} MiB (budget 2048 MiB); "
          f"median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.1f} s per port")
    for r in rows:
        if r["status"] != "ported":
            print(f"  {r['model']} ({r['run']}): {r['status']}: {r['served_summary']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
