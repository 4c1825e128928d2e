"""The retarget path of ``hfcheck port``: the original equals a native transformers class.

1. read the original's anatomy from its reference run and search the retarget registry for a
   native class that reproduces its logits (``retarget.search``), keeping only classes vLLM then
   serves (natively, or through its transformers backend);
2. write a native model folder: ``config.json`` for the native ``model_type`` (the real sizes,
   read from the original's full-size meta build), the checkpoint converted tensor by tensor
   with the proven plan when the source has one, ``weight_plan.json``, and the tokenizer and
   generation files (a tokenizer that is itself remote code keeps its files); no model code;
3. prove more at the shrunk size: the native class's ``sdpa`` attention too, and a greedy
   ``generate`` with the native KV cache against the original's own cache in its own release;
   with real weights, the same on the checkpoint (first layers, first vocabulary rows: the
   2 GB budget holds for any model size).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.porter.output.served import how_served_config
from hfcheck.porter.output.weights import INDEX_NAME
from hfcheck.porter.reference.establish import Reference
from hfcheck.porter.retarget.anatomy import Anatomy, AnatomyError, analyse, full_dims
from hfcheck.porter.retarget.plan import CheckpointReader, PlanError, convert_folder, convert_state
from hfcheck.porter.retarget.search import (
    Found,
    SearchResult,
    build_native,
    compare,
    identity_plan,
    load_planned,
    load_same_names,
    search,
)

MODEL_CODE_PREFIXES = ("modeling_", "modelling_", "configuration_")


@dataclass(frozen=True)
class RetargetOutcome:
    """The search's result: the native class found (with the checks it passed at the shrunk size) or why none fits."""

    search: SearchResult
    anatomy_error: str | None = None
    found: Found | None = None
    native_config: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    anatomy: list[str] = field(default_factory=list)  # Anatomy.describe()
    analysed: Anatomy | None = field(default=None, repr=False)  # what full_native_config reads the full sizes with

    def to_dict(self) -> dict[str, Any]:
        hyp = self.found.hypothesis if self.found else None
        return {
            "target": hyp.architecture if hyp else None,
            "model_type": hyp.target if hyp else None,
            "choices": hyp.choices if hyp else None,
            "notes": list(hyp.notes) if hyp else [],
            "attempts": [a.to_dict() for a in self.search.attempts],
            "not_fitting": self.search.skipped + ([f"anatomy: {self.anatomy_error}"] if self.anatomy_error else []),
            "search_seconds": self.search.seconds,
            "native_config": self.native_config,
            "anatomy": self.anatomy,
        }


@dataclass(frozen=True)
class NativeTarget:
    """The native class's full-size config, its layer count, and the proven weight plan (None: the checkpoint's names are the native ones)."""

    config: dict[str, Any]
    layers: int
    plan: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ExtraChecks:
    """The checks ``extra_checks`` ran and the notes on the original's own generate."""

    checks: list[dict[str, Any]]
    notes: list[str]


@dataclass(frozen=True)
class NativeFolder:
    """What ``write_native_folder`` wrote: the files, the converted checkpoint's summary (or its error) and its notes."""

    files: list[str]
    weights: dict[str, Any] | None
    notes: list[str]


def _served_refusal(found: Found) -> str | None:
    served = how_served_config(found.native_tiny_config)
    if served.served:
        return None
    return served.summary.replace("vLLM serves", "vLLM serves", 1)


def find_retarget(reference: Reference) -> RetargetOutcome:
    run = reference.run
    anatomy = None
    anatomy_error = None
    try:
        anatomy = analyse(run, reference.tiny_config)
    except AnatomyError as exc:
        anatomy_error = str(exc)
    result = search(run, anatomy, reference.tiny_config, reference.input_ids, accept=_served_refusal)
    described = anatomy.describe() if anatomy else []
    if result.found:
        return RetargetOutcome(result, anatomy_error, result.found, checks=list(result.found.checks), anatomy=described, analysed=anatomy)
    return RetargetOutcome(result, anatomy_error, result.found, anatomy=described)


def full_native_config(outcome: RetargetOutcome, reference: Reference, config: dict[str, Any]) -> NativeTarget:
    found = outcome.found
    assert found is not None
    hyp = found.hypothesis
    if found.plan is None:
        native = hyp.config(None, config)  # same names: the config translated, sizes as they are
        return NativeTarget(native, int(native.get("num_hidden_layers") or 0))
    assert outcome.analysed is not None  # a planned retarget was proven on the anatomy it read
    dims = full_dims(outcome.analysed, reference.run, config, reference.tiny_config)
    plan = hyp.plan(dims)
    return NativeTarget(hyp.config(dims, config), dims.layers, plan)


def extra_checks(outcome: RetargetOutcome, reference: Reference) -> ExtraChecks:
    """sdpa attention and greedy generation with the native cache, at the shrunk size."""
    import torch
    import transformers

    checks: list[dict[str, Any]] = []
    notes: list[str] = []
    found = outcome.found
    assert found is not None  # the extra checks are of the class the search found
    run = reference.run
    ids = torch.tensor(reference.input_ids, dtype=torch.long)
    layers = reference.num_layers

    def load(attn: str):
        if found.plan is None:

            model, _, _ = load_same_names(found.native_tiny_config, run.state)
            model.config._attn_implementation = attn
            return model
        model = build_native(found.native_tiny_config, attn)
        missing, unexpected = load_planned(model, convert_state(found.plan, layers, run.state))
        if missing or unexpected:
            raise RuntimeError(f"the proven plan no longer fits: missing {missing[:3]}, unexpected {unexpected[:3]}")
        return model

    try:
        model = load("sdpa")
        with torch.no_grad():
            got = model(input_ids=ids, use_cache=False).logits
        checks.append({"name": "random weights, sdpa", **compare(run.logits_for("sdpa"), got)})
    except ValueError as exc:
        if "does not support" not in str(exc):  # not "no sdpa path in this release" (GPT-J before transformers 5.24)
            checks.append({"name": "random weights, sdpa", "ok": False, "detail": f"ValueError: {str(exc)[:200]}"})
        else:
            checks.append({"name": "random weights, sdpa", "ok": True, "skipped": True,
                                   "detail": f"not run: transformers {transformers.__version__}'s {found.hypothesis.architecture} has no sdpa path"})
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        checks.append({"name": "random weights, sdpa", "ok": False, "detail": f"{type(exc).__name__}: {str(exc)[:200]}"})
    expected: list[int] = run.result.get("greedy_no_cache") or run.result.get("generated") or []
    own: list[int] = run.result.get("generated") or []
    stopped = bool(own) and len(own) < len(expected) and expected[:len(own)] == own
    if stopped:  # an EOS the generation config still named: a stop, not a defect
        notes.append(f"the original's own generate stopped after {len(own)} of {len(expected)} tokens ({own}, the last one its "
                             "end-of-sequence id); the tokens it gave equal its full forward pass token by token")
    elif own and expected and own != expected:
        notes.append(f"the original's own generate (with its cache) gives {own}, not the {expected} its full forward pass gives "
                             "token by token: its cache code is wrong in its own release; the native class was compared with the full forward pass")
    if expected:
        model = load("eager")
        if getattr(model, "generation_config", None) is not None:  # no EOS stop: compared token for token
            model.generation_config.eos_token_id = None
        with torch.no_grad():
            gen = model.generate(ids[:1], max_new_tokens=len(expected), do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=None,
                                 use_cache=True)
        tokens = [int(t) for t in gen[0, ids.shape[1]:].tolist()]
        checks.append({"name": f"greedy generate, {len(expected)} tokens with the native KV cache", "ok": tokens == expected,
                               "detail": "" if tokens == expected else f"original {expected}, native {tokens}", "tokens": tokens})
    else:
        notes.append(f"greedy generation not compared: the original's generate failed in its own release ({run.result.get('generate_error')})")
    return ExtraChecks(checks, notes)


def _tokenizer_code(src_dir: Path) -> set[str]:
    """Code files the tokenizer itself needs (tokenizer_config.json's auto_map)."""
    try:
        data = json.loads((src_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    refs = []
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    for value in (auto_map or {}).values():
        refs += value if isinstance(value, list) else [value]
    return {f"{r.partition('--')[2] if '--' in r else r}".rpartition(".")[0] + ".py" for r in refs if isinstance(r, str)}


QUANTIZATION_FILES = ("quantize_config.json", "quant_config.json", "quantization_config.json")
"""AutoGPTQ/AWQ side files: they describe the original's quantized tensors, not the float native folder."""


def write_native_folder(outcome: RetargetOutcome, source, out_dir: Path, target: NativeTarget, *, shard_bytes: int | None = None) -> NativeFolder:
    """The native folder: its config, the tokenizer and generation files, the converted checkpoint and the weight plan."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    weights: dict[str, Any] | None = None
    (out_dir / "config.json").write_text(json.dumps(target.config, indent=2) + "\n", encoding="utf-8")
    files = ["config.json"]
    src_dir = Path(source.location) if source.kind == "local" and source.location else None
    if src_dir is not None:
        keep_code = _tokenizer_code(src_dir)
        for path in sorted(src_dir.iterdir()):
            name = path.name
            if not path.is_file() or name.startswith(".") or name in ("config.json", INDEX_NAME, "pytorch_model.bin.index.json", "PORT.md",
                                                                      "port.diff", "weight_plan.json"):
                continue
            if name.endswith((".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")):
                continue
            if name.endswith((".py", ".cu", ".cpp", ".h")) and name not in keep_code:
                continue  # model code: the native class replaces it
            if name in QUANTIZATION_FILES:
                continue  # describes the original's quantized tensors; the native folder is float
            shutil.copy2(path, out_dir / name)
            files.append(name)
        plan = target.plan

        reader = CheckpointReader(src_dir)
        if reader.kind is not None:
            if plan is None:
                plan = identity_plan(reader.keys(), _layers_path(reader.keys()))
            try:
                summary = convert_folder(plan, target.layers, src_dir, out_dir, max_shard_bytes=shard_bytes)
            except PlanError as exc:
                weights = {"error": str(exc)}
            else:
                weights = summary
                files += summary["shards"] + ([INDEX_NAME] if len(summary["shards"]) > 1 else [])
    if target.plan is not None:
        (out_dir / "weight_plan.json").write_text(json.dumps({"layers": target.layers, "recipes": target.plan}, indent=1) + "\n", encoding="utf-8")
        files.append("weight_plan.json")
    return NativeFolder(files, weights, notes)


def _layers_path(keys: list[str]) -> str:
    counts: dict[str, int] = {}
    for key in keys:
        m = re.match(r"^(.*?)\.(\d+)\.", key)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return max(counts, key=lambda path: counts[path]) if counts else ""
