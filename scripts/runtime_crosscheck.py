"""The atlas checked against what vLLM actually does: every causal-LM model type loaded in real
vLLM (the CPU build here), its logged decisions compared with hfcheck's prediction.

    .venv/bin/python scripts/runtime_crosscheck.py [--types qwen3,llama] [--batch 8] [--out reports/runtime-vllm-0.32.0.jsonl]

- vLLM's CPU build is set up once (``porter.runtime.environment``) and hfcheck is installed into
  it without dependencies, so prediction and runtime read the same transformers (5.19 there);
- model types run in batches, several per process (``porter.runtime.batch``), each batch a child
  under the one isolated-process runner with a time limit; a model that hangs or kills its
  process costs that model (it is recorded as such) and the batch resumes after it;
- results are one JSON line per model type in ``--out``: re-running skips every type already
  there for the same hfcheck source and vLLM version (resumable; ``--fresh`` starts over);
- the summary prints agreement: over the types whose small instance builds, the share where
  hfcheck's verdict (loads or not) and every module's fusions and attention equal vLLM's.

A full run is long on 2 cores (about 25 s per type: 196 types in 1.5 h).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPS = ("networkx", "rich", "platformdirs", "libcst", "einops")


def source_hash() -> str:
    h = hashlib.sha256()
    for folder in ("analyzer", "porter/runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def prepare(log) -> tuple[Path, str]:
    from hfcheck.porter.runtime.environment import cpu_vllm

    runtime = cpu_vllm(log)
    check = subprocess.run([str(runtime.python), "-c", f"import hfcheck, sys; sys.exit(0 if hfcheck.__file__.startswith({str(ROOT)!r}) else 1)"],
                           capture_output=True, check=False)
    if check.returncode != 0:
        log("installing hfcheck (editable, no dependencies) into vLLM's environment")
        subprocess.run([str(runtime.python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        subprocess.run([str(runtime.python), "-m", "pip", "install", "-q", *DEPS], check=True)
    return runtime.python, runtime.version


def model_types(python: Path) -> list[str]:
    code = "from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M; import json; print(json.dumps(sorted(M)))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(types: list[str], python: Path, version: str, out: Path, batch: int, per_model_s: float, log) -> None:
    from hfcheck.analyzer.isolation import child_env, private_root, run_child

    todo = list(types)
    while todo:
        chunk, todo = todo[:batch], todo[batch:]
        with private_root("hfcheck-runtime-batch-") as root:
            job = {"model_types": chunk, "out": str(out), "progress": str(root / "progress"), "vllm_version": version}
            (root / "job.json").write_text(json.dumps(job))
            env = child_env(root, 2, {"VLLM_CPU_KVCACHE_SPACE": "1", "HFCHECK_ENV_DIR": str(root / "envs")})
            log(f"batch of {len(chunk)}: {', '.join(chunk)}")
            child = run_child([str(python), "-m", "hfcheck.porter.runtime.batch", str(root / "job.json")], root,
                              timeout=per_model_s * len(chunk) + 60, env=env, cwd=root / "work")
            done = {json.loads(line)["model_type"] for line in out.read_text().splitlines() if line.strip()} if out.is_file() else set()
            missing = [t for t in chunk if t not in done]
            if missing:
                stuck = (root / "progress").read_text().strip() if (root / "progress").is_file() else missing[0]
                why = "timed out" if child.timed_out else f"the process ended with status {child.returncode}"
                with open(out, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"model_type": stuck, "status": "crashed", "error": f"{why} while running it", "vllm": version}) + "\n")
                todo = [t for t in missing if t != stuck] + todo


def agreement(rows: list[dict]) -> dict:
    built = [r for r in rows if r.get("status") in ("loaded", "refused")]
    verdict_ok = [r for r in built if (r["status"] == "loaded") == (r.get("verdict") in ("native-speed", "runs"))]
    full_ok = [r for r in verdict_ok if r["status"] == "refused" or (not r.get("differences") and r.get("tokens_match"))]
    return {"types": len(rows), "built": len(built), "verdict_agrees": len(verdict_ok), "all_agree": len(full_ok),
            "disagree": sorted(r["model_type"] for r in built if r not in full_ok)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=None, help="comma-separated model types (default: every causal-LM type)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--per-model", type=float, default=180.0, help="seconds allowed per model type")
    parser.add_argument("--out", default=None)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--gate", metavar="TOML", default=None,
                        help="exit 1 when a type disagrees with vLLM and is not listed (with its reason) in this file")
    args = parser.parse_args()

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    python, version = prepare(log)
    out = Path(args.out or ROOT / "reports" / f"runtime-vllm-{version}.jsonl")
    key = source_hash()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() and not args.fresh else []
    rows = [r for r in rows if r.get("hfcheck_source") in (None, key)]
    types = args.types.split(",") if args.types else model_types(python)
    have = {r["model_type"] for r in rows}
    todo = [t for t in types if t not in have]
    log(f"{len(types)} types, {len(have & set(types))} already recorded, {len(todo)} to run (vLLM {version})")
    tmp = out.with_suffix(".new.jsonl")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.monotonic()
    if todo:
        run(todo, python, version, tmp, args.batch, args.per_model, log)
    rows = [dict(json.loads(line), hfcheck_source=key) for line in tmp.read_text().splitlines() if line.strip()]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.unlink()
    summary = agreement([r for r in rows if r["model_type"] in types])
    log(f"done in {time.monotonic() - t0:.0f} s: {summary['all_agree']}/{summary['built']} types agree with vLLM at runtime "
        f"(verdict {summary['verdict_agrees']}/{summary['built']}); {summary['types'] - summary['built']} without a runnable instance")
    known = {}
    if args.gate:
        import tomllib

        known = tomllib.loads(Path(args.gate).read_text(encoding="utf-8")).get("types", {})
    unexplained = []
    for name in summary["disagree"]:
        row = next(r for r in rows if r["model_type"] == name)
        why = known.get(name)
        log(f"  {name}: {row['status']} (hfcheck: {row.get('verdict')}) {row.get('error') or '; '.join(row.get('differences') or [])[:300]}"
            + (f" [known: {why}]" if why else ""))
        if not why:
            unexplained.append(name)
    if args.gate:
        log(f"gate: {len(unexplained)} unexplained difference(s)" + (f": {', '.join(unexplained)}" if unexplained else ""))
        return 1 if unexplained else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
