"""The detail pane: the full report of one model, below the table.

The pane owns which model it shows (``model``, a key of the App's entries) and renders it with
``detail.render_detail``. The App sets ``model`` from the table's ``Highlighted`` message; it is
set again when that model's row was redrawn (a scan finished), so the watcher runs on every set,
not only when the key changes (``always_update``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from hfcheck.tui.detail import render_detail
from hfcheck.tui.rows import Entry


class DetailPane(VerticalScroll):
    """The report of one model, scrollable; the model shown is this widget's state."""

    DEFAULT_CSS = "DetailPane { height: 3fr; border-top: solid $primary; padding: 0 1; }"

    model: reactive[str | None] = reactive(None, always_update=True, init=False)
    """The key of the entry shown (None: no model); setting it, even to the same key, renders it."""

    def __init__(self, entries: Mapping[str, Entry], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._entries = entries
        self._body = Static("", id="detail")  # held, not queried: see FilterBar

    def compose(self) -> ComposeResult:
        yield self._body

    def watch_model(self, key: str | None) -> None:
        entry = self._entries.get(key) if key else None
        try:
            renderable = render_detail(entry)
        except Exception as exc:  # noqa: BLE001 - never crash on one odd report
            renderable = Text(f"cannot display {key}: {type(exc).__name__}: {exc}", style="red")
        self._body.update(renderable)
