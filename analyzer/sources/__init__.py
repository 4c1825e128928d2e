"""Turn what the user typed into a model's config, generation config and remote-code text.

``resolve(ref)`` is the only entry point the rest of hfcheck needs:

- an existing directory -> ``kind="local"`` (``local.py``);
- otherwise a Hub id ``org/name`` or ``name``, optionally ``@revision`` -> ``kind="hub"``,
  fetched with huggingface_hub through the normal HF cache (``hub.py``);
- when neither the Hub nor the cache can serve it, hfcheck's bundled snapshot of a few
  popular configs -> ``kind="bundled"`` with a ``note`` saying so (``bundled.py``).

Remote code (``auto_map``) is collected as text only (``code_files.py``); it is never imported
or executed. Every failure the user can cause is a ``SourceError`` whose text is one line.
"""
from __future__ import annotations

from ._base import ModelSource, SourceError, read_json_object
from .bundled import bundled_repo_ids
from .hub import HubSession, hub_fetcher, resolve_hub
from .local import expand, looks_like_path, not_a_folder_message, resolve_local

__all__ = ["ModelSource", "SourceError", "bundled_repo_ids", "read_json_object", "resolve"]


def resolve(ref: str) -> ModelSource:
    """Resolve a local folder or a Hub reference; raise SourceError with one line if impossible."""
    if not ref or not ref.strip():
        raise SourceError("empty model reference: pass a Hub id like Qwen/Qwen3-4B or a folder path")
    if ref != ref.strip():
        ref = ref.strip()
    path = expand(ref)
    try:
        is_dir = path.is_dir()
    except OSError as exc:
        raise SourceError(f"{ref}: cannot be accessed ({exc.strerror or exc})") from None
    if is_dir:
        session = HubSession()  # only for cross-repo auto_map references
        return resolve_local(ref, path, lambda repo_id: hub_fetcher(session, repo_id, None))
    if looks_like_path(ref):
        raise SourceError(not_a_folder_message(ref))
    return resolve_hub(ref)
