"""Settle which native class computes the original's function, numerically.

For each target of the registry that ``match``es the anatomy, each hypothesis is built as a
native transformers model at the reference run's shrunk size, loaded with the reference run's
own random weights converted by the hypothesis's plan (strictly: a missing or extra tensor
fails it), and run on the same token ids. The first hypothesis whose logits equal the
original's (max |a - b| / max |a| <= 1e-4 in float32, same greedy token at every position)
is the retarget; every attempt is kept for PORT.md, with the first decoder layer whose output
differs when one does.

Native transformers code is trusted, so these models are built in-process; the remote code
never is (it ran in the reference environment).
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.instance.shrink import first, head_counts
from hfcheck.analyzer.terms.tolerances import PORT_LOGITS
from hfcheck.analyzer.vllm.registry import vllm_has_native
from hfcheck.porter.reference.compare import compare
from hfcheck.porter.reference.run import ReferenceRun
from hfcheck.porter.retarget.anatomy import Anatomy, Dims, layer_count
from hfcheck.porter.retarget.plan import PlanError, Recipe, convert_state, expand, sources
from hfcheck.porter.retarget.targets import TARGETS, Hypothesis

TOLERANCE = PORT_LOGITS
MAX_ATTEMPTS = 96


@dataclass
class Attempt:
    target: str
    choices: dict[str, str]
    ok: bool
    max_rel_error: float | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "choices": self.choices, "ok": self.ok, "max_rel_error": self.max_rel_error, "detail": self.detail}


@dataclass
class Found:
    hypothesis: Hypothesis
    plan: list[Recipe] | None  # None: same names (identity, through the native loader)
    native_tiny_config: dict[str, Any]
    checks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SearchResult:
    found: Found | None
    attempts: list[Attempt]
    skipped: list[str]  # "target: why it does not fit"
    seconds: float


def build_native(config: dict[str, Any], attn: str = "eager"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    cfg.architectures = config.get("architectures")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
    return model.float().eval()


def _layer_outputs(model, ids):
    """Each decoder layer's output (hooks), for naming the first layer that differs."""
    import torch

    outs: dict[int, Any] = {}
    layers = None
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1:
            layers = module
            break
    hooks = []
    for i, layer in enumerate(layers or []):
        hooks.append(layer.register_forward_hook(lambda _m, _i, out, i=i: outs.__setitem__(i, out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    return logits, outs


def identity_plan(keys: list[str], layers_path: str) -> list[Recipe]:
    pattern = re.compile(rf"^{re.escape(layers_path)}\.(\d+)\.")
    plan, seen = [], set()
    for key in keys:
        generic = pattern.sub(f"{layers_path}.{{i}}.", key)
        if generic not in seen:
            seen.add(generic)
            plan.append({"out": generic, "src": generic})
    return plan


def _try(hyp: Hypothesis, run: ReferenceRun, dims: Dims, tiny_config: dict[str, Any], ids) -> tuple[Attempt, Found | None]:
    import torch

    attempt = Attempt(hyp.target, dict(hyp.choices), False)
    try:
        native_cfg = hyp.config(dims, tiny_config)
        model = build_native(native_cfg)
    except Exception as exc:  # noqa: BLE001 - a config the native class refuses is a failed hypothesis
        attempt.detail = f"the native config is refused: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return attempt, None
    state = run.state
    plan = None
    try:
        if hyp.plan is not None:
            plan = hyp.plan(dims)
            converted = convert_state(plan, dims.layers, state)
            missing, unexpected = load_planned(model, converted)
        else:
            model, missing, unexpected = load_same_names(native_cfg, state)
    except (PlanError, RuntimeError, ValueError, KeyError) as exc:
        attempt.detail = f"the weights do not convert: {str(exc).splitlines()[0][:200]}"
        return attempt, None
    if missing or unexpected:
        attempt.detail = f"weights do not fit the native class: missing {missing[:3]}, unexpected {unexpected[:3]}"
        return attempt, None
    unused = _unused_parameters(run, plan, state)
    if unused:
        attempt.detail = f"original parameters left unused: {', '.join(unused[:3])}"
        return attempt, None
    ids_t = torch.tensor(ids, dtype=torch.long)
    logits, outs = _layer_outputs(model, ids_t)
    cmp = compare(run.logits, logits)
    attempt.max_rel_error = cmp.get("max_rel_error")
    attempt.ok = cmp["ok"]
    if not cmp["ok"]:
        attempt.detail = cmp.get("detail") or _first_different_layer(run, outs) or "logits differ"
        return attempt, None
    return attempt, Found(hyp, plan, native_cfg, [{"name": "random weights, eager", **cmp}])


def load_planned(model, converted: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Load exactly the plan's tensors; a name the native class ties to a planned one (the
    head of a tied model) takes that tensor, as ``from_pretrained`` would."""
    keys = set(model.state_dict())
    shared: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    for names in shared.values():
        given = [n for n in names if n in converted]
        for name in names:
            if given and name not in converted:
                converted[name] = converted[given[0]]
    missing = sorted(keys - set(converted))
    unexpected = sorted(set(converted) - keys)
    if not missing and not unexpected:
        model.load_state_dict(converted, strict=True)
    return missing, unexpected


def load_same_names(native_cfg: dict[str, Any], state: dict[str, Any]):
    """Same names: save the original's tensors as a checkpoint and let the native class load
    it the way ``from_pretrained`` (and vLLM) does, renames and expert fusion included."""

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    with tempfile.TemporaryDirectory(prefix="hfcheck-samenames-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(native_cfg))
        save_file({k: v.contiguous() for k, v in state.items()}, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        # with output_loading_info transformers returns (model, info); its annotation names the model alone
        loaded: Any = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager", output_loading_info=True,
                                                           local_files_only=True)
        model, info = loaded
    missing = sorted(k for k in info.get("missing_keys", []) if not k.endswith(("inv_freq", "rotary_emb.inv_freq")))
    unexpected = sorted(k for k in info.get("unexpected_keys", []) if not _is_buffer_name(k))
    return model.float().eval(), missing, unexpected


def _is_buffer_name(key: str) -> bool:
    return key.endswith(("inv_freq", "masked_bias", ".attn.bias", "cos_cached", "sin_cached", "future_mask"))


def _unused_parameters(run: ReferenceRun, plan: list[Recipe] | None, state: dict[str, Any]) -> list[str]:
    if plan is None:
        return []
    params = {f"{m['name']}.{p}" if m["name"] else p for m in run.result.get("modules", []) for p in m["params"]}
    n = layer_count(run)
    used = sources(expand(plan, n))
    tied = {b for a, b in run.result.get("tied", [])} | {a for a, b in run.result.get("tied", [])}
    return sorted(p for p in params if p not in used and not (p in tied and any(t in used for t in tied)))


def _first_different_layer(run: ReferenceRun, outs: dict[int, Any]) -> str:
    for i in sorted(outs):
        ref = run.hidden(i)
        if ref is None or ref.shape != outs[i].shape:
            continue
        cmp = compare(ref, outs[i])
        if cmp.get("max_rel_error", 1.0) > TOLERANCE:
            return f"decoder layer {i} output differs (max relative error {cmp['max_rel_error']:.1e})"
    return ""


def search(run: ReferenceRun, anatomy: Anatomy | None, tiny_config: dict[str, Any], input_ids: list[list[int]],
           dims: Dims | None = None, accept: Callable[[Found], str | None] | None = None) -> SearchResult:
    """The first proven hypothesis that ``accept`` takes (it returns a reason to refuse one:
    the port only retargets to a class vLLM then serves)."""
    start = time.perf_counter()
    attempts: list[Attempt] = []
    skipped: list[str] = []
    dims = dims or (anatomy.dims if anatomy else None) or _dims_from_run(run, tiny_config)
    hypotheses: list[Hypothesis] = []
    for target in TARGETS:
        reason = target.match(anatomy, tiny_config)
        if reason:
            skipped.append(f"{target.name}: {reason}")
            continue
        hypotheses.extend(target.hypotheses(anatomy, tiny_config))
    refused: set[str] = set()
    for hyp in sorted(hypotheses, key=serving_rank):  # stable: within a rank, the registry's order
        if len(attempts) >= MAX_ATTEMPTS:
            break
        if hyp.architecture in refused:
            continue  # proven under another reading and refused: its other readings cannot do better
        attempt, found = _try(hyp, run, dims, tiny_config, input_ids)
        attempts.append(attempt)
        if found:
            refusal = accept(found) if accept else None
            if refusal:
                attempt.detail = f"computes the same function, but {refusal}"
                skipped.append(f"{hyp.architecture}: computes the same function, but {refusal}")
                refused.add(hyp.architecture)
                continue
            found.native_tiny_config = copy.deepcopy(found.native_tiny_config)
            return SearchResult(found, attempts, skipped, round(time.perf_counter() - start, 2))
    return SearchResult(None, attempts, skipped, round(time.perf_counter() - start, 2))


def serving_rank(hyp: Hypothesis) -> int:
    """0 where vLLM serves the class natively, 1 where only its transformers backend does: a
    retarget takes the best-served class that reproduces the original."""

    return 0 if vllm_has_native([hyp.architecture])[0] else 1


def _dims_from_run(run: ReferenceRun, tiny_config: dict[str, Any]) -> Dims:
    heads, kv = head_counts(tiny_config)
    hidden = first(tiny_config, "hidden") or 0
    return Dims(hidden, heads or 0, kv or 0, first(tiny_config, "head_dim") or (hidden // heads if heads else 0),
                first(tiny_config, "intermediate") or 0, first(tiny_config, "vocab") or 0, first(tiny_config, "layers") or 0)
