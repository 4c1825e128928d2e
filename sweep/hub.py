"""Model lists from the Hub itself: a query through huggingface_hub's listing API -> Hub ids.

A query is a few words and ``key=value`` filters, the way ``--hub-search``, ``--author`` and a
``hub:`` entry (``--from hub:QUERY``, or a ``hub:QUERY`` line of a ``--from`` file) write it::

    qwen3 pipeline_tag=text-generation library=transformers sort=downloads limit=500
    author=Qwen filter=base_model:finetune:Qwen/Qwen3-4B limit=all

Bare words are the search text; the keys are ``search``, ``author``, ``pipeline_tag``,
``library``, ``filter`` (a Hub tag; repeatable), ``sort`` (downloads, likes, trending_score,
created_at, last_modified) and ``limit`` (a number, or ``all``). What a query leaves out comes
from the command's defaults (``--pipeline-tag``, ``--library``, ``--sort``, ``--limit``):
text-generation models, most downloaded first.

Everything goes through ``huggingface_hub.list_models`` (so ``HF_ENDPOINT``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` apply); an error is one line (``TargetError``). Listing returns ids only:
reading each model's config, and folding identical configs into one analysis, is the sweep's
(``run.run_batch``).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import Any, cast

from hfcheck.analyzer.sources._base import first_line
from hfcheck.analyzer.sources.hub import is_unreachable, unreachable_why
from hfcheck.analyzer.sources.model_types import TargetError

HUB_PREFIX = "hub:"
SORTS = ("downloads", "likes", "trending_score", "created_at", "last_modified")
KEYS = ("search", "author", "pipeline_tag", "library", "filter", "sort", "limit")
_ALIASES = {"pipeline": "pipeline_tag", "task": "pipeline_tag", "tag": "filter", "lib": "library"}
ANY = ("any", "all", "none", "*", "")


@dataclass(frozen=True)
class HubQuery:
    search: str | None = None
    author: str | None = None
    pipeline_tag: str | None = "text-generation"
    library: str | None = None
    filters: tuple[str, ...] = field(default=())
    sort: str | None = "downloads"
    limit: int | None = 1000  # None: every match

    def describe(self) -> str:
        parts = [f"search={self.search!r}"] if self.search else []
        parts += [f"{k}={v}" for k, v in (("author", self.author), ("pipeline_tag", self.pipeline_tag), ("library", self.library)) if v]
        parts += [f"filter={f}" for f in self.filters]
        parts += [f"sort={self.sort}"] if self.sort else []
        parts.append(f"limit={self.limit if self.limit is not None else 'all'}")
        return " ".join(parts)


def parse_query(text: str, defaults: HubQuery | None = None, *, label: str = "hub query") -> HubQuery:
    """``"words key=value ..."`` -> HubQuery over ``defaults``; TargetError (one line) when malformed."""
    query = defaults or HubQuery()
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"{label}: {exc}") from None
    words: list[str] = []
    filters = list(query.filters)
    changes: dict = {}
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq:
            words.append(token)
            continue
        key = _ALIASES.get(key.strip().lower(), key.strip().lower())
        value = value.strip()
        if key not in KEYS:
            raise TargetError(f"{label}: unknown key {key!r} in {token!r} (known: {', '.join(KEYS)})")
        if key == "filter":
            if value:
                filters.append(value)
        elif key == "sort":
            changes["sort"] = sort_value(value, label)
        elif key == "limit":
            changes["limit"] = limit_value(value, label)
        else:
            changes[key] = None if value.lower() in ANY else value
    if words:
        changes["search"] = " ".join(words)
    return replace(query, filters=tuple(filters), **changes)


def sort_value(value: str, label: str = "--sort") -> str | None:
    value = value.strip().lower()
    if value in ANY:
        return None
    if value not in SORTS:
        raise TargetError(f"{label}: sort must be one of {', '.join(SORTS)} (or none), not {value!r}")
    return value


def limit_value(value: str | int | None, label: str = "--limit") -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ANY):
        return None
    try:
        limit = int(value)
    except ValueError:
        raise TargetError(f"{label}: limit must be a number or 'all', not {value!r}") from None
    if limit < 1:
        raise TargetError(f"{label}: limit must be at least 1")
    return limit


def list_refs(query: HubQuery, *, label: str, offline_hint: str = "", announce: str | None = None) -> list[str]:
    """The Hub ids the query lists, in the Hub's order; TargetError (one line) when impossible."""
    from huggingface_hub import constants, list_models
    from huggingface_hub.utils import logging as hf_logging


    def unreachable(why: str) -> TargetError:
        return TargetError(f"{label}: the Hub cannot be reached ({why}); {offline_hint or 'listing the Hub needs it'}")

    if constants.is_offline_mode():
        raise unreachable("HF_HUB_OFFLINE=1")
    if announce:
        sys.stderr.write(announce + "\n")
    hf_logging.set_verbosity_error()  # one message from us, not one per retry
    filters = [f for f in (query.library, *query.filters) if f]
    try:
        models = list_models(
            search=query.search,
            author=query.author,
            pipeline_tag=query.pipeline_tag,
            filter=filters or None,
            sort=cast(Any, query.sort),  # one of SORTS, the Hub's sort keys (sort_value), or None
            limit=query.limit,
        )
        ids = list(dict.fromkeys(m.id for m in models))  # first occurrence of each, in order
    except Exception as exc:  # noqa: BLE001 - every failure is one line for the user
        if is_unreachable(exc):
            raise unreachable(unreachable_why(exc)) from None
        raise TargetError(f"{label}: cannot list the Hub's models: {type(exc).__name__}: {first_line(exc)}") from None
    if not ids:
        raise TargetError(f"{label}: no models on the Hub match ({query.describe()})")
    return ids


def expand(entries: list[str], defaults: HubQuery, *, offline_hint: str = "", announce_as: str = "hfcheck") -> list[str]:
    """References with every ``hub:QUERY`` entry replaced by the ids it lists (in place, in order)."""
    out: list[str] = []
    for entry in entries:
        if not entry.startswith(HUB_PREFIX):
            out.append(entry)
            continue
        text = entry[len(HUB_PREFIX) :].strip()
        label = f"{HUB_PREFIX}{text}"
        query = parse_query(text, defaults, label=label)
        out += list_refs(query, label=label, offline_hint=offline_hint, announce=f"{announce_as}: listing {query.describe()} on the Hub...")
    return out
