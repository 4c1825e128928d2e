"""``port(src, out)``: establish the original, then retarget, rewrite or refuse; prove; re-scan.

1. Resolve the source (a local folder or a Hub id, as ``scan`` does) and refuse what no port
   can fix: layers that are not softmax attention (linear attention, SSM, convolutions: vLLM's
   transformers backend serves only layers that dispatch through the attention interface),
   encoder-decoder models, MXFP4 checkpoints, and code the static analysis flags as unsafe at
   import time. A model without remote code is native: nothing to port, nothing written.
2. Establish the original's behaviour where it was written (``porter.reference``): the
   transformers release it declares, in a cached environment, at a shrunk size, with seeded
   random weights. The original is never patched to run; if it does not run there, the port
   stops and says where (file:line).
3. Retarget (``retarget.stage``): when a native transformers class reproduces the original's
   logits and vLLM serves that class, write a native model folder (no remote code left).
4. Otherwise rewrite in place (``codemods``), unless the original computes something vLLM's
   transformers backend cannot keep (ALiBi: refused, naming the construct at file:line).
   The rewrite is proven against the same reference run (``equivalence``).
5. Every result says the path it took and ends with how vLLM serves the output (a re-scan) or
   the blocker that stopped it; PORT.md and port.diff are written next to the model.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfcheck.analyzer.facts import collect_facts
from hfcheck.analyzer.facts.errors import FactsError
from hfcheck.analyzer.remote import has_remote_code
from hfcheck.analyzer.remote.checks import code_findings, static_findings
from hfcheck.analyzer.remote.roles import base_of_head
from hfcheck.analyzer.sources import SourceError, resolve
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.porter.output import weights as W
from hfcheck.porter.output.lint import lint_port
from hfcheck.porter.output.render import render_markdown
from hfcheck.porter.output.served import Served, how_served
from hfcheck.porter.output.weights import INDEX_NAME
from hfcheck.porter.reference.establish import Reference, ReferenceError, establish
from hfcheck.porter.reference.realweights import prove_real_weights
from hfcheck.porter.retarget.anatomy import AnatomyError
from hfcheck.porter.retarget.stage import (
    ExtraChecks,
    NativeFolder,
    extra_checks,
    find_retarget,
    full_native_config,
    write_native_folder,
)
from hfcheck.porter.rewrite.equivalence import prove_rewrite
from hfcheck.porter.rewrite.state import PortState, apply_config_edits
from hfcheck.porter.stages import (
    NativeCheck,
    PortedCode,
    PortResult,
    PortStages,
    ProofStage,
    ReferenceStage,
    Refusal,
    RetargetStage,
    RewriteStage,
    SearchStage,
    ServedStage,
    Verdict,
    WriteStage,
    assemble,
)
from hfcheck.shared.environments import EnvError

if TYPE_CHECKING:
    from hfcheck.analyzer.facts import ModelFacts
    from hfcheck.analyzer.sources import ModelSource
    from hfcheck.porter.retarget.stage import RetargetOutcome
    from hfcheck.porter.retarget.targets import Hypothesis
    from hfcheck.porter.rewrite.state import PortState

STATUS_RANK = {"fail": 4, "warn": 3, "inconclusive": 2, "info": 1, "pass": 0}
WEIGHT_SUFFIXES = (".safetensors",)
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
NOT_SOFTMAX_WHY = ("vLLM's transformers backend serves a decoder layer only through the attention interface "
                   "(one softmax-attention module with a layer_idx per layer); no rewrite turns these layers into that")
ALIBI_WHY = ("vLLM's transformers backend creates each attention layer with only heads, scale, head size, kv heads, softcap, "
             "sliding window and sinks (vllm/model_executor/models/transformers/base.py, _create_attention_instances, 0.32 and 0.33): "
             "no ALiBi slopes, and the attention interface ignores the additive mask the model builds, so the bias would be dropped")
UNSAFE = ("HFC820", "HFC821", "HFC822", "HFC823", "HFC824", "HFC825")


class PortError(Exception):
    """hfcheck could not run (bad reference, unusable output folder): exit 2, one line."""


@dataclass(frozen=True)
class PortOptions:
    """``port``'s keyword arguments, as the stages receive them: how far to go and how long to wait."""

    prove: bool = True
    rescan: bool = True
    force: bool = False
    proof_timeout: float = 300.0
    shard_bytes: int | None = None
    reference_transformers: str | None = None
    path: str = "auto"
    log: Callable[[str], None] | None = None


def port(src: str, out: str | os.PathLike | None, *, prove: bool = True, rescan: bool = True, force: bool = False,
         proof_timeout: float = 300.0, shard_bytes: int | None = None, reference_transformers: str | None = None,
         path: str = "auto", log: Callable[[str], None] | None = None) -> PortResult:
    """Port ``src`` into ``out`` by the steps the module docstring lists; PortError when hfcheck itself cannot run."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    options = PortOptions(prove, rescan, force, proof_timeout, shard_bytes, reference_transformers, path, log)

    t0 = time.perf_counter()
    source, facts = _open_source(src)
    model = {"model_type": facts.model_type, "architectures": facts.architectures, "remote_code": has_remote_code(source)}
    begun = PortStages(src, str(out) if out is not None else None, model, Verdict("refused", ""), source_config=dict(source.config))
    if out is not None:  # the proofs run in children with other working directories: the folder by its full path
        out = Path(out).expanduser().resolve()

    # ------------------------------------------------------------------ refuse early, or native
    reason = _model_refusal(facts, source, static_findings)  # called here, not in a helper: a defect is named by the porter function it surfaced in (porter/cli.py)
    if reason:
        return assemble(replace(begun, verdict=Verdict("refused", reason), path="refused"))
    if not has_remote_code(source):
        return assemble(replace(begun, verdict=Verdict("nothing_to_port", _native_transformers_message(facts, source))))
    native = _native_check(facts, source)
    begun = replace(begun, native=native)
    if native.fits and options.path == "auto":
        return assemble(replace(begun, verdict=_served_as_it_is(src, native), path="native"))
    out_dir = _output_folder(src, source, out, options.force)

    # ------------------------------------------------------------------ reference run
    ran = _run_the_original(src, source, t0, options)
    if ran.reference is None or ran.refusal is not None:
        return assemble(replace(begun, verdict=Verdict("refused", ran.refusal or ""), path="refused", reference=ran))
    reference = ran.reference
    begun = replace(begun, reference=ran)

    # ------------------------------------------------------------------ retarget
    searched = _search_retarget(reference, options.path)
    begun = replace(begun, search=searched)
    outcome = searched.outcome
    if outcome is not None and outcome.found is not None:
        retargeted = _port_by_retarget(outcome, reference, source, out_dir, options)
        ended = replace(begun, verdict=retargeted.verdict, path="retarget", retarget=retargeted, total=round(time.perf_counter() - t0, 2))
        return _write_reports(ended, None, source, None, out_dir)

    # ------------------------------------------------------------------ rewrite, or refuse
    bias = position_bias(reference, source)
    if bias:
        refusal = _refuse_alibi(bias, reference, source, outcome)
        return assemble(replace(begun, verdict=Verdict("refused", refusal.message), path="refused", refusal=refusal,
                                total=round(time.perf_counter() - t0, 2)))
    return _port_by_rewrite(begun, reference, source, out_dir, options, t0)


def _open_source(src: str) -> tuple[ModelSource, ModelFacts]:
    """The model and its config's facts, or PortError's one line: nothing can be decided without them."""

    if importlib.util.find_spec("libcst") is None:
        raise PortError("hfcheck port needs libcst: pip install libcst")
    try:
        source = resolve(src)
    except SourceError as exc:
        raise PortError(str(exc)) from None
    try:
        facts, _ = collect_facts(source.config, source.code_files)
    except FactsError as exc:
        raise PortError(f"{src}: {exc}") from None
    return source, facts


def _native_transformers_message(facts: ModelFacts, source: ModelSource) -> str:
    """Why a model without remote code has nothing to port, with its scan verdict: the user learns where it stands."""
    from hfcheck.analyzer.scan import scan

    report = scan(source).report
    return (f"{facts.architectures[0] if facts.architectures else facts.model_type} is a native transformers model "
            f"(model_type {facts.model_type!r}): its code is transformers' own, so there is nothing to port and nothing was written "
            f"(hfcheck scan: {report['verdict']}, {report['score']}/100)")


def _native_check(facts: ModelFacts, source: ModelSource) -> NativeCheck:
    """Whether vLLM's native class fits the model (recorded in the result's model facts)."""
    native = served_natively(facts)
    return NativeCheck() if native is None else NativeCheck(*native)


def _served_as_it_is(src: str, native: NativeCheck) -> Verdict:
    """The answer of an --path auto port of a model vLLM's native class fits: nothing to write."""
    return Verdict("served_natively", f"{native.why}: `vllm serve {src} --trust-remote-code` runs it as it is, so nothing was ported or written; "
                   "--path backend ports it for the transformers backend anyway (--path rewrite: in place)")


def _output_folder(src: str, source: ModelSource, out: Path | None, force: bool) -> Path:
    """The folder the port writes, emptied with --force, once the remote code is known to be whole and parsable."""
    if source.missing_code:
        raise PortError(f"{src}: remote code not available: {'; '.join(source.missing_code)}")
    broken = _unparsable(source)
    if broken:
        raise PortError(f"{src}: {broken}")
    if out is None:
        raise PortError("--out DIR is required to write the ported model")
    out_dir = Path(out).expanduser()
    _check_out(out_dir, source, force)
    return out_dir


def _run_the_original(src: str, source: ModelSource, t0: float, options: PortOptions) -> ReferenceStage:
    """The original's run in its own release, what every proof compares against; a refusal when there is none."""
    try:
        reference = establish(source, override=options.reference_transformers, timeout=options.proof_timeout, log=options.log)
    except EnvError as exc:
        raise PortError(f"{src}: the reference environment cannot be built: {exc}") from None
    except ReferenceError as exc:
        return ReferenceStage(None, refusal=f"refused: {exc}")
    summary, seconds = reference_summary(reference), round(time.perf_counter() - t0, 2)
    run = reference.run
    if not run.ok:
        where = run.error_at
        at = f" ({where['file']}:{where['line']}: `{where['code']}`)" if where else ""
        return ReferenceStage(reference, summary, seconds,
                              f"refused: the original does not run in its own release (transformers {reference.env.spec.transformers}, "
                              f"{reference.version_reason}): {run.error}{at}; nothing can be proven against it")
    return ReferenceStage(reference, summary, seconds)


def _search_retarget(reference: Reference, path: str) -> SearchStage:
    """Look for a native class that reproduces the original (not for --path rewrite), timed and recorded either way."""

    t1 = time.perf_counter()
    outcome = find_retarget(reference) if path in ("auto", "backend") else None
    seconds = round(time.perf_counter() - t1, 2)
    return SearchStage(outcome, outcome.to_dict() if outcome is not None else {"skipped": "--path rewrite"}, seconds)


def _refuse_alibi(bias: dict[str, Any], reference: Reference, source: ModelSource, outcome: RetargetOutcome | None) -> Refusal:
    """Refuse an ALiBi model, naming the bias's call site and where the recorded dataflow sees it reach the scores."""
    from hfcheck.porter.rewrite.dataflow import CoreRefusal, plans

    equal = [s for s in outcome.search.skipped if "computes the same function" in s] if outcome is not None else []
    message = (f"refused: ALiBi position bias at {bias['file']}:{bias['line']} (`{bias['code']}`): {ALIBI_WHY}"
               + (f". {equal[0]}" if equal else ""))
    not_ported = [{"code": "ALiBi", "file": bias["file"], "where": f"line {bias['line']}", "reason": ALIBI_WHY}]
    for found in plans(reference.run.result, reference.run.tensors, source.code_files, reference.input_ids, reference.tiny_config):
        if isinstance(found, CoreRefusal):  # where the recorded dataflow sees the bias reach the scores
            not_ported.append({"code": found.code, "file": found.file, "where": f"line {found.line}", "reason": found.reason})
    return Refusal(message, not_ported)


def reference_summary(reference) -> dict[str, Any]:
    run = reference.run
    return {
        "transformers": reference.env.spec.transformers,
        "why": reference.version_reason,
        "packages": list(reference.packages),
        "not_installed": reference.not_installed,
        "environment": str(reference.env.path),
        "built_seconds": reference.env.built_seconds,
        "versions": reference.env.versions,
        "run_seconds": run.seconds,
        "peak_rss_bytes": run.peak_rss_bytes,
        "tiny_config": reference.tiny_config,
        "error": run.error,
        "error_at": run.error_at,
        "generate_error": run.result.get("generate_error"),
        "tried": reference.tried,
        "gpu_shims": run.result.get("gpu_shims") if reference.gpu_shims else None,
        "switched_off": reference.switched_off,
        "one_sequence": reference.one_sequence,
    }


def _unparsable(source) -> str | None:
    for name, text in source.code_files.items():
        if not name.endswith(".py"):
            continue
        try:
            ast.parse(text, filename=name)
        except SyntaxError as exc:
            return f"{name}:{exc.lineno}: the remote code does not parse ({exc.msg})"
        except (ValueError, RecursionError) as exc:
            return f"{name}: the remote code does not parse ({type(exc).__name__})"
    return None


def position_bias(reference, source) -> dict[str, Any] | None:
    """Where the original's forward pass builds an ALiBi bias: a function named for ALiBi whose
    body ran (``build_alibi_bias``, ``_gen_alibi_mask``...), named at its executed call site
    (else at its definition). Code that only tests for ALiBi (``if alibi is None``) with it
    switched off does not count: its bias function never runs."""

    executed = reference.run.result.get("executed_lines") or {}
    found = []
    for name, lines in executed.items():
        text = source.code_files.get(name)
        if text is None:
            continue
        ran = set(lines)
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "alibi" in node.name.lower():
                body = set(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
                if body & ran:
                    found.append((node.name, name, node.lineno))
    if not found:
        return None
    rows_of = {name: source.code_files[name].splitlines() for _, name, _ in found}
    calls = []
    for fname, _, _ in found:
        for name, lines in executed.items():
            rows = source.code_files.get(name, "").splitlines()
            for line in lines:
                if 0 < line <= len(rows) and re.search(rf"\b{re.escape(fname)}\(", rows[line - 1]) and not rows[line - 1].lstrip().startswith("def "):
                    calls.append((name, line, rows[line - 1].strip()))
    if calls:
        name, line, code = sorted(calls, key=lambda c: (c[0], c[1]))[0]
    else:
        fname, name, line = found[0]
        code = rows_of[name][line - 1].strip()
    return {"file": name, "line": line, "code": code[:160]}


def _port_by_retarget(outcome: RetargetOutcome, reference: Reference, source: ModelSource, out_dir: Path, options: PortOptions) -> RetargetStage:
    """Write the native folder the search found, prove it (extra checks, real weights) and ask how vLLM serves it."""

    t0 = time.perf_counter()
    assert outcome.found is not None  # called only when the search found a native class
    hyp = outcome.found.hypothesis
    try:
        target = full_native_config(outcome, reference, source.config)
    except AnatomyError as exc:
        return RetargetStage(Verdict("failed", f"{hyp.architecture} reproduces the original at the shrunk size, but its full-size config cannot be written: {exc}"))
    native = target.config
    record = outcome.to_dict()
    record["native_config"] = native
    seconds: dict[str, float] = {}
    extra = extra_checks(outcome, reference) if options.prove else ExtraChecks([], [])
    folder = write_native_folder(outcome, source, out_dir, target, shard_bytes=options.shard_bytes)
    checks = [*outcome.checks, *extra.checks]
    if options.prove and folder.weights and not folder.weights.get("error"):

        t1 = time.perf_counter()
        checks.append(prove_real_weights(reference, source, out_dir, native_config=native))
        seconds["real_weights"] = round(time.perf_counter() - t1, 2)
    record["notes"] = hyp.notes + extra.notes + folder.notes
    proof = {"checks": checks, "ok": all(c["ok"] or c.get("skipped") for c in checks), "reference": "original in its own release"}
    seconds["write"] = round(time.perf_counter() - t0, 2)
    t1 = time.perf_counter()
    served = how_served(out_dir)
    seconds["rescan"] = round(time.perf_counter() - t1, 2)
    verdict = _retarget_verdict(hyp, reference, folder, proof, served)
    return RetargetStage(verdict, record, folder.weights, proof, served.to_dict(), folder.files + ["PORT.md"], seconds)


def _retarget_verdict(hyp: Hypothesis, reference: Reference, folder: NativeFolder, proof: dict[str, Any], served: Served) -> Verdict:
    """Ported when the checkpoint converted and every check held; failed, saying which did not, otherwise."""
    if folder.weights and folder.weights.get("error"):
        return Verdict("failed", f"retargeted to {hyp.architecture}, but the checkpoint could not be converted: {folder.weights['error']}")
    checks = proof["checks"]
    if not proof["ok"]:
        failed = [c for c in checks if not c["ok"] and not c.get("skipped")]
        return Verdict("failed", f"retargeted to {hyp.architecture}, NOT proven: " + "; ".join(f"{c['name']}: {c.get('detail') or _err(c)}" for c in failed))
    rel = max((c.get("max_rel_error") or 0.0) for c in checks)
    return Verdict("ported", f"retargeted to transformers' {hyp.architecture} (model_type {hyp.target}): logits equal the original's in transformers "
                   f"{reference.env.spec.transformers} (max relative error {rel:.1e}); {served.summary}")


def _port_by_rewrite(begun: PortStages, reference: Reference, source: ModelSource, out_dir: Path, options: PortOptions, t0: float) -> PortResult:
    """Rewrite the remote code in place, write it, prove it and re-scan it; the reports are written once files are."""
    rewritten = _rewrite(reference, source)
    begun = replace(begun, path="rewrite", rewrite=rewritten)
    state = rewritten.state
    if not rewritten.changed and not state.config_edits:
        message = ("no native class reproduces the original, and the remote code already passes every check the porter rewrites; nothing written"
                   + (f" ({len(state.refusals)} finding(s) need a hand-written change: see not_ported)" if state.refusals else ""))
        return assemble(replace(begun, verdict=Verdict("nothing_to_port", message), total=round(time.perf_counter() - t0, 2)))

    code = _ported_code(state, source)
    written = _write_rewrite(state, source, code, out_dir, options.shard_bytes)
    begun = replace(begun, code=code, written=written)
    if written.failure is None:
        if options.prove:
            begun = replace(begun, proof=_prove_rewritten(reference, source, state, code, written, out_dir, options.proof_timeout))
        if options.rescan:
            begun = replace(begun, served=_rescan_rewritten(source, out_dir))
    ended = replace(begun, verdict=_rewrite_verdict(begun), total=round(time.perf_counter() - t0, 2))
    return _write_reports(ended, state, source, code.config, out_dir)


def _rewrite(reference: Reference, source: ModelSource) -> RewriteStage:
    """The codemods run on the state the original's run recorded."""
    from hfcheck.porter.rewrite.codemods import CODEMODS

    t0 = time.perf_counter()
    state = _recorded_state(reference, source)
    _name_the_base_model(state, source)
    for codemod in CODEMODS:
        codemod().apply(state)
    seconds = round(time.perf_counter() - t0, 2)
    changed = frozenset(f for f, text in state.files.items() if text != source.code_files.get(f))
    return RewriteStage(state, changed, [r.to_dict() for r in state.refusals], seconds)


def _rewrite_verdict(stages: PortStages) -> Verdict:
    """Ported when written, proven (if asked) and served (if re-scanned); failed, saying at which step, otherwise."""
    written, proof, served = stages.written, stages.proof, stages.served
    assert written is not None and stages.code is not None and stages.rewrite is not None
    if written.failure is not None:
        return Verdict("failed", written.failure)
    attention_left = [r for r in stages.rewrite.not_ported if r["code"] == "HFC803"]
    if attention_left and (served is None or not served.served.served):
        # the construct, not whatever the proof then tripped on: vLLM cannot serve attention computed outside the interface
        r = attention_left[0]
        return Verdict("refused", f"refused: the attention cannot be rewritten to go through the attention interface, the only way vLLM "
                       f"serves it: {r['file']} {r['where']}: {r['reason']}; the partial rewrite is kept for inspection")
    if proof is not None and proof.failure is not None:
        return Verdict("failed", proof.failure)
    changes = len(stages.rewrite.state.changes)
    if served is not None and not served.served.served:
        left = "; ".join(f"{r['code']} {r['file']} {r['where']}: {r['reason']}" for r in stages.rewrite.not_ported[:3])
        return Verdict("failed", f"rewritten in place ({changes} change(s)) and proven, but vLLM still does not serve the result: "
                       f"{'; '.join(served.served.blockers[:2]) or served.served.summary}" + (f". Not rewritten: {left}" if left else "")
                       + "; the output is kept for inspection")
    return Verdict("ported", f"rewritten in place: {changes} change(s) in {len(stages.rewrite.changed)} file(s)")


def _recorded_state(reference: Reference, source: ModelSource) -> PortState:
    """The port's working state, seeded with what the original's run recorded: the codemods act on observed behaviour."""
    from hfcheck.porter.rewrite.dataflow import plans

    state = PortState(dict(source.code_files), dict(source.config))
    state.observed = plans(reference.run.result, reference.run.tensors, source.code_files, reference.input_ids, reference.tiny_config)
    state.tied = reference.run.result.get("tied") or []
    state.built_classes = {}
    for m in reference.run.result.get("modules", []):  # class -> whether any instance holds weights
        state.built_classes[m["class"]] = state.built_classes.get(m["class"], False) or bool(m.get("params") or m.get("persistent"))
    return state


def _name_the_base_model(state: PortState, source: ModelSource) -> None:
    """Point auto_map's AutoModel at the base model before the codemods run: they read the base model from it."""
    index, roles = state.roles()
    early = _auto_map(source.config.get("auto_map") or {}, roles, index)
    if early.get("AutoModel") != (source.config.get("auto_map") or {}).get("AutoModel"):
        state.config_edits.append({"op": "set", "key": "auto_map", "value": early})
        state.change("HFC102", "config.json", "auto_map", f"AutoModel -> {early['AutoModel']} (the base model; it named the causal-LM class)",
                     "vLLM builds AutoModel and adds its own lm_head; a causal-LM class there nests a second head and its loader "
                     "strips 'model.' from every checkpoint name")


def _ported_code(state: PortState, source: ModelSource) -> PortedCode:
    """The final auto_map (naming the rewritten modules), the config defaults, the config the output carries, and the changes
    linked to the findings they fix."""

    index, roles = state.roles()
    auto_map = _auto_map(state.ported_config().get("auto_map") or {}, roles, index)
    if auto_map != state.ported_config().get("auto_map"):
        state.config_edits.append({"op": "set", "key": "auto_map", "value": auto_map})
    defaults = state.config_defaults()
    config = apply_config_edits(source.config, state.config_edits, defaults)
    _attach_fixes(state, source)
    return PortedCode(auto_map, defaults, config, [c.to_dict() for c in state.changes])


def _write_rewrite(state: PortState, source: ModelSource, code: PortedCode, out_dir: Path, shard_bytes: int | None) -> WriteStage:
    """Write the output folder: its files, and its converted checkpoint (failure set when it could not be converted)."""
    written = _write_code(state, code.config, out_dir)
    src_dir = Path(source.location) if source.kind == "local" and source.location else None
    if src_dir is None:
        return WriteStage(written + ["port.diff", "PORT.md"])
    written += _copy_other_files(src_dir, out_dir, set(state.files))
    converted = _convert_checkpoint(src_dir, out_dir, state, source.config, code.defaults, shard_bytes)
    return WriteStage(written + converted.files + ["port.diff", "PORT.md"], converted.weights, converted.failure)


def _write_code(state: PortState, ported_config: dict[str, Any], out_dir: Path) -> list[str]:
    """Write every code file of the port and its config.json; the names written, in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, text in sorted(state.files.items()):
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(name)
    (out_dir / "config.json").write_text(json.dumps(ported_config, indent=2) + "\n", encoding="utf-8")
    written.append("config.json")
    return written


def _convert_checkpoint(src_dir: Path, out_dir: Path, state: PortState, config: dict[str, Any], defaults: dict[str, Any],
                        shard_bytes: int | None) -> WriteStage:
    """Convert a safetensors checkpoint by the port's weight rules (a pickle one is only noted): the shard files written."""

    if W.checkpoint_files(src_dir) and state.weight_rules and isinstance(config.get("quantization_config"), dict):
        why = W.quantized_tensors(config, state.weight_rules)
        return WriteStage([], {"error": why}, f"the checkpoint could not be converted: {why}")
    if W.checkpoint_files(src_dir):
        t1 = time.perf_counter()
        try:
            summary = W.convert_checkpoint(src_dir, out_dir, state.weight_rules, config, defaults,
                                           **({"max_shard_bytes": shard_bytes} if shard_bytes else {}))
        except W.ConvertError as exc:
            return WriteStage([], {"error": str(exc)}, f"the checkpoint could not be converted: {exc}")
        summary["seconds"] = round(time.perf_counter() - t1, 2)
        return WriteStage(summary["shards"] + ([W.INDEX_NAME] if len(summary["shards"]) > 1 else []), summary)
    if any(p.suffix in PICKLE_WEIGHTS for p in src_dir.iterdir() if p.is_file()):
        return WriteStage([], {"note": "the checkpoint is in a pickle format (.bin/.pt): not converted; convert it to safetensors first, then port again"})
    return WriteStage([])


def _prove_rewritten(reference: Reference, source: ModelSource, state: PortState, code: PortedCode, written: WriteStage, out_dir: Path,
                     proof_timeout: float) -> ProofStage:
    """Prove the rewrite against the original's run (and on the converted checkpoint); a failed proof fails the port."""

    t1 = time.perf_counter()
    proof = prove_rewrite(reference, state.files, code.auto_map, state.weight_rules, state.config_edits, code.defaults, timeout=proof_timeout)
    if written.weights and "shards" in written.weights:

        key = "AutoModelForCausalLM" if "AutoModelForCausalLM" in code.auto_map else "AutoModel"
        check = prove_real_weights(reference, source, out_dir, class_ref=code.auto_map[key], timeout=proof_timeout)
        proof["checks"].append(check)
        proof["ok"] = proof["ok"] and (check["ok"] or bool(check.get("skipped")))
    seconds = round(time.perf_counter() - t1, 2)
    if proof.get("ok"):
        return ProofStage(proof, seconds)
    failed = [c for c in proof.get("checks", []) if not c.get("ok")]
    why = proof.get("error") or "; ".join(f"{c['name']}: {c.get('detail') or _err(c)}" for c in failed)
    return ProofStage(proof, seconds, f"rewritten in place, but the ported model does not reproduce the original ({why}); the output is kept for inspection")


def _rescan_rewritten(source: ModelSource, out_dir: Path) -> ServedStage:
    """Re-scan the output and ask how vLLM serves it (a proven port vLLM still does not serve fails: ``_rewrite_verdict``)."""
    t1 = time.perf_counter()
    rows = _rescan(source, out_dir)
    served = how_served(out_dir, trust_remote_code=True)
    return ServedStage(rows, served, round(time.perf_counter() - t1, 2))


def _err(check: dict) -> str:
    rel = check.get("max_rel_error")
    return f"max relative error {rel:.2e}" if isinstance(rel, (int, float)) else "mismatch"


# ---------------------------------------------------------------------- decisions


def served_natively(facts: ModelFacts) -> tuple[bool, str] | None:
    """Whether vLLM's native class of this architecture name computes the model (None: vLLM
    has no native class of that name): the facts' answer, the one scan reports. A registry name
    kept for another generation of the architecture (ChatGLM-6B v1 under ``ChatGLMModel``) is
    not served natively."""

    if facts.vllm_native_mismatch:
        return False, facts.vllm_native_mismatch
    if not facts.vllm_native:
        return None
    return True, f"vLLM {facts.vllm_table_version} serves {facts.architectures[0]} with its own native implementation"


def _model_refusal(facts, source, static_findings) -> str | None:
    bad: dict[str, list[int]] = {}
    for i, kind in enumerate(facts.layer_types):
        if kind not in V.SOFTMAX_LAYER_KINDS:
            bad.setdefault(kind, []).append(i)
    if bad:
        parts = "; ".join(f"{kind}: layer{'s' if len(idx) > 1 else ''} {_ranges(idx)}" for kind, idx in bad.items())
        return f"cannot be ported: {sum(map(len, bad.values()))} of {len(facts.layer_types)} layers are not softmax attention ({parts}): {NOT_SOFTMAX_WHY}"
    if facts.is_encoder_decoder:
        return "cannot be ported: encoder-decoder models are not served by vLLM's transformers backend"
    if facts.quant_method in V.MXFP4_METHODS:
        return "cannot be ported: vLLM's transformers backend refuses MXFP4 checkpoints; dequantize first"
    findings = static_findings(source) or []
    unsafe = [f for f in findings if f.code in UNSAFE and f.status == "fail"]
    if unsafe:
        f = unsafe[0]
        return f"refused: the code acts at import time ({f.code} {f.file}:{f.line}: {f.message}); review and remove it before porting"
    layers = [f for f in findings if f.code == "HFC815" and f.status == "fail"]
    if layers:
        where = "; ".join(f"{f.file}:{f.line}: " + f.message.split(": vLLM's")[0].removeprefix("the code computes ") for f in layers)
        return f"cannot be ported: the code computes layers that are not softmax attention ({where}): {NOT_SOFTMAX_WHY}"
    return None


def _ranges(idx: list[int]) -> str:
    out, start, prev = [], None, None
    for i in idx + [None]:
        if start is None:
            start = prev = i
        elif i is not None and prev is not None and i == prev + 1:
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


def _auto_map(auto_map: dict, roles, index=None) -> dict:
    """auto_map naming the ported (local) modules, with the AutoModel entry vLLM resolves: the
    base model. vLLM builds ``AutoModel`` and adds its own lm_head, mapping checkpoint names onto
    that pair; an AutoModel naming the causal-LM class itself (a common 4.x Hub config) nests a
    second head and strips ``model.`` from every name ("no module or parameter named
    'embed_tokens'" at load)."""
    out = {}
    for key, value in auto_map.items():
        out[key] = value.partition("--")[2] if isinstance(value, str) and "--" in value else value
    base = roles.base_model
    if index is not None and base is not None and out.get("AutoModel") == out.get("AutoModelForCausalLM"):

        base = base_of_head(index, base)
        if base is not None:
            out["AutoModel"] = f"{Path(base.file).stem}.{base.name}"
    elif "AutoModel" not in out and base is not None and str(out.get("AutoModelForCausalLM", "")).rpartition(".")[2] != base.name:
        out["AutoModel"] = f"{Path(base.file).stem}.{base.name}"  # (MixFormer has no base apart from its causal-LM class: none named)
    return out


def _attach_fixes(state, source) -> None:
    """Link each change to the original findings it answers (same code and file, and the class
    it names or, for import and Cache-call findings, the API it names)."""


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
    from hfcheck.analyzer.scan import scan

    def worst(report) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for c in report["checks"]:
            prev = out.get(c["code"])
            if prev is None or STATUS_RANK.get(c["status"], 0) > STATUS_RANK.get(prev[0], 0):
                out[c["code"]] = (c["status"], c["message"])
        return out

    before_report = scan(source).report
    before = worst(before_report)
    after_report = scan(str(out_dir), trust_remote_code=True).report
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


def _diff(source, state, ported_config: dict | None) -> str:
    """Unified diff of every changed file. A retarget (no state) removes the model code: the
    diff is the config's, headed by the list of files the native class replaces."""
    chunks = []
    if state is None:
        removed = sorted(n for n in source.code_files if n.endswith(".py"))
        chunks.append("# retarget: the native class replaces the model code; removed: " + ", ".join(removed) + "\n")
        ported_config = ported_config or {}
    else:
        for name in sorted(set(source.code_files) | set(state.files)):
            a, b = source.code_files.get(name, ""), state.files.get(name, "")
            if a != b:
                chunks.extend(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"a/{name}", f"b/{name}"))
    a = json.dumps(source.config, indent=2) + "\n"
    b = json.dumps(ported_config, indent=2) + "\n"
    if a != b:
        chunks.extend(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "a/config.json", "b/config.json"))
    return "".join(chunks)


def _write_reports(stages: PortStages, state: PortState | None, source: ModelSource, ported_config: dict[str, Any] | None,
                   out_dir: Path) -> PortResult:
    """The result, with the linter's word on both sides, and port.diff and PORT.md written next to the model."""
    lint = lint_port(source.code_files, dict(state.files) if state is not None else None).to_dict()
    result = assemble(replace(stages, lint=lint))
    if ported_config is None and result.retarget:
        ported_config = result.retarget.get("native_config")
    (out_dir / "port.diff").write_text(_diff(source, state, ported_config), encoding="utf-8")
    (out_dir / "PORT.md").write_text(render_markdown(result), encoding="utf-8")
    if "port.diff" not in result.files:  # a retarget's: in the result, not in PORT.md's list (written before it)
        result.files.append("port.diff")
    return result
