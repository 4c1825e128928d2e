"""Report -> SARIF 2.1.0 (GitHub code scanning, any SARIF viewer).

One run; ``tool.driver.rules`` is the rule registry (every check code with its documentation
as help text), ``results`` the problems of the report:

- every check whose status is ``fail``, ``warn`` or ``inconclusive`` (passes and notes are
  left out). Level: ``error`` for a failure that the policy enforces (``warning`` when it does
  not), ``warning`` for a warning, ``note`` for an inconclusive check;
- every entry of ``code_findings`` (remote-code analysis, HFC8xx) not already reported by a check
  at the same file and line.

Location: ``file``/``line`` from the finding (``details`` of a check, or the code finding),
relative to the model folder; otherwise the model's ``config.json``, line 1. Paths are made
relative to the repository root by prefixing ``model_dir`` (default: the scanned folder as given
on the command line, for local models). ``problems(report)`` is the located, level-mapped list
that both this renderer and ``render.github`` read.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfcheck.analyzer.findings.rule import Rule
from hfcheck.analyzer.report.policy import enforced
from hfcheck.analyzer.rules.registry import RULES

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
CONFIG_FILE = "config.json"
IMPACT_LEVEL = {"blocker": "error", "speed": "warning", "parallel": "warning", "info": "note"}
CODE_FINDING_LEVEL = {"fail": "error", "warn": "warning", "info": "note", "inconclusive": "note"}


@dataclass(frozen=True)
class Problem:
    code: str
    level: str  # SARIF level: error | warning | note
    status: str  # the check's status (fail, warn, inconclusive, info)
    message: str
    file: str  # repository-relative path (posix)
    line: int
    impact: str | None
    remediation: str | None
    source: str  # "check" | "code_finding"


def default_model_dir(report: dict[str, Any], cwd: str | os.PathLike | None = None) -> str:
    """The model folder relative to the working directory (for local models), else ``""``."""
    model = report.get("model") or {}
    if model.get("source") != "local":
        return ""
    ref = str(model.get("ref") or "")
    path = Path(ref)
    if path.is_absolute():
        base = Path(cwd or os.getcwd()).resolve()
        try:
            path = path.resolve().relative_to(base)
        except ValueError:
            return path.as_posix()
    norm = posixpath.normpath(path.as_posix())
    return "" if norm == "." else norm


def _join(model_dir: str, file: object) -> str:
    path = str(file).replace("\\", "/")
    return posixpath.normpath(posixpath.join(model_dir, path) if model_dir and not path.startswith("/") else path)


def _line(value: Any) -> int:
    try:
        line = int(value)
    except (TypeError, ValueError):
        return 1
    return line if line >= 1 else 1


def problems(report: dict[str, Any], model_dir: str | None = None) -> list[Problem]:
    """The report's problems, located and levelled, in report order (checks, then code findings)."""

    model_dir = default_model_dir(report) if model_dir is None else model_dir.strip("/")
    out: list[Problem] = []
    seen: set[tuple[str, str, int]] = set()
    for c in report.get("checks", []):
        status = c.get("status")
        if status not in ("fail", "warn", "inconclusive"):
            continue
        details = c.get("details") or {}
        file, line = (details.get("file"), _line(details.get("line"))) if details.get("file") else (CONFIG_FILE, 1)
        if status == "fail":
            level = "error" if enforced(report, c["code"]) else "warning"
        else:
            level = "warning" if status == "warn" else "note"
        message = c["message"] if status != "inconclusive" else f"inconclusive: {c['message']}"
        problem = Problem(c["code"], level, status, message, _join(model_dir, file), line, c.get("impact"), c.get("remediation"), "check")
        seen.add((problem.code, problem.file, problem.line))
        out.append(problem)
    for f in report.get("code_findings") or []:
        file = _join(model_dir, f.get("file") or CONFIG_FILE)
        line = _line(f.get("line"))
        if (f["code"], file, line) in seen:
            continue
        seen.add((f["code"], file, line))
        status = f.get("status") or "warn"
        level = CODE_FINDING_LEVEL.get(status, "warning")
        if level == "error" and not enforced(report, f["code"]):
            level = "warning"
        out.append(Problem(f["code"], level, status, f.get("message") or f["code"], file, line, None, f.get("remediation"), "code_finding"))
    return out


def _rule_descriptor(rule: type[Rule]) -> dict[str, Any]:
    doc = rule.documentation()
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.what},
        "fullDescription": {"text": rule.why},
        "help": {"text": doc, "markdown": _help_markdown(rule)},
        "defaultConfiguration": {"level": IMPACT_LEVEL.get(rule.impact, "warning")},
        "properties": {"impact": rule.impact, "tags": ["hfcheck", "vllm", rule.impact]},
    }


def _help_markdown(rule: type[Rule]) -> str:
    return (
        f"**{rule.code} {rule.name}** (impact: {rule.impact})\n\n"
        f"**What it checks.** {rule.what}\n\n**Why it matters.** {rule.why}\n\n"
        f"**Example**\n\n```\n{rule.example.strip()}\n```\n\n**Fix.** {rule.fix}\n"
    )


def render_sarif(report: dict[str, Any], model_dir: str | None = None) -> dict[str, Any]:
    """The SARIF 2.1.0 log (a dict; ``json.dumps`` it) of one scan report."""

    found = problems(report, model_dir)
    rules = [_rule_descriptor(r) for r in RULES]
    index = {r["id"]: i for i, r in enumerate(rules)}
    for p in found:  # a code finding whose code the registry does not (yet) document
        if p.code not in index:
            index[p.code] = len(rules)
            rules.append({"id": p.code, "shortDescription": {"text": f"hfcheck check {p.code}"}, "defaultConfiguration": {"level": "warning"}})
    results = []
    for p in found:
        text = p.message if not p.remediation or p.status == "inconclusive" else f"{p.message.rstrip('.')}. Fix: {p.remediation}"
        results.append(
            {
                "ruleId": p.code,
                "ruleIndex": index[p.code],
                "level": p.level,
                "message": {"text": text},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": p.file}, "region": {"startLine": p.line}}}],
                "properties": {"status": p.status, **({"impact": p.impact} if p.impact else {}), "from": p.source},
            }
        )
    model = report.get("model") or {}
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "hfcheck",
                "version": str(report.get("hfcheck_version") or "0"),
                "semanticVersion": str(report.get("hfcheck_version") or "0"),
                "rules": rules,
            }
        },
        "automationDetails": {"id": f"hfcheck/{model.get('ref', 'model')}/"},
        "columnKind": "unicodeCodePoints",
        "invocations": [{"executionSuccessful": True}],
        "results": results,
        "properties": {
            "verdict": report.get("verdict"),
            "score": report.get("score"),
            "model": model.get("ref"),
            "model_type": model.get("model_type"),
            "vllm_version_modelled": report.get("vllm_version_modelled"),
            "target": report.get("target"),
            "serve_command": report.get("serve_command"),
            **({"policy_score": report["policy"]["score"]} if report.get("policy") else {}),
        },
    }
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}
