"""``hfcheck scan --cross-check``: ask vLLM's own code the questions hfcheck answered.

Where vLLM is importable in the same interpreter and is the release the prediction is for (a
modelled release: ``vllm.release.releases()``; an installed vLLM that is a modelled release is
the one predicted for unless ``--vllm`` names another), vLLM's own logic is run on the *same*
structural instance hfcheck walked:

- registry: whether vLLM has a native class for the architecture (``vllm.ModelRegistry``), and
  how ``ModelRegistry._try_resolve_transformers`` resolves it with ``--model-impl
  transformers`` (class found / not compatible / which backend class, MoE or not). Remote
  classes (``auto_map``) are never imported: that part is then skipped;
- fusions: ``get_fusers`` (candidates per class) and ``Fusers.__getitem__`` (chosen per
  instance, with vLLM's head size from its own config convertor) on every module hfcheck
  visited;
- attention coverage: the layers whose attention vLLM's ``AttentionFuser`` takes (the text
  config's attention implementation is switched from hfcheck's stand-in to ``"vllm"`` while
  vLLM looks, and restored);
- MoE: vLLM's replaceable-experts test and ``MoEBlockFuser.match`` on every block with an
  ``experts`` child (block taken over, routing, scoring function, shared expert).

The result is the report's ``cross_check`` block::

    {"available": true, "vllm_version": "0.34.0", "agrees": false,
     "compared": {"modules": 31, "layers": 4, "moe_blocks": 1, ...},
     "differences": [{"quantity": "chosen", "where": "Qwen3MLP", "vllm": [...], "hfcheck": [...],
                      "instances": 2, "example": "layers.0.mlp"}]}

Otherwise ``{"available": false, "vllm_version": X|null, "agrees": null, "differences": [],
"note": "cross-check unavailable for vLLM X"}`` and the command prints that one line. A
cross-check never changes the verdict, the score or the exit code.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hfcheck.analyzer.fusions.detect import class_fusions
from hfcheck.analyzer.fusions.moe import EXPERTS_NAME, MoEBlockFusion, divides_shared_output
from hfcheck.analyzer.instance import ATTN_IMPLEMENTATION, module_configs
from hfcheck.analyzer.vllm.release import installed_vllm_version, modelled_version, releases

if TYPE_CHECKING:
    from hfcheck.analyzer.analysis import Analysis

CROSS_CHECK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["available", "vllm_version", "agrees", "differences"],
    "properties": {
        "available": {"type": "boolean"},
        "vllm_version": {"type": ["string", "null"]},
        "agrees": {"type": ["boolean", "null"]},
        "note": {"type": ["string", "null"]},
        "compared": {"type": "object"},
        "vllm_backend_class": {"type": ["string", "null"]},
        "differences": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["quantity", "where", "vllm", "hfcheck"],
                "properties": {
                    "quantity": {"type": "string"},
                    "where": {"type": "string"},
                    "instances": {"type": "integer"},
                    "example": {"type": ["string", "null"]},
                },
            },
        },
    },
}
"""The ``cross_check`` property of the scan report (for scan.schema.json)."""


def supported(version: str | None) -> bool:
    """Is the installed vLLM the release predicted for (its private APIs are then the ones modelled)?"""
    if not version:
        return False
    return version.split("+")[0] == modelled_version()


def unavailable(version: str | None, why: str | None = None) -> dict[str, Any]:
    if version is None:
        note = "cross-check unavailable: vLLM not installed"
    elif why:
        note = f"cross-check unavailable for vLLM {version}: {why}"
    else:
        note = (f"cross-check unavailable for vLLM {version}: the prediction is for vLLM {modelled_version()}"
                if version.split("+")[0] in releases() else
                f"cross-check unavailable for vLLM {version} (the cross-check reads the code of a modelled release: {', '.join(releases())})")
    return {"available": False, "vllm_version": version, "agrees": None, "differences": [], "note": note}


def summary_line(cross: dict[str, Any]) -> str:
    """One line for the terminal / CI log."""
    if not cross.get("available"):
        return cross.get("note") or "cross-check unavailable"
    n = len(cross["differences"])
    head = f"cross-check with vLLM {cross['vllm_version']}: "
    if cross.get("agrees"):
        compared = cross.get("compared") or {}
        parts = [k.replace("_", " ") for k in ("registry", "backend_class") if compared.get(k)]
        for key, noun in (("modules", "module"), ("layers", "attention layer"), ("moe_blocks", "MoE block")):
            if compared.get(key):
                parts.append(f"{compared[key]} {noun}{'s' * (compared[key] != 1)}")
        return head + (f"agrees on {', '.join(parts)}" if parts else "agrees")
    return head + f"{n} difference{'s' * (n != 1)}"


def render_cross_check_text(cross: dict[str, Any], console: Any) -> None:
    """Terminal rendering (rich console): the summary line, then each difference."""
    style = "green" if cross.get("agrees") else ("yellow" if cross.get("available") else "dim")
    console.print(summary_line(cross), style=style, markup=False)
    for d in cross.get("differences", []):
        where = f" (e.g. {d['example']})" if d.get("example") else ""
        console.print(f"  {d['quantity']} {d['where']}: vLLM={d['vllm']!r} hfcheck={d['hfcheck']!r}{where}", markup=False)


def cross_check(analysis: Analysis, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``cross_check`` block for this analysis (never raises for a vLLM-side problem)."""
    version = installed_vllm_version()
    if not supported(version):
        return unavailable(version)
    try:
        vllm_api = import_vllm()
    except Exception as exc:  # noqa: BLE001 - broken install, missing CUDA runtime pieces, ...
        return unavailable(version, f"vLLM does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    diffs = _Differences()
    compared: dict[str, int] = {}
    backend = _registry(vllm_api, analysis, report or {}, diffs, compared)
    inst, obs = analysis.instance, analysis.observations
    note = None
    if getattr(analysis, "sandbox", None) is not None:
        # remote classes only ever run in hfcheck's sandbox: vLLM's code is not run on them here
        note = "remote code built in the sandbox: only the registry was compared"
    elif inst is None or obs is None or not hasattr(getattr(inst, "model", None), "named_modules"):
        note = f"no structural instance to compare ({analysis.instance_error})"
    else:
        with _vllm_attention(inst.model):
            _fusions(vllm_api, analysis, diffs, compared)
            _moe(vllm_api, analysis, diffs, compared)
    out = {
        "available": True,
        "vllm_version": version,
        "agrees": not diffs.items,
        "compared": compared,
        "vllm_backend_class": backend,
        "differences": diffs.as_list(),
    }
    if note:
        out["note"] = note
    return out


# --- asking vLLM's own code ------------------------------------------------------------
# Every call hfcheck makes into vLLM's code is in this module: its fusers, MoE block fuser and
# config convertor here, its registry in ``_registry`` below; ``scan --cross-check`` and the CI
# harness (scripts/crosscheck/vllm_side.py) both ask through these functions.


def import_vllm() -> SimpleNamespace:
    """The pieces of vLLM the cross-check calls (0.32 to 0.34 alike; importing the transformers backend
    registers its "vllm" attention function)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm
        import vllm.model_executor.models.transformers
        from vllm.config import ModelConfig
        from vllm.model_executor.models import registry
        from vllm.model_executor.models.transformers.fuser import Fusers, get_fusers
        from vllm.model_executor.models.transformers.fusers import AttentionFuser
        from vllm.model_executor.models.transformers.fusers.moe import MoEBlockFuser
        from vllm.transformers_utils.model_arch_config_convertor import (
            MODEL_ARCH_CONFIG_CONVERTORS,
            ModelArchConfigConvertorBase,
        )
    return SimpleNamespace(
        vllm=vllm, registry=registry, ModelConfig=ModelConfig, Fusers=Fusers, get_fusers=get_fusers, AttentionFuser=AttentionFuser,
        MoEBlockFuser=MoEBlockFuser, convertors=MODEL_ARCH_CONFIG_CONVERTORS, convertor_base=ModelArchConfigConvertorBase,
    )


FUSER_NAMES = {
    "MLAFuser": "mla", "GLUFuser": "glu", "QKVFuser": "qkv", "PackedQKVFuser": "packed_qkv",
    "MergedColumnParallelFuser": "merged_column", "RMSNormFuser": "rms_norm", "AttentionFuser": "attention",
}
"""vLLM's fuser classes in hfcheck's fusion vocabulary."""


def fuser_name(fuser: Any) -> str:
    return FUSER_NAMES.get(type(fuser).__name__, type(fuser).__name__)


def stub_vllm_config(api: SimpleNamespace, config: Any, text: Any) -> SimpleNamespace:
    """What ``Fusers.__getitem__`` and the fusers' ``validate`` read of a VllmConfig: the head
    size from vLLM's own config convertor (``convert()``, per layer then merged, as
    ``ModelConfig.get_head_size`` does for heterogeneous configs such as Gemma 4), ``use_mla``
    (the transformers backend's test: ``kv_lora_rank is not None``) and TP 1."""
    import torch

    convertor = api.convertors.get(getattr(config, "model_type", None), api.convertor_base)
    try:
        head_size = convertor(config, text).convert().head_size
    except Exception:  # noqa: BLE001 - vLLM's converter may not handle this config: its plain head size
        head_size = convertor(config, text).get_head_size()
    use_mla = getattr(text, "kv_lora_rank", None) is not None
    model_config = SimpleNamespace(use_mla=use_mla, get_head_size=lambda: head_size, dtype=torch.bfloat16)
    return SimpleNamespace(model_config=model_config, parallel_config=SimpleNamespace(tensor_parallel_size=1), quant_config=None)


@dataclass
class VllmModuleFusers:
    """vLLM's answer for one module: its fusers' candidates (``get_fusers``) and the ones this
    instance takes (``Fusers.__getitem__``), or the exception vLLM raised asking."""

    cls: str
    candidates: list[str] | None = None
    chosen: list[str] | None = None
    error: BaseException | None = None
    attention_error: BaseException | None = None
    """Raised reading a chosen ``AttentionFuser``'s layer index (the fusers' answer stands)."""


def ask_fusers(api: SimpleNamespace, model: Any, vllm_config: SimpleNamespace) -> tuple[dict[str, VllmModuleFusers], dict[int, list[str]]]:
    """vLLM's fusers on every module of ``model`` (path -> answer), and the modules whose
    ``AttentionFuser`` claims a decoder layer (layer index -> paths)."""
    answers: dict[str, VllmModuleFusers] = {}
    attention_by_layer: dict[int, list[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fusers = api.Fusers(model, vllm_config)  # the real class: get_fusers per module, validate per instance
        for path, module in model.named_modules():
            answer = answers[path] = VllmModuleFusers(type(module).__name__)
            try:
                answer.candidates = [fuser_name(f) for f in api.get_fusers(module)]
                chosen = fusers[module]
                answer.chosen = [fuser_name(f) for f in chosen]
            except Exception as exc:  # noqa: BLE001 - vLLM's failure is the answer for this module
                answer.error = exc
                continue
            try:
                for f in chosen:
                    if isinstance(f, api.AttentionFuser) and (idx := f.layer_index(module)) is not None:
                        attention_by_layer.setdefault(idx, []).append(path)
            except Exception as exc:  # noqa: BLE001 - recorded; the layers read so far stand
                answer.attention_error = exc
    return answers, attention_by_layer


def match_moe_block(api: SimpleNamespace, block: Any, divides: bool | None = None) -> Any:
    """vLLM's ``MoEBlockFuser.match`` on one block (raises what vLLM raises): the fuser when vLLM
    takes the block forward over (its ``scoring_func`` set when it routes itself, its
    ``shared_name`` the shared expert), else None. ``divides`` (the fp16 shared-output rule,
    ``moe.divides_shared_output``) None: vLLM's default."""

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.MoEBlockFuser.match(block, EXPERTS_NAME) if divides is None else api.MoEBlockFuser.match(block, EXPERTS_NAME, divides)


def vllm_replaces_experts(experts: Any) -> bool:
    """vLLM's ``MoEMixin.recursive_replace`` test for an ``experts`` child, re-stated (vLLM writes
    it inline, there is no function to call): a ModuleList, or only 3-D parameters, which
    FusedMoE then takes the place of. What the cross-check compares hfcheck's
    ``moe.experts_replaceable`` with."""
    from torch import nn

    params = list(experts.parameters())
    return isinstance(experts, nn.ModuleList) or (len(params) > 0 and all(p.ndim == 3 for p in params))


class _Differences:
    """Differences deduplicated by (quantity, where, vLLM value, hfcheck value)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def add(self, quantity: str, where: str, vllm_value: Any, hfcheck_value: Any, path: str | None = None) -> None:
        key = (quantity, where, repr(vllm_value), repr(hfcheck_value))
        entry = self.items.setdefault(key, {"quantity": quantity, "where": where, "vllm": vllm_value, "hfcheck": hfcheck_value, "instances": 0, "example": path})
        entry["instances"] += 1

    def as_list(self) -> list[dict[str, Any]]:
        return list(self.items.values())


def _text_config(config: Any) -> Any:
    try:
        return config.get_text_config(decoder=True)
    except TypeError:
        return config.get_text_config()


def _status(report: dict[str, Any], code: str) -> str | None:
    for c in report.get("checks", []):
        if c.get("code") == code:
            return c.get("status")
    return None


def _registry(api: SimpleNamespace, analysis: Analysis, report: dict[str, Any], diffs: _Differences, compared: dict[str, int]) -> str | None:
    facts = analysis.facts
    archs = list(facts.architectures or [])
    if not archs:
        return None
    reg = api.registry
    always_transformers = set(reg._TRANSFORMERS_SUPPORTED_MODELS) | set(reg._TRANSFORMERS_BACKEND_MODELS)
    supported_archs = set(api.vllm.ModelRegistry.get_supported_archs())
    native = any(a in supported_archs and a not in always_transformers for a in archs)
    predicted = (report.get("model") or {}).get("vllm_native", facts.vllm_native)
    compared["registry"] = 1
    if predicted is not None and bool(predicted) != native:
        diffs.add("vllm_native", archs[0], native, bool(predicted))
    # --model-impl transformers resolution; never for a class only auto_map provides
    import transformers

    if getattr(transformers, archs[0], None) is None and facts.auto_map:
        return None
    config = analysis.config_object
    if config is None:
        return None
    text = _text_config(config)
    convertor = api.convertors.get(getattr(config, "model_type", None), api.convertor_base)
    try:
        num_experts = convertor(config, text).get_num_experts()
    except Exception:  # noqa: BLE001 - vLLM's private API may not handle this config: no experts then
        num_experts = 0
    stub = SimpleNamespace(
        hf_config=config, hf_text_config=text, is_moe=bool(num_experts and num_experts > 0), architectures=archs, runner="auto",
        model=report.get("model", {}).get("ref", "model"), revision=None, code_revision=None, trust_remote_code=False, model_impl="transformers",
    )
    try:
        backend_cls = api.ModelConfig._get_transformers_backend_cls(stub)
    except Exception as exc:  # noqa: BLE001 - vLLM's own failure is a recorded difference
        backend_cls = None
        diffs.add("registry_error", archs[0], f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}", None)
    stub._get_transformers_backend_cls = lambda: backend_cls
    # hide auto_map: vLLM would import the remote classes it names; the transformers class wins anyway
    stub.hf_config = SimpleNamespace(auto_map=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            backend = api.vllm.ModelRegistry._try_resolve_transformers(archs[0], stub)
            outcome = {"HFC101": "pass", "HFC102": "pass"}
        except ValueError as exc:
            backend = None
            text_exc = str(exc)
            outcome = {"HFC101": "fail"} if "Cannot find model module" in text_exc else {"HFC101": "pass", "HFC102": "fail"}
        except Exception as exc:  # noqa: BLE001 - vLLM itself failed on this config: record, do not guess
            diffs.add("registry_error", archs[0], f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}", None)
            return None
        finally:
            stub.hf_config = config
    for code, status in outcome.items():
        mine = _status(report, code)
        if mine in ("pass", "fail") and mine != status:
            diffs.add(code, archs[0], status, mine)
    if backend is not None:
        compared["backend_class"] = 1
        if ("MoE" in backend) != bool(facts.is_moe):
            diffs.add("backend_moe", backend, "MoE" in backend, bool(facts.is_moe))
    return backend


@contextmanager
def _vllm_attention(model: Any) -> Iterator[None]:
    """Switch configs patched with hfcheck's stand-in attention to vLLM's "vllm", then back."""

    switched = []
    for config in module_configs(model):
        if getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION:
            try:
                config._attn_implementation = "vllm"
                switched.append(config)
            except Exception:  # noqa: BLE001, S110 - a config that refuses the attribute keeps its own
                pass
    try:
        yield
    finally:
        for config in switched:
            config._attn_implementation = ATTN_IMPLEMENTATION


def _err(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"ERROR {type(exc).__name__}: {text}"


def _fusions(api: SimpleNamespace, analysis: Analysis, diffs: _Differences, compared: dict[str, int]) -> None:

    # the caller runs this only with a structural instance and its observations
    assert analysis.instance is not None and analysis.observations is not None
    model, obs = analysis.instance.model, analysis.observations
    config = analysis.instance.config
    answers, vllm_attention = ask_fusers(api, model, stub_vllm_config(api, config, _text_config(config)))
    # by module: a module shared by two paths is one entry of named_modules, and hfcheck's walk visits both paths
    answer_for = {id(module): answers[path] for path, module in model.named_modules()}
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in obs.modules:
            module = model.get_submodule(m.path) if m.path else model
            n += 1
            answer = answer_for[id(module)]
            v_candidates: str | list[str] | None
            v_chosen: str | list[str]
            if answer.error is not None:
                v_candidates = v_chosen = _err(answer.error)
            else:
                assert answer.chosen is not None  # set whenever vLLM raised nothing
                v_candidates, v_chosen = answer.candidates, answer.chosen
            h_candidates = [p.name for p, _ in class_fusions(module).candidates]
            h_chosen = list(m.fusions) + (["attention"] if m.attention else [])
            if v_candidates != h_candidates:
                diffs.add("candidates", m.cls, v_candidates, h_candidates, m.path or "<model>")
            if isinstance(v_chosen, str) or sorted(v_chosen) != sorted(h_chosen):
                diffs.add("chosen", m.cls, v_chosen, h_chosen, m.path or "<model>")
    compared["modules"] = n
    compared["layers"] = len(set(vllm_attention) | set(obs.attention_by_layer))
    mine = {int(k): sorted(v) for k, v in obs.attention_by_layer.items()}
    theirs = {k: sorted(v) for k, v in vllm_attention.items()}
    for idx in sorted(set(mine) | set(theirs)):
        if mine.get(idx) != theirs.get(idx):
            diffs.add("attention_by_layer", f"layer {idx}", theirs.get(idx), mine.get(idx))


def _moe(api: SimpleNamespace, analysis: Analysis, diffs: _Differences, compared: dict[str, int]) -> None:

    # the caller runs this only with a structural instance and its observations
    assert analysis.instance is not None and analysis.observations is not None
    model, obs = analysis.instance.model, analysis.observations
    mine = dict(obs.moe_blocks)
    text = _text_config(analysis.instance.config)
    dtype = getattr(text, "dtype", None) or getattr(analysis.instance.config, "dtype", None) or analysis.facts.dtype
    divides = divides_shared_output(str(dtype), getattr(text, "routed_scaling_factor", 1.0))
    n = 0
    for path, block in model.named_modules():
        experts = dict(block.named_children()).get(EXPERTS_NAME)
        if experts is None:
            continue
        replaceable = vllm_replaces_experts(experts)
        h = mine.get(path)
        if h is None and MoEBlockFusion.find(None, block) is None:
            continue  # neither side treats a parameter-free "experts" child as MoE
        n += 1
        cls = type(block).__name__
        if h is None:
            diffs.add("moe_block", cls, "experts child", None, path)
            continue
        try:
            fuser = match_moe_block(api, block, divides)
            values = {
                "moe_replaceable": replaceable,
                "moe_block_fused": fuser is not None,
                "moe_internal": bool(fuser and fuser.scoring_func),
                "moe_scoring": fuser.scoring_func if fuser else None,
                "moe_shared": fuser.shared_name if fuser else None,
            }
        except Exception as exc:  # noqa: BLE001 - vLLM's failure is recorded as the value
            values = {"moe_replaceable": replaceable, "moe_block_fused": _err(exc)}
        predicted = {
            "moe_replaceable": h.experts_replaceable,
            "moe_block_fused": h.block_taken_over,
            "moe_internal": h.internal_routing,
            "moe_scoring": h.scoring if h.internal_routing else None,
            "moe_shared": h.shared_expert,
        }
        for q, v in values.items():
            if v != predicted[q]:
                diffs.add(q, cls, v, predicted[q], path)
    compared["moe_blocks"] = n
