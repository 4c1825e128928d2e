"""The dashboard's data, without Textual: one ``Entry`` per model, its table cells, sorting,
filtering and the two exports (JSON in the shape of ``hfcheck sweep --format json``, and a
Markdown table of the visible columns).

An entry moves ``queued -> scanning -> done`` (or ``cancelled``); a done entry holds the
sweep's ``Result``: ``{"report": scan report}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hfcheck.analyzer.report.cells import fusions_cell, largest_tp, moe_summary, pp_cell
from hfcheck.analyzer.report.verdict import VERDICT_STYLE as VERDICT_STYLES
from hfcheck.analyzer.report.verdict import VERDICTS
from hfcheck.analyzer.sources.model_types import Target
from hfcheck.analyzer.vllm.release import modelled_version
from hfcheck.sweep.run import failure_reason

QUEUED, SCANNING, DONE, CANCELLED = "queued", "scanning", "done", "cancelled"
ERROR = "error"  # the verdict cell of a model whose analysis failed
PENDING = "pending"  # the verdict filter matching queued / scanning / cancelled rows

VERDICT_FILTERS: tuple[str | None, ...] = (None, *VERDICTS, ERROR, PENDING)
VERDICT_STYLE = {  # the verdicts' styles, and the TUI's own row states
    **VERDICT_STYLES,
    ERROR: "bold white on red",
    QUEUED: "dim",
    SCANNING: "italic cyan",
    CANCELLED: "dim italic",
}

# (column id, header label); the table shows them in this order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("verdict", "verdict"),
    ("score", "score"),
    ("fusions", "fusions"),
    ("moe", "MoE"),
    ("tp", "TP"),
    ("pp", "PP"),
    ("blockers", "blk"),
    ("source", "source"),
    ("note", "note"),
)
COLUMN_IDS = tuple(c for c, _ in COLUMNS)
SORTS: tuple[str, ...] = ("order", *COLUMN_IDS)  # "order": the order the models were given in
NOTE_WIDTH = 70
MODEL_WIDTH = 26  # longer ids are cut in the middle in the table (the detail pane has them whole)


@dataclass
class Entry:
    target: Target
    index: int  # position in the order given
    state: str = QUEUED
    result: dict[str, Any] | None = None
    cached: bool = False
    generation: int = 0  # the scan request this entry waits for; older events are ignored

    @property
    def key(self) -> str:
        return self.target.key

    @property
    def report(self) -> dict[str, Any] | None:
        return (self.result or {}).get("report")

    @property
    def error(self) -> str | None:
        """The failure of a finished analysis (one line), None otherwise."""
        if self.state != DONE or self.result is None or "report" in self.result:
            return None
        return str(self.result.get("error") or "unknown error")

    @property
    def verdict(self) -> str:
        if self.state != DONE:
            return self.state
        return self.report["verdict"] if self.report else ERROR


# ------------------------------------------------------------------------------- cells


def note_of(entry: Entry) -> str:
    if entry.state == QUEUED:
        return "waiting for a worker"
    if entry.state == SCANNING:
        return "analysing…"
    if entry.state == CANCELLED:
        return "scan cancelled (r: re-scan)"
    if entry.error is not None:
        error = entry.error
        for prefix in (entry.key, entry.key.removeprefix("./")):  # the model column says which model
            if error.startswith(prefix + ": "):
                return error[len(prefix) + 2 :]
        return error
    report = entry.report or {}
    if report.get("blockers"):
        return report["blockers"][0]
    state = report.get("analysis") or {}
    if state.get("instance_error"):
        return f"no tiny instance: {state['instance_error']}"
    failing = [c for c in report.get("checks", []) if c.get("status") in ("fail", "warn")]
    if failing:
        return f"{failing[0]['code']}: {failing[0]['message']}"
    return ""


def short(text: str, limit: int = NOTE_WIDTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def middle_cut(text: str, limit: int = MODEL_WIDTH) -> str:
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def cells(entry: Entry) -> dict[str, str]:
    """Plain text of every column (the table adds colour to the verdict, and cuts model and note)."""
    report = entry.report
    out = {c: "" for c in COLUMN_IDS}
    out["model"] = entry.key
    out["verdict"] = entry.verdict
    out["note"] = note_of(entry)
    if report is None:
        return out
    tp = largest_tp(report)
    out.update(
        score=str(report.get("score", "")),
        fusions=fusions_cell(report).replace(", ", " "),
        moe=moe_summary(report),
        tp=str(tp) if tp else "none",
        pp=pp_cell(report),
        blockers=str(len(report.get("blockers") or [])),
        source=str((report.get("model") or {}).get("source") or ""),
    )
    return out


# ------------------------------------------------------------------------ sort, filter


@dataclass(frozen=True)
class Filter:
    """Which rows the view shows: those of ``verdict`` (None: any) whose text holds ``text``.

    One value for both filters, so a widget that owns them changes them together (clearing
    both is one change, one redraw) and hands them on whole in one message.
    """

    verdict: str | None = None
    text: str = ""


@dataclass(frozen=True)
class Sort:
    """The view's order: by ``column`` (one of ``SORTS``), reversed or not; one value for the
    same reason as ``Filter``: a click on another header sets both at once."""

    column: str = SORTS[0]
    reverse: bool = False


_VERDICT_RANK = {v: i for i, v in enumerate((*VERDICTS, ERROR, SCANNING, QUEUED, CANCELLED))}


def sort_key(column: str):
    """A key function over entries; rows without a value for the column sort last."""

    def value_of(entry: Entry):
        report = entry.report
        if column == "order":
            return (0, entry.index)
        if column == "model":
            return (0, entry.key.lower(), entry.index)
        if column == "verdict":
            return (0, _VERDICT_RANK.get(entry.verdict, 99), entry.index)
        if report is None:
            return (1, entry.index)
        if column == "score":
            value: Any = -int(report.get("score", 0))  # best first
        elif column == "tp":
            value = -(largest_tp(report) or 0)
        elif column == "blockers":
            value = len(report.get("blockers") or [])
        elif column == "fusions":
            value = -len([f for m in report.get("modules", []) for f in m.get("fusions", [])])
        else:
            value = cells(entry)[column].lower()
        return (0, value, entry.index)

    def key(entry: Entry):
        try:
            return value_of(entry)
        except Exception:  # noqa: BLE001 - a malformed result sorts last, it never stops the table
            return (1, entry.index)

    return key


def matches(entry: Entry, verdict: str | None, text: str) -> bool:
    if verdict == PENDING:
        if entry.state == DONE:
            return False
    elif verdict is not None and entry.verdict != verdict:
        return False
    needle = text.strip().lower()
    if not needle:
        return True
    try:
        report = entry.report or {}
        model = report.get("model") or {}
        hay = [entry.key, entry.verdict, note_of(entry), str(model.get("model_type") or ""), " ".join(model.get("architectures") or []), str(model.get("source") or "")]
    except Exception:  # noqa: BLE001 - a malformed result is matched by its name only
        hay = [entry.key]
    return any(needle in h.lower() for h in hay)


def view(entries: Iterable[Entry], *, verdict: str | None = None, text: str = "", sort: str = "order", reverse: bool = False) -> list[Entry]:
    """The visible entries, filtered then sorted; rows that lack the sort column's value come last."""
    key = sort_key(sort)
    shown = [e for e in entries if matches(e, verdict, text)]
    valued = sorted((e for e in shown if key(e)[0] == 0), key=key, reverse=reverse)
    missing = sorted((e for e in shown if key(e)[0] != 0), key=lambda e: e.index)
    return valued + missing  # rows without a value stay last either way


def describe_view(verdict: str | None, text: str, sort: str, reverse: bool) -> str:
    parts = [f"verdict: {verdict or 'all'}"]
    if text.strip():
        parts.append(f"text: {text.strip()!r}")
    label = dict(COLUMNS).get(sort, sort)
    parts.append(f"sort: {label}{' (reversed)' if reverse else ''}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- exports


def to_json(entries: Iterable[Entry]) -> dict[str, Any]:
    """``{key: scan report | {"error": "analysis failed: ..."}}``, finished entries only, in view order.

    The shape of ``hfcheck sweep --format json``: what reads one reads the other.
    """

    out: dict[str, Any] = {}
    for e in entries:
        if e.state != DONE or e.result is None:
            continue
        out[e.key] = e.report if e.report is not None else {"error": failure_reason(e.result)}
    return out


def json_text(entries: Iterable[Entry]) -> str:
    return json.dumps(to_json(entries), indent=2) + "\n"


def _md(value: str) -> str:
    text = str(value).replace("\n", " ").replace("|", "\\|").strip()
    return text or "—"


def markdown(entries: list[Entry], *, title: str = "hfcheck tui", scope: str = "") -> str:
    """A Markdown table of the view: the table's columns plus the serve command."""

    target = next(((e.report or {}).get("target") for e in entries if (e.report or {}).get("target")), None)
    label = target["label"] if target else f"vLLM {modelled_version()}"
    lines = [f"# {title}", "", f"{label}: the transformers backend (`--model-impl transformers`), as predicted by hfcheck."]
    if scope:
        lines += ["", f"View: {scope}; {len(entries)} models."]
    lines += ["", "| " + " | ".join(label for _, label in COLUMNS) + " | vllm serve |", "|" + "---|" * (len(COLUMNS) + 1)]
    for e in entries:
        c = cells(e)
        c["fusions"] = fusions_cell(e.report) if e.report else ""
        command = (e.report or {}).get("serve_command") or ""
        lines.append("| " + " | ".join(_md(c[col]) for col in COLUMN_IDS) + f" | {('`' + command + '`') if command else '—'} |")
    lines.append("")
    return "\n".join(lines)
