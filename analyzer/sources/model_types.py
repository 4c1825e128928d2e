"""What a sweep analyses: model types of the installed transformers, or references.

A *model type* target is analysed from its config class defaults (the reference checkpoint's
shape, as transformers documents it) with ``architectures`` set to the class the causal-LM
mapping names, exactly as if a user had saved that config to a folder. A *reference* target
is whatever ``hfcheck scan`` accepts (Hub id[@revision] or local folder).

On the command line and in ``--from`` files, ``type:<model_type>`` names a model type (a
causal-LM type, else an image-text-to-text one) and ``pooling:<model_type>`` an encoder type
analysed as the base model vLLM's pooling runner serves (``<X>Model``: an embedding model).

The atlas has three sections (``SECTIONS``): every causal-LM type, every image-text-to-text
type outside the causal-LM mapping, and every encoder type (the masked-LM mapping) as pooling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hfcheck.analyzer.sources import ModelSource, SourceError, resolve

TYPE_PREFIX = "type:"
POOLING_PREFIX = "pooling:"
CAUSAL, VLM, POOLING = "causal-lm", "image-text-to-text", "pooling"
SECTIONS = (CAUSAL, VLM, POOLING)


class TargetError(Exception):
    """A target that cannot be turned into a model source; str() is one line."""


class DefaultConfigError(TargetError):
    """transformers' own default config of a model type does not validate."""


@dataclass(frozen=True)
class Target:
    key: str  # what the results are keyed by: the model type, or the reference as typed
    ref: str | None = None  # a reference for sources.resolve (None for a model type)
    model_type: str | None = None  # a transformers model type (None for a reference)
    section: str = CAUSAL  # which atlas section a model type belongs to (SECTIONS)

    @property
    def is_type(self) -> bool:
        return self.model_type is not None


def causal_lm_mapping() -> dict[str, str]:
    """transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: model type -> causal-LM class name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def image_text_to_text_mapping() -> dict[str, str]:
    """transformers' ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` less the causal-LM types (those
    are analysed with their causal-LM class): the vision-language types vLLM's multimodal path takes."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    causal = causal_lm_mapping()
    return {t: name for t, name in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.items() if t not in causal}


def pooling_mapping() -> dict[str, str]:
    """Encoder types (transformers' masked-LM mapping) -> their base model class, which vLLM's
    pooling runner serves as an embedding model (``TransformersEmbeddingModel``)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    out = {}
    for t in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        base = MODEL_MAPPING_NAMES.get(t)
        if isinstance(base, str):
            out[t] = base
    return out


def causal_lm_types() -> list[Target]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return [Target(key=t, model_type=t) for t in sorted(causal_lm_mapping())]


def atlas_types() -> list[Target]:
    """Every model type of the three atlas sections, each section sorted."""
    return (
        causal_lm_types()
        + [Target(key=t, model_type=t, section=VLM) for t in sorted(image_text_to_text_mapping())]
        + [Target(key=POOLING_PREFIX + t, model_type=t, section=POOLING) for t in sorted(pooling_mapping())]
    )


def parse_refs(refs: list[str]) -> list[Target]:
    """Command-line / file entries -> targets, first occurrence wins (duplicates dropped)."""
    seen: set[str] = set()
    out: list[Target] = []
    for raw in refs:
        ref = raw.strip()
        if not ref or ref in seen:
            continue
        seen.add(ref)
        if ref.startswith((TYPE_PREFIX, POOLING_PREFIX)):
            prefix = TYPE_PREFIX if ref.startswith(TYPE_PREFIX) else POOLING_PREFIX
            model_type = ref[len(prefix) :].strip()
            if not model_type:
                raise TargetError(f"{ref!r}: empty model type after {prefix!r}")
            if prefix == POOLING_PREFIX:
                out.append(Target(key=POOLING_PREFIX + model_type, model_type=model_type, section=POOLING))
            else:
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


def default_config(model_type: str, section: str = CAUSAL) -> tuple[dict, list[str]]:
    """(the config.json a ``save_pretrained`` of the type's default config would write, completions).

    A few transformers defaults leave a field at None that their own modeling code divides by
    (``head_dim``, ``num_key_value_heads``). Such a field is filled with the value every
    transformers config derives when it is absent, and the completion is reported (it ends up
    in the report's source note), never silent: see ``complete``.
    """
    from transformers import AutoConfig

    if section == POOLING:
        mapping = pooling_mapping()
        if model_type not in mapping:
            raise TargetError(f"{model_type!r} is not an encoder (masked-LM) model type of the installed transformers")
    else:
        mapping = {**image_text_to_text_mapping(), **causal_lm_mapping()}
        if model_type not in mapping:
            raise TargetError(f"{model_type!r} is neither a causal-LM nor an image-text-to-text model type of the installed transformers")
    try:
        config = AutoConfig.for_model(model_type).to_dict()
    except Exception as exc:  # noqa: BLE001 - a transformers default that does not validate is a finding
        raise DefaultConfigError(f"the default {model_type} config does not build: {type(exc).__name__}: {_first_line(exc)}") from None
    config["architectures"] = [mapping[model_type]]
    return config, complete(config)


def complete(config: dict, where: str = "") -> list[str]:
    """Fill derivable fields a default left at None, in place; returns what was filled.

    Only the two universal conventions: ``head_dim = hidden_size // num_attention_heads`` and
    ``num_key_value_heads = num_attention_heads`` (no GQA stated: multi-head attention).
    """
    done: list[str] = []
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if isinstance(heads, int) and heads > 0:
        if "head_dim" in config and config["head_dim"] is None and isinstance(hidden, int) and hidden % heads == 0:
            config["head_dim"] = hidden // heads
            done.append(f"{where}head_dim={config['head_dim']} (hidden_size / num_attention_heads)")
        if "num_key_value_heads" in config and config["num_key_value_heads"] is None:
            config["num_key_value_heads"] = heads
            done.append(f"{where}num_key_value_heads={heads} (= num_attention_heads)")
    for name, value in config.items():
        if isinstance(value, dict) and name.endswith(("text_config", "decoder")):
            done += complete(value, f"{where}{name}.")
    return done


def type_source(model_type: str, section: str = CAUSAL):
    """A ModelSource for a model type's default config (no folder, no remote code)."""
    import transformers


    config, completed = default_config(model_type, section)
    note = f"default {config['architectures'][0]} config of transformers {transformers.__version__}"
    if completed:
        note += "; completed: " + ", ".join(completed)
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
        note=note,
    )


def prepare(target: Target):
    """The target's ModelSource; TargetError (one line) when there is none."""
    if target.model_type is not None:  # target.is_type
        return type_source(target.model_type, target.section)

    assert target.ref is not None  # a target is a model type or a reference
    try:
        return resolve(target.ref)
    except SourceError as exc:
        raise TargetError(str(exc)) from None


def plain_build_error(config: dict) -> str | None:
    """Does plain transformers build this config? None when ``AutoModelForCausalLM.from_config``
    (meta device, the config's own attention) succeeds, else the error, one line.

    Asked only when hfcheck's tiny instance failed on a default config, to tell hfcheck's
    failures apart from transformers defaults that no code could build.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        cfg = AutoConfig.for_model(config["model_type"], **kwargs)
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - the error is the answer
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    """The first non-empty line; and the next one when the first only introduces it (ends with ':')."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return text[:300]
