"""A port result as PORT.md (written next to the model) and as terminal text.

Both say, in this order: the result and the path taken (retarget, rewrite, refused), how vLLM
serves the output (or what stops it), where the original's behaviour came from (its own
transformers release), what was mapped or changed, the weights, the proof, and the files.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from hfcheck.analyzer.instance.shrink import first, head_counts
from hfcheck.shared.version import __version__

PATH_WORDS = {"retarget": "retarget to a native transformers class", "rewrite": "rewrite of the remote code in place",
              "refused": "refused", "none": "none"}


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(value: Any, fmt: str = ".2e") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _mib(value: Any) -> str:
    return f"{value / 2**20:.0f} MiB" if isinstance(value, (int, float)) and value else "-"


def head_word(result) -> str:
    return {"ported": "ported and proven" if result.proof and result.proof.get("ok") else "ported",
            "failed": "ported, NOT proven", "refused": "refused", "nothing_to_port": "nothing to port",
            "served_natively": "served natively by vLLM"}[result.status]


def render_markdown(result) -> str:
    try:
        import transformers

        tv = transformers.__version__
    except Exception:  # noqa: BLE001 - pragma: no cover
        tv = "?"
    lines = [
        f"# Port of `{result.src}`", "",
        f"Written by `hfcheck port` (hfcheck {__version__}, transformers {tv}) on {_dt.date.today().isoformat()}. "
        "The original folder is left untouched; `port.diff` holds the unified diff of every changed file.", "",
        f"**Result: {head_word(result)}.** {result.message}", "",
        f"**Path taken:** {PATH_WORDS.get(result.path, result.path)}.", "",
    ]
    lines += _served_md(result)
    lines += _reference_md(result)
    if result.retarget:
        lines += _retarget_md(result)
    if result.path == "rewrite":
        lines += _changes_md(result)
    lines += _weights_md(result)
    lines += _proof_md(result)
    if result.rescan:
        lines += ["## Re-scan", "", "`hfcheck scan` of the original (static) and of the output (`--trust-remote-code`, sandboxed):", "",
                  "| check | before | after | now |", "|---|---|---|---|"]
        lines += [f"| {r['code']} | {r['before']} | {r['after']} | {_md(r['message'])} |" for r in result.rescan]
        lines.append("")
    lines += _lint_md(result)
    lines += ["## Files", ""] + [f"- `{f}`" for f in result.files]
    return "\n".join(lines) + "\n"


def _lint_md(result) -> list[str]:
    """transformers-mlinter on both sides: what the port added (nothing, or a porter defect),
    what the original already had, rule by rule, marked where it matters to vLLM or loading."""
    lint = result.lint
    if not lint:
        return []
    lines = ["## transformers' model linter", ""]
    if lint.get("error"):
        return lines + [f"`transformers-mlinter` did not run: {_md(lint['error'])}.", ""]
    ported = "the ported files" if result.path == "rewrite" else "no model code (a native class)"
    lines.append(f"`transformers-mlinter` {lint.get('version')} on the original's files and on {ported}.")
    introduced = lint.get("introduced") or []
    if introduced:
        lines += ["", f"**The port added {len(introduced)} finding(s)** (a porter defect; please report it):", ""]
        lines += [f"- `{f['file']}:{f['line']}` {f['rule']}: {_md(f['message'])}" for f in introduced]
    elif result.path == "rewrite":
        lines.append(" The port adds no finding.")
    fixed = lint.get("fixed") or []
    if fixed and result.path == "rewrite":
        lines += ["", f"The port removes {len(fixed)} of the original's findings: "
                  + ", ".join(sorted({f['rule'] for f in fixed})) + "."]
    original = lint.get("original") or []
    lines.append("")
    if not original:
        return lines + ["The original has no finding.", ""]
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for f in original:
        by_rule.setdefault(f["rule"], []).append(f)
    lines += [f"The original already has {len(original)} finding(s) under {len(by_rule)} rule(s) "
              "(`mlinter --rule TRFxxx` explains each); **bold**: matters to vLLM or to loading:", "",
              "| rule | findings | first at | matters because |", "|---|---|---|---|"]
    for rule in sorted(by_rule, key=lambda r: (not by_rule[r][0].get("matters"), r)):
        found = by_rule[rule]
        why = found[0].get("matters")
        name = f"**{rule}**" if why else rule
        lines.append(f"| {name} | {len(found)} | `{found[0]['file']}:{found[0]['line']}` {_md(found[0]['message'][:120])} | {_md(why or '')} |")
    return lines + [""]


def _served_md(result) -> list[str]:
    s = result.served
    if not s:
        return []
    lines = ["## How vLLM serves it", "", s["summary"] + ".", ""]
    if s.get("command"):
        lines += ["```", s["command"], "```", ""]
    return lines


def _reference_md(result) -> list[str]:
    r = result.reference
    if not r:
        return []
    v = r.get("versions") or {}
    lines = ["## The original, where it was written", "",
             f"The original remote code ran unmodified in transformers {r['transformers']} ({r['why']}), torch {v.get('torch', '?')}"
             + (f", with {', '.join(r['packages'])}" if r["packages"] else "") + f", in a fenced subprocess (environment `{r['environment']}`"
             + (f", built in {r['built_seconds']} s" if r.get("built_seconds") else ", cached") + ").",
             f"It was built at a shrunk size with seeded random float32 weights: {_shrunk(r.get('tiny_config') or {})}. "
             f"That run took {r['run_seconds']} s at a peak of {_mib(r['peak_rss_bytes'])} resident.", ""]
    shims = r.get("gpu_shims")
    if shims:
        lines += ["The original constructs only on a GPU machine as written, so it ran with CPU stand-ins that keep its function "
                  "(a stand-in that is called fails the run, naming it; none was):", ""]
        lines += [f"- `{name}`: a stub module (CUDA-only package, not installable on a CPU); every callable in it raises when called"
                  for name in shims.get("stubbed") or []]
        lines += [f"- `.cuda()` at `{site}`: left the tensor on the CPU" for site in shims.get("cuda_calls") or []]
        lines += [f"- `{flag}: false` in its config: the flag selects a flash-attention kernel that needs CUDA and half precision; "
                  "the code's own attention path computes the same (exact) softmax attention" for flag in r.get("switched_off") or []]
        lines.append("")
    if r.get("one_sequence"):
        lines += [f"It fails on a batch of two sequences without an attention mask ({r['one_sequence']}), so every comparison "
                  "ran on one sequence, the way vLLM hands a model its tokens.", ""]
    if r.get("not_installed"):
        lines += [f"Not installed there (CUDA-only, guarded in the code): {', '.join(r['not_installed'])}.", ""]
    if r.get("tried"):
        lines += ["Releases tried first: " + "; ".join(r["tried"]) + ".", ""]
    if r.get("generate_error"):
        lines += [f"The original's own `generate` failed there ({r['generate_error']}); greedy decoding was not compared.", ""]
    return lines


def _shrunk(cfg: dict[str, Any]) -> str:
    heads, kv = head_counts(cfg)
    return (f"{first(cfg, 'layers')} layers, hidden {first(cfg, 'hidden')}, {heads} heads ({kv} key/value), "
            f"head dim {first(cfg, 'head_dim') or '-'}, MLP {first(cfg, 'intermediate') or '-'}, vocabulary {first(cfg, 'vocab')}")


def _retarget_md(result) -> list[str]:
    rt = result.retarget
    lines = ["## Retarget", ""]
    if rt.get("skipped"):
        lines += [f"Not searched ({rt['skipped']}): the remote code is rewritten in place.", ""]
    elif rt.get("target"):
        lines += [f"Target: transformers' `{rt['target']}` (model_type `{rt['model_type']}`), chosen because its logits equal the "
                  "original's on the reference run's weights (see Proof) and vLLM serves it.", "",
                  "| reading | chosen |", "|---|---|"]
        lines += [f"| {_md(k)} | {_md(v)} |" for k, v in (rt.get("choices") or {}).items()]
        lines.append("")
        if rt.get("notes"):
            lines += ["Where the functions differ (the proof covers ordinary inputs; these do not):", ""]
            lines += [f"- {n}" for n in rt["notes"]] + [""]
        else:
            lines += ["No input is known where the functions differ.", ""]
        if rt.get("native_config"):
            lines += ["Native `config.json`:", "", "```json", json.dumps(rt["native_config"], indent=1), "```", ""]
    else:
        lines += ["No native transformers class that vLLM serves reproduces the original.", ""]
    if rt.get("anatomy"):
        lines += ["The original's anatomy, as its reference run shows it (at the shrunk size):", ""] + [f"- {_md(a)}" for a in rt["anatomy"]] + [""]
    if rt.get("not_fitting"):
        lines += ["Targets that do not fit:", ""] + [f"- {_md(n)}" for n in rt["not_fitting"]] + [""]
    if rt.get("attempts"):
        lines += [f"Readings tried ({len(rt['attempts'])}, {rt.get('search_seconds', '-')} s):", "",
                  "| # | target | readings | max rel error | result |", "|---|---|---|---|---|"]
        for i, a in enumerate(rt["attempts"], 1):
            readings = "; ".join(f"{k}: {v}" for k, v in a["choices"].items() if k != "target")
            lines.append(f"| {i} | {a['target']} | {_md(readings)} | {_num(a.get('max_rel_error'), '.1e')} | "
                         f"{'equal' if a['ok'] and not a.get('detail') else _md(a.get('detail') or 'different')} |")
        lines.append("")
    return lines


def _changes_md(result) -> list[str]:
    lines = ["## Changes", "", "Each change answers a finding of `hfcheck scan` (its code and, where known, its line in the original).", "",
             "| # | check | where | change | why |", "|---|-------|-------|--------|-----|"]
    for i, c in enumerate(result.changes, 1):
        where = f"`{c['file']}` `{c['where']}`" + (f" (line {', '.join(map(str, sorted(c['fixes'])))})" if c["fixes"] else "")
        lines.append(f"| {i} | {c['code']} | {where} | {_md(c['what'])} | {_md(c['why'])} |")
    lines.append("")
    if result.not_ported:
        lines += ["## Not ported", "", "Recognised but not rewritten automatically:", ""]
        lines += [f"- {r['code']} `{r['file']}` `{r['where']}`: {r['reason']}" for r in result.not_ported] + [""]
    return lines


def _weights_md(result) -> list[str]:
    lines = ["## Weights", ""]
    if result.quantized:
        lines += [result.quantized[0].upper() + result.quantized[1:] + ".", ""]
    w = result.weights
    if not w:
        lines.append("No local checkpoint: the config (and code) were ported"
                     + ("; `weight_plan.json` says how each native tensor is made from the original's, for converting a checkpoint later."
                        if result.path == "retarget" else "."))
    elif "error" in w:
        lines.append(f"Conversion failed: {w['error']}")
    elif "note" in w:
        lines.append(w["note"])
    elif "format" in w:
        lines.append(f"{w['tensors_in']} {w['format']} tensors read one at a time, {w['tensors_out']} written to "
                     f"{', '.join(f'`{s}`' for s in w['shards'])} ({w['bytes'] / 2**20:.1f} MiB) with the proven plan (`weight_plan.json`)"
                     + (f"; not used by the native class: {', '.join(w['unused'][:8])}" if w.get("unused") else "") + ".")
    else:
        lines.append(f"{w['tensors_in']} tensors read with `safe_open` one at a time, {w['tensors_out']} written to {', '.join(f'`{s}`' for s in w['shards'])} "
                     f"({w['bytes'] / 2**20:.1f} MiB, {w.get('seconds', '-')} s): {w['renamed']} renamed, {w['split']} split, {w['stacked_groups']} expert group(s) stacked.")
    return lines + [""]


def _proof_md(result) -> list[str]:
    p = result.proof
    lines = ["## Proof", ""]
    if not p:
        return lines + ["Not run." if result.status != "refused" else "Nothing to prove: the port was refused.", ""]
    lines.append("The original's logits come from its reference run (its own transformers release, fenced subprocess); the output model "
                 "runs in the current transformers on the same seeded random weights, converted and loaded strictly, on the same token ids, float32. "
                 "Equal means max |a - b| / max |a| <= 1e-4 and the same greedy token at every position.")
    lines += ["", "| check | max abs error | max rel error | greedy argmax agreement | result |", "|---|---|---|---|---|"]
    for c in p.get("checks", []):
        agree = f"{c['argmax_agreement']:.0%}" if isinstance(c.get("argmax_agreement"), float) else "-"
        lines.append(f"| {c['name']} | {_num(c.get('max_abs_error'))} | {_num(c.get('max_rel_error'))} | {agree} | "
                     f"{_md(c['detail']) if c.get('skipped') else 'same' if c['ok'] else _md(c.get('detail') or 'DIFFERENT')} |")
    if p.get("error"):
        lines.append(f"\nError: {p['error']}")
    return lines + [""]


def render_text(result, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    style = {"ported": "bold green", "nothing_to_port": "bold cyan", "served_natively": "bold cyan", "refused": "bold red", "failed": "bold red"}[result.status]
    head = Text()
    head.append(result.status.replace("_", " ").upper(), style=style)
    head.append(f"  {result.src}" + (f" -> {result.out}" if result.status in ("ported", "failed") else ""))
    head.append(f"  (path: {result.path})", style="dim")
    console.print(head)
    console.print(result.message, markup=False)
    r = result.reference
    if r:
        console.print(f"original: transformers {r['transformers']} ({r['why']}), {r['run_seconds']} s, peak {_mib(r['peak_rss_bytes'])}", markup=False)
    rt = result.retarget or {}
    if rt.get("target"):
        console.print("readings: " + "; ".join(f"{k}: {v}" for k, v in (rt.get("choices") or {}).items() if k != "target"), markup=False)
        for note in rt.get("notes") or []:
            console.print(Text(f"differs: {note}", style="yellow"))
    if result.changes:
        table = Table(title="Changes", title_justify="left", expand=True)
        table.add_column("check", no_wrap=True, min_width=6)
        table.add_column("where", ratio=2, overflow="fold")
        table.add_column("change", ratio=4, overflow="fold")
        for c in result.changes:
            table.add_row(c["code"], f"{c['file']} {c['where']}", c["what"])
        console.print(table)
    for n in result.not_ported:
        console.print(Text(f"not ported: {n['code']} {n['file']} {n['where']}: {n['reason']}", style="yellow"))
    w = result.weights
    if w and "tensors_in" in w:
        console.print(f"weights: {w['tensors_in']} -> {w['tensors_out']} tensors in {', '.join(w['shards'])}", markup=False)
    elif w:
        console.print(f"weights: {w.get('note') or w.get('error')}", markup=False)
    if result.proof:
        table = Table(title="Proof (original in its own release vs output, float32)", title_justify="left", expand=True)
        # the numbers stay on one line; a check's name and any detail wrap in the wide column (80
        # columns or a pipe: nothing is cut to an ellipsis)
        table.add_column("", width=1)
        table.add_column("check", ratio=1, overflow="fold")
        table.add_column("max rel error", justify="right", no_wrap=True)
        table.add_column("argmax", justify="right", no_wrap=True)
        for c in result.proof.get("checks", []):
            mark = Text("✓", style="green") if c["ok"] else Text("✗", style="red")
            numeric = isinstance(c.get("max_rel_error"), float)
            rel = f"{c['max_rel_error']:.1e}" if numeric else "-"
            agree = f"{c['argmax_agreement']:.0%}" if isinstance(c.get("argmax_agreement"), float) else "-"
            name = Text(c["name"])
            if not numeric and c.get("detail"):
                name.append(f"\n{c['detail']}", style="dim")
            table.add_row(mark, name, rel, agree)
        console.print(table)
        if result.proof.get("error"):
            console.print(Text(f"proof error: {result.proof['error']}", style="red"))
    if result.rescan:
        table = Table(title="Re-scan (before: original; after: ported, --trust-remote-code)", title_justify="left", expand=True)
        for col in ("check", "before", "after"):
            table.add_column(col, no_wrap=True, min_width=len(col))
        table.add_column("now", ratio=4, overflow="fold")
        colors = {"pass": "green", "fail": "red", "warn": "yellow", "info": "dim"}
        for row in result.rescan:
            table.add_row(row["code"], Text(row["before"], style=colors.get(row["before"], "")), Text(row["after"], style=colors.get(row["after"], "")), Text(row["message"]))
        console.print(table)
    s = result.served
    if s:
        console.print(Text(s["summary"], style="bold"))
        if s.get("command"):
            console.print(f"Run it:\n  {s['command']}", markup=False)
    if result.files:
        console.print(f"wrote {len(result.files)} files to {result.out} (PORT.md, port.diff)", markup=False)
