"""How many GPUs: weights by dtype (FP8 included) plus a KV cache for one full-length sequence.

Parameters are counted on the structural instance and scaled back to the real model:
each real layer counts like the kept layer of the same kind, experts scaled to the real
expert count. The meta device makes this free of any weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from hfcheck.analyzer.instance.shrink import is_moe_layer

GPU_GIB = 80
"""Assumed accelerator memory (H100/A100 80 GB class); stated in the output."""
UTILISATION = 0.9
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "compressed-tensors": 1.0, "mxfp4": 0.53, "awq": 0.53, "gptq": 0.53, "bitsandbytes": 0.53}


@dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    weight_gib: float
    kv_gib_per_sequence: float
    context: int
    gpu_gib: int = GPU_GIB


def estimate(analysis) -> MemoryEstimate | None:
    inst, facts = analysis.instance, analysis.facts
    if inst is None:
        return None
    model = inst.model
    layers = _layer_list(model)
    total_other = sum(p.numel() for n, p in model.named_parameters() if not _in_layers(n, layers))
    text = inst.config.get_text_config()
    kept: dict[tuple[str, bool], tuple[int, int]] = {}
    if layers is not None:
        name, module = layers
        for i, layer in enumerate(module):
            expert = sum(p.numel() for n, p in layer.named_parameters() if ".experts." in f".{n}")
            other = sum(p.numel() for p in layer.parameters()) - expert
            key = (inst.layer_types[i] if i < len(inst.layer_types) else "full_attention", is_moe_layer(facts, text, i))
            kept.setdefault(key, (other, expert))
    tiny_experts = max(2, min(facts.num_experts, 4)) if facts.is_moe else 1
    scale = facts.num_experts / tiny_experts if facts.is_moe else 1
    layer_total = 0.0
    fallback = next(iter(kept.values()), (0, 0))
    for i, kind in enumerate(facts.layer_types):
        other, expert = kept.get((kind, is_moe_layer(facts, text, i)), fallback)
        layer_total += other + expert * scale
    params = int(total_other + layer_total)
    lm_head = 0 if facts.tie_word_embeddings else (facts.vocab_size or 0) * (facts.hidden_size or 0)
    params += lm_head
    weight_bytes = params * QUANT_BYTES.get(facts.quant_method or "", BYTES.get(facts.dtype, 2))
    context = min(facts.max_position_embeddings or 8192, 32768)
    attn_layers = sum(1 for k in facts.layer_types if "attention" in k or k == "hybrid")
    if facts.uses_mla:
        per_token = attn_layers * ((facts.kv_lora_rank or 0) + (facts.qk_rope_head_dim or 0)) * 2
    else:
        per_token = attn_layers * 2 * (facts.num_kv_heads or 0) * (facts.head_dim or 0) * 2
    return MemoryEstimate(params, weight_bytes / 2**30, per_token * context / 2**30, context)


def _layer_list(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) and n.endswith("layers")]
    return lists[0] if lists else None


def _in_layers(name: str, layers) -> bool:
    return layers is not None and name.startswith(layers[0] + ".")


def suggested_parallelism(mem: MemoryEstimate | None, working: list[int], pp_supported: bool) -> tuple[int | None, int]:
    """(TP, PP): the smallest working TP size whose per-GPU share of weights + one
    sequence's KV cache fits; past the largest, pipeline stages of that TP size."""
    if not working:
        return None, 1
    if mem is None:
        return working[0], 1
    need = mem.weight_gib + mem.kv_gib_per_sequence
    budget = mem.gpu_gib * UTILISATION * 0.95
    for size in working:
        if need / size <= budget:
            return size, 1
    tp = working[-1]
    return tp, (math.ceil(need / (tp * budget)) if pp_supported else 1)
