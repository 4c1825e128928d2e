"""Shared helpers: scan a real transformers architecture from its default or a given config."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

# Hermetic: what the suite caches (the Hub's cache and transformers' copies of remote code under
# HF_HOME, hfcheck's scan and sweep caches, vLLM's cache root) lives in one temporary folder per
# run, shared by the xdist workers (they inherit the environment this sets) and removed at the
# end; the user's home is neither read nor written. Ray gets a home of its own in test_ray.py.
# The one exception is hfcheck's store of Python environments ($HFCHECK_ENV_DIR, default the
# user cache): the transformers releases a port's reference runs in, the analysis environments
# of --vllm 0.33/0.32 and vLLM's CPU build take minutes each to build, and the suite reuses them.
if "HFCHECK_TEST_STATE" not in os.environ:
    _STATE = Path(tempfile.mkdtemp(prefix="hfcheck-tests-"))
    os.environ["HFCHECK_TEST_STATE"] = str(_STATE)
    os.environ.update(HF_HOME=str(_STATE / "hf"), HFCHECK_CACHE_DIR=str(_STATE / "hfcheck-cache"),
                      VLLM_CACHE_ROOT=str(_STATE / "vllm"), RAY_USAGE_STATS_ENABLED="0")
    for _key in ("HF_HUB_CACHE", "HF_MODULES_CACHE", "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        os.environ.pop(_key, None)  # each follows HF_HOME
    atexit.register(shutil.rmtree, _STATE, ignore_errors=True)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hub"
BUNDLED = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "bundled"


def causal_lm_architecture(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) or MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    assert name, model_type
    return name


def write_model(folder: Path, model_type: str, architecture: str | None = None, **overrides) -> Path:
    """A local model folder holding the architecture's default config.json (+ overrides);
    ``architecture`` names the class (default: the type's causal-LM class)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **overrides).to_dict()
    config["architectures"] = [architecture or causal_lm_architecture(model_type)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def scan_type(tmp_path_factory):
    """scan_type("qwen3") -> the JSON report of the default qwen3 architecture."""
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    cache: dict = {}

    def scan(model_type: str, **overrides):
        key = (model_type, json.dumps(overrides, sort_keys=True))
        if key not in cache:
            folder = write_model(tmp_path_factory.mktemp(model_type), model_type, **overrides)
            cache[key] = build_report(analyse(resolve(str(folder))))
        return cache[key]

    return scan


def from_a_terminal() -> None:
    """``preexec_fn`` for a child that a test interrupts like a terminal's Ctrl-C: SIGINT at its
    default, as a command started from an interactive shell has it, even where the suite itself
    runs with SIGINT ignored (a background job or nohup, whose children inherit the ignore and
    whose Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
