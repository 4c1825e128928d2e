"""The atlas checked against what vLLM actually does: every causal-LM model type loaded in real
vLLM (the CPU build here), its logged decisions compared with hfcheck's prediction.

    .venv/bin/python scripts/runtime_crosscheck.py [--types qwen3,llama] [--batch 8] [--out reports/runtime-vllm-0.32.0.jsonl] [--ray ADDRESS]
    .venv/bin/python scripts/runtime_crosscheck.py --vlm [--types llava,gemma3]   # vision-language folders with an image
    .venv/bin/python scripts/runtime_crosscheck.py --pooling [--types pooling:bert]   # every encoder type as an embedding model

- vLLM's CPU build is set up once (``runtime.environment``) and hfcheck is installed into
  it without dependencies, so prediction and runtime read the same transformers (5.19 there);
- model types run in batches, several per process (``runtime.batch``), each batch a child
  under the one isolated-process runner with a time limit; a model that hangs or kills its
  process costs that model (it is recorded as such) and the batch resumes after it;
- results are one JSON line per model type in ``--out``: re-running skips every type already
  there for the same hfcheck source and vLLM version (resumable; ``--fresh`` starts over), and
  ``--types`` re-runs those types alone, keeping the others' rows (each names its source);
- the summary prints agreement: over the types whose small instance builds, the share where
  hfcheck's verdict (loads or not) and every module's fusions and attention equal vLLM's.

A full run is long on 2 cores (about 25 s per type: 196 types in 1.5 h). ``--ray ADDRESS`` runs
the same batches as Ray tasks, as many at once as the cluster has ``--cpus-per-batch`` for; each
task runs its batch under the same runner on its node and sends the rows back to this file.
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


def source_hash() -> str:
    h = hashlib.sha256()
    for folder in ("hfcheck", "analyzer", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def prepare(log) -> tuple[Path, str]:
    from hfcheck.runtime.environment import cpu_vllm, install_hfcheck

    runtime = cpu_vllm(log)
    if not install_hfcheck(runtime, log):
        raise SystemExit("hfcheck could not be installed into vLLM's environment: the batches would not import it")
    return runtime.python, runtime.version


def model_types(python: Path) -> list[str]:
    code = "from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M; import json; print(json.dumps(sorted(M)))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


BATCH_MODULE = "hfcheck.runtime.batch"
VLM_MODULE = "hfcheck.runtime.vlm"
POOLING_MODULE = "hfcheck.runtime.pooling"
"""The child that runs a batch: causal-LM model types, the tiny vision-language cases (``--vlm``),
or encoder types on vLLM's pooling runner (``--pooling``)."""


def run_batch(chunk: list[str], python: Path, version: str, out: Path, per_model_s: float, module: str = BATCH_MODULE) -> dict:
    """One batch in an isolated child on this machine (the one isolated-process runner); the
    batch appends a row per model type to ``out``. Returns which types got none: ``missing``, the
    one it was running when it stopped (``stuck``) and why."""
    from hfcheck.isolation import child_env, private_root
    from hfcheck.isolation.jobs import run_job

    with private_root("hfcheck-runtime-batch-") as root:
        job = {"model_types": chunk, "out": str(out), "progress": str(root / "progress"), "vllm_version": version}
        env = child_env(root, 2, {"VLLM_CPU_KVCACHE_SPACE": "1", "HFCHECK_ENV_DIR": str(root / "envs")})
        child, _ = run_job([str(python), "-m", module, str(root)], root, job,  # the rows go to ``out``, no result.json
                           timeout=per_model_s * len(chunk) + 60, env=env, cwd=root / "work")
        done = {json.loads(line)["model_type"] for line in out.read_text().splitlines() if line.strip()} if out.is_file() else set()
        missing = [t for t in chunk if t not in done]
        stuck = ((root / "progress").read_text().strip() if (root / "progress").is_file() else "") or (missing[0] if missing else None)
    why = "timed out" if child.timed_out else f"the process ended with status {child.returncode}"
    last = [line for line in child.stderr_tail.splitlines() if line.strip()]
    if missing and last:
        why += f" ({last[-1].strip()[:200]})"
    return {"missing": missing, "stuck": stuck if missing else None, "why": why}


def settle(outcome: dict, out: Path, version: str) -> list[str]:
    """Record the model type a batch stopped on as crashed; the rest of its missing types run again."""
    if not outcome["missing"]:
        return []
    stuck = outcome["stuck"] if outcome["stuck"] in outcome["missing"] else outcome["missing"][0]
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"model_type": stuck, "status": "crashed", "error": f"{outcome['why']} while running it", "vllm": version}) + "\n")
    return [t for t in outcome["missing"] if t != stuck]


def run(types: list[str], python: Path, version: str, out: Path, batch: int, per_model_s: float, log,
        ray: str | None = None, cpus_per_batch: float = 2, module: str = BATCH_MODULE) -> None:
    """Every type in batches of ``batch``; a type that hangs or kills its batch is recorded as
    crashed and the batch resumes after it. With ``ray`` (an address; ``""``: Ray's default)
    the batches run as Ray tasks on the cluster instead, as many at once as it has CPUs for."""
    if ray is not None:
        return run_on_ray(types, python, version, out, batch, per_model_s, log, ray, cpus_per_batch)
    todo = list(types)
    while todo:
        chunk, todo = todo[:batch], todo[batch:]
        log(f"batch of {len(chunk)}: {', '.join(chunk)}")
        todo = settle(run_batch(chunk, python, version, out, per_model_s, module), out, version) + todo


def ray_batch(chunk: list[str], python: str, version: str, per_model_s: float) -> dict:
    """A Ray task: ``run_batch`` on the node it lands on, into a file there; its rows come back.
    The node needs what this machine has at the same paths: vLLM's environment (``python``)
    with hfcheck installed in it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hfcheck-runtime-ray-") as folder:
        out = Path(folder) / "rows.jsonl"
        outcome = run_batch(chunk, Path(python), version, out, per_model_s)
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    return {**outcome, "rows": rows}


def run_on_ray(types: list[str], python: Path, version: str, out: Path, batch: int, per_model_s: float, log,
               address: str, cpus_per_batch: float) -> None:
    import logging

    import ray

    if __name__ != "__main__":  # imported (a test): Ray's workers cannot import this script by name
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address=address or None, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
    try:
        task = ray.remote(num_cpus=cpus_per_batch, max_retries=0)(ray_batch)
        slots = max(1, int(ray.cluster_resources().get("CPU", 0) // cpus_per_batch))
        todo = [types[i:i + batch] for i in range(0, len(types), batch)]
        running: dict = {}
        while todo or running:
            while todo and len(running) < slots:
                chunk = todo.pop(0)
                log(f"batch of {len(chunk)} on Ray: {', '.join(chunk)}")
                running[task.remote(chunk, str(python), version, per_model_s)] = chunk
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                chunk = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the node or the task's worker was lost
                    line = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
                    outcome = {"missing": chunk, "stuck": chunk[0], "why": f"the Ray task was lost ({line[:200]})", "rows": []}
                with open(out, "a", encoding="utf-8") as f:
                    f.writelines(json.dumps(row) + "\n" for row in outcome["rows"])
                done = {row.get("model_type") for row in outcome["rows"]}
                outcome["missing"] = [t for t in chunk if t not in done]
                again = settle(outcome, out, version)
                if again:
                    todo.insert(0, again)
    finally:
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=None, help="comma-separated model types (default: every causal-LM type; with --vlm every case)")
    parser.add_argument("--vlm", action="store_true", help="the tiny vision-language cases (runtime/vlm.py), served with an image and text only")
    parser.add_argument("--pooling", action="store_true", help="encoder types on vLLM's pooling runner (runtime/pooling.py), embeddings compared")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--per-model", type=float, default=180.0, help="seconds allowed per model type")
    parser.add_argument("--out", default=None)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run the batches as Ray tasks on this cluster (every node needs vLLM's environment at the same path)")
    parser.add_argument("--cpus-per-batch", type=float, default=2, help="CPUs a batch reserves on a Ray node (default 2)")
    parser.add_argument("--gate", metavar="TOML", default=None,
                        help="exit 1 when a type disagrees with vLLM and is not listed (with its reason) in this file")
    args = parser.parse_args()
    kind = "vlm" if args.vlm else ("pooling" if args.pooling else "")
    if kind and args.ray is not None:
        parser.error(f"--{kind} runs its few cases on this machine (no --ray)")

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    from hfcheck.runtime.decisions import agreement

    python, version = prepare(log)
    from hfcheck.runtime.decisions import rows_prefix

    out = Path(args.out or ROOT / "reports" / f"{rows_prefix(kind)}{version}.jsonl").resolve()  # the batches run elsewhere
    key = source_hash()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() and not args.fresh else []
    if kind:
        from importlib import import_module

        module = import_module(VLM_MODULE if args.vlm else POOLING_MODULE)
        types = args.types.split(",") if args.types else module.cases()
    else:
        types = args.types.split(",") if args.types else model_types(python)
    # a row recorded by other hfcheck code is run again when its type is asked for; the rows of
    # types not asked for are kept as they are (each says which code made it)
    rows = [r for r in rows if r.get("hfcheck_source") in (None, key) or r["model_type"] not in types]
    have = {r["model_type"] for r in rows if r["model_type"] in types}
    todo = [t for t in types if t not in have]
    log(f"{len(types)} types, {len(have & set(types))} already recorded, {len(todo)} to run (vLLM {version})")
    tmp = out.with_suffix(".new.jsonl")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.monotonic()
    if todo:
        run(todo, python, version, tmp, args.batch, args.per_model, log, ray=args.ray, cpus_per_batch=args.cpus_per_batch,
            module={"vlm": VLM_MODULE, "pooling": POOLING_MODULE}.get(kind, BATCH_MODULE))
    rows = [{"hfcheck_source": key, **json.loads(line)} for line in tmp.read_text().splitlines() if line.strip()]
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
