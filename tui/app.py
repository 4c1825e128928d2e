"""``hfcheck tui``: the Textual dashboard over many models.

One row per model, filled live by the background ``Scanner`` (the sweep's worker pool and
cache; the UI thread never waits on a scan), a progress bar, sort by any column (``s`` / a
click on a header, ``S`` reverses), filter by verdict (``v``) and by text (``/``), and the
detail pane of the highlighted row. ``r`` re-scans a row, ``c`` cancels, ``j`` / ``m`` export
the current view to JSON / Markdown; everything is also in the command palette (ctrl+p).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Input, ProgressBar, Static

from hfcheck.analyzer.sources.model_types import Target
from hfcheck.analyzer.vllm.target import current as current_target
from hfcheck.tui import rows as R
from hfcheck.tui.detail import render_detail
from hfcheck.tui.scanner import Cancelled, Event, Finished, Idle, Scanner, Started

EXPORT_NAME = "hfcheck-tui"


class ScanEvent(Message):
    """A scanner event, carried from the scan thread to the UI thread."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class Dashboard(App[int]):
    TITLE = "hfcheck tui"
    CSS = """
    #bar { height: 1; }
    #filter { width: 1fr; }
    #verdict-filter { width: auto; padding: 0 1; }
    #sort-label { width: auto; padding: 0 1; }
    #progress-row { height: 1; }
    #progress { width: 44; }
    #status { width: 1fr; padding: 0 1; }
    #table { height: 2fr; scrollbar-size-vertical: 1; }
    #detail-pane { height: 3fr; border-top: solid $primary; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("/", "focus_filter", "Filter"),
        Binding("v", "cycle_verdict", "Verdict"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse"),
        Binding("r", "rescan", "Re-scan"),
        Binding("c", "cancel", "Cancel"),
        Binding("j", "export_json", "JSON"),
        Binding("m", "export_markdown", "Markdown"),
        Binding("q", "quit", "Quit"),
        Binding("escape", "focus_table", "Table", show=False),
    ]
    FLUSH_S = 0.05
    """Scan events arrive in bursts (a cached sweep finishes hundreds of rows at once): the rows
    they touch are redrawn together at most this often."""

    # The view's state. Setting one redraws what depends on it (its ``watch_``); ``init=False``:
    # nothing is drawn before the widgets exist.
    verdict_filter: reactive[str | None] = reactive(None, init=False)
    sort_column: reactive[str] = reactive("order", init=False)
    sort_reverse: reactive[bool] = reactive(False, init=False)
    selected: reactive[str | None] = reactive(None, init=False)

    def __init__(
        self,
        targets: Iterable[Target],
        *,
        jobs: int | None = None,
        timeout: float = 60.0,
        use_cache: bool = True,
        output_dir: str | Path = ".",
        scope: str = "",
        ray: str | None = None,
    ) -> None:
        super().__init__()
        self.entries: dict[str, R.Entry] = {t.key: R.Entry(t, i) for i, t in enumerate(targets)}
        self.scanner = Scanner(self._post_scan_event, jobs=jobs, timeout=timeout, use_cache=use_cache, ray=ray)
        self.output_dir = Path(output_dir)
        self.scope = scope
        self._shown: list[str] = []
        self._widths: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._flush_timer: Timer | None = None
        self._log_levels: dict[str, int] = {}
        self.sub_title = f"{len(self.entries)} models · {current_target().label}" + (f" · {scope}" if scope else "")

    # ------------------------------------------------------------------ layout, start, stop
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="bar"):
            yield Input(placeholder="/ filter by text: model, type, architecture, note", id="filter", compact=True)
            yield Static("", id="verdict-filter")
            yield Static("", id="sort-label")
        with Horizontal(id="progress-row"):
            yield ProgressBar(total=max(1, len(self.entries)), show_eta=False, id="progress")
            yield Static("", id="status")
        table: DataTable = DataTable(id="table", cursor_type="row", zebra_stripes=True)
        yield table
        with VerticalScroll(id="detail-pane"):
            yield Static("", id="detail")
        yield Footer()

    def on_mount(self) -> None:
        # Library warnings (a Hub retry, a config oddity) would be written over the screen by a
        # handler bound to the terminal; each model's failure reaches its row instead.
        for name in ("huggingface_hub", "transformers"):
            self._log_levels[name] = logging.getLogger(name).level
            logging.getLogger(name).setLevel(logging.ERROR)
        table = self.query_one(DataTable)
        self._flush_timer = self.set_interval(self.FLUSH_S, self._flush_changes, pause=True)
        self._update_labels()
        self._rebuild_table()
        table.focus()
        if self.entries:
            generation = self.scanner.submit([e.target for e in self.entries.values()])
            for e in self.entries.values():
                e.generation = generation
        self._update_status()

    def on_unmount(self) -> None:
        self.scanner.close()
        for name, level in self._log_levels.items():
            logging.getLogger(name).setLevel(level)

    def _post_scan_event(self, event: Event) -> None:  # called on the scan thread
        self.post_message(ScanEvent(event))

    # ------------------------------------------------------------------ scan events
    def on_scan_event(self, message: ScanEvent) -> None:
        event = message.event
        if isinstance(event, Idle):
            self._guarded(self._update_status)
            return
        entry = self.entries.get(event.key)
        if entry is None or entry.generation != event.generation:
            return  # an event of a request since replaced (re-scan, cancel)
        if isinstance(event, Started):
            if entry.state == R.DONE:
                return
            entry.state = R.SCANNING
        elif isinstance(event, Finished):
            entry.state, entry.result, entry.cached = R.DONE, event.result, event.cached
        elif isinstance(event, Cancelled):
            if entry.state == R.DONE:
                return
            entry.state = R.CANCELLED
        self._changed(entry.key)

    def _changed(self, *keys: str) -> None:
        self._dirty.update(keys)
        if self._flush_timer is not None:
            self._flush_timer.resume()

    @property
    def refresh_pending(self) -> bool:
        """Rows changed since the table was last redrawn."""
        return bool(self._dirty)

    def _flush_changes(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.pause()
        dirty, self._dirty = self._dirty, set()
        if not dirty:
            return

        def flush() -> None:
            self._refresh_table(dirty)
            self._update_status()
            if self.selected in dirty:
                self._show_detail()

        self._guarded(flush)

    def _guarded(self, update) -> None:
        """Run a UI update that a late scan event asked for; the widgets may be gone (the app is closing)."""
        try:
            update()
        except NoMatches:
            pass

    # ------------------------------------------------------------------ the table
    def visible_entries(self) -> list[R.Entry]:
        """The rows of the current view, in their order (what the exports write)."""
        return R.view(self.entries.values(), verdict=self.verdict_filter, text=self._filter_text(), sort=self.sort_column, reverse=self.sort_reverse)

    def _filter_text(self) -> str:
        try:
            return self.query_one("#filter", Input).value
        except Exception:  # noqa: BLE001 - before compose
            return ""

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
        table = self.query_one(DataTable)
        total = table.size.width or self.size.width
        pad = 2 * table.cell_padding
        every = [self._cells(e) for e in entries]
        widths = {column: max([cell_len(label), *(cell_len(c[column]) for c in every)]) for column, label in R.COLUMNS if column != "note"}
        used = sum(w + pad for w in widths.values()) + pad + 1  # + the note's padding, the vertical scrollbar
        widths["note"] = max(12, total - used)
        return widths

    def _row(self, entry: R.Entry, note_width: int) -> list:
        c = self._cells(entry)
        out: list = []
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

    def _refresh_table(self, dirty: set[str] | None = None) -> None:
        entries = self.visible_entries()
        shown = [e.key for e in entries]
        widths = self._layout(entries)
        if shown != self._shown or widths != self._widths:
            self._rebuild_table(entries, widths)
            return
        table = self.query_one(DataTable)
        for key in dirty or ():
            if key in self.entries and key in shown:
                for column, value in zip(R.COLUMN_IDS, self._row(self.entries[key], widths["note"])):
                    table.update_cell(key, column, value)

    def _rebuild_table(self, entries: list[R.Entry] | None = None, widths: dict[str, int] | None = None) -> None:
        table = self.query_one(DataTable)
        entries = self.visible_entries() if entries is None else entries
        widths = self._layout(entries) if widths is None else widths
        shown = [e.key for e in entries]
        keep = self.selected
        table.clear(columns=True)
        for column, label in R.COLUMNS:
            table.add_column(label, width=widths[column], key=column)
        for e in entries:
            table.add_row(*self._row(e, widths["note"]), key=e.key)
        self._shown, self._widths = shown, widths
        if keep in shown:
            table.move_cursor(row=shown.index(keep), animate=False)
        elif shown:
            table.move_cursor(row=0, animate=False)
        # the rows were redrawn: the detail is shown again below whether or not the selection moved
        self.set_reactive(Dashboard.selected, keep if keep in shown else (shown[0] if shown else None))
        self._show_detail()

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self._refresh_table)

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.selected = event.row_key.value if event.row_key is not None else None

    def watch_selected(self) -> None:
        self._show_detail()

    @on(DataTable.HeaderSelected)
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        column = event.column_key.value
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.set_sort(column)

    def _show_detail(self) -> None:
        entry = self.entries.get(self.selected) if self.selected else None
        try:
            renderable = render_detail(entry)
        except Exception as exc:  # noqa: BLE001 - never crash on one odd report
            renderable = Text(f"cannot display {self.selected}: {type(exc).__name__}: {exc}", style="red")
        self.query_one("#detail", Static).update(renderable)

    # ------------------------------------------------------------------ status line
    def _update_labels(self) -> None:
        self.query_one("#verdict-filter", Static).update(Text.assemble(("v ", "bold"), f"verdict: {self.verdict_filter or 'all'}"))
        label = dict(R.COLUMNS).get(self.sort_column, self.sort_column)
        self.query_one("#sort-label", Static).update(Text.assemble(("s ", "bold"), f"sort: {label}{' ↑' if self.sort_reverse else ''}"))

    def counts(self) -> dict[str, int]:
        entries = list(self.entries.values())
        return {
            "total": len(entries),
            "done": sum(e.state == R.DONE for e in entries),
            "errors": sum(e.error is not None for e in entries),
            "cached": sum(e.state == R.DONE and e.cached for e in entries),
            "running": sum(e.state == R.SCANNING for e in entries),
            "queued": sum(e.state == R.QUEUED for e in entries),
            "cancelled": sum(e.state == R.CANCELLED for e in entries),
            "shown": len(self._shown),
        }

    def _update_status(self) -> None:
        n = self.counts()
        bar = self.query_one(ProgressBar)
        bar.update(total=max(1, n["total"]), progress=n["done"] + n["cancelled"])
        parts = [f"{n['done']}/{n['total']} scanned"]
        if n["running"] or n["queued"]:
            parts.append(f"{n['running']} running, {n['queued']} queued")
        parts.append(f"{n['errors']} error{'s' if n['errors'] != 1 else ''}")
        parts.append(f"{n['cached']} from cache")
        if n["cancelled"]:
            parts.append(f"{n['cancelled']} cancelled")
        if n["shown"] != n["total"]:
            parts.append(f"showing {n['shown']}")
        self.query_one("#status", Static).update(" · ".join(parts))

    # ------------------------------------------------------------------ actions
    def _view_changed(self) -> None:
        self._update_labels()
        self._refresh_table()
        self._update_status()

    def watch_verdict_filter(self) -> None:
        self._view_changed()

    def watch_sort_column(self) -> None:
        self._view_changed()

    def watch_sort_reverse(self) -> None:
        self._view_changed()

    @on(Input.Changed, "#filter")
    def _filter_changed(self) -> None:
        self._view_changed()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        self.action_focus_table()

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_table(self) -> None:
        self.query_one(DataTable).focus()

    def action_cycle_verdict(self) -> None:
        i = R.VERDICT_FILTERS.index(self.verdict_filter)
        self.set_verdict_filter(R.VERDICT_FILTERS[(i + 1) % len(R.VERDICT_FILTERS)])

    def set_verdict_filter(self, verdict: str | None) -> None:
        self.verdict_filter = verdict

    def action_cycle_sort(self) -> None:
        i = R.SORTS.index(self.sort_column)
        self.set_sort(R.SORTS[(i + 1) % len(R.SORTS)])

    def set_sort(self, column: str, reverse: bool = False) -> None:
        """Both at once, the view redrawn once (a change of either alone goes through its watcher)."""
        if (column, reverse) == (self.sort_column, self.sort_reverse):
            return
        self.set_reactive(Dashboard.sort_column, column)
        self.set_reactive(Dashboard.sort_reverse, reverse)
        self._view_changed()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def clear_filters(self) -> None:
        self.verdict_filter = None
        self.query_one("#filter", Input).value = ""  # Input.Changed refreshes the view
        self._view_changed()

    def action_rescan(self) -> None:
        if self.selected is None:
            self.notify("No row selected.", severity="warning")
            return
        self.rescan([self.selected])

    def rescan(self, keys: list[str]) -> None:
        entries = [self.entries[k] for k in keys if k in self.entries]
        if not entries:
            return
        generation = self.scanner.submit([e.target for e in entries], force=True)
        for e in entries:
            e.state, e.result, e.cached, e.generation = R.QUEUED, None, False, generation
        self._changed(*(e.key for e in entries))
        self.notify(f"Re-scanning {entries[0].key}" if len(entries) == 1 else f"Re-scanning {len(entries)} models", timeout=2)

    def action_rescan_all(self) -> None:
        self.rescan(list(self.entries))

    def action_cancel(self) -> None:
        open_entries = [e for e in self.entries.values() if e.state in (R.QUEUED, R.SCANNING)]
        self.scanner.cancel()
        for e in open_entries:
            e.state = R.CANCELLED
        self._changed(*(e.key for e in open_entries))
        self.notify(f"Cancelled {len(open_entries)} scan{'s' if len(open_entries) != 1 else ''}" if open_entries else "Nothing to cancel.", timeout=2)

    def export(self, fmt: str) -> Path | None:
        """Write the current view to ``<output dir>/hfcheck-tui.json`` or ``.md``; returns the path."""
        shown = self.visible_entries()
        path = self.output_dir / f"{EXPORT_NAME}.{'json' if fmt == 'json' else 'md'}"
        try:
            text = R.json_text(shown) if fmt == "json" else R.markdown(shown, scope=R.describe_view(self.verdict_filter, self._filter_text(), self.sort_column, self.sort_reverse))
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.partial")  # whole or not at all: a reader never sees half a file
            partial.write_text(text, encoding="utf-8")
            partial.replace(path)
        except OSError as exc:
            self.notify(f"Cannot write {path}: {exc.strerror or exc}", severity="error")
            return None
        unfinished = sum(e.state != R.DONE for e in shown)
        extra = f" ({unfinished} unfinished row{'s' if unfinished != 1 else ''} left out)" if fmt == "json" and unfinished else ""
        self.notify(f"Exported {len(shown) - (unfinished if fmt == 'json' else 0)} rows to {path}{extra}", timeout=4)
        return path

    def action_export_json(self) -> None:
        self.export("json")

    def action_export_markdown(self) -> None:
        self.export("markdown")

    # ------------------------------------------------------------------ command palette
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Re-scan selected model", "Analyse the highlighted row again, bypassing the cache (r)", self.action_rescan)
        yield SystemCommand("Re-scan all models", "Analyse every row again, bypassing the cache", self.action_rescan_all)
        yield SystemCommand("Cancel scans", "Stop every queued and running analysis (c)", self.action_cancel)
        yield SystemCommand("Export view to JSON", f"Write the visible rows to {self.output_dir / (EXPORT_NAME + '.json')} (j)", self.action_export_json)
        yield SystemCommand("Export view to Markdown", f"Write the visible rows to {self.output_dir / (EXPORT_NAME + '.md')} (m)", self.action_export_markdown)
        yield SystemCommand("Clear filters", "Show every row", self.clear_filters)
        yield SystemCommand("Reverse sort order", "Flip the current sort (S)", self.action_reverse_sort)
        for verdict in R.VERDICT_FILTERS:
            label = verdict or "all"
            yield SystemCommand(f"Filter verdict: {label}", f"Show {'every row' if verdict is None else 'rows whose verdict is ' + label}", lambda v=verdict: self.set_verdict_filter(v), discover=False)
        for column in R.SORTS:
            label = dict(R.COLUMNS).get(column, "the order given" if column == "order" else column)
            yield SystemCommand(f"Sort by {label}", f"Order the rows by {label}", lambda c=column: self.set_sort(c), discover=False)
