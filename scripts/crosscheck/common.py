"""Shared by vllm_side.py and hfcheck_side.py (runs under either venv; only transformers/torch).

Both sides must build exactly the same cut model, so the config surgery lives here.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

MAX_LAYERS = 4
LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
# Per-layer index lists: keep the indices that still exist.
INDEX_LIST_NAMES = ("attn_layer_indices", "full_attn_idxs", "mlp_only_layers")
# Per-layer strings: one character per layer.
PATTERN_STR_NAMES = ("hybrid_override_pattern",)


def common_model_types() -> list[str]:
    """Every model type of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES in *both* transformers versions."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M

    here = set(M)
    try:
        other = set(open(sys.argv[sys.argv.index("--other-types") + 1]).read().split())
    except (ValueError, IndexError, OSError):
        other = here
    return sorted(here & other)


def cut_text_config(cfg) -> tuple[int | None, int | None]:
    """Cut the text config to min(n, MAX_LAYERS) layers in place; (old, new) layer counts."""
    text = cfg.get_text_config()
    n = getattr(text, "num_hidden_layers", None)
    if not isinstance(n, int):
        return None, None
    new = min(n, MAX_LAYERS)
    if new == n:
        return n, new
    text.num_hidden_layers = new
    for name, value in list(vars(text).items()):
        if name.startswith("_"):
            continue
        if isinstance(value, (list, tuple)) and len(value) == n:
            setattr(text, name, list(value)[:new])
    # layer_types may be a property / attribute-mapped name not in vars()
    lt = getattr(text, "layer_types", None)
    if isinstance(lt, (list, tuple)) and len(lt) > new:
        try:
            text.layer_types = list(lt)[:new]
        except Exception:  # noqa: BLE001, S110 - a config that refuses the cut keeps its list
            pass
    for name in INDEX_LIST_NAMES:
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)) and value and all(isinstance(i, int) for i in value) and len(value) != new:
            setattr(text, name, [i for i in value if i < new])
    for name in PATTERN_STR_NAMES:
        value = getattr(text, name, None)
        if isinstance(value, str) and len(value) > new:
            setattr(text, name, value[:new])
    return n, new


class Timeout(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    def handler(signum, frame):
        raise Timeout(f"timed out after {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def err(exc: BaseException) -> str:
    """One line: type, first message line, and the innermost frame (file:line)."""
    import traceback

    msg = str(exc).splitlines()[0][:240] if str(exc) else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" @{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {msg}{where}"


def moe_replaceable(experts) -> bool:
    """vLLM MoEMixin.recursive_replace's exact test (is_modulelist or is_3d)."""
    from torch import nn

    params = list(experts.parameters())
    return isinstance(experts, nn.ModuleList) or (len(params) > 0 and all(p.ndim == 3 for p in params))


def build_cut_model(mt: str, attn_impl: str):
    """(config, text_config, model, info): the meta-device AutoModel for ``mt`` cut to
    MAX_LAYERS decoder layers; if the cut config does not build, the uncut one (recorded)."""
    import torch
    from transformers import AutoConfig, AutoModel

    info: dict = {}
    for cut in (True, False):
        cfg = AutoConfig.for_model(mt)
        text = cfg.get_text_config()
        info["layers"] = list(cut_text_config(cfg)) if cut else [getattr(text, "num_hidden_layers", None)] * 2
        text._attn_implementation = attn_impl
        try:
            with torch.device("meta"):
                model = AutoModel.from_config(cfg)
            return cfg, text, model, info
        except Exception as exc:
            if not cut or info["layers"][0] == info["layers"][1]:
                raise
            info["cut_error"] = err(exc)  # retry with every layer
    raise AssertionError("unreachable")
