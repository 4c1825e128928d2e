"""Shared by vllm_side.py and hfcheck_side.py (runs under either venv: transformers, torch, hfcheck).

Both sides must build exactly the same cut model: the cut is hfcheck's, analyzer/shrink.py's
``cut_every_layer_list`` (every way hfcheck makes a model small lives there).
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager


def common_model_types() -> list[str]:
    """Every model type of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES in *both* transformers versions."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M

    here = set(M)
    try:
        other = set(open(sys.argv[sys.argv.index("--other-types") + 1]).read().split())
    except (ValueError, IndexError, OSError):
        other = here
    return sorted(here & other)


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


def build_cut_model(mt: str, attn_impl: str):
    """(config, text_config, model, info): the meta-device AutoModel for ``mt`` cut to
    CROSS_CHECK_LAYERS decoder layers; if the cut config does not build, the uncut one (recorded)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from hfcheck.analyzer.shrink import cut_every_layer_list

    info: dict = {}
    for cut in (True, False):
        cfg = AutoConfig.for_model(mt)
        text = cfg.get_text_config()
        info["layers"] = list(cut_every_layer_list(cfg)) if cut else [getattr(text, "num_hidden_layers", None)] * 2
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
