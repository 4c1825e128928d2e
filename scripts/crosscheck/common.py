"""Shared by vllm_side.py and hfcheck_side.py (runs under either venv: transformers, torch, hfcheck).

Both sides must build exactly the same cut model: the cut is hfcheck's, analyzer/instance/shrink.py's
``cut_every_layer_list`` (every way hfcheck makes a model small lives there).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
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

    from hfcheck.analyzer.instance.shrink import cut_every_layer_list

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


def run_over_types(one: Callable[[str], dict], meta: dict, default_out: str, *, seconds: int = 120, error_key: str = "error",
                   describe: Callable[[dict], str] | None = None) -> None:
    """Each side's loop: ``one(model_type)`` for every common type (``--only a,b``: those),
    each under a time limit, its failure recorded under ``error_key``; one progress line per
    type; the whole written as JSON to $CROSSCHECK_OUT (else ``default_out``)."""
    types = common_model_types()
    if "--only" in sys.argv:
        types = sys.argv[sys.argv.index("--only") + 1].split(",")
    result: dict = {"_meta": meta}
    t0 = time.time()
    for mt in types:
        t = time.time()
        try:
            with time_limit(seconds):
                result[mt] = one(mt)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result[mt] = {error_key: err(exc)}
        result[mt]["seconds"] = round(time.time() - t, 2)
        line = describe(result[mt]) if describe else (result[mt].get(error_key) or "")
        print(f"{mt:32s} {result[mt]['seconds']:6.2f}s {line}", flush=True)
    result["_meta"]["seconds"] = round(time.time() - t0, 1)
    out = os.environ.get("CROSSCHECK_OUT", default_out)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True, default=str)
    print("wrote", out, "in", result["_meta"]["seconds"], "s")
