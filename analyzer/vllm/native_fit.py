"""Does vLLM's native class for an architecture name compute *this* model?

vLLM picks its native class by the first ``architectures`` entry alone. A Hub repo can carry
the registry name of a different generation of the architecture: ChatGLM-6B (v1, GLMBlock,
2D positions) is ``ChatGLMModel``, the name vLLM's ChatGLM2/3 class is registered under. vLLM
then parses the config with its own ``ChatGLMConfig`` (the absent v2 keys take its defaults
without a word) and builds a network whose weights the checkpoint does not hold.

The signature of a generation is the config keys its class is written against
(``scripts/generate_vllm_tables.py`` reads them from the release's wheel into
``data/vllm/<version>/tables.json``): the keys the class reads without a guard, and, where vLLM
ships its own config class for the model_type, that class's explicit parameters. A config
that lacks several of them was written for another class. One absent key is not enough: a
class may read a key that only one variant sets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hfcheck.analyzer.vllm.release import tables

MISMATCH_AT = 2
"""Absent keys (that vLLM's class reads) from which the config is another generation's."""


@dataclass(frozen=True)
class NativeFit:
    architecture: str
    absent: tuple[str, ...]  # keys vLLM's class reads that the config does not provide
    defaulted: bool  # vLLM parses the config with its own class: the absent keys take its defaults

    @property
    def fits(self) -> bool:
        return len(self.absent) < MISMATCH_AT

    def describe(self) -> str:
        shown = ", ".join(self.absent[:6]) + (f" (+{len(self.absent) - 6})" if len(self.absent) > 6 else "")
        how = ("vLLM parses this config with its own class and fills them with its defaults, building a network of another shape"
               if self.defaulted else "vLLM's class fails to build without them")
        return f"vLLM's native {self.architecture} reads {shown}, which this config does not have ({how}): it is written for another generation of the architecture"


@lru_cache(maxsize=1)
def _pretrained_defaults() -> frozenset[str]:
    from transformers import PretrainedConfig

    return frozenset(dir(PretrainedConfig()))


@lru_cache(maxsize=64)
def _transformers_config_keys(model_type: str) -> frozenset[str]:
    """Attributes transformers' own config class for ``model_type`` sets (its defaults)."""
    from transformers import AutoConfig

    try:
        return frozenset(vars(AutoConfig.for_model(model_type)))
    except Exception:  # noqa: BLE001 - not a transformers type (remote config) or its defaults do not build: none
        return frozenset()


def native_fit(architecture: str, config: dict[str, Any], config_class_keys: Iterable[str] = ()) -> NativeFit | None:
    """How ``config`` meets vLLM's native class for ``architecture`` (None: no signature known).

    ``config_class_keys``: attributes the model's own (remote) config class sets, which the
    config object vLLM reads has beside config.json's keys.
    """

    table = tables()
    reads = (table.get("config_reads") or {}).get(architecture)
    if reads is None:
        return None
    model_type = str(config.get("model_type") or "")
    own = (table.get("config_params") or {}).get(model_type)
    have = set(config) | _pretrained_defaults() | {"rope_parameters"}  # vLLM's patch_rope_parameters derives it from rope_theta
    if own is None:
        known = set(config_class_keys) | _transformers_config_keys(model_type)
        if not known:
            return None  # a remote config class whose defaults were not read: cannot tell
        have |= known
    else:
        have |= {"vocab_size", "max_position_embeddings", "num_hidden_layers"}  # set or aliased by vLLM's config classes
    absent = tuple(k for k in reads if k not in have)
    return NativeFit(architecture, absent, own is not None)
