"""The filter bar: the text box (``/``) and the verdict filter (``v``) that narrow the table.

The bar owns the filter (``FilterBar.filter``, a ``rows.Filter``) because it is where the user
edits it: the text box and the verdict label show it, and every change is posted up as one
``FilterBar.Changed`` carrying the whole filter. The App hands that down to the table; neither
widget knows the other (Textual's "attributes down, messages up").
"""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Input, Static

from hfcheck.tui import rows as R

PLACEHOLDER = "/ filter by text: model, type, architecture, note"


class FilterBar(Horizontal):
    """The text box and the verdict filter's label; the filter is this widget's state."""

    DEFAULT_CSS = """
    FilterBar { width: 1fr; height: 1; }
    FilterBar #filter { width: 1fr; }
    FilterBar #verdict-filter { width: auto; padding: 0 1; }
    """

    filter: reactive[R.Filter] = reactive(R.Filter, init=False)
    """Setting it shows it (in the text box and the verdict label) and posts ``Changed``."""

    class Changed(Message):
        """The filter changed: the view shows other rows."""

        def __init__(self, bar: FilterBar, view_filter: R.Filter) -> None:
            super().__init__()
            self.bar = bar
            self.filter = view_filter

        @property
        def control(self) -> FilterBar:
            return self.bar

    class Submitted(Message):
        """Enter in the text box: the user is done typing (the App gives the table the focus)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        # held, not queried: a late message (the app closing) finds them even once they are gone
        self._text_box = Input(placeholder=PLACEHOLDER, id="filter", compact=True)
        self._verdict_label = Static("", id="verdict-filter")

    def compose(self) -> ComposeResult:
        yield self._text_box
        yield self._verdict_label

    def on_mount(self) -> None:
        self._show_verdict()

    def watch_filter(self, old: R.Filter, new: R.Filter) -> None:
        if new.verdict != old.verdict:
            self._show_verdict()
        if self._text_box.value != new.text:
            self._text_box.value = new.text  # its Input.Changed then finds the filter already set
        self.post_message(self.Changed(self, new))

    def _show_verdict(self) -> None:
        self._verdict_label.update(Text.assemble(("v ", "bold"), f"verdict: {self.filter.verdict or 'all'}"))

    @on(Input.Changed, "#filter")
    def _text_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter = replace(self.filter, text=event.value)

    @on(Input.Submitted, "#filter")
    def _text_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Submitted())

    # ------------------------------------------------------------------ what the App asks
    def focus_text(self) -> None:
        """Put the cursor in the text box (``/``)."""
        self._text_box.focus()

    def show_verdict(self, verdict: str | None) -> None:
        """Show only rows of ``verdict`` (None: every verdict); the text filter stays."""
        self.filter = replace(self.filter, verdict=verdict)

    def cycle_verdict(self) -> None:
        """The next verdict of ``rows.VERDICT_FILTERS`` (``v``), back to all after the last."""
        i = R.VERDICT_FILTERS.index(self.filter.verdict)
        self.show_verdict(R.VERDICT_FILTERS[(i + 1) % len(R.VERDICT_FILTERS)])

    def clear(self) -> None:
        """Both filters off: one change, one redraw of the table."""
        self.filter = R.Filter()
