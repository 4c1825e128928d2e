"""Collect the remote-code *text* a config's ``auto_map`` names, without ever running it.

A model with ``auto_map`` ships its own modeling code; hfcheck analyses that code statically,
so it needs the files transformers would load: each ``module.py`` named by the config/model
entries, plus the files those import relatively (``from .utils import x``), transitively.
The files come from a *fetcher* (a local folder, the HF cache/Hub, the bundled snapshot);
whatever cannot be obtained, or must not be read (path traversal, symlinks out of the folder,
oversized files), becomes one human-readable line in ``missing`` instead of an exception,
because a model with partly-missing code can still be partly analysed.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

MAX_CODE_BYTES = 5 * 1024 * 1024
"""Refuse bigger .py files: no real modeling file is near this, and it caps what we read."""


class CodeUnavailable(Exception):
    """Raised by a fetcher; ``str(exc)`` is the reason, e.g. "not in the HF cache ..."."""


Fetch = Callable[[str], Path]
"""Relative POSIX file name in a repo/folder -> local path of the file; raises CodeUnavailable."""

_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_name_reason(name: str) -> str | None:
    """Why ``name`` must not be used as a file name inside a model folder, or None if it is safe.

    auto_map values come from an untrusted config.json and end up joined to a folder path or
    sent to the Hub, so anything that could climb out of the model (``..``, absolute paths,
    home-relative or Windows paths) is refused before any file system access.
    """
    if not name:
        return "empty file name"
    if "\\" in name:
        return "refused: backslash in the file name"
    if name.startswith(("/", "~")) or _DRIVE.match(name):
        return "refused: absolute path"
    if ".." in name:
        return "refused: path traversal ('..')"
    if any(part in ("", ".") for part in name.split("/")):
        return "refused: empty or '.' path component"
    return None


def is_model_key(key: str) -> bool:
    """auto_map entries that build the model: its config and model classes."""
    return key == "AutoConfig" or key.startswith("AutoModel")


PROCESSOR_KEYS = ("AutoProcessor", "AutoImageProcessor", "AutoVideoProcessor", "AutoFeatureExtractor")
"""auto_map entries that build a multimodal model's processor (its tokenizer is the text side's)."""


def auto_map_references(config: dict[str, Any], keep: Callable[[str], bool] = is_model_key) -> Iterator[str]:
    """Yield the class references of ``config["auto_map"]`` whose key ``keep`` accepts, in order
    (by default the config/model classes).

    Tokenizer entries are never wanted: they are ``[slow, fast]`` lists that may hold None.
    Non-string values are yielded as their repr so the caller reports them as malformed.
    """
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return
    for key, value in auto_map.items():
        if not isinstance(key, str) or not keep(key):
            continue
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if item is None:
                continue
            yield item if isinstance(item, str) else repr(item)


def split_reference(reference: str) -> tuple[str | None, str]:
    """``"module.Class"`` -> (None, "module.py"); ``"org/repo--module.Class"`` -> ("org/repo", ...).

    Mirrors transformers' ``get_class_from_dynamic_module`` (one ``--``, one ``.``) so that what
    is reported missing is exactly what transformers would fail to load.
    """
    repo: str | None = None
    body = reference
    if "--" in reference:
        repo, _, body = reference.partition("--")
        if "--" in body or not repo:
            raise CodeUnavailable("malformed auto_map reference (expected 'org/repo--module.Class')")
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(repo)
        except HFValidationError:
            raise CodeUnavailable(f"malformed auto_map reference: {repo!r} is not a Hub repo id") from None
    module, dot, cls = body.rpartition(".")
    reason = unsafe_name_reason(module + ".py") if module else None
    if reason:
        raise CodeUnavailable(reason)
    if not dot or not module or not cls or "." in module:
        raise CodeUnavailable("malformed auto_map reference (expected 'module.Class')")
    return repo, module + ".py"


def relative_import_target(importer: str, name: str) -> str:
    """File a relative import in ``importer`` points at: ``("a/m.py", "x.y")`` -> ``"a/x/y.py"``.

    ``name`` is what transformers' ``get_relative_imports`` returns, i.e. the text after the
    first dot, so a leading dot means one package level up. Climbing above the model folder
    is refused.
    """
    ups = len(name) - len(name.lstrip("."))
    dotted = name[ups:]
    parts = dotted.split(".")
    if not dotted or not all(part.isidentifier() for part in parts):
        raise CodeUnavailable(f"refused: {name!r} is not a module name")
    base = PurePosixPath(importer).parent.parts
    if ups > len(base):
        raise CodeUnavailable("refused: relative import climbs out of the model folder")
    return "/".join((*base[: len(base) - ups], *parts)) + ".py"


def collect_code(
    config: dict[str, Any],
    fetch_own: Fetch,
    fetch_other: Callable[[str], Fetch],
    keep: Callable[[str], bool] = is_model_key,
) -> tuple[dict[str, str], tuple[str, ...]]:
    """Gather auto_map code files and their relative imports: (code_files, missing_code).

    ``fetch_own`` serves the model's own repo/folder; ``fetch_other(repo_id)`` serves the
    ``"org/repo--module.Class"`` cross-repo references. Keys of ``code_files`` are relative paths,
    prefixed ``"org/repo--"`` for files from another repo (the auto_map notation).
    Files are only read as text; imports are found by transformers' regex scan of the file.
    """
    from transformers.dynamic_module_utils import get_relative_imports

    code: dict[str, str] = {}
    missing: list[str] = []
    seen: set[tuple[str | None, str]] = set()
    queue: list[tuple[str | None, str, str | None]] = []  # (repo, filename, imported by)

    for reference in auto_map_references(config, keep):
        try:
            repo, filename = split_reference(reference)
        except CodeUnavailable as exc:
            missing.append(f"{reference}: {exc}")
            continue
        queue.append((repo, filename, None))

    while queue:
        repo, filename, importer = queue.pop(0)
        if (repo, filename) in seen:
            continue
        seen.add((repo, filename))
        key = f"{repo}--{filename}" if repo else filename
        suffix = f" (imported by {importer})" if importer else ""
        try:
            path = (fetch_other(repo) if repo else fetch_own)(filename)
            text = _read_code(path)
        except CodeUnavailable as exc:
            missing.append(f"{key}: {exc}{suffix}")
            continue
        code[key] = text
        for name in sorted(get_relative_imports(path)):
            try:
                target = relative_import_target(filename, name)
            except CodeUnavailable as exc:
                missing.append(f"{key}: import of .{name}: {exc}")
                continue
            queue.append((repo, target, key))
    return code, tuple(missing)


def _read_code(path: Path) -> str:
    """Source text of a fetched file, refusing oversized or non-UTF-8 ones."""
    try:
        size = path.stat().st_size
        if size > MAX_CODE_BYTES:
            raise CodeUnavailable(f"refused: {size} bytes, over the {MAX_CODE_BYTES // (1024 * 1024)} MB limit")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CodeUnavailable("not UTF-8 text") from None
    except OSError as exc:
        raise CodeUnavailable(f"cannot be read ({exc.strerror or exc})") from None
