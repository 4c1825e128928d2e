"""What a sweep analyses: model types of the installed transformers, or references.

A *model type* target is analysed from its config class defaults (the reference checkpoint's
shape, as transformers documents it) with ``architectures`` set to the class the causal-LM
mapping names, exactly as if a user had saved that config to a folder. A *reference* target
is whatever ``hfcheck scan`` accepts (Hub id[@revision] or local folder).

On the command line and in ``--from`` files, ``type:<model_type>`` names a model type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TYPE_PREFIX = "type:"


class TargetError(Exception):
    """A target that cannot be turned into a model source; str() is one line."""


@dataclass(frozen=True)
class Target:
    key: str  # what the results are keyed by: the model type, or the reference as typed
    ref: str | None = None  # a reference for sources.resolve (None for a model type)
    model_type: str | None = None  # a transformers model type (None for a reference)

    @property
    def is_type(self) -> bool:
        return self.model_type is not None


def causal_lm_mapping() -> dict[str, str]:
    """transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: model type -> causal-LM class name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def causal_lm_types() -> list[Target]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return [Target(key=t, model_type=t) for t in sorted(causal_lm_mapping())]


def parse_refs(refs: list[str]) -> list[Target]:
    """Command-line / file entries -> targets, first occurrence wins (duplicates dropped)."""
    seen: set[str] = set()
    out: list[Target] = []
    for raw in refs:
        ref = raw.strip()
        if not ref or ref in seen:
            continue
        seen.add(ref)
        if ref.startswith(TYPE_PREFIX):
            model_type = ref[len(TYPE_PREFIX) :].strip()
            if not model_type:
                raise TargetError(f"{ref!r}: empty model type after {TYPE_PREFIX!r}")
            out.append(Target(key=model_type, model_type=model_type))
        else:
            out.append(Target(key=ref, ref=ref))
    return out


def read_ref_file(path: str) -> list[str]:
    """One reference per line; blank lines and ``#`` comments are skipped."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"--from {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def default_config(model_type: str) -> dict:
    """The config.json a ``save_pretrained`` of the type's default config would write."""
    from transformers import AutoConfig

    mapping = causal_lm_mapping()
    if model_type not in mapping:
        raise TargetError(f"{model_type!r} is not a causal-LM model type of the installed transformers")
    try:
        config = AutoConfig.for_model(model_type).to_dict()
    except Exception as exc:  # noqa: BLE001 - a transformers default that does not validate is a finding
        raise TargetError(f"the default {model_type} config does not build: {type(exc).__name__}: {_first_line(exc)}") from None
    config["architectures"] = [mapping[model_type]]
    return config


def type_source(model_type: str):
    """A ModelSource for a model type's default config (no folder, no remote code)."""
    import transformers

    from hfcheck.analyzer.sources import ModelSource

    config = default_config(model_type)
    return ModelSource(
        ref=model_type,
        kind="local",
        repo_id=None,
        revision=None,
        config=config,
        generation_config=None,
        code_files={},
        missing_code=(),
        location=None,
        note=f"default {config['architectures'][0]} config of transformers {transformers.__version__}",
    )


def prepare(target: Target):
    """The target's ModelSource; TargetError (one line) when there is none."""
    if target.is_type:
        return type_source(target.model_type)
    from hfcheck.analyzer.sources import SourceError, resolve

    try:
        return resolve(target.ref)
    except SourceError as exc:
        raise TargetError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
