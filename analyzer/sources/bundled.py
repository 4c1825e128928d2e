"""hfcheck's bundled snapshot of a few popular models' configs, for when the Hub is unreachable.

Layout: ``analyzer/data/bundled/<org>__<name>/config.json`` (+ optional generation_config.json);
see that folder's README.md for where the files come from. It is a fallback only: a reachable
Hub or a cached copy always wins, and the output says when the snapshot was used, because the
repo may have changed since.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ._base import ModelSource, read_config
from .assemble import Origin, assemble
from .code_files import Fetch
from .local import folder_fetcher

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "bundled"

UNREACHABLE_CODE = "not in the bundled snapshot and the Hub cannot be reached"


def _folder_names() -> set[str]:
    """Exact folder names, listed rather than probed so lookup stays case-sensitive on macOS/Windows."""
    try:
        return {name for name in os.listdir(BUNDLED_DIR) if (BUNDLED_DIR / name / "config.json").is_file()}
    except OSError:
        return set()


def bundled_repo_ids() -> tuple[str, ...]:
    """Repo ids that have a bundled snapshot, sorted."""
    return tuple(sorted(name.replace("__", "/", 1) for name in _folder_names()))


def bundled_dir(repo_id: str) -> Path | None:
    """The snapshot folder for ``repo_id`` (case-sensitive match), or None."""
    name = repo_id.replace("/", "__", 1)
    return BUNDLED_DIR / name if name in _folder_names() else None


def load_bundled(
    ref: str, repo_id: str, folder: Path, note: str, hub_cache_fetcher: Callable[[str], Fetch]
) -> ModelSource:
    """A ModelSource from the snapshot in ``folder``; ``note`` tells the user it is a snapshot.

    The snapshot has no .py files, so auto_map modules end up in ``missing_code``;
    ``hub_cache_fetcher`` (already known to be offline) may still find cross-repo ones in
    the local HF cache.
    """
    config = read_config(folder / "config.json", f"bundled config.json of {repo_id}")
    origin = Origin(ref, "bundled", repo_id, None, str(folder), note)
    own = folder_fetcher(folder, UNREACHABLE_CODE)
    return assemble(origin, config, own, hub_cache_fetcher, folder / "generation_config.json", processor=False)
