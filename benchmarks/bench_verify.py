"""Fusion proofs + TP 2 per model, each model in a fresh (cold) process, as a user runs it.

    .venv/bin/python benchmarks/bench_verify.py            # every model, a table
    .venv/bin/python benchmarks/bench_verify.py qwen3 olmo2

Target (issue 4): fusion proofs + TP 2 within 20 s per model on 2 cores, imports included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = ["qwen3", "qwen3_moe", "llama", "deepseek_v3", "gemma3_text", "phi3", "olmo2"]
TARGET_S = 20.0
ROOT = Path(__file__).resolve().parents[1]


def one(model_type: str) -> dict:
    t0 = time.perf_counter()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import write_model

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.sources import resolve
    from hfcheck.verify.common import build_subject
    from hfcheck.verify.fusion import prove_fusions
    from hfcheck.verify.runner import observed_fusions
    from hfcheck.verify.tp import prove_tp

    t_import = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        analysis = analyse(resolve(str(write_model(Path(tmp) / model_type, model_type))))
        t_scan = time.perf_counter() - t1
        t2 = time.perf_counter()
        subject = build_subject(analysis.facts, analysis.config_object)
        t_subject = time.perf_counter() - t2
        t3 = time.perf_counter()
        fusions = prove_fusions(subject, analysis.facts, observed_fusions(analysis))
        t_fusion = time.perf_counter() - t3
        t4 = time.perf_counter()
        tp2 = prove_tp(subject, analysis.facts, 2)
        t_tp = time.perf_counter() - t4
    return {
        "model": model_type,
        "import_s": t_import,
        "scan_s": t_scan,
        "instance_s": t_subject,
        "fusion_s": t_fusion,
        "tp2_s": t_tp,
        "total_s": time.perf_counter() - t0,
        "fusion_proofs": f"{sum(p.status == 'proven' for p in fusions)}/{len(fusions)}",
        "fusion_max_err": max((p.max_rel_error or 0.0) for p in fusions),
        "tp2": tp2.status,
        "tp2_err": tp2.max_rel_error,
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print(json.dumps(one(argv[1])))
        return 0
    models = argv or MODELS
    print(f"cores: {os.cpu_count()}  (target: fusion proofs + TP 2 <= {TARGET_S:.0f} s per model, cold process)")
    print(f"{'model':<13} {'import':>7} {'scan':>6} {'inst':>6} {'fusion':>7} {'TP2':>6} {'total':>7}  proofs  max err   TP2")
    worst = 0.0
    for model in models:
        out = subprocess.run([sys.executable, __file__, "--one", model], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if out.returncode:
            print(f"{model:<13} failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            worst = float("inf")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        worst = max(worst, r["total_s"])
        print(f"{r['model']:<13} {r['import_s']:>7.2f} {r['scan_s']:>6.2f} {r['instance_s']:>6.2f} {r['fusion_s']:>7.2f} {r['tp2_s']:>6.2f} "
              f"{r['total_s']:>7.2f}  {r['fusion_proofs']:>6}  {r['fusion_max_err']:.1e}  {r['tp2']} ({(r['tp2_err'] or 0):.1e})")
    print(f"slowest model: {worst:.2f} s ({'within' if worst <= TARGET_S else 'OVER'} the {TARGET_S:.0f} s target)")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
