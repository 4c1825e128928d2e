"""The detail pane of one model, as rich renderables: verdict, blockers, checks with their
remediation, fusions per module, MoE, the TP/PP/EP table, the layer map, memory and the
``vllm serve`` command. Reads the scan report dict only (like ``analyzer/render/text.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hfcheck.analyzer.render.text import NO_COMMAND, STATUS_MARK
from hfcheck.tui.rows import CANCELLED, QUEUED, SCANNING, VERDICT_STYLE, Entry

LAYERS_PER_LINE = 64
SERVED, BLOCKS = "░", "█"  # block elements: every monospace font has them, at one cell
SHOWN_STATUSES = ("fail", "warn", "inconclusive", "info")


def _heading(text: str) -> Text:
    return Text(text, style="bold")


def render_detail(entry: Entry | None) -> RenderableType:
    if entry is None:
        return Text("No model selected.", style="dim")
    if entry.state in (QUEUED, SCANNING, CANCELLED):
        what = {QUEUED: "waiting for a worker", SCANNING: "being analysed in a worker process", CANCELLED: "scan cancelled; press r to re-scan it"}[entry.state]
        return Group(Text(entry.key, style="bold"), Text(f"{entry.state}: {what}", style=VERDICT_STYLE.get(entry.state, "")))
    if entry.report is None:
        return Group(
            Text.assemble((" ERROR ", VERDICT_STYLE["error"]), "  ", (entry.key, "bold")),
            Text(""),
            Text(f"analysis failed: {entry.error}", style="red"),
            Text(""),
            Text("The other models are unaffected. Fix the reference or the folder, then press r to re-scan this row; "
                 f"`hfcheck scan {entry.key}` prints the same error.", style="dim"),
        )
    return report_detail(entry.report, cached=entry.cached)


def report_detail(report: dict[str, Any], cached: bool = False) -> RenderableType:
    parts: list[RenderableType] = []
    model = report.get("model") or {}
    head = Text()
    head.append(f" {report['verdict'].upper()} ", style=VERDICT_STYLE.get(report["verdict"], "bold") + " reverse")
    head.append(f"  score {report['score']}/100  ", style="bold")
    archs = ", ".join(model.get("architectures") or []) or "no architectures"
    head.append(f"{model.get('ref')}  ({model.get('model_type')}, {archs})")
    parts.append(head)
    source = f"source: {model.get('source')}" + (f" — {model['source_note']}" if model.get("source_note") else "")
    if cached:
        source += " (result from the sweep cache)"
    parts.append(Text(source, style="dim"))
    if model.get("parameters"):
        parts.append(Text(f"parameters: {model['parameters'] / 1e9:.2f} B", style="dim"))
    if report.get("blockers"):
        parts += [Text(""), Text("Blockers", style="bold red")]
        parts += [Text(f"  ✗ {b}", style="red") for b in report["blockers"]]
    serve = report.get("serve") or {}
    if report.get("serve_command"):
        label = "Run it (vLLM's native implementation): " if serve.get("implementation") == "native" else "Run it: "
        parts += [Text(""), Text.assemble((label, "bold"), (report["serve_command"], "bold cyan"))]
        if serve.get("note"):
            parts.append(Text(serve["note"], style="yellow"))
    else:
        parts += [Text(""), Text(f"No vllm serve command: {serve.get('note') or NO_COMMAND}", style="red")]
    parts += [Text(""), _checks(report)]
    if report.get("modules"):
        parts += [Text(""), _modules(report)]
    for m in report.get("moe") or []:
        state = "experts replaced by FusedMoE" if m.get("experts_replaceable") else "experts NOT replaced (naive loop)"
        routing = "internal" if m.get("internal_routing") else "external"
        parts.append(Text(f"MoE {m['class']}: {state}, {routing} routing — {m.get('reason') or ''}"))
    parts += [Text(""), _parallel(report)]
    layer_map = _layer_map(report.get("layers") or [])
    if layer_map is not None:
        parts += [Text(""), layer_map]
    mem = report.get("memory")
    if mem:
        parts += [
            Text(""),
            Text(
                f"Memory: weights {mem['weights_gib']:.1f} GiB, KV cache {mem['kv_cache_gib_per_sequence']:.1f} GiB per "
                f"{mem['context']}-token sequence (assuming {mem['assumed_gpu_gib']} GiB GPUs); suggested TP {mem.get('suggested_tp')}, PP {mem.get('suggested_pp')}",
                style="dim",
            ),
        ]
    for line in report.get("missing_code") or []:
        parts.append(Text(f"Code not analysed: {line}", style="magenta"))
    return Group(*parts)


def _checks(report: dict[str, Any]) -> RenderableType:
    checks = report.get("checks") or []
    shown = [c for c in checks if c.get("status") in SHOWN_STATUSES or c.get("code") == "HFC502"]
    passing = len(checks) - len(shown)
    table = Table(title=f"Checks ({passing} more passing)", title_justify="left", title_style="bold", expand=True, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("", width=1, no_wrap=True)
    table.add_column("code", no_wrap=True, style="bold")
    table.add_column("result", ratio=3)
    table.add_column("remediation", ratio=2, style="dim")
    for c in shown:
        mark, style = STATUS_MARK.get(c["status"], ("?", ""))
        remedy = (c.get("remediation") or "") if c["status"] in ("fail", "warn", "inconclusive") else ""
        table.add_row(Text(mark, style=style), c["code"], Text(c.get("message") or ""), Text(remedy))
    return table


def _modules(report: dict[str, Any]) -> RenderableType:
    table = Table(title="Fusions per module", title_justify="left", title_style="bold", expand=True, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("module class", style="bold", no_wrap=True)
    table.add_column("fusions")
    table.add_column("attention")
    table.add_column("not fused (why)", style="dim", ratio=1)
    for m in report["modules"]:
        why = "; ".join(f"{n['fusion']}: {n['reason']}" for n in (m.get("not_fused") or [])[:2])
        trace = m.get("trace") or {}
        if trace.get("traced") and not trace.get("complete") and trace.get("error"):
            why = (why + "; " if why else "") + f"trace stopped: {trace['error']}"
        table.add_row(m["class"], Text(", ".join(m.get("fusions") or []) or "—", style="green" if m.get("fusions") else "dim"), "yes" if m.get("attention_interface") else "", why)
    return table


def _parallel(report: dict[str, Any]) -> RenderableType:
    par = report.get("parallel") or {}
    tp = par.get("tp") or {}
    table = Table(title="Parallelism (TP / PP / EP)", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    sizes = tp.get("sizes") or {}
    for s in sizes:
        table.add_column(f"TP {s}", justify="center")
    table.add_column("PP", justify="center")
    table.add_column("EP", justify="center")

    def yes(flag: bool) -> Text:
        return Text("yes", style="green") if flag else Text("no", style="red")

    table.add_row(*[yes(v) for v in sizes.values()], yes(bool((par.get("pp") or {}).get("supported"))), yes(bool((par.get("ep") or {}).get("supported"))))
    rows: list[RenderableType] = [table]
    plan = tp.get("plan")
    rows.append(Text(f"TP plan: {plan['source']} ({len(plan['entries'])} entries)" if plan else "TP plan: none", style="dim"))
    scopes = tp.get("refusal_scope") or {}
    for size, reasons in (tp.get("refusals") or {}).items():
        if reasons:
            who = "not possible with any vLLM backend" if scopes.get(size) == "any-backend" else "refused"
            rows.append(Text(f"TP {size} {who}: {'; '.join(str(r) for r in reasons[:2])}", style="dim" if scopes.get(size) == "any-backend" else "yellow"))
    return Group(*rows)


def _layer_map(layers: list[dict[str, Any]]) -> RenderableType | None:
    if not layers:
        return None
    blocking = [layer for layer in layers if not layer.get("attention_interface")]
    kinds = Counter(layer["type"] for layer in layers)
    blocking_kinds = Counter(layer["type"] for layer in blocking)
    title = Text.assemble(("Layer map", "bold"), f"  {len(layers)} layers, ", (f"{len(blocking)} blocking", "bold red" if blocking else "green"), "   ")
    title.append(f"{SERVED} served by vLLM's attention", style="green")
    title.append("   ")
    title.append(f"{BLOCKS} blocks loading", style="bold red")
    grid = Text()
    width = len(str(len(layers) - 1))
    for start in range(0, len(layers), LAYERS_PER_LINE):
        grid.append(f"  {start:>{width}} ", style="dim")
        for i, layer in enumerate(layers[start : start + LAYERS_PER_LINE]):
            if i and i % 8 == 0:
                grid.append(" ")
            served = bool(layer.get("attention_interface"))
            grid.append(SERVED if served else BLOCKS, style="green" if served else "bold red")
        grid.append("\n")
    grid.rstrip()
    kinds_line = Text("  ")
    for n, (kind, count) in enumerate(kinds.most_common()):
        if n:
            kinds_line.append(", ")
        kinds_line.append(f"{kind} ×{count}", style="red" if blocking_kinds.get(kind) else "")
    out: list[RenderableType] = [title, grid, kinds_line]
    if blocking:
        shown = ", ".join(str(layer["index"]) for layer in blocking[:24]) + (f", … (+{len(blocking) - 24})" if len(blocking) > 24 else "")
        out.append(Text(f"  blocking layers: {shown}", style="red"))
    return Group(*out)
