"""vLLM 0.33's own fuser detection on every common causal-LM model type (CPU, meta device),
asked through hfcheck.analyzer.crosscheck (the one module that calls vLLM's fusers).

Run with the Python of an environment holding vLLM 0.33 and hfcheck (CI: .venv-vllm):
    python scripts/crosscheck/vllm_side.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_vllm.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
from common import build_cut_model, common_model_types, err, time_limit  # noqa: E402

from hfcheck.analyzer.crosscheck import (  # noqa: E402
    ask_fusers,
    ask_moe_block,
    import_vllm,
    stub_vllm_config,
    vllm_replaces_experts,
)

logging.disable(logging.WARNING)
transformers.logging.set_verbosity_error()
VLLM = import_vllm()  # the one module that asks vLLM's code; scan --cross-check asks through it too


def one(mt: str) -> dict:
    out: dict = {"error": None}
    cfg, text, model, info = build_cut_model(mt, "vllm")
    out.update(info)
    out["model_class"] = type(model).__name__
    vcfg = stub_vllm_config(VLLM, cfg, text)
    out["head_size"], out["use_mla"] = vcfg.model_config.get_head_size(), vcfg.model_config.use_mla
    answers, attention_by_layer = ask_fusers(VLLM, model, vcfg)
    modules: dict = {}
    moe: dict = {}
    for path, module in model.named_modules():
        answer = answers[path]
        entry: dict = {"cls": answer.cls}
        if answer.candidates is not None:
            entry["candidates"] = answer.candidates
        if answer.error is not None:
            entry["error"] = err(answer.error)
        else:
            entry["chosen"] = answer.chosen
        modules[path] = entry
        experts = dict(module.named_children()).get("experts")
        if experts is not None:
            m: dict = {"block_cls": type(module).__name__, "experts_cls": type(experts).__name__}
            m["replaceable"] = vllm_replaces_experts(experts)
            try:
                answer_moe = ask_moe_block(VLLM, module)
                m["fuser"] = m["fused"] = answer_moe["fused"]  # block forward taken over (internal or external routing)
                m["scoring"] = answer_moe["scoring"]
                m["internal"] = answer_moe["internal"]
                m["shared"] = answer_moe["shared"]
            except Exception as exc:  # noqa: BLE001 - recorded per block
                m["error"] = err(exc)
            moe[path] = m
    out["modules"] = modules
    out["attention_by_layer"] = {str(idx): paths for idx, paths in attention_by_layer.items()}
    out["moe"] = moe
    return out


def main() -> None:
    types = common_model_types()
    if "--only" in sys.argv:
        types = sys.argv[sys.argv.index("--only") + 1].split(",")
    result = {"_meta": {"side": "vllm", "vllm": VLLM.vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}
    t0 = time.time()
    for mt in types:
        t = time.time()
        try:
            with time_limit(120):
                result[mt] = one(mt)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result[mt] = {"error": err(exc)}
        result[mt]["seconds"] = round(time.time() - t, 2)
        print(f"{mt:32s} {result[mt]['seconds']:6.2f}s {result[mt]['error'] or ''}", flush=True)
    result["_meta"]["seconds"] = round(time.time() - t0, 1)
    out = os.environ.get("CROSSCHECK_OUT", "/tmp/crosscheck_vllm.json")
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    print("wrote", out, "in", result["_meta"]["seconds"], "s")


if __name__ == "__main__":
    main()
