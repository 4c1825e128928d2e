"""Sweep results -> the atlas: a markdown page, summary counts first, every failure named.

Layout: title and provenance; summary counts (native-speed / runs / blocked / inconclusive /
analysis failed) and the coverage of the tiny instance + graph; every failure with its reason
(analyses that failed, then types whose tiny instance or graph walk failed); one row per
model type. Nothing time- or machine-dependent is written, so regenerating it with nothing
changed gives the same file (it is committed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfcheck.analyzer.report.cells import fusions_cell, moe_detail, native_cell, pp_cell, tp_cell
from hfcheck.analyzer.report.verdict import SUMMARY_ORDER
from hfcheck.analyzer.sources.model_types import CAUSAL, POOLING, VLM
from hfcheck.analyzer.vllm.release import modelled_platform, modelled_version
from hfcheck.runtime.decisions import agreement, latest_rows, runtime_cell
from hfcheck.sweep.cache import versions
from hfcheck.sweep.run import (
    FAILED,
    SweepResult,
    failure_reason,
    instance_error,
    instance_ok,
)

VERDICTS = SUMMARY_ORDER


def default_path(transformers_version: str | None, vllm_version: str | None = None) -> Path:
    """``reports/atlas-vllm-<release>-transformers-<release>.md``: an atlas is for one target."""
    return Path("reports") / f"atlas-vllm-{vllm_version or modelled_version()}-transformers-{transformers_version}.md"


def _platform_label() -> str:
    return "CUDA GPUs" if modelled_platform() == "cuda" else "CPUs (vLLM's CPU build)"


def _cell(value: Any) -> str:
    text = str(value).replace("\n", " ").replace("|", "\\|").strip()
    return text or "—"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _plain(result: dict) -> str:
    probe = result.get("transformers_builds")
    if not probe:
        return "—"
    return "yes" if probe.get("ok") else f"no: {_cell(_short(probe.get('error') or '', 200))}"


def summary_counts(result: SweepResult) -> dict[str, int]:
    counts = {v: 0 for v in VERDICTS}
    counts[FAILED] = 0
    for _, res in result.ordered():
        if "report" in res:
            verdict = res["report"].get("verdict")
            counts[verdict] = counts.get(verdict, 0) + 1
        else:
            counts[FAILED] += 1
    return counts


def coverage(result: SweepResult) -> tuple[int, int]:
    done = result.ordered()
    return sum(instance_ok(r) for _, r in done), len(done)


def _runtime_section(runtime: tuple[str, dict[str, dict]] | None, keys: list[str]) -> list[str]:
    """The headline of the runtime cross-check over the atlas's model types."""
    if runtime is None:
        return []
    version, by_type = runtime
    rows = [by_type[k] for k in keys if k in by_type]
    if not rows:
        return []
    a = agreement(rows)
    loaded = sum(1 for r in rows if r.get("status") == "loaded")
    pct = f"{100 * a['all_agree'] / a['built']:.1f}%" if a["built"] else "n/a"
    return [
        "## Checked against running vLLM",
        "",
        f"`scripts/runtime_crosscheck.py` took {len(rows)} of these types to real vLLM {version} (its CPU build, "
        "`model_impl=\"transformers\"`, random weights, greedy tokens against transformers' `generate`) and compared what "
        f"vLLM logged with hfcheck's prediction for vLLM {version}, made in the same environment. Over the "
        f"{a['built']} types whose small instance built and whose load vLLM attempted, the prediction agrees on "
        f"**{a['all_agree']} of {a['built']}** ({pct}): the verdict (loads or not) on {a['verdict_agrees']}, and for the "
        f"{loaded} vLLM loaded, every module's logged fusions, attention and MoE routing and the greedy tokens as well. "
        "Column *vLLM ran* below; "
        "the reasons for each remaining difference are in `scripts/crosscheck/runtime_known_differences.toml`.",
        "",
    ]


def render_atlas(result: SweepResult, *, title_scope: str | None = None, runtime: tuple[str, dict[str, dict]] | None = None,
                 sections_runtime: dict[str, tuple[str, dict[str, dict]]] | None = None) -> str:
    """``runtime``: (vLLM version, runtime cross-check rows by model type), for the *vLLM ran* column;
    ``sections_runtime``: the same per further section (VLM, pooling), rows keyed by target key.

    The summary, failures and main table cover the causal-LM types and the references; each
    further section (``model_types.SECTIONS``) follows with its own counts and table."""

    v = versions()
    main = SweepResult([t for t in result.targets if t.section == CAUSAL or not t.is_type], result.results, interrupted=result.interrupted)
    rows = main.ordered()
    counts = summary_counts(main)
    ok, total = coverage(main)
    all_types = all(t.is_type for t in main.targets)
    scope = title_scope or (
        f"every causal-LM model type of transformers {v['transformers']} (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), "
        "each analysed from its config class defaults with `architectures` set to the mapping's class"
        if all_types
        else "the references given to `hfcheck sweep`"
    )
    out = [
        f"# hfcheck atlas: vLLM {modelled_version()}, transformers {v['transformers']}, {_platform_label()}",
        "",
        f"What vLLM {modelled_version()}'s transformers backend (`--model-impl transformers`) does with {scope}, "
        f"running on {_platform_label()} with transformers {v['transformers']}, as predicted by hfcheck {v['hfcheck']} on CPU without weights.",
        "",
        "Regenerate: `hfcheck sweep` (writes this file; `--no-cache` to re-analyse everything).",
        "",
    ]
    if result.interrupted:
        out += [f"**Partial: the sweep was interrupted after {len(rows)} of {len(result.targets)} targets.**", ""]
    out += ["## Summary", "", "| result | count |", "|---|---:|"]
    for name in (*VERDICTS, FAILED):
        out.append(f"| {name} | {counts.get(name, 0)} |")
    for name, n in counts.items():
        if name not in VERDICTS and name != FAILED:
            out.append(f"| {_cell(name)} | {n} |")
    out.append(f"| **total** | **{len(rows)}** |")
    pct = f"{100 * ok / total:.1f}%" if total else "n/a"
    out += ["", f"Tiny instance built and graph walked: **{ok} of {total}** ({pct}).", ""]
    upstream = [t for t, r in rows if not instance_ok(r) and (r.get("transformers_builds") or {}).get("ok") is False]
    if upstream:
        rest = total - len(upstream)
        out += [
            f"{len(upstream)} of the {total - ok} failures are transformers' own: the default config does not build a model "
            f"with plain `AutoModelForCausalLM.from_config` either ({', '.join(t.key for t in upstream)}). "
            f"Over the other {rest} targets: **{ok} of {rest}** ({100 * ok / rest:.1f}%).",
            "",
        ]

    failed = main.failed
    no_instance = [(t, r, instance_error(r)) for t, r in rows if "report" in r and not instance_ok(r)]
    out += ["## Failures", ""]
    if not failed and not no_instance:
        out += ["None.", ""]
    else:
        out += ["| target | stage | reason | plain transformers builds it |", "|---|---|---|---|"]
        by_key = dict((t.key, r) for t, r in rows)
        for t, reason in failed:
            out.append(f"| {_cell(t.key)} | analysis | {_cell(reason)} | {_plain(by_key[t.key])} |")
        for t, r, why in no_instance:
            out.append(f"| {_cell(t.key)} | tiny instance / graph | {_cell(why)} | {_plain(r)} |")
        out.append("")

    out += _runtime_section(runtime, [t.model_type for t, _ in rows if t.model_type is not None])
    out += ["## Every target", ""] + _table(rows, runtime)
    for section in (VLM, POOLING):
        out += _section(result, section, (sections_runtime or {}).get(section))
    return "\n".join(out)


def _table(rows: list, runtime: tuple[str, dict[str, dict]] | None) -> list[str]:
    """One row per target; with ``runtime`` rows (keyed by target key), a *vLLM ran* column."""
    out: list[str] = []
    ran = runtime[1] if runtime else None
    head = "| target | architecture | verdict | score | fusions | MoE | TP sizes | PP | blockers | vLLM native |"
    rule = "|---|---|---|---:|---|---|---|---|---|---|"
    if runtime is not None and ran is not None:
        head, rule = head + f" vLLM ran ({runtime[0]}) |", rule + "---|"
    out += [head, rule]
    for t, res in rows:
        report = res.get("report")
        tail = ""
        if ran is not None:
            row = ran.get(t.key if t.section != CAUSAL else (t.model_type or ""))
            tail = f" {_cell(_short(runtime_cell(row), 220)) if row else '—'} |"
        if report is None:
            out.append(f"| {_cell(t.key)} | — | {FAILED} | — | — | — | — | — | {_cell(failure_reason(res))} | — |{tail}")
            continue
        archs = ", ".join(report.get("model", {}).get("architectures") or []) or "—"
        blockers = "; ".join(_short(b) for b in report.get("blockers") or []) or "—"
        out.append(
            f"| {_cell(t.key)} | {_cell(archs)} | {report.get('verdict')} | {report.get('score')} | {_cell(fusions_cell(report))} | "
            f"{_cell(moe_detail(report))} | {tp_cell(report)} | {pp_cell(report)} | {_cell(blockers)} | {native_cell(report)} |{tail}"
        )
    out.append("")
    return out


SECTION_TITLES = {
    VLM: ("Vision-language types", "every image-text-to-text type (`MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`) outside the causal-LM "
          "mapping, analysed with its image-text-to-text class (vLLM's `TransformersMultiModal*` path)"),
    POOLING: ("Pooling types", "every encoder type (`MODEL_FOR_MASKED_LM_MAPPING_NAMES`) as its base model, which vLLM's pooling runner "
              "serves as an embedding model (`TransformersEmbeddingModel`)"),
}


def _section(result: SweepResult, section: str, runtime: tuple[str, dict[str, dict]] | None) -> list[str]:
    """A section of the atlas for the model types of one more kind: its counts, then its rows."""
    rows = [(t, r) for t, r in result.ordered() if t.is_type and t.section == section]
    if not rows:
        return []
    title, scope = SECTION_TITLES[section]
    counts = {v: 0 for v in (*VERDICTS, FAILED)}
    for _, r in rows:
        name = r["report"].get("verdict") if "report" in r else FAILED
        counts[name] = counts.get(name, 0) + 1
    built = sum(instance_ok(r) for _, r in rows)
    out = [f"## {title}", "", f"{len(rows)} targets: {scope}.", "",
           ", ".join(f"{name} {n}" for name, n in counts.items()) + f"; tiny instance built and graph walked: {built} of {len(rows)}.", ""]
    if runtime is not None:
        ran = [runtime[1][t.key] for t, _ in rows if t.key in runtime[1]]
        if ran:
            a = agreement(ran)
            out += [f"Checked against running vLLM {runtime[0]} (`scripts/runtime_crosscheck.py --{'vlm' if section == VLM else 'pooling'}`): "
                    f"{len(ran)} of these types taken to it, {a['built']} with a small folder it could try (the last column says why "
                    f"the others have none); **{a['all_agree']} of {a['built']}** agree with the prediction"
                    + (f" (differing: {', '.join(a['disagree'])}; see the row)." if a["disagree"] else "."), ""]
    return out + _table(rows, runtime)


def write_atlas(result: SweepResult, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    sections = {section: rows for section, kind in ((VLM, "vlm"), (POOLING, "pooling")) if (rows := latest_rows(path.parent, kind))}
    tmp.write_text(render_atlas(result, runtime=latest_rows(path.parent), sections_runtime=sections), encoding="utf-8")
    tmp.replace(path)
    return path
