"""Report -> a readable terminal report (rich): verdict first, then blockers, checks with
remediation, fusions per module, the TP/PP/EP table and the command to run."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from hfcheck.analyzer.report.verdict import VERDICT_STYLE

NO_COMMAND = "vLLM's transformers backend would refuse this model."
"""Why there is no command, for reports older than schema 1.1 (no ``serve`` note)."""
STATUS_MARK = {"pass": ("✓", "green"), "fail": ("✗", "red"), "warn": ("!", "yellow"), "info": ("·", "cyan"), "inconclusive": ("?", "magenta")}


def render_text(report: dict[str, Any], console: Console, verbose: bool = False) -> None:
    model = report["model"]
    head = Text()
    head.append(f"{report['verdict'].upper()}", style=VERDICT_STYLE.get(report["verdict"], "bold"))
    head.append(f"  score {report['score']}/100   ", style="bold")
    head.append(f"{model['ref']}  ({model['model_type']}, {', '.join(model['architectures']) or 'no architectures'})")
    lines = [head, Text(f"source: {model['source']}" + (f" — {model['source_note']}" if model["source_note"] else ""), style="dim")]
    if model.get("parameters"):
        lines.append(Text(f"parameters: {model['parameters'] / 1e9:.2f} B", style="dim"))
    lines += [Text(note, style="dim") for note in model.get("notes") or []]
    target = report.get("target") or {}
    if target:
        lines.append(Text(f"predicted for: {target['label']}", style="dim"))
        lines += [Text(f"! {note}", style="yellow") for note in target.get("notes") or []]
    console.print(Panel(Group(*lines), title="hfcheck scan", title_align="left"))
    if report["blockers"]:
        console.print(Text("Blockers", style="bold red"))
        for b in report["blockers"]:
            console.print(f"  ✗ {b}", style="red", markup=False)
    checks = Table(title="Checks", title_justify="left", show_lines=False, expand=True)
    checks.add_column("", width=1)
    checks.add_column("code", style="bold", no_wrap=True)
    checks.add_column("result", ratio=3)
    checks.add_column("remediation", ratio=2, style="dim")
    for c in report["checks"]:
        if c["status"] in ("pass", "info") and not verbose and c["code"] not in ("HFC103", "HFC502"):
            continue
        mark, style = STATUS_MARK[c["status"]]
        checks.add_row(Text(mark, style=style), c["code"], Text(c["message"]), Text(c["remediation"] or "") if c["status"] in ("fail", "warn") else "")
    console.print(checks)
    if report["modules"]:
        mods = Table(title="Fusions per module", title_justify="left", expand=True)
        mods.add_column("module class", style="bold")
        mods.add_column("fusions")
        mods.add_column("attention")
        mods.add_column("not fused (why)", style="dim")
        for m in report["modules"]:
            why = "; ".join(f"{n['fusion']}: {n['reason']}" for n in m["not_fused"][:2])
            mods.add_row(m["class"], ", ".join(m["fusions"]) or "—", "yes" if m["attention_interface"] else "", why)
        console.print(mods)
    for m in report["moe"]:
        console.print(f"MoE {m['class']}: experts {'replaced by FusedMoE' if m['experts_replaceable'] else 'NOT replaced'}, "
                      f"{'internal' if m['internal_routing'] else 'external'} routing — {m['reason']}", markup=False)
    par = report["parallel"]
    table = Table(title="Parallelism", title_justify="left")
    for s in par["tp"]["sizes"]:
        table.add_column(f"TP {s}", justify="center")
    table.add_column("PP", justify="center")
    table.add_column("EP", justify="center")
    yes = lambda b: Text("yes", style="green") if b else Text("no", style="red")  # noqa: E731
    table.add_row(*[yes(v) for v in par["tp"]["sizes"].values()], yes(par["pp"]["supported"]), yes(par["ep"]["supported"]))
    console.print(table)
    plan = par["tp"]["plan"]
    plan_text = f"{plan['source']} ({len(plan['entries'])} entries)" if plan else "none"
    console.print(f"TP plan: {plan_text}", markup=False)
    blocking = [layer for layer in report["layers"] if not layer["attention_interface"]]
    if blocking:
        console.print(f"Layers vLLM cannot serve: {', '.join(str(layer['index']) + ' (' + layer['type'] + ')' for layer in blocking[:12])}" + (" ..." if len(blocking) > 12 else ""), markup=False)
    mem = report["memory"]
    if mem:
        console.print(f"Memory: weights {mem['weights_gib']:.1f} GiB, KV cache {mem['kv_cache_gib_per_sequence']:.1f} GiB per {mem['context']}-token sequence (assuming {mem['assumed_gpu_gib']} GiB GPUs)", markup=False)
    for f in report.get("code_findings", []):
        where = f"{f['file']}:{f['line']}" if f.get("file") and f.get("line") else (f.get("file") or "")
        console.print(f"{f['code']} {where} {f['message']}", style="yellow", markup=False)
    for line in report.get("missing_code", []):
        console.print(f"Code not analysed: {line}", style="magenta", markup=False)
    serve = report.get("serve") or {}
    if report["serve_command"]:
        if serve.get("implementation") == "native":
            console.print(Text("Run it with vLLM's native implementation:", style="bold"))
        else:
            console.print(Text("Run it:", style="bold"))
        console.print(f"  {report['serve_command']}", style="bold cyan", markup=False, soft_wrap=True)
        if serve.get("note"):
            console.print(Text(serve["note"], style="yellow"))
    else:
        console.print(Text(f"No vllm serve command: {serve.get('note') or NO_COMMAND}", style="red"))
