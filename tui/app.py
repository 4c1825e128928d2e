"""``hfcheck tui``: the Textual dashboard over many models.

One row per model, filled live by the background ``Scanner`` (the sweep's worker pool and
cache; the UI thread never waits on a scan), a progress bar, sort by any column (``s`` / a
click on a header, ``S`` reverses), filter by verdict (``v``) and by text (``/``), and the
detail pane of the highlighted row. ``r`` re-scans a row, ``c`` cancels, ``j`` / ``m`` export
the current view to JSON / Markdown; everything is also in the command palette (ctrl+p).

The App holds the models (``entries``) and the scanner, and composes the widgets, each the
owner of its own state: ``FilterBar`` (the filter), ``ResultsTable`` (the rows, their sort and
the highlighted one), ``DetailPane`` (the model shown), ``SortLabel`` and ``ScanProgress``. The
widgets post messages up; the App answers by setting the attributes of the widget concerned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header

from hfcheck.analyzer.sources.model_types import Target
from hfcheck.analyzer.vllm.target import current as current_target
from hfcheck.tui import rows as R
from hfcheck.tui.detail_pane import DetailPane
from hfcheck.tui.filter_bar import FilterBar
from hfcheck.tui.results_table import ResultsTable
from hfcheck.tui.scan_progress import ScanProgress
from hfcheck.tui.scanner import Cancelled, Event, Finished, Idle, Scanner, Started
from hfcheck.tui.sort_label import SortLabel

EXPORT_NAME = "hfcheck-tui"


class ScanEvent(Message):
    """A scanner event, carried from the scan thread to the UI thread."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class Dashboard(App[int]):
    TITLE = "hfcheck tui"
    CSS = "#bar { height: 1; }"
    BINDINGS: ClassVar[list[BindingType]] = [
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
        self._log_levels: dict[str, int] = {}
        self.sub_title = f"{len(self.entries)} models · {current_target().label}" + (f" · {scope}" if scope else "")
        # The widgets, made here so the App names them without querying; each owns its state.
        self.filter_bar = FilterBar()
        self.sort_label = SortLabel(id="sort-label")
        self.progress = ScanProgress(len(self.entries), id="progress-row")
        self.table = ResultsTable(self.entries, id="table")
        self.detail = DetailPane(self.entries, id="detail-pane")

    # ------------------------------------------------------------------ layout, start, stop
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="bar"):
            yield self.filter_bar
            yield self.sort_label
        yield self.progress
        yield self.table
        yield self.detail
        yield Footer()

    def on_mount(self) -> None:
        # Library warnings (a Hub retry, a config oddity) would be written over the screen by a
        # handler bound to the terminal; each model's failure reaches its row instead.
        for name in ("huggingface_hub", "transformers"):
            self._log_levels[name] = logging.getLogger(name).level
            logging.getLogger(name).setLevel(logging.ERROR)
        self.table.focus()
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
            self._update_status()
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
        self.table.changed(entry.key)

    # ------------------------------------------------------------------ the widgets' messages
    @on(FilterBar.Changed)
    def _filter_changed(self, event: FilterBar.Changed) -> None:
        self.table.view_filter = event.filter

    @on(FilterBar.Submitted)
    def _filter_submitted(self) -> None:
        self.action_focus_table()

    @on(ResultsTable.Highlighted)
    def _row_highlighted(self, event: ResultsTable.Highlighted) -> None:
        self.detail.model = event.key

    @on(ResultsTable.Redrawn)
    def _table_redrawn(self, event: ResultsTable.Redrawn) -> None:
        self.sort_label.sorting = event.table.sorting
        self._update_status()

    # ------------------------------------------------------------------ the view's state, read
    @property
    def verdict_filter(self) -> str | None:
        """The verdict filter (the filter bar's)."""
        return self.filter_bar.filter.verdict

    @property
    def sort_column(self) -> str:
        """The sort column (the table's)."""
        return self.table.sorting.column

    @property
    def sort_reverse(self) -> bool:
        return self.table.sorting.reverse

    @property
    def selected(self) -> str | None:
        """The key of the highlighted row (the table's)."""
        return self.table.selected

    @property
    def refresh_pending(self) -> bool:
        """Rows changed since the table was last redrawn."""
        return self.table.refresh_pending

    def visible_entries(self) -> list[R.Entry]:
        """The rows of the current view, in their order (what the exports write)."""
        return self.table.visible_entries()

    # ------------------------------------------------------------------ status line
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
            "shown": len(self.table.shown_keys),
        }

    def _update_status(self) -> None:
        self.progress.counts = self.counts()

    # ------------------------------------------------------------------ actions
    def action_focus_filter(self) -> None:
        self.filter_bar.focus_text()

    def action_focus_table(self) -> None:
        self.table.focus()

    def action_cycle_verdict(self) -> None:
        self.filter_bar.cycle_verdict()

    def set_verdict_filter(self, verdict: str | None) -> None:
        self.filter_bar.show_verdict(verdict)

    def action_cycle_sort(self) -> None:
        self.table.cycle_sort()

    def set_sort(self, column: str, reverse: bool = False) -> None:
        """Both at once, the view redrawn once."""
        self.table.sort_by(column, reverse)

    def action_reverse_sort(self) -> None:
        self.table.reverse_sort()

    def clear_filters(self) -> None:
        self.filter_bar.clear()

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
        self.table.changed(*(e.key for e in entries))
        self.notify(f"Re-scanning {entries[0].key}" if len(entries) == 1 else f"Re-scanning {len(entries)} models", timeout=2)

    def action_rescan_all(self) -> None:
        self.rescan(list(self.entries))

    def action_cancel(self) -> None:
        open_entries = [e for e in self.entries.values() if e.state in (R.QUEUED, R.SCANNING)]
        self.scanner.cancel()
        for e in open_entries:
            e.state = R.CANCELLED
        self.table.changed(*(e.key for e in open_entries))
        self.notify(f"Cancelled {len(open_entries)} scan{'s' if len(open_entries) != 1 else ''}" if open_entries else "Nothing to cancel.", timeout=2)

    def export(self, fmt: str) -> Path | None:
        """Write the current view to ``<output dir>/hfcheck-tui.json`` or ``.md``; returns the path."""
        shown = self.visible_entries()
        f, s = self.table.view_filter, self.table.sorting  # the view the rows were taken from
        path = self.output_dir / f"{EXPORT_NAME}.{'json' if fmt == 'json' else 'md'}"
        try:
            text = R.json_text(shown) if fmt == "json" else R.markdown(shown, scope=R.describe_view(f.verdict, f.text, s.column, s.reverse))
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
