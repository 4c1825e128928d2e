"""One way a source's files become a ``ModelSource``: the code its auto_map names, gathered by
the same fetchers that serve its processor files.

A Hub snapshot, a local folder and a bundled snapshot differ only in where the files come from
(the fetchers) and in what they say about themselves (kind, repo, revision, note); what is read
from those files, and how, is the same for all three, so it is written once here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._base import ModelSource, read_generation_config
from .code_files import Fetch, collect_code
from .processor_files import ProcessorFiles, collect_processor_files


@dataclass(frozen=True)
class Origin:
    """What a source says about itself: the ``ModelSource`` fields that are not read from files."""

    ref: str
    kind: str
    repo_id: str | None
    revision: str | None
    location: str | None
    note: str | None = None


def assemble(
    origin: Origin,
    config: dict[str, Any],
    own: Fetch,
    other: Callable[[str], Fetch],
    generation_file: Path | None,
    *,
    processor: bool = True,
) -> ModelSource:
    """The ``ModelSource`` of ``config`` and the files ``own`` (this model's) and ``other`` (a
    cross-repo ``org/repo--module`` reference's) serve. ``processor=False`` where the files
    cannot hold a processor (a bundled snapshot keeps config files only)."""
    code, missing = collect_code(config, own, other)
    return ModelSource(
        ref=origin.ref,
        kind=origin.kind,
        repo_id=origin.repo_id,
        revision=origin.revision,
        config=config,
        generation_config=read_generation_config(generation_file) if generation_file else None,
        code_files=code,
        missing_code=missing,
        location=origin.location,
        note=origin.note,
        processor=collect_processor_files(config, own, other, origin.location) if processor else ProcessorFiles(),
    )
