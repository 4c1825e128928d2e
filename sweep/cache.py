"""Sweep results on disk, keyed by (config hash, code hash, transformers version, hfcheck version).

- config hash: the parsed config.json and generation config, plus the provenance the report
  prints (ref, source kind, repo id, revision, folder, note);
- code hash: the model's remote-code text (and what could not be fetched) plus the source of
  hfcheck's analyzer itself, so editing a rule invalidates old results even at the same version;
- the transformers version and the hfcheck version.

One JSON file per key under ``<cache dir>/sweep/``. The cache dir is ``$HFCHECK_CACHE_DIR`` when
set, else the platform's user cache dir for "hfcheck" (``~/.cache/hfcheck`` on Linux). Writes are
atomic (temp file + rename), so an interrupted sweep never leaves a torn entry. Timeouts and
crashes are not cached (they may be the machine's fault); analysis errors are.

Versions are read from package metadata, never by importing transformers. Beside the results,
``TypeIndex`` keeps, per environment (``environment_key``), the list of causal-LM types and each
type's result key, so a sweep of model types that are all cached needs neither transformers nor
torch (building a type's default config would import both).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import hfcheck.analyzer
import hfcheck.shared
from hfcheck.analyzer.vllm.release import (
    installed_vllm_version,
    modelled_platform,
    modelled_version,
)
from hfcheck.shared import version

CACHE_FORMAT = 2  # bump when the shape of a stored result changes


def cache_dir() -> Path:
    """``$HFCHECK_CACHE_DIR``, else the user cache dir for hfcheck."""
    env = os.environ.get("HFCHECK_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("hfcheck", appauthor=False))
    except ImportError:  # pragma: no cover - platformdirs is everywhere, but not a declared dependency yet
        if sys.platform == "win32":
            return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "hfcheck" / "Cache"
        if sys.platform == "darwin":
            return Path.home() / "Library" / "Caches" / "hfcheck"
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfcheck"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=1)
def analyzer_code_hash() -> str:
    """sha256 over hfcheck's analyzer source and data and the shared modules an analysis reads."""
    root = Path(hfcheck.analyzer.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or "__pycache__" in rel.parts:
            continue
        if path.suffix not in (".py", ".json", ".md"):
            continue
        h.update(str(rel.as_posix()).encode() + b"\0" + path.read_bytes() + b"\0")
    # the shared room's parts an analysis reads: the packages hidden as vLLM's environment lacks
    # them (hfcheck/__init__), the package tables of HFC812, the sandbox's child processes
    shared = Path(hfcheck.shared.__file__).resolve().parents[1]
    for path in [shared / "__init__.py", shared / "shared" / "packages.py", *sorted((shared / "isolation").glob("*.py"))]:
        h.update(b"hfcheck/" + str(path.relative_to(shared).as_posix()).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def transformers_install() -> tuple[str, str | None]:
    """(version, path of its ``__init__.py``) of the transformers ``import transformers`` would
    load, read from its package metadata without importing it (importing it costs seconds, and
    torch with it). Only when the metadata is not that copy's (a source tree on ``sys.path``)
    is it imported to ask."""

    spec = importlib.util.find_spec("transformers")
    origin = spec.origin if spec is not None else None
    if origin:
        try:
            dist = metadata.distribution("transformers")
            if Path(str(dist.locate_file("transformers/__init__.py"))).resolve() == Path(origin).resolve():
                return dist.version, origin
        except (metadata.PackageNotFoundError, OSError):
            pass
    import transformers

    return transformers.__version__, origin


@lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    return {"transformers": transformers_install()[0], "hfcheck": version.__version__, "vllm": installed_vllm_version(),
            "vllm_modelled": modelled_version(), "platform": modelled_platform()}


def key_parts(source) -> dict[str, Any]:
    """The four parts of a result's key (plus the installed vLLM, named in the report's target,
    and the vLLM release and platform modelled)."""
    config = {
        "config": source.config,
        "generation_config": source.generation_config,
        "provenance": [source.ref, source.kind, source.repo_id, source.revision, source.location, source.note],
    }
    code = {"remote": sorted(source.code_files.items()), "missing": list(source.missing_code), "analyzer": analyzer_code_hash()}
    v = versions()
    return {"config": _digest(config), "code": _digest(code), "transformers": v["transformers"], "hfcheck": v["hfcheck"], "vllm": v["vllm"],
            "vllm_modelled": v["vllm_modelled"], "platform": v["platform"]}


def result_key(source) -> str:
    return _digest([CACHE_FORMAT, key_parts(source)])


NOT_ANALYSED = ("_name_or_path", "transformers_version")
"""config.json / generation_config.json fields no analysis reads (who saved it, with which
transformers): left out of the config hash, so fine-tunes that differ only there share one."""


def config_hash(source) -> str:
    """What the analysis of a model depends on, and nothing else: its config.json and generation
    config (less ``NOT_ANALYSED``), its remote code and what of it could not be fetched. Not
    where it came from: ten thousand fine-tunes of one base that kept its config have one hash."""
    config = {k: v for k, v in source.config.items() if k not in NOT_ANALYSED}
    generation = {k: v for k, v in source.generation_config.items() if k not in NOT_ANALYSED} if source.generation_config else None
    return _digest({"config": config, "generation_config": generation, "remote": sorted(source.code_files.items()), "missing": list(source.missing_code)})


def content_key(chash: str) -> str:
    """The key of an analysis of a config hash under this hfcheck, transformers and vLLM: two
    sources with the same one get the same report, but for the model's name (``run.restamp``)."""
    v = versions()
    return _digest([CACHE_FORMAT, "content", chash, analyzer_code_hash(), v["transformers"], v["hfcheck"], v["vllm"], v["vllm_modelled"]])


class ResultCache:
    """get/put of sweep results; ``enabled=False`` (``--no-cache``) reads and writes nothing.

    Beside the results (one file per result key), ``sweep-configs/`` maps a ``content_key`` to
    the result key of the one model analysed with that config, and the reference its serve
    command names: a model with the same config hash is answered from that result, renamed."""

    def __init__(self, root: Path | None = None, enabled: bool = True) -> None:
        self.root = (root or cache_dir()) / "sweep"
        self.configs = self.root.parent / "sweep-configs"
        self.enabled = enabled

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT or not isinstance(entry.get("result"), dict):
            return None
        return entry["result"]

    def put(self, key: str, result: dict[str, Any], parts: dict[str, Any] | None = None) -> None:
        if self.enabled:
            _write_json(self.path(key), {"format": CACHE_FORMAT, "key_parts": parts, "result": result})

    def same_config(self, ckey: str) -> tuple[dict[str, Any], str] | None:
        """(the result of the model analysed with this ``content_key``, the reference its serve
        command names), or None."""
        if not self.enabled:
            return None
        try:
            entry = json.loads((self.configs / ckey[:2] / f"{ckey}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT or not isinstance(entry.get("key"), str):
            return None
        result = self.get(entry["key"])
        return (result, str(entry.get("serve_ref") or "")) if result is not None else None

    def put_same_config(self, ckey: str, key: str, serve_ref: str) -> None:
        if self.enabled:
            _write_json(self.configs / ckey[:2] / f"{ckey}.json", {"format": CACHE_FORMAT, "key": key, "serve_ref": serve_ref})


def _write_json(path: Path, data: Any) -> None:
    """Atomically (temp file + rename); a read-only or full cache dir costs speed, never results."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


INDEX_FORMAT = 2  # 2: types are [key, model type, atlas section]


@lru_cache(maxsize=1)
def environment_key() -> str:
    """What decides a model type's default config and the key of its result: the transformers
    install (version, where, when written), hfcheck (version, analyzer source, which holds the
    model types' default configs in sources/model_types.py, and the sweep's cache code), the installed vLLM, the vLLM release modelled and the result cache's format. Computed
    without importing transformers or torch."""
    version, origin = transformers_install()
    try:
        written = os.stat(origin).st_mtime_ns if origin else None
    except OSError:
        written = None
    here = Path(__file__).resolve().parent
    sweep_code = hashlib.sha256((here / "cache.py").read_bytes()).hexdigest()
    v = versions()
    return _digest([INDEX_FORMAT, CACHE_FORMAT, version, origin, written, v["hfcheck"], v["vllm"], v["vllm_modelled"], analyzer_code_hash(),
                    sweep_code, sys.version_info[:2]])


class TypeIndex:
    """What the sweep knows about model types without asking transformers, for one
    ``environment_key``: the list of atlas types (key, model type, section), and per target key the key of its result (or
    the failure of its default config, which only a new transformers or hfcheck can change).

    A re-run whose every target is a cache hit reads this and the result cache and never
    imports transformers or torch. One JSON file per environment under
    ``<cache dir>/sweep-types/``; written atomically; disabled with the result cache."""

    def __init__(self, cache: ResultCache) -> None:
        self.enabled = cache.enabled
        self.root = cache.root.parent / "sweep-types"
        self._data: dict[str, Any] | None = None
        self._dirty = False

    @property
    def path(self) -> Path:
        return self.root / f"{environment_key()}.json"

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            data: Any = None
            if self.enabled:
                try:
                    data = json.loads(self.path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    data = None
            if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("entries"), dict):
                data = {"format": INDEX_FORMAT, "types": None, "entries": {}}
            self._data = data
        return self._data

    def types(self) -> list[list[str]] | None:
        """Every atlas model type as [key, model type, section], as stored; None when not known yet."""
        if not self.enabled:
            return None
        types = self._load().get("types")
        return [list(t) for t in types] if isinstance(types, list) else None

    def set_types(self, types: list[list[str]]) -> None:
        if self.enabled:
            self._load()["types"] = list(types)
            self._dirty = True

    def entry(self, model_type: str) -> dict[str, Any] | None:
        """``{"key": result key}`` or ``{"failure": result}`` for a type, or None."""
        if not self.enabled:
            return None
        entry = self._load()["entries"].get(model_type)
        return entry if isinstance(entry, dict) and ("key" in entry or isinstance(entry.get("failure"), dict)) else None

    def remember(self, model_type: str, *, key: str | None = None, failure: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        entry = {"key": key} if key is not None else {"failure": failure}
        entries = self._load()["entries"]
        if entries.get(model_type) != entry:
            entries[model_type] = entry
            self._dirty = True

    def save(self) -> None:
        if not (self.enabled and self._dirty):
            return
        path = self.path
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._data, f)
            os.replace(tmp, path)
            self._dirty = False
        except OSError:  # costs speed on the next run, never results
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
