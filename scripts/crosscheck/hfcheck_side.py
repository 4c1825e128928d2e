"""hfcheck's prediction of the same quantities vllm_side.py records, on the same cut models.

Run: /work/main/.venv/bin/python scripts/crosscheck/hfcheck_side.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_hfcheck.json.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
from common import build_cut_model, err, run_over_types  # noqa: E402

from hfcheck.analyzer.analysis.crosscheck import vllm_replaces_experts  # noqa: E402
from hfcheck.analyzer.facts import collect_facts  # noqa: E402
from hfcheck.analyzer.fusions.attention import layer_index  # noqa: E402
from hfcheck.analyzer.fusions.base import FusionContext  # noqa: E402
from hfcheck.analyzer.fusions.context import fusion_context  # noqa: E402
from hfcheck.analyzer.fusions.detect import class_fusions, instance_fusions  # noqa: E402
from hfcheck.analyzer.fusions.moe import MoEBlockFusion  # noqa: E402
from hfcheck.analyzer.instance import ATTN_IMPLEMENTATION, register_attention  # noqa: E402

logging.disable(logging.WARNING)
transformers.logging.set_verbosity_error()


def one(mt: str) -> dict:
    out: dict = {"error": None}
    cfg, text, model, info = build_cut_model(mt, ATTN_IMPLEMENTATION)
    out.update(info)
    out["model_class"] = type(model).__name__
    # hfcheck's own model-wide facts, exactly as `analyse` derives its FusionContext
    try:
        facts, _ = collect_facts({"model_type": mt})
        ctx = fusion_context(facts)
    except Exception as exc:  # noqa: BLE001 - hfcheck cannot analyse this type; still compare class-level results
        out["facts_error"] = err(exc)
        ctx = FusionContext(head_size=1)
    out["head_size"], out["use_mla"] = ctx.head_size, ctx.use_mla
    modules: dict = {}
    attention_by_layer: dict = {}
    moe: dict = {}
    for path, module in model.named_modules():
        entry: dict = {"cls": type(module).__name__}
        try:
            cf = class_fusions(module)
            entry["candidates"] = [p.name for p, _ in cf.candidates]
            if cf.refused:
                entry["refused"] = [list(r) for r in cf.refused]
            inst = instance_fusions(module, ctx)
            entry["chosen"] = [m.fusion for m in inst.chosen]
            if "attention" in entry["chosen"] and (idx := layer_index(module)) is not None:
                attention_by_layer.setdefault(str(idx), []).append(path)
            rejected = [list(r) for r in inst.rejected if "higher-priority" not in r[1]]
            if rejected:
                entry["rejected"] = rejected
        except Exception as exc:  # noqa: BLE001 - recorded per module
            entry["error"] = err(exc)
        modules[path] = entry
        experts = dict(module.named_children()).get("experts")
        if experts is not None:
            m: dict = {"block_cls": type(module).__name__, "experts_cls": type(experts).__name__}
            m["replaceable_common"] = vllm_replaces_experts(experts)
            try:
                b = MoEBlockFusion.analyse(module, ctx)
                m["replaceable"] = b.experts_replaceable
                m["internal"] = b.internal_routing
                # hfcheck has no "block forward taken over, routing external" outcome:
                # the only block takeover it predicts is internal routing.
                m["fused"] = b.block_taken_over
                m["scoring"] = b.scoring if b.internal_routing else None
                m["shared"] = b.shared_expert
                m["reason"] = b.routing_reason
            except Exception as exc:  # noqa: BLE001 - recorded per block
                m["error"] = err(exc)
            moe[path] = m
    out["modules"] = modules
    out["attention_by_layer"] = attention_by_layer
    out["moe"] = moe
    return out


def main() -> None:
    register_attention()
    run_over_types(one, {"side": "hfcheck", "transformers": transformers.__version__, "torch": torch.__version__}, "/tmp/crosscheck_hfcheck.json")


if __name__ == "__main__":
    main()
