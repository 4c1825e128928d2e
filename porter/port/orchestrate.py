"""``port(src, out)``: decide, rewrite, write, prove, re-scan.

1. Resolve the source (a local folder or a Hub id, as ``scan`` does) and refuse what no rewrite
   can fix: layers that are not softmax attention (linear attention, SSM, convolutions: vLLM's
   transformers backend serves only layers that dispatch through the attention interface),
   encoder-decoder models, MXFP4 checkpoints, and code the static analysis flags as unsafe
   at import time.
2. A model without remote code is a native transformers model: nothing to port, nothing written.
3. Otherwise apply every codemod (``codemods``), and when nothing changed say so (write nothing).
4. Write the output folder: the ported ``.py`` files, ``config.json`` (``auto_map`` naming the
   ported classes, ``AutoModel`` included), the other files of the source folder (tokenizer,
   generation config), the checkpoint converted tensor by tensor when the source has
   safetensors, ``port.diff`` (unified diff of every changed file) and ``PORT.md``.
5. Prove it (``equivalence``: same logits on random weights, and on the real ones when there
   are any) and re-scan the output with ``--trust-remote-code`` (sandboxed), listing each
   check that was not passing before next to its status now.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 2
STATUS_RANK = {"fail": 4, "warn": 3, "inconclusive": 2, "info": 1, "pass": 0}
WEIGHT_SUFFIXES = (".safetensors",)
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
NOT_SOFTMAX_WHY = ("vLLM's transformers backend serves a decoder layer only through the attention interface "
                   "(one softmax-attention module with a layer_idx per layer); no rewrite turns these layers into that")
UNSAFE = ("HFC820", "HFC821", "HFC822", "HFC823", "HFC824", "HFC825")


class PortError(Exception):
    """hfcheck could not run (bad reference, unusable output folder): exit 2, one line."""


@dataclass
class PortResult:
    status: str  # "ported" | "nothing_to_port" | "refused" | "failed"
    message: str
    src: str
    out: str | None
    model: dict[str, Any] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)
    not_ported: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, Any] | None = None
    proof: dict[str, Any] | None = None
    rescan: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    serve: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        if self.status in ("ported", "nothing_to_port"):
            return EXIT_OK if (self.serve is None or self.serve.get("ok")) else EXIT_REFUSED
        return EXIT_REFUSED

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["exit_code"] = self.exit_code
        return out


def port(src: str, out: str | os.PathLike | None, *, prove: bool = True, rescan: bool = True, force: bool = False,
         proof_timeout: float = 300.0, shard_bytes: int | None = None) -> PortResult:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.facts import FactsError, collect_facts
    from hfcheck.analyzer.remote import has_remote_code, static_findings
    from hfcheck.analyzer.sources import SourceError, resolve

    t0 = time.perf_counter()
    if importlib.util.find_spec("libcst") is None:
        raise PortError("hfcheck port needs libcst: pip install libcst")
    try:
        source = resolve(src)
    except SourceError as exc:
        raise PortError(str(exc)) from None
    try:
        facts, _ = collect_facts(source.config)
    except FactsError as exc:
        raise PortError(f"{src}: {exc}") from None
    model = {"model_type": facts.model_type, "architectures": facts.architectures, "remote_code": has_remote_code(source)}
    result = PortResult("refused", "", src, str(out) if out is not None else None, model)

    reason = _model_refusal(facts, source, static_findings)
    if reason:
        result.message = reason
        return result
    if not has_remote_code(source):
        from hfcheck.analyzer.analysis import analyse
        from hfcheck.analyzer.report import build_report

        report = build_report(analyse(source))
        result.status = "nothing_to_port"
        result.message = (f"{facts.architectures[0] if facts.architectures else facts.model_type} is a native transformers model "
                          f"(model_type {facts.model_type!r}): its code is transformers' own, so there is nothing to port and nothing was written "
                          f"(hfcheck scan: {report['verdict']}, {report['score']}/100)")
        return result
    if source.missing_code:
        raise PortError(f"{src}: remote code not available: {'; '.join(source.missing_code)}")

    from hfcheck.porter.port.codemods import CODEMODS
    from hfcheck.porter.port.state import PortState, apply_config_edits

    state = PortState(dict(source.code_files), dict(source.config))
    for codemod in CODEMODS:
        codemod().apply(state)
    result.seconds["rewrite"] = round(time.perf_counter() - t0, 2)
    result.not_ported = [r.to_dict() for r in state.refusals]
    changed = {f for f, text in state.files.items() if text != source.code_files.get(f)}
    if not changed and not state.config_edits:
        result.status = "nothing_to_port"
        result.message = ("the remote code already passes every check the porter rewrites; nothing written"
                          + (f" ({len(state.refusals)} finding(s) need a hand-written change: see not_ported)" if state.refusals else ""))
        return result
    if out is None:
        raise PortError("--out DIR is required to write the ported model")
    out_dir = Path(out).expanduser()
    _check_out(out_dir, source, force)

    _, roles = state.roles()
    auto_map = _auto_map(source.config.get("auto_map") or {}, roles)
    if auto_map != source.config.get("auto_map"):
        state.config_edits.append({"op": "set", "key": "auto_map", "value": auto_map})
    defaults = state.config_defaults()
    ported_config = apply_config_edits(source.config, state.config_edits, defaults)
    _attach_fixes(state, source)
    result.changes = [c.to_dict() for c in state.changes]

    # ------------------------------------------------------------------ write
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, text in sorted(state.files.items()):
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(name)
    (out_dir / "config.json").write_text(json.dumps(ported_config, indent=2) + "\n", encoding="utf-8")
    written.append("config.json")
    src_dir = Path(source.location) if source.kind == "local" and source.location else None
    has_weights = False
    if src_dir is not None:
        written += _copy_other_files(src_dir, out_dir, set(state.files))
        from hfcheck.porter.port import weights as W

        files = W.checkpoint_files(src_dir)
        if files:
            has_weights = True
            t1 = time.perf_counter()
            try:
                summary = W.convert_checkpoint(src_dir, out_dir, state.weight_rules, source.config, defaults,
                                               **({"max_shard_bytes": shard_bytes} if shard_bytes else {}))
            except W.ConvertError as exc:
                result.status, result.message = "failed", f"the checkpoint could not be converted: {exc}"
                result.weights = {"error": str(exc)}
                _write_reports(result, state, source, ported_config, out_dir)
                return result
            summary["seconds"] = round(time.perf_counter() - t1, 2)
            result.weights = summary
            written += summary["shards"] + ([W.INDEX_NAME] if len(summary["shards"]) > 1 else [])
        elif any(p.suffix in PICKLE_WEIGHTS for p in src_dir.iterdir() if p.is_file()):
            result.weights = {"note": "the checkpoint is in a pickle format (.bin/.pt): not converted; convert it to safetensors first, then port again"}
    result.files = written + ["port.diff", "PORT.md"]

    # ------------------------------------------------------------------ prove and re-scan
    result.status, result.message = "ported", f"{len(state.changes)} change(s) in {len(changed)} file(s)"
    if prove:
        from hfcheck.analyzer.remote import CodeIndex
        from hfcheck.analyzer.remote.checks import _installed, unguarded_imports
        from hfcheck.porter.port.equivalence import run_equivalence

        original = CodeIndex(dict(source.code_files))
        stubs = sorted({top for f in original.files.values() if f.tree is not None for top in unguarded_imports(f)
                        if top not in ("torch", "transformers") and not _installed(top)})
        t1 = time.perf_counter()
        result.proof = run_equivalence(source, out_dir, state.files, state.weight_rules, state.config_edits, defaults,
                                       real_weights=has_weights, stub_packages=tuple(stubs), timeout=proof_timeout)
        result.seconds["proof"] = round(time.perf_counter() - t1, 2)
        if not result.proof.get("ok"):
            result.status = "failed"
            failed = [c for c in result.proof.get("checks", []) if not c.get("ok")]
            why = result.proof.get("error") or "; ".join(f"{c['name']}: {c.get('detail') or _err(c)}" for c in failed)
            result.message = f"the ported model does not reproduce the original ({why}); the output is kept for inspection"
    if rescan:
        t1 = time.perf_counter()
        result.rescan = _rescan(source, out_dir)
        result.seconds["rescan"] = round(time.perf_counter() - t1, 2)
    result.seconds["total"] = round(time.perf_counter() - t0, 2)
    _write_reports(result, state, source, ported_config, out_dir)
    return result


def _err(check: dict) -> str:
    rel = check.get("max_rel_error")
    return f"max relative error {rel:.2e}" if isinstance(rel, (int, float)) else "mismatch"


# ---------------------------------------------------------------------- decisions


def _model_refusal(facts, source, static_findings) -> str | None:
    from hfcheck.analyzer import vocabulary as V

    bad: dict[str, list[int]] = {}
    for i, kind in enumerate(facts.layer_types):
        if kind not in V.SOFTMAX_LAYER_KINDS:
            bad.setdefault(kind, []).append(i)
    if bad:
        parts = "; ".join(f"{kind}: layer{'s' if len(idx) > 1 else ''} {_ranges(idx)}" for kind, idx in bad.items())
        return f"cannot be ported: {sum(map(len, bad.values()))} of {len(facts.layer_types)} layers are not softmax attention ({parts}): {NOT_SOFTMAX_WHY}"
    if facts.is_encoder_decoder:
        return "cannot be ported: encoder-decoder models are not served by vLLM's transformers backend"
    if facts.quant_method in ("mxfp4", "gpt_oss_mxfp4"):
        return "cannot be ported: vLLM's transformers backend refuses MXFP4 checkpoints; dequantize first"
    findings = static_findings(source) or []
    unsafe = [f for f in findings if f.code in UNSAFE and f.status == "fail"]
    if unsafe:
        f = unsafe[0]
        return f"refused: the code acts at import time ({f.code} {f.file}:{f.line}: {f.message}); review and remove it before porting"
    ssm = [f for f in findings if f.code == "HFC811" and "MambaCache" in f.message]
    if ssm:
        return f"cannot be ported: the code uses MambaCache (recurrent/SSM layers): {NOT_SOFTMAX_WHY}"
    return None


def _ranges(idx: list[int]) -> str:
    out, start, prev = [], None, None
    for i in idx + [None]:
        if start is None:
            start = prev = i
        elif i is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    return ", ".join(out)


def _check_out(out_dir: Path, source, force: bool) -> None:
    if source.location and out_dir.resolve() == Path(source.location).resolve():
        raise PortError("--out must not be the source folder (the original stays untouched)")
    if out_dir.exists() and not out_dir.is_dir():
        raise PortError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not force:
            raise PortError(f"{out_dir}: exists and is not empty (pass --force to replace its contents)")
        for child in out_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def _auto_map(auto_map: dict, roles) -> dict:
    """auto_map naming the ported (local) modules, with the AutoModel entry vLLM resolves."""
    out = {}
    for key, value in auto_map.items():
        out[key] = value.partition("--")[2] if isinstance(value, str) and "--" in value else value
    if "AutoModel" not in out and roles.base_model is not None:
        module = Path(roles.base_model.file).stem
        out["AutoModel"] = f"{module}.{roles.base_model.name}"
    return out


def _attach_fixes(state, source) -> None:
    """Link each change to the original findings it answers (same code and file, and the class
    it names or, for import and Cache-call findings, the API it names)."""
    import re

    from hfcheck.analyzer.remote import code_findings

    for f in code_findings(source):
        named = re.search(r"(?:imports|uses) \.?([\w.]+)", f["message"])
        api = named.group(1).split(".") if named else []
        for change in state.changes:
            if f["code"] != change.code or f["file"] != change.file or f["line"] is None or f["line"] in change.fixes:
                continue
            if change.where in ("imports", "Cache calls"):
                hit = bool(api) and (api[-1] in change.what or (f["code"] == "HFC812" and api[0] in change.what))
            else:
                hit = change.where.split(".")[0] in f["message"]
            if hit:
                change.fixes.append(f["line"])


def _copy_other_files(src_dir: Path, out_dir: Path, code: set[str]) -> list[str]:
    from hfcheck.porter.port.weights import INDEX_NAME

    copied = []
    for path in sorted(src_dir.iterdir()):
        name = path.name
        if (not path.is_file() or name.startswith(".") or name in code or name in ("config.json", INDEX_NAME, "PORT.md", "port.diff")
                or name.endswith(WEIGHT_SUFFIXES) or name.endswith(PICKLE_WEIGHTS)):
            continue
        shutil.copy2(path, out_dir / name)
        copied.append(name)
    return copied


def _rescan(source, out_dir: Path) -> list[dict[str, Any]]:
    """Checks that were not passing on the original, next to their status on the ported model."""
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    def worst(report) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for c in report["checks"]:
            prev = out.get(c["code"])
            if prev is None or STATUS_RANK.get(c["status"], 0) > STATUS_RANK.get(prev[0], 0):
                out[c["code"]] = (c["status"], c["message"])
        return out

    before_report = build_report(analyse(source))
    before = worst(before_report)
    after_report = build_report(analyse(resolve(str(out_dir)), trust_remote_code=True))
    after = worst(after_report)
    rows = []
    for code in sorted(set(before) | set(after)):
        b, a = before.get(code, ("-", "")), after.get(code, ("-", ""))
        if b[0] in ("fail", "warn", "inconclusive") or (code.startswith("HFC8") and b[0] == "info") or a[0] in ("fail", "warn"):
            rows.append({"code": code, "before": b[0], "after": a[0], "message": a[1] or b[1],
                         "fixed": b[0] in ("fail", "warn", "info", "inconclusive") and a[0] == "pass"})
    rows.append({"code": "verdict", "before": before_report["verdict"], "after": after_report["verdict"], "message": f"score {after_report['score']}/100", "fixed": False})
    return rows


# ---------------------------------------------------------------------- reports


def _diff(source, state, ported_config: dict) -> str:
    chunks = []
    for name in sorted(set(source.code_files) | set(state.files)):
        a, b = source.code_files.get(name, ""), state.files.get(name, "")
        if a != b:
            chunks.extend(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"a/{name}", f"b/{name}"))
    a = json.dumps(source.config, indent=2) + "\n"
    b = json.dumps(ported_config, indent=2) + "\n"
    if a != b:
        chunks.extend(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "a/config.json", "b/config.json"))
    return "".join(chunks)


def _write_reports(result: PortResult, state, source, ported_config: dict, out_dir: Path) -> None:
    (out_dir / "port.diff").write_text(_diff(source, state, ported_config), encoding="utf-8")
    (out_dir / "PORT.md").write_text(render_markdown(result), encoding="utf-8")


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(result: PortResult) -> str:
    from hfcheck import __version__

    try:
        import transformers

        tv = transformers.__version__
    except Exception:  # pragma: no cover
        tv = "?"
    head = {"ported": "ported and proven" if result.proof and result.proof.get("ok") else "ported",
            "failed": "ported, NOT proven", "refused": "refused", "nothing_to_port": "nothing to port"}[result.status]
    lines = [
        f"# Port of `{result.src}`",
        "",
        f"Written by `hfcheck port` (hfcheck {__version__}, transformers {tv}) on {_dt.date.today().isoformat()}. "
        "The original folder is left untouched; `port.diff` holds the unified diff of every changed file.",
        "",
        f"**Result: {head}.** {result.message}",
        "",
        "## Changes",
        "",
        "Each change answers a finding of `hfcheck scan` (its code and, where known, its line in the original).",
        "",
        "| # | check | where | change | why |",
        "|---|-------|-------|--------|-----|",
    ]
    for i, c in enumerate(result.changes, 1):
        where = f"`{c['file']}` `{c['where']}`" + (f" (line {', '.join(map(str, sorted(c['fixes'])))})" if c["fixes"] else "")
        lines.append(f"| {i} | {c['code']} | {where} | {_md(c['what'])} | {_md(c['why'])} |")
    if result.not_ported:
        lines += ["", "## Not ported", "", "Recognised but not rewritten automatically (the model still runs; these need a hand-written change):", ""]
        for r in result.not_ported:
            lines.append(f"- {r['code']} `{r['file']}` `{r['where']}`: {r['reason']}")
    lines += ["", "## Weights", ""]
    w = result.weights
    if not w:
        lines.append("No local checkpoint: only the code and config were ported (convert the weights by porting a folder that holds the safetensors).")
    elif "error" in w:
        lines.append(f"Conversion failed: {w['error']}")
    elif "note" in w:
        lines.append(w["note"])
    else:
        lines.append(f"{w['tensors_in']} tensors read with `safe_open` one at a time, {w['tensors_out']} written to {', '.join(f'`{s}`' for s in w['shards'])} "
                     f"({w['bytes'] / 2**20:.1f} MiB, {w['seconds']} s): {w['renamed']} renamed, {w['split']} split, {w['stacked_groups']} expert group(s) stacked.")
    lines += ["", "## Proof", ""]
    p = result.proof
    if not p:
        lines.append("Not run (`--no-verify`).")
    else:
        lines.append("Original and ported model in a sandboxed subprocess (no network, writes fenced), float32, same seeded random weights "
                     "(converted with the port's weight rules and loaded strictly), same attention backend on both sides.")
        if p.get("shims"):
            lines.append(f"The reference run had v4 stand-ins for APIs the installed transformers removed: {', '.join(p['shims'])}.")
        lines += ["", "| check | max abs error | max rel error | greedy argmax agreement | result |", "|---|---|---|---|---|"]
        for c in p.get("checks", []):
            abs_e = f"{c['max_abs_error']:.2e}" if isinstance(c.get("max_abs_error"), float) else "-"
            rel_e = f"{c['max_rel_error']:.2e}" if isinstance(c.get("max_rel_error"), float) else "-"
            agree = f"{c['argmax_agreement']:.0%}" if isinstance(c.get("argmax_agreement"), float) else "-"
            lines.append(f"| {c['name']} | {abs_e} | {rel_e} | {agree} | {'same' if c['ok'] else _md(c.get('detail') or 'DIFFERENT')} |")
        if p.get("error"):
            lines.append(f"\nError: {p['error']}")
    if result.rescan:
        lines += ["", "## Re-scan", "", "`hfcheck scan` of the original (static) and of the output (`--trust-remote-code`, sandboxed):", "",
                  "| check | before | after | now |", "|---|---|---|---|"]
        for r in result.rescan:
            lines.append(f"| {r['code']} | {r['before']} | {r['after']} | {_md(r['message'])} |")
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in result.files]
    return "\n".join(lines) + "\n"


def render_text(result: PortResult, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    style = {"ported": "bold green", "nothing_to_port": "bold cyan", "refused": "bold red", "failed": "bold red"}[result.status]
    head = Text()
    head.append(result.status.replace("_", " ").upper(), style=style)
    head.append(f"  {result.src}" + (f" -> {result.out}" if result.status in ("ported", "failed") else ""))
    console.print(head)
    console.print(result.message, markup=False)
    if result.changes:
        table = Table(title="Changes", title_justify="left", expand=True)
        table.add_column("check", no_wrap=True)
        table.add_column("where", ratio=2)
        table.add_column("change", ratio=4)
        for c in result.changes:
            table.add_row(c["code"], f"{c['file']} {c['where']}", c["what"])
        console.print(table)
    for r in result.not_ported:
        console.print(Text(f"not ported: {r['code']} {r['file']} {r['where']}: {r['reason']}", style="yellow"))
    w = result.weights
    if w and "tensors_in" in w:
        console.print(f"weights: {w['tensors_in']} -> {w['tensors_out']} tensors in {', '.join(w['shards'])} ({w['renamed']} renamed, {w['split']} split, {w['stacked_groups']} expert groups stacked, {w['seconds']} s)", markup=False)
    elif w:
        console.print(f"weights: {w.get('note') or w.get('error')}", markup=False)
    if result.proof:
        table = Table(title="Proof (original vs ported, float32, sandboxed)", title_justify="left", expand=True)
        table.add_column("", width=1)
        table.add_column("check", ratio=3)
        table.add_column("max rel error", justify="right")
        table.add_column("argmax", justify="right")
        for c in result.proof.get("checks", []):
            mark = Text("✓", style="green") if c["ok"] else Text("✗", style="red")
            rel = f"{c['max_rel_error']:.1e}" if isinstance(c.get("max_rel_error"), float) else (c.get("detail") or "-")
            agree = f"{c['argmax_agreement']:.0%}" if isinstance(c.get("argmax_agreement"), float) else "-"
            table.add_row(mark, c["name"], rel, agree)
        console.print(table)
        if result.proof.get("error"):
            console.print(Text(f"proof error: {result.proof['error']}", style="red"))
    if result.rescan:
        table = Table(title="Re-scan (before: original; after: ported, --trust-remote-code)", title_justify="left", expand=True)
        table.add_column("check", no_wrap=True)
        table.add_column("before", no_wrap=True)
        table.add_column("after", no_wrap=True)
        table.add_column("now", ratio=4)
        colors = {"pass": "green", "fail": "red", "warn": "yellow", "info": "dim"}
        for r in result.rescan:
            table.add_row(r["code"], Text(r["before"], style=colors.get(r["before"], "")), Text(r["after"], style=colors.get(r["after"], "")), Text(r["message"]))
        console.print(table)
    if result.files:
        console.print(f"wrote {len(result.files)} files to {result.out} (PORT.md, port.diff)", markup=False)
