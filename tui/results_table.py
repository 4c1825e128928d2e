"""The results table: one row per model, in the view's order.

The table owns what it shows: which rows (the ``view_filter`` the App hands down from the
filter bar), in which order (``sorting``: ``s``, ``S``, a click on a header) and which model is
highlighted (``selected``). The rows' data are the App's entries, which the scan events fill:
the App names the entries that changed (``changed``) and the table redraws them together.

It tells the App what it did through messages, never by reaching into another widget:
``Highlighted`` (the model the detail pane shows) and ``Redrawn`` (the rows or the sort
changed: the status line and the sort label follow).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from rich.cells import cell_len
from rich.text import Text
from textual import events, on
from textual.message import Message
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import DataTable

from hfcheck.tui import rows as R


class ResultsTable(DataTable[Text]):
    """One row per model; the view's filter, sort and highlighted row are this widget's state."""

    DEFAULT_CSS = "ResultsTable { height: 2fr; scrollbar-size-vertical: 1; }"
    FLUSH_S = 0.05
    """Scan events arrive in bursts (a cached sweep finishes hundreds of rows at once): the rows
    they touch are redrawn together at most this often."""

    # Setting one redraws the rows (its ``watch_``); ``init=False``: nothing is drawn before mount.
    view_filter: reactive[R.Filter] = reactive(R.Filter, init=False)
    sorting: reactive[R.Sort] = reactive(R.Sort, init=False)
    selected: reactive[str | None] = reactive(None, init=False)

    class Highlighted(Message):
        """The model to show in the detail pane: the highlight moved, or its row was redrawn."""

        def __init__(self, table: ResultsTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> ResultsTable:
            return self.table

    class Redrawn(Message):
        """The rows, their order or the sort changed (what the status line and sort label show)."""

        def __init__(self, table: ResultsTable) -> None:
            super().__init__()
            self.table = table

        @property
        def control(self) -> ResultsTable:
            return self.table

    def __init__(self, entries: Mapping[str, R.Entry], *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._entries = entries
        self._shown: list[str] = []
        self._widths: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._flush_timer: Timer | None = None

    def on_mount(self) -> None:
        self._flush_timer = self.set_interval(self.FLUSH_S, self._flush, pause=not self._dirty)
        self._refresh_rows()

    # ------------------------------------------------------------------ what the App asks
    @property
    def shown_keys(self) -> list[str]:
        """The keys of the rows on screen, in their order."""
        return list(self._shown)

    def visible_entries(self) -> list[R.Entry]:
        """The rows of the current view, in their order (what the exports write)."""
        f, s = self.view_filter, self.sorting
        return R.view(self._entries.values(), verdict=f.verdict, text=f.text, sort=s.column, reverse=s.reverse)

    def changed(self, *keys: str) -> None:
        """These entries changed (a scan event): their rows are redrawn on the next flush."""
        self._dirty.update(keys)
        if self._flush_timer is not None:
            self._flush_timer.resume()

    @property
    def refresh_pending(self) -> bool:
        """Rows changed since the table was last redrawn."""
        return bool(self._dirty)

    def sort_by(self, column: str, reverse: bool = False) -> None:
        """Column and direction at once: the rows are redrawn once."""
        self.sorting = R.Sort(column, reverse)

    def cycle_sort(self) -> None:
        """The next column of ``rows.SORTS`` (``s``), ascending."""
        i = R.SORTS.index(self.sorting.column)
        self.sort_by(R.SORTS[(i + 1) % len(R.SORTS)])

    def reverse_sort(self) -> None:
        """The same column the other way round (``S``)."""
        self.sorting = replace(self.sorting, reverse=not self.sorting.reverse)

    # ------------------------------------------------------------------ state changes
    def watch_view_filter(self) -> None:
        self._refresh_rows()

    def watch_sorting(self) -> None:
        self._refresh_rows()

    def watch_selected(self) -> None:
        self.post_message(self.Highlighted(self, self.selected))

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.selected = event.row_key.value if event.row_key is not None else None

    @on(DataTable.HeaderSelected)
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        column = event.column_key.value or ""
        if column == self.sorting.column:
            self.reverse_sort()
        else:
            self.sort_by(column)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._refresh_rows)

    def _flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.pause()
        dirty, self._dirty = self._dirty, set()
        if not dirty:
            return
        self._refresh_rows(dirty)
        if self.selected in dirty:
            self.post_message(self.Highlighted(self, self.selected))

    # ------------------------------------------------------------------ drawing
    def _cells(self, entry: R.Entry) -> dict[str, str]:
        try:
            c = R.cells(entry)
        except Exception as exc:  # noqa: BLE001 - a malformed result shows as that row's error
            c = {col: "" for col in R.COLUMN_IDS}
            c.update(model=entry.key, verdict=R.ERROR, note=f"cannot display: {type(exc).__name__}: {exc}")
        c["model"] = R.middle_cut(c["model"])
        return c

    def _layout(self, entries: list[R.Entry]) -> dict[str, int]:
        """Every column's width: its widest cell; the note gets what is left of the table's width.

        The widths are set on the columns (not measured by the DataTable when idle), so a
        rebuilt table is drawn at its final widths at once, and the note column holds as much
        of a failed row's error as the terminal allows, without a horizontal scrollbar.
        """
        total = self.size.width or self.app.size.width
        pad = 2 * self.cell_padding
        every = [self._cells(e) for e in entries]
        widths = {column: max([cell_len(label), *(cell_len(c[column]) for c in every)]) for column, label in R.COLUMNS if column != "note"}
        used = sum(w + pad for w in widths.values()) + pad + 1  # + the note's padding, the vertical scrollbar
        widths["note"] = max(12, total - used)
        return widths

    def _row(self, entry: R.Entry, note_width: int) -> list[Text]:
        c = self._cells(entry)
        out: list[Text] = []
        for column in R.COLUMN_IDS:
            value = c[column]
            if column == "verdict":
                out.append(Text(value, style=R.VERDICT_STYLE.get(value, "")))
            elif column in ("score", "tp", "blockers"):
                style = "bold red" if column == "blockers" and value not in ("", "0") else ""
                out.append(Text(value, justify="right", style=style))
            elif column == "note":
                out.append(Text(R.short(value, note_width), style="red" if entry.error else "dim"))
            else:
                out.append(Text(value))
        return out

    def _refresh_rows(self, dirty: Iterable[str] = ()) -> None:
        """Redraw the view: rebuilt when its rows or widths changed, else the ``dirty`` rows' cells."""
        entries = self.visible_entries()
        shown = [e.key for e in entries]
        widths = self._layout(entries)
        if shown != self._shown or widths != self._widths:
            self._rebuild(entries, widths)
        else:
            for key in dirty:
                if key in self._entries and key in shown:
                    for column, value in zip(R.COLUMN_IDS, self._row(self._entries[key], widths["note"])):
                        self.update_cell(key, column, value)
        self.post_message(self.Redrawn(self))

    def _rebuild(self, entries: list[R.Entry], widths: dict[str, int]) -> None:
        shown = [e.key for e in entries]
        keep = self.selected
        self.clear(columns=True)
        for column, label in R.COLUMNS:
            self.add_column(label, width=widths[column], key=column)
        for e in entries:
            self.add_row(*self._row(e, widths["note"]), key=e.key)
        self._shown, self._widths = shown, widths
        if keep in shown:
            self.move_cursor(row=shown.index(keep), animate=False)
        elif shown:
            self.move_cursor(row=0, animate=False)
        # the rows were redrawn: the detail is shown again whether or not the selection moved
        self.set_reactive(ResultsTable.selected, keep if keep in shown else (shown[0] if shown else None))
        self.post_message(self.Highlighted(self, self.selected))
