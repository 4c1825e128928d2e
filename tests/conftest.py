"""Shared helpers: scan a real transformers architecture from its default or a given config."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

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
