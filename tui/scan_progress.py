"""The progress row: a bar and a status line of the scans (``5/7 scanned · 1 running, 1 queued ·
0 errors · 3 from cache · showing 4``).

The row owns the counts it shows (``counts``, the App's ``Dashboard.counts()``): the App sets
them when a scan event or a redraw of the table changed them, the row draws them. Setting the
same counts again draws nothing.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static


def status_line(n: dict[str, int]) -> str:
    """The status line of counts (keys as ``Dashboard.counts()``)."""
    parts = [f"{n['done']}/{n['total']} scanned"]
    if n["running"] or n["queued"]:
        parts.append(f"{n['running']} running, {n['queued']} queued")
    parts.append(f"{n['errors']} error{'s' if n['errors'] != 1 else ''}")
    parts.append(f"{n['cached']} from cache")
    if n["cancelled"]:
        parts.append(f"{n['cancelled']} cancelled")
    if n["shown"] != n["total"]:
        parts.append(f"showing {n['shown']}")
    return " · ".join(parts)


class ScanProgress(Horizontal):
    """The bar (finished or cancelled of all) and the status line; the counts are its state."""

    DEFAULT_CSS = """
    ScanProgress { height: 1; }
    ScanProgress #progress { width: 44; }
    ScanProgress #status { width: 1fr; padding: 0 1; }
    """

    counts: reactive[dict[str, int]] = reactive(dict, init=False)

    def __init__(self, total: int, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._bar = ProgressBar(total=max(1, total), show_eta=False, id="progress")  # held, not queried: see FilterBar
        self._status = Static("", id="status")

    def compose(self) -> ComposeResult:
        yield self._bar
        yield self._status

    def watch_counts(self, n: dict[str, int]) -> None:
        self._bar.update(total=max(1, n["total"]), progress=n["done"] + n["cancelled"])
        self._status.update(status_line(n))
