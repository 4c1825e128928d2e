"""Model folders on disk: a checkout, a ``save_pretrained`` output, or an HF cache snapshot.

A folder is read in place; nothing is copied or executed. Code files named by ``auto_map``
are read only when they really live inside the folder, so a crafted symlink cannot make
hfcheck read (and later print) files from elsewhere on the machine.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ._base import ModelSource, SourceError, read_config
from .assemble import Origin, assemble
from .code_files import CodeUnavailable, Fetch

_PATH_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\", "\\")
_WINDOWS_ABSOLUTE = re.compile(r"^[A-Za-z]:[\\/]")


def expand(ref: str) -> Path:
    """``ref`` as a path with ``~`` expanded; an unknown ``~user`` is left as typed."""
    try:
        return Path(ref).expanduser()
    except RuntimeError:
        return Path(ref)


def looks_like_path(ref: str) -> bool:
    """True when ``ref`` was meant as a path rather than a Hub id (so a typo is not sent to the Hub)."""
    if ref in (".", "..") or ref.startswith(_PATH_PREFIXES) or _WINDOWS_ABSOLUTE.match(ref):
        return True
    try:
        return expand(ref).exists()
    except OSError:
        return False


def not_a_folder_message(ref: str) -> str:
    """The one-line SourceError text for a path-like ``ref`` that is not a directory."""
    path = expand(ref)
    try:
        if path.is_file():
            what = "config.json" if path.name == "config.json" else "a file"
            return f"{ref}: is {what}, not a model folder (pass the folder that holds config.json)"
    except OSError:
        pass
    return f"{ref}: no such directory"


def folder_fetcher(folder: Path, missing_reason: str) -> Fetch:
    """A fetcher serving files that really are inside ``folder``.

    Symlinks are followed only when they stay inside the folder, except for an HF cache
    snapshot (``models--org--name/snapshots/<sha>``), whose files are symlinks into the same
    repo's ``blobs/`` by design; there the whole ``models--org--name`` folder is allowed.
    """
    root = folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        roots.append(root.parent.parent)

    def fetch(filename: str) -> Path:
        candidate = folder / filename
        if not (candidate.exists() or candidate.is_symlink()):
            raise CodeUnavailable(missing_reason)
        target = candidate.resolve()
        if not any(target.is_relative_to(allowed) for allowed in roots):
            raise CodeUnavailable(f"refused: symlink to {target}, outside the model folder")
        if not target.is_file():
            raise CodeUnavailable("broken symlink" if not target.exists() else "not a regular file")
        return target

    return fetch


def resolve_local(ref: str, folder: Path, hub_fetcher: Callable[[str], Fetch]) -> ModelSource:
    """Read a model folder: config.json (required), generation_config.json, auto_map code.

    ``hub_fetcher`` serves cross-repo auto_map references (``org/repo--module.Class``), which
    even a local model may point at.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{ref}: no config.json in {folder}")
    config = read_config(config_path, str(config_path))
    own = folder_fetcher(folder, "not found in the model folder")
    origin = Origin(ref, "local", None, None, str(folder.resolve()))
    return assemble(origin, config, own, hub_fetcher, folder / "generation_config.json")
