"""vLLM 0.33's own fuser detection on every common causal-LM model type (CPU, meta device),
asked through hfcheck.analyzer.analysis.crosscheck (the one module that calls vLLM's fusers).

Run with the Python of an environment holding vLLM 0.33 and hfcheck (CI: .venv-vllm):
    python scripts/crosscheck/vllm_side.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_vllm.json.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
from common import build_cut_model, err, run_over_types  # noqa: E402

import hfcheck  # noqa: E402
from hfcheck.analyzer.analysis.crosscheck import (  # noqa: E402
    ask_fusers,
    import_vllm,
    match_moe_block,
    stub_vllm_config,
    vllm_replaces_experts,
)

# importing hfcheck hides the packages vLLM's environment lacks (hfcheck.ABSENT_FROM_VLLM); this
# side runs vLLM in its environment as it is, so whatever that environment has stays importable
for _name in hfcheck.ABSENT_FROM_VLLM:
    if _name in sys.modules and sys.modules[_name] is None:
        del sys.modules[_name]

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
        if answer.chosen is not None:
            entry["chosen"] = answer.chosen
        error = answer.error if answer.error is not None else answer.attention_error
        if error is not None:
            entry["error"] = err(error)
        modules[path] = entry
        experts = dict(module.named_children()).get("experts")
        if experts is not None:
            m: dict = {"block_cls": type(module).__name__, "experts_cls": type(experts).__name__}
            m["replaceable"] = vllm_replaces_experts(experts)
            try:
                fuser = match_moe_block(VLLM, module)
                m["fuser"] = m["fused"] = fuser is not None  # block forward taken over (internal or external routing)
                m["scoring"] = fuser.scoring_func if fuser else None
                m["internal"] = bool(fuser and fuser.scoring_func)
                m["shared"] = fuser.shared_name if fuser else None
            except Exception as exc:  # noqa: BLE001 - recorded per block
                m["error"] = err(exc)
            moe[path] = m
    out["modules"] = modules
    out["attention_by_layer"] = {str(idx): paths for idx, paths in attention_by_layer.items()}
    out["moe"] = moe
    return out


def main() -> None:
    run_over_types(one, {"side": "vllm", "vllm": VLLM.vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__}, "/tmp/crosscheck_vllm.json")


if __name__ == "__main__":
    main()
