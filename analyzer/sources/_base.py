"""The value every source produces, the one error it may raise, and the JSON readers they share.

Kept apart from ``__init__`` so that ``local``, ``hub`` and ``bundled`` can import these
without a circular import; ``hfcheck.analyzer.sources`` re-exports them as the public API.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processor_files import ProcessorFiles


@dataclass(frozen=True)
class ModelSource:
    """Everything hfcheck reads about a model before analysing it: configs and remote code text.

    Nothing here is executed: ``code_files`` holds source *text* for static analysis only.
    """

    ref: str  # what the user typed, e.g. "Qwen/Qwen3-4B@main" or "./my-model"
    kind: str  # "hub" | "local" | "bundled"
    repo_id: str | None  # "Qwen/Qwen3-4B" for hub/bundled, None for local
    revision: str | None  # the requested revision (hub), commit sha when known
    config: dict  # parsed config.json (Infinity/NaN kept, as Python's json reads them)
    generation_config: dict | None
    code_files: dict[str, str]  # relative path -> source text (auto_map modules + relative imports)
    missing_code: tuple[str, ...]  # "file.py: why it could not be obtained", one line each
    location: str | None  # local folder / snapshot folder path
    note: str | None  # a label for the output, e.g. that the bundled snapshot was used
    processor: ProcessorFiles = field(default_factory=ProcessorFiles)
    """The processor files (multimodal models): configs as data, remote processor code as text."""


class SourceError(Exception):
    """A reference that cannot be resolved. str(exc) is ONE clear line for the user."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception message: huggingface_hub's run to several lines."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def read_json_object(path: Path, label: str) -> dict[str, Any]:
    """Parse ``path`` as a JSON object, or raise SourceError naming ``label`` and the problem.

    ``json.loads`` is used as is: it accepts the bare ``Infinity``/``NaN`` that real configs
    carry (Nemotron-H), which is also what transformers does when it loads them.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{label}: not UTF-8 text") from None
    except OSError as exc:
        raise SourceError(f"{label}: cannot be read ({exc.strerror or first_line(exc)})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"{label}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise SourceError(f"{label}: expected a JSON object, found a JSON {_json_kind(data)}")
    return data


def read_config(path: Path, label: str) -> dict[str, Any]:
    """Read a model's config.json; refuse one that transformers could not map to a model class."""
    config = read_json_object(path, label)
    if "model_type" not in config and "architectures" not in config:
        raise SourceError(
            f'{label}: has neither "model_type" nor "architectures": not a transformers model config'
        )
    return config


def read_generation_config(path: Path) -> dict[str, Any] | None:
    """Read generation_config.json if it exists; an unreadable one counts as absent.

    vLLM does the same: transformers turns a broken file into an OSError, which vLLM's
    ``try_get_generation_config`` swallows, so it never blocks loading the model.
    """
    if not path.is_file():
        return None
    try:
        return read_json_object(path, path.name)
    except SourceError:
        return None


def _json_kind(value: object) -> str:
    """JSON's own name for a parsed value's type, for error messages."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
