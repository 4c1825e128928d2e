"""A multimodal model's processor files: read as data, their remote code as text, never weights.

vLLM builds the HF processor of every multimodal model at start (``get_processor``): it looks
for ``processor_class`` in ``processor_config.json``, ``preprocessor_config.json`` and
``tokenizer_config.json``, then lets ``AutoProcessor`` resolve the rest (video processors read
``video_preprocessor_config.json``; chat templates ride along). These files are what decides
whether the processor exposes an image, video or audio processor, counts tokens and reports
replacement offsets, so a scan reads them like it reads config.json.

Tokenizer vocabularies (``tokenizer.json`` and friends) are fetched only where a processor
config exists, so that the processor can be built offline; they are data, not weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .code_files import PROCESSOR_KEYS, CodeUnavailable, Fetch, collect_code

PROCESSOR_CONFIGS = (
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "tokenizer_config.json",
    "chat_template.json",
)
"""Processor files read as JSON, in the order vLLM looks for ``processor_class`` (the first three
it reads: processor, preprocessor, tokenizer config)."""

CHAT_TEMPLATE_FILES = ("chat_template.jinja",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json")
"""What a tokenizer needs to build offline; fetched only beside a processor config."""

PROCESSOR_MARKERS = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


@dataclass(frozen=True)
class ProcessorFiles:
    """The processor side of a model folder or repo, as read (nothing built or executed)."""

    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """File name -> parsed JSON object, for each processor config present."""
    present: tuple[str, ...] = ()
    """Every processor, chat-template and tokenizer file found (names)."""
    problems: tuple[str, ...] = ()
    """"file: why it could not be read", one line each."""
    code: dict[str, str] = field(default_factory=dict)
    """Remote processor code (auto_map ``AutoProcessor`` / ``AutoImageProcessor`` ...) as text."""
    missing_code: tuple[str, ...] = ()
    folder: str | None = None
    """Where the files lie together (a local folder or an HF cache snapshot), for building."""

    @property
    def has_processor_config(self) -> bool:
        return any(name in self.configs for name in PROCESSOR_MARKERS)

    def auto_map(self, model_config: dict[str, Any]) -> dict[str, Any]:
        """The processor auto_map entries of every file, config.json's first."""
        merged: dict[str, Any] = {}
        for data in (model_config, *self.configs.values()):
            entries = data.get("auto_map")
            if isinstance(entries, dict):
                for key, value in entries.items():
                    if key in PROCESSOR_KEYS:
                        merged.setdefault(key, value)
        return merged


def collect_processor_files(
    model_config: dict[str, Any],
    fetch_own: Callable[[str], Path],
    fetch_other: Callable[[str], Fetch],
    folder: str | None,
    *,
    tokenizer: bool = True,
) -> ProcessorFiles:
    """Read the processor files ``fetch_own`` serves (absent ones are simply absent). With
    ``tokenizer`` the vocabulary files are fetched too, once a processor config was found.
    ``folder``: where the served files lie together (for building the processor later)."""
    configs: dict[str, dict[str, Any]] = {}
    present: list[str] = []
    problems: list[str] = []

    def get(name: str) -> Path | None:
        try:
            path = fetch_own(name)
        except CodeUnavailable:
            return None
        present.append(name)
        return path

    for name in PROCESSOR_CONFIGS:
        path = get(name)
        if path is None:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{name}: not readable as JSON ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})")
            continue
        if isinstance(data, dict):
            configs[name] = data
        else:
            problems.append(f"{name}: expected a JSON object")
    for name in CHAT_TEMPLATE_FILES:
        get(name)
    files = ProcessorFiles(configs=configs)
    if tokenizer and files.has_processor_config:
        for name in TOKENIZER_FILES:
            get(name)
    code, missing = collect_code({"auto_map": files.auto_map(model_config)}, fetch_own, fetch_other, keep=lambda key: key in PROCESSOR_KEYS)
    return ProcessorFiles(configs, tuple(present), tuple(problems), code, missing, folder if present else None)


def tokenizer_needs_remote_code(folder: Path) -> bool:
    """A tokenizer_config.json with an ``auto_map`` is remote code: vLLM needs ``--trust-remote-code``
    to load it even where the model itself is native."""
    path = folder / "tokenizer_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("auto_map"))
