"""``hfcheck port`` on real published remote code: every folder it is given, one row each.

Models: ``../shared/fixtures/remote-real`` (5), ``tests/fixtures/remote-published`` (kept in
this repository with their sources) and every folder under each ``--more DIR`` (real remote
code fetched from public mirrors of Hub repositories, outside the project; each folder's
SOURCE.md names its commit and licence). For each model, runs of the real command line (a
fresh process each; wall clock and the peak resident memory of its whole process tree,
reference and proof children included):

- ``full``: the published folder (full-size config, no weights): the original runs in its own
  transformers release at a shrunk size with seeded random weights and the output is proven
  against it (or port stops: served natively, refused with its reason at file:line);
- ``ckpt`` (where ``full`` ported): a small copy with a random checkpoint in the original's own
  tensor names, made by the original code in its own release, so the checkpoint is converted
  and the proof also runs on those converted weights;
- ``back`` (where vLLM serves the published folder natively, so ``full`` stops with the
  command): the published folder with ``--path backend``, ported anyway for the transformers
  backend;
- ``inpl`` (``--inplace``): the published folder with ``--path rewrite``.

Reference environments are built first (once; their build time is printed apart), so the
port times are what a user with a warm cache sees. The last lines are a Markdown table for
the README.

    .venv/bin/python benchmarks/bench_port.py [--more /work/realcode] [--models a,b] [--inplace] [--json out.json]
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

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "fixtures" / "remote-real"
PUBLISHED = ROOT / "tests" / "fixtures" / "remote-published"
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
        "served_summary": served.get("summary") or result.get("message", "")[:700],
        "seconds": round(run["wall_s"], 1), "peak_rss_mib": round(run["peak_rss_bytes"] / 2**20), "rc": run["rc"],
        "reference": (result.get("reference") or {}).get("transformers"),
    }


def folders(more: list[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in [REAL, PUBLISHED, *map(Path, more)]:
        if root.is_dir():
            for path in sorted(root.iterdir()):
                if (path / "config.json").is_file() and path.name not in found:
                    found[path.name] = path
    return found


def path_cell(r: dict) -> str:
    """The path the port took, and how it ended where it did not end ported (a refused rewrite is not a port)."""
    path = r["path"] or r["status"]
    if r["status"] in ("ported", "served_natively") or path == r["status"] or (r["status"] == "refused" and path == "refused"):
        return path
    return f"{path} ({r['status']})"


def served_cell(r: dict) -> str:
    how = r["served"]
    if how.startswith("vllm-native") or r["status"] == "served_natively":
        return "native"
    if how.startswith("transformers-backend"):
        return "backend " + how.split(" ", 1)[1] if " " in how else "backend"
    return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated folder names (default: all)")
    parser.add_argument("--more", action="append", default=[], help="a folder of more real remote-code model folders")
    parser.add_argument("--inplace", action="store_true", help="also port each with --path rewrite")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    available = folders(args.more)
    names = args.models.split(",") if args.models else list(available)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import candidate_releases, required_packages
    from hfcheck.shared.environments import EnvError, EnvSpec, ensure_env

    print("reference environments (built once, then cached):")
    for name in names:
        source = resolve(str(available[name]))
        release = candidate_releases(source.config, None)[0][0]
        packages, _ = required_packages(source.code_files, source.config.get("auto_map") or {})
        t0 = time.perf_counter()
        try:
            env = ensure_env(EnvSpec(release, packages))
            state = f"built in {time.perf_counter() - t0:.0f} s" if env.built_seconds else "cached"
        except EnvError as exc:
            state = f"cannot be built: {str(exc)[:120]}"
        print(f"  {name:26} transformers {release:8} {state}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="hfcheck-bench-port-") as tmp:
        from hfcheck.porter.reference.sample import write_sample

        for name in names:
            src = available[name]
            full = {"model": name, "run": "full", **port(src, Path(tmp) / f"{name}-out")}
            rows.append(full)
            print(f"  {name}: {full['status']} ({full['path']}, {full['target'] or '-'}) in {full['seconds']} s", flush=True)
            if full["status"] == "ported":
                try:
                    sample = write_sample(src, Path(tmp) / f"{name}-small")
                    rows.append({"model": name, "run": "ckpt", **port(sample, Path(tmp) / f"{name}-small-out")})
                except Exception as exc:  # noqa: BLE001 - a sample the original cannot make is a row, not a stop
                    rows.append({"model": name, "run": "ckpt", "status": "error", "path": "-", "target": None, "max_rel_error": None, "checks": 0,
                                 "checks_ok": 0, "served": "-", "served_summary": f"sample: {exc}"[:300], "seconds": 0.0, "peak_rss_mib": 0, "rc": 2,
                                 "reference": None})
            if full["status"] == "served_natively":  # what `--path backend` makes of it (the user's other choice)
                rows.append({"model": name, "run": "back", **port(src, Path(tmp) / f"{name}-backend-out", "--path", "backend")})
            if args.inplace and full["status"] == "ported":
                rows.append({"model": name, "run": "inpl", **port(src, Path(tmp) / f"{name}-inplace-out", "--path", "rewrite")})
    head = f"{'model':26} {'run':4} {'path':9} {'target':18} {'max rel err':>11} {'proof':>6} {'vLLM serves':31} {'seconds':>7} {'peak RSS':>9}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        rel = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else "-"
        print(f"{r['model']:26} {r['run']:4} {r['path'] or '-':9} {r['target'] or '-':18} {rel:>11} {r['checks_ok']}/{r['checks']:<4} "
              f"{r['served']:31} {r['seconds']:>7.1f} {r['peak_rss_mib']:>6} MiB")
    full_rows = [r for r in rows if r["run"] == "full"]
    ported = [r for r in full_rows if r["status"] == "ported"]
    worst = max(r["peak_rss_mib"] for r in rows)
    print(f"\n{len(full_rows)} models: {len(ported)} ported and proven, {sum(r['status'] == 'served_natively' for r in full_rows)} served natively as published, "
          f"{sum(r['status'] == 'refused' for r in full_rows)} refused, {sum(r['status'] not in ('ported', 'served_natively', 'refused') for r in full_rows)} other; "
          f"worst max relative error {max(((r['max_rel_error'] or 0) for r in rows if r['status'] == 'ported'), default=0):.1e} (budget 1e-4); "
          f"peak RSS at most {worst} MiB (budget 2048 MiB); median {sorted(r['seconds'] for r in full_rows)[len(full_rows) // 2]:.1f} s per port")

    print("\n| model | release | path | target | max rel. error, random | converted checkpoint | vLLM | seconds | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    ckpt = {r["model"]: r for r in rows if r["run"] == "ckpt"}
    for r in full_rows:
        c = ckpt.get(r["model"])
        rel = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else "-"
        conv = (f"{c['max_rel_error']:.1e}" if c and c["max_rel_error"] is not None else (c["status"] if c else "-"))
        target = f"`{r['target']}`" if r["target"] else ("in place" if r["path"] == "rewrite" else "-")
        print(f"| {r['model']} | {r['reference'] or '-'} | {path_cell(r)} | {target} | {rel} | {conv} | {served_cell(r)} | {r['seconds']:.1f} | {r['peak_rss_mib']} MiB |")
    backend = [r for r in rows if r["run"] == "back"]
    if backend:
        print("\nServed natively as published; ported anyway with `--path backend`:\n")
        print("| model | release | path | target | max rel. error, random | vLLM | seconds | peak RSS |")
        print("|---|---|---|---|---|---|---|---|")
        for r in backend:
            rel = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else "-"
            target = f"`{r['target']}`" if r["target"] else ("in place" if r["path"] == "rewrite" else "-")
            print(f"| {r['model']} | {r['reference'] or '-'} | {path_cell(r)} | {target} | {rel} | {served_cell(r)} | {r['seconds']:.1f} | {r['peak_rss_mib']} MiB |")
    print()
    for r in full_rows:
        if r["status"] != "ported":
            print(f"- {r['model']}: {r['status']}: {r['served_summary']}")
    for r in rows:
        if r["run"] != "full" and r["status"] != "ported":
            print(f"- {r['model']} ({r['run']}): {r['status']}: {r['served_summary']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
