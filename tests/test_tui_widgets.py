"""The dashboard's widgets, each driven for real (``App.run_test``) on its own, then wired.

Each widget owns its state and speaks through Textual messages: the filter bar posts
``FilterBar.Changed``, the table ``ResultsTable.Highlighted`` / ``Redrawn``, the detail pane
renders the model it is given. Here each runs in a small host app that records what it posts,
over finished entries (no scan: these run in a second); the last test drives the real
``Dashboard`` through the scanner's own ``ScanEvent`` messages. tests/test_tui.py runs the
dashboard over real scans.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

pytest.importorskip("textual", reason="the [tui] extra (textual) is not installed")

from rich.console import Console
from textual import on
from textual.app import App, ComposeResult
from textual.widgets import Input, Static

from hfcheck.analyzer.sources.model_types import Target
from hfcheck.tui import rows as R
from hfcheck.tui.app import Dashboard, ScanEvent
from hfcheck.tui.detail_pane import DetailPane
from hfcheck.tui.filter_bar import FilterBar
from hfcheck.tui.results_table import ResultsTable
from hfcheck.tui.scanner import Finished

SIZE = (120, 30)
MODELS = [("org/llama-7b", "llama", "runs", 80), ("org/qwen-4b", "qwen3", "native-speed", 100), ("org/mamba-1b", "mamba", "blocked", 20)]


def report(key: str, model_type: str, verdict: str, score: int) -> dict[str, Any]:
    """A scan report with the fields the table and the detail pane read."""
    return {"verdict": verdict, "score": score, "blockers": ["no attention interface"] if verdict == "blocked" else [],
            "model": {"ref": key, "model_type": model_type, "architectures": [f"{model_type.title()}ForCausalLM"], "source": "local"},
            "modules": [], "moe": [], "checks": [], "parallel": {"tp": {"sizes": {"1": True, "2": score > 50}}, "pp": {"supported": True}}}


def finished_entries() -> dict[str, R.Entry]:
    entries = {}
    for i, (key, model_type, verdict, score) in enumerate(MODELS):
        entry = R.Entry(Target(key=key, ref=key), i)
        entry.state, entry.result = R.DONE, {"report": report(key, model_type, verdict, score)}
        entries[key] = entry
    return entries


def text_of(static: Static) -> str:
    console = Console(width=116, record=True, file=io.StringIO(), color_system=None)
    console.print(static.content)
    return console.export_text()


class Host(App[None]):
    """One widget on a screen; every message it posts is kept in ``seen``."""

    def __init__(self, widget) -> None:
        super().__init__()
        self.widget = widget
        self.seen: list[Any] = []

    def compose(self) -> ComposeResult:
        yield self.widget

    @on(FilterBar.Changed)
    @on(FilterBar.Submitted)
    @on(ResultsTable.Highlighted)
    @on(ResultsTable.Redrawn)
    def _keep(self, message) -> None:
        self.seen.append(message)


def of_type(app: Host, kind: type) -> list:
    return [m for m in app.seen if isinstance(m, kind)]


def test_filter_bar_owns_the_filter_and_posts_each_change():
    bar = FilterBar()
    app = Host(bar)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            bar.focus_text()
            await pilot.press(*"qw")
            assert bar.filter == R.Filter(text="qw")
            assert [m.filter for m in of_type(app, FilterBar.Changed)] == [R.Filter(text="q"), R.Filter(text="qw")]
            assert all(m.control is bar for m in of_type(app, FilterBar.Changed))

            app.seen.clear()
            bar.cycle_verdict()
            await pilot.pause()
            assert [m.filter for m in of_type(app, FilterBar.Changed)] == [R.Filter(verdict=R.VERDICT_FILTERS[1], text="qw")]
            assert f"verdict: {R.VERDICT_FILTERS[1]}" in str(bar.query_one("#verdict-filter", Static).content)

            app.seen.clear()
            bar.clear()  # both filters at once: one change, and the text box follows
            await pilot.pause()
            assert [m.filter for m in of_type(app, FilterBar.Changed)] == [R.Filter()]
            assert bar.query_one(Input).value == "" and "verdict: all" in str(bar.query_one("#verdict-filter", Static).content)

            await pilot.press("enter")
            assert len(of_type(app, FilterBar.Submitted)) == 1

    asyncio.run(scenario())


def test_results_table_filters_sorts_highlights_and_redraws_changed_rows():
    entries = finished_entries()
    table = ResultsTable(entries, id="table")
    app = Host(table)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert table.shown_keys == [key for key, *_ in MODELS]
            assert table.selected == "org/llama-7b" and of_type(app, ResultsTable.Highlighted)[-1].key == "org/llama-7b"

            table.view_filter = R.Filter(text="QWEN")
            assert table.shown_keys == ["org/qwen-4b"] and table.selected == "org/qwen-4b"
            table.view_filter = R.Filter(verdict="blocked")
            assert table.shown_keys == ["org/mamba-1b"]
            table.view_filter = R.Filter()
            table.sort_by("score")
            assert table.shown_keys == ["org/qwen-4b", "org/llama-7b", "org/mamba-1b"]
            table.reverse_sort()
            assert table.sorting == R.Sort("score", reverse=True) and table.shown_keys[0] == "org/mamba-1b"
            await pilot.pause()
            assert of_type(app, ResultsTable.Redrawn)  # the status line and the sort label follow these

            # the cursor moves: the table says which model to show
            table.focus()
            app.seen.clear()
            await pilot.press("down")
            await pilot.pause()
            assert table.selected == "org/llama-7b" and [m.key for m in of_type(app, ResultsTable.Highlighted)] == ["org/llama-7b"]

            # the highlighted model's data changed (a re-scan finished): its row is redrawn, and shown again
            entries["org/llama-7b"].result = {"report": report("org/llama-7b", "llama", "blocked", 30)}
            app.seen.clear()
            table.changed("org/llama-7b")
            assert table.refresh_pending
            await pilot.pause(table.FLUSH_S * 4)
            assert not table.refresh_pending
            assert str(table.get_row("org/llama-7b")[R.COLUMN_IDS.index("verdict")]) == "blocked"
            assert [m.key for m in of_type(app, ResultsTable.Highlighted)] == ["org/llama-7b"]

    asyncio.run(scenario())


def test_detail_pane_renders_the_model_it_is_given_each_time():
    entries = finished_entries()
    pane = DetailPane(entries, id="detail-pane")
    app = Host(pane)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            body = pane.query_one("#detail", Static)
            pane.model = "org/mamba-1b"
            await pilot.pause()
            text = text_of(body)
            assert "BLOCKED" in text and "org/mamba-1b  (mamba, MambaForCausalLM)" in text and "no attention interface" in text
            entries["org/mamba-1b"].state = R.SCANNING  # re-scanning: the same model, set again, is drawn again
            pane.model = "org/mamba-1b"
            await pilot.pause()
            assert "scanning: being analysed in a worker process" in text_of(body)
            pane.model = None
            await pilot.pause()
            assert text_of(body).strip() == "No model selected."

    asyncio.run(scenario())


def test_dashboard_wires_filter_table_detail_and_status_by_messages():
    app = Dashboard([])  # no targets: nothing is scanned; the rows arrive as the scanner's own events

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            for i, (key, model_type, verdict, score) in enumerate(MODELS):
                app.entries[key] = R.Entry(Target(key=key, ref=key), i)
                app.post_message(ScanEvent(Finished(key, 0, {"report": report(key, model_type, verdict, score)})))
            await pilot.pause(0.3)
            status, detail = app.query_one("#status", Static), app.query_one("#detail", Static)
            assert app.table.shown_keys == [key for key, *_ in MODELS]
            assert "3/3 scanned · 0 errors · 0 from cache" in str(status.content)
            assert "org/llama-7b  (llama" in text_of(detail)

            # typing in the filter narrows the table; the status line says so
            await pilot.press("/", *"qwen")
            await pilot.pause()
            assert app.table.shown_keys == ["org/qwen-4b"] and "showing 1" in str(status.content)
            assert "org/qwen-4b  (qwen3" in text_of(detail)  # the only row left is the one shown
            await pilot.press("enter")
            assert app.focused is app.table

            # selecting a row updates the detail pane
            await pilot.press("/", *["backspace"] * len("qwen"), "enter")
            await pilot.pause()
            assert len(app.table.shown_keys) == 3
            await pilot.press("down", "down")
            await pilot.pause()
            assert app.selected == "org/mamba-1b" and "BLOCKED" in text_of(detail)

            # the sort label follows the table's sort
            await pilot.press("s", "S")
            await pilot.pause()
            assert (app.sort_column, app.sort_reverse) == ("model", True)
            assert "sort: model ↑" in str(app.query_one("#sort-label", Static).content)

    asyncio.run(scenario())
