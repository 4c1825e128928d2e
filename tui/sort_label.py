"""The sort label beside the filters (``s sort: score ↑``).

It shows the table's sort, which the table owns: the App sets ``sorting`` from the table's
``Redrawn`` message, so the label follows every way the sort changes (``s``, ``S``, a click on a
header, the command palette) without the table knowing the label exists.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from hfcheck.tui import rows as R


class SortLabel(Static):
    """The sort in force; ``sorting`` is what it shows."""

    DEFAULT_CSS = "SortLabel { width: auto; padding: 0 1; }"

    sorting: reactive[R.Sort] = reactive(R.Sort, init=False)

    def on_mount(self) -> None:
        self._show()

    def watch_sorting(self) -> None:
        self._show()

    def _show(self) -> None:
        label = dict(R.COLUMNS).get(self.sorting.column, self.sorting.column)
        self.update(Text.assemble(("s ", "bold"), f"sort: {label}{' ↑' if self.sorting.reverse else ''}"))
