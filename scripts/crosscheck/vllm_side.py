"""vLLM 0.33's own fuser detection on every common causal-LM model type (CPU, meta device).

Run: /work/vllmenv/venv/bin/python scripts/crosscheck/vllm_side.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_vllm.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
import vllm  # noqa: E402
import vllm.model_executor.models.transformers  # noqa: E402  (registers "vllm" attention)
from common import build_cut_model, common_model_types, err, moe_replaceable, time_limit  # noqa: E402
from vllm.model_executor.models.transformers.fuser import Fusers, get_fusers  # noqa: E402
from vllm.model_executor.models.transformers.fusers import AttentionFuser  # noqa: E402
from vllm.model_executor.models.transformers.fusers.moe import MoEBlockFuser  # noqa: E402
from vllm.transformers_utils.model_arch_config_convertor import (  # noqa: E402
    MODEL_ARCH_CONFIG_CONVERTORS,
    ModelArchConfigConvertorBase,
)

logging.disable(logging.WARNING)
transformers.logging.set_verbosity_error()

NAMES = {
    "MLAFuser": "mla",
    "GLUFuser": "glu",
    "QKVFuser": "qkv",
    "PackedQKVFuser": "packed_qkv",
    "MergedColumnParallelFuser": "merged_column",
    "RMSNormFuser": "rms_norm",
    "AttentionFuser": "attention",
}


def name(fuser) -> str:
    return NAMES.get(type(fuser).__name__, type(fuser).__name__)


def stub_vllm_config(cfg, text):
    """What Fusers.__getitem__/validate read: model_config.use_mla / get_head_size(), TP size."""
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(getattr(cfg, "model_type", None), ModelArchConfigConvertorBase)
    # ModelConfig.get_head_size() is model_arch_config.head_size, built by convert()
    # (per layer, then merged, for heterogeneous configs such as Gemma 4)
    try:
        head_size = convertor(cfg, text).convert().head_size
    except Exception:  # noqa: BLE001 - vLLM's converter may not handle this config: its plain head size
        head_size = convertor(cfg, text).get_head_size()
    # ModelConfig.use_mla for the transformers backend: kv_lora_rank is not None
    use_mla = getattr(text, "kv_lora_rank", None) is not None
    model_config = SimpleNamespace(use_mla=use_mla, get_head_size=lambda: head_size, dtype=torch.bfloat16)
    return SimpleNamespace(
        model_config=model_config,
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        quant_config=None,
    ), head_size, use_mla


def one(mt: str) -> dict:
    out: dict = {"error": None}
    cfg, text, model, info = build_cut_model(mt, "vllm")
    out.update(info)
    out["model_class"] = type(model).__name__
    vcfg, head_size, use_mla = stub_vllm_config(cfg, text)
    out["head_size"], out["use_mla"] = head_size, use_mla
    fusers = Fusers(model, vcfg)  # real class: get_fusers for every module, validate per instance
    modules: dict = {}
    attention_by_layer: dict = {}
    moe: dict = {}
    for path, module in model.named_modules():
        entry: dict = {"cls": type(module).__name__}
        try:
            entry["candidates"] = [name(f) for f in get_fusers(module)]
            chosen = fusers[module]
            entry["chosen"] = [name(f) for f in chosen]
            for f in chosen:
                if isinstance(f, AttentionFuser) and (idx := f.layer_index(module)) is not None:
                    attention_by_layer.setdefault(str(idx), []).append(path)
        except Exception as exc:  # noqa: BLE001 - recorded per module
            entry["error"] = err(exc)
        modules[path] = entry
        experts = dict(module.named_children()).get("experts")
        if experts is not None:
            m: dict = {"block_cls": type(module).__name__, "experts_cls": type(experts).__name__}
            m["replaceable"] = moe_replaceable(experts)
            try:
                fuser = MoEBlockFuser.match(module, "experts")
                m["fuser"] = m["fused"] = fuser is not None  # block forward taken over (internal or external routing)
                m["scoring"] = fuser.scoring_func if fuser else None
                m["internal"] = bool(fuser and fuser.scoring_func)
                m["shared"] = fuser.shared_name if fuser else None
            except Exception as exc:  # noqa: BLE001 - recorded per block
                m["error"] = err(exc)
            moe[path] = m
    out["modules"] = modules
    out["attention_by_layer"] = attention_by_layer
    out["moe"] = moe
    return out


def main() -> None:
    types = common_model_types()
    if "--only" in sys.argv:
        types = sys.argv[sys.argv.index("--only") + 1].split(",")
    result = {"_meta": {"side": "vllm", "vllm": vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__}}
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
