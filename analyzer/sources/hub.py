"""Hub references (``org/name[@revision]``) fetched with huggingface_hub, never weights.

Everything network- and cache-related is left to ``hf_hub_download`` so that users get the
behaviour they know from transformers: the normal HF cache, ``HF_TOKEN``, ``HF_ENDPOINT``,
``HF_HUB_OFFLINE`` (served from the cache). hfcheck only adds two things: each
huggingface_hub error becomes one line a user can act on, and when neither the Hub nor the
cache can serve a repo, the bundled snapshot is used if hfcheck has one (and says so).
"""
from __future__ import annotations

import re
from pathlib import Path

import huggingface_hub
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from ._base import ModelSource, SourceError, first_line, read_config
from .assemble import Origin, assemble
from .bundled import bundled_dir, load_bundled
from .code_files import CodeUnavailable, Fetch

try:  # huggingface_hub 2.x talks through httpx2, 1.x through httpx
    from httpx2 import TransportError
except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
    from httpx import TransportError  # type: ignore[no-redef]

HUB_ERRORS = (OSError, ValueError, EntryNotFoundError, HfHubHTTPError, TransportError)
"""What ``hf_hub_download`` raises for a bad repo, revision, file, token or connection."""

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def parse_hub_ref(ref: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ("org/name", "rev"); validated by huggingface_hub's own rules.

    The first ``@`` splits: repo ids cannot contain one, revisions (``refs/pr/1``) may
    contain anything else.
    """
    repo_id, at, revision = ref.partition("@")
    if at and not revision.strip():
        raise SourceError(f"{ref}: empty revision after '@'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise SourceError(
            f"{ref}: not a local folder nor a valid Hub id 'org/name[@revision]' ({first_line(exc)})"
        ) from None
    return repo_id, (revision if at else None)


def is_unreachable(exc: BaseException) -> bool:
    """True when the Hub could not be asked (offline mode, network down), as opposed to answering no."""
    return isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled, TransportError, ConnectionError))


def unreachable_why(exc: BaseException) -> str:
    """Short reason the Hub could not be reached, e.g. "HF_HUB_OFFLINE=1" or "[Errno 111] Connection refused"."""
    if huggingface_hub.constants.is_offline_mode():
        return "HF_HUB_OFFLINE=1"
    cause = exc.__cause__ or exc.__context__
    return first_line(cause) if cause is not None else "network error"


def describe(exc: BaseException, repo_id: str, revision: str | None, filename: str) -> str:
    """One line for a Hub error other than "unreachable"; subclasses are tested before parents."""
    at = f"{repo_id}@{revision or 'main'}"
    if isinstance(exc, GatedRepoError):
        return f"{repo_id} is gated: accept the license on the Hub and set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo_id} not found on the Hub (or private: set HF_TOKEN)"
    if isinstance(exc, DisabledRepoError):
        return f"{repo_id} has been disabled on the Hub"
    if isinstance(exc, RevisionNotFoundError):
        return f"revision {revision!r} not found in {repo_id}"
    if isinstance(exc, RemoteEntryNotFoundError):
        return f"no {filename} in {at} on the Hub"
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code == 401:
        return "the Hub refused the credentials (401): check HF_TOKEN"
    return f"{filename} of {at}: {first_line(exc)}"


class HubSession:
    """One ``resolve()``'s view of the Hub: once it proved unreachable, stop asking it.

    With no cached copy, huggingface_hub retries a refused or timed-out request for about
    20 s per file; a model with several remote-code files would wait minutes. After the first
    "unreachable", later files of the same resolve are looked up in the cache only.
    """

    def __init__(self, unreachable: str | None = None) -> None:
        self.unreachable = unreachable  # why the Hub cannot be reached, once known

    def download(self, repo_id: str, filename: str, revision: str | None) -> Path:
        """``hf_hub_download`` into the normal cache; token/endpoint/offline come from the environment."""
        try:
            return Path(
                hf_hub_download(
                    repo_id, filename, revision=revision, local_files_only=self.unreachable is not None
                )
            )
        except HUB_ERRORS as exc:
            if self.unreachable is None and is_unreachable(exc):
                self.unreachable = unreachable_why(exc)
            raise


def hub_fetcher(session: HubSession, repo_id: str, revision: str | None) -> Fetch:
    """A code-file fetcher for one repo at one revision (a commit sha pins it to the config's)."""

    def fetch(filename: str) -> Path:
        try:
            return session.download(repo_id, filename, revision)
        except HUB_ERRORS as exc:
            if is_unreachable(exc):
                why = f" ({session.unreachable})" if session.unreachable else ""
                raise CodeUnavailable(f"not in the HF cache and the Hub cannot be reached{why}") from None
            raise CodeUnavailable(describe(exc, repo_id, revision, filename)) from None

    return fetch


def _snapshot_sha(path: Path) -> str | None:
    """The commit sha of a cached file: hf_hub_download returns ``.../snapshots/<sha>/<file>``."""
    sha = path.parent.name
    return sha if path.parent.parent.name == "snapshots" and _COMMIT.match(sha) else None


def resolve_hub(ref: str) -> ModelSource:
    """Fetch config.json (+ generation_config.json, auto_map code) of a Hub repo via the HF cache."""
    repo_id, revision = parse_hub_ref(ref)
    session = HubSession()
    try:
        config_file = session.download(repo_id, "config.json", revision)
    except HUB_ERRORS as exc:
        if session.unreachable is not None:
            return _fallback(ref, repo_id, revision, session)
        message = describe(exc, repo_id, revision, "config.json")
        if isinstance(exc, RemoteEntryNotFoundError):
            message += " (not a transformers model?)"
        raise SourceError(f"{ref}: {message}") from None
    pinned = _snapshot_sha(config_file) or revision
    config = read_config(config_file, f"config.json of {repo_id}@{pinned or 'main'}")
    try:
        generation_file: Path | None = session.download(repo_id, "generation_config.json", pinned)
    except HUB_ERRORS:  # optional file: absent, or not cached while offline
        generation_file = None
    own = hub_fetcher(session, repo_id, pinned)
    other = lambda repo: hub_fetcher(session, repo, None)  # noqa: E731
    origin = Origin(ref, "hub", repo_id, pinned, str(config_file.parent))
    return assemble(origin, config, own, other, generation_file)


def _fallback(ref: str, repo_id: str, revision: str | None, session: HubSession) -> ModelSource:
    """Neither Hub nor cache could serve ``repo_id``: use the bundled snapshot, or give up in one line.

    The snapshot stands for the default branch only, so a pinned revision is never served from it.
    """
    why = session.unreachable
    folder = bundled_dir(repo_id)
    if folder is None:
        raise SourceError(f"{ref}: cannot reach the Hub ({why}) and no cached or bundled copy of {repo_id}")
    if revision not in (None, "main"):
        raise SourceError(
            f"{ref}: cannot reach the Hub ({why}) and no cached copy of {repo_id}@{revision}"
            " (hfcheck bundles the default branch only)"
        )
    note = f"Hub unreachable ({why}): using hfcheck's bundled snapshot of {repo_id}'s config.json"
    return load_bundled(ref, repo_id, folder, note, lambda other: hub_fetcher(session, other, None))
