"""Whether a model carries remote code at all: code files fetched, or an ``auto_map`` naming
classes outside transformers."""

from __future__ import annotations


def has_remote_code(source) -> bool:
    config = source.config if isinstance(source.config, dict) else {}
    return bool(source.code_files) or bool(config.get("auto_map"))
