"""Findings (and proofs) -> verdict and score. Judgement lives here and only here.

The one home of the verdict arithmetic: ``build_report`` (scan), ``attach_proofs`` (``verify``
and ``scan --verify``), the policy score (``analyzer/report/policy.py``) and the TUI read it. It
imports nothing heavy (no torch, no transformers), so the TUI and the policy can use it.

The verdict compares vLLM's transformers backend (``--model-impl transformers``) with vLLM's
native path for the same model on the same hardware. A limit the native path has too (a TP
size the head count does not divide, a warning vLLM logs either way) is not a loss: the rules
report it as ``info`` or ``pass`` and it counts for nothing here.

Verdict:
- ``blocked``: a blocker check fails (the transformers backend refuses to load the model;
  the report still gives the native command when vLLM has a native implementation).
- ``runs``: it loads, but a speed or parallel check fails or warns: slower than native, or
  fewer parallel options than native.
- ``native-speed``: every fusion and plan the native path has is in place.
- ``inconclusive``: no blocker failed but a blocker check could not be decided.

Score (0-100): start at 100; each failing speed check -15, each failing parallel check
-10, each warning -4, each inconclusive check -5; a blocker caps the score at 20
(minus 10 per further blocker), floored at 0. Native-speed models score 100.

Proofs (``hfcheck verify``): a failed proof counts as a failing check of the impact its claim
is about (``PROOF_IMPACT``): a wrong fusion as a failing speed check, a wrong TP/PP/EP plan as
a failing parallel check. So a failed proof turns ``native-speed`` into ``runs`` and costs
what that check would, under the same blocker cap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hfcheck.analyzer.findings.rule import Finding

VERDICTS: tuple[str, ...] = ("native-speed", "runs", "inconclusive", "blocked")
"""Every verdict, best first."""

SUMMARY_ORDER: tuple[str, ...] = ("native-speed", "runs", "blocked", "inconclusive")
"""The order the atlas and the sweep count verdicts in: those that load, then those that do not."""

VERDICT_STYLE: dict[str, str] = {"native-speed": "bold green", "runs": "bold yellow", "blocked": "bold red", "inconclusive": "bold magenta"}
"""How every view colours a verdict (rich styles): the text report, the sweep's table, the TUI."""

LOADS: frozenset[str] = frozenset({"native-speed", "runs"})
"""The verdicts under which vLLM's transformers backend loads the model."""

PENALTY = {("fail", "speed"): 15, ("fail", "parallel"): 10}
WARNING_COST = 4
INCONCLUSIVE_COST = 5
BLOCKER_CAP = 20
FURTHER_BLOCKER_COST = 10

PROOF_IMPACT = {"fusion": "speed", "tp": "parallel", "pp": "parallel", "ep": "parallel"}
"""What a failed proof of each kind counts as (a kind not listed: a parallel check)."""


def verdict_of(findings: Iterable[Finding]) -> str:
    findings = list(findings)
    if any(f.status == "fail" and f.impact == "blocker" for f in findings):
        return "blocked"
    if any(f.status == "inconclusive" and f.impact == "blocker" for f in findings):
        return "inconclusive"
    if any(f.status in ("fail", "warn") and f.impact in ("speed", "parallel") for f in findings):
        return "runs"
    return "native-speed"


def score_of(findings: Iterable[Finding]) -> int:
    findings = list(findings)
    score = 100
    for f in findings:
        score -= PENALTY.get((f.status, f.impact), 0)
        if f.status == "warn":
            score -= WARNING_COST
        if f.status == "inconclusive":
            score -= INCONCLUSIVE_COST
    blockers = sum(1 for f in findings if f.status == "fail" and f.impact == "blocker")
    if blockers:
        score = min(score, BLOCKER_CAP) - FURTHER_BLOCKER_COST * (blockers - 1)
    return max(0, min(100, score))


def proof_findings(proofs: Iterable[Any]) -> list[Finding]:
    """Failed proofs (``Proof`` objects or their report dicts) as failing findings."""
    out = []
    for p in proofs:
        record = p if isinstance(p, dict) else p.to_dict()
        if record.get("status") == "failed":
            impact = PROOF_IMPACT.get(record.get("kind", ""), "parallel")
            out.append(Finding("proof", "fail", record.get("claim", ""), None, impact))  # type: ignore[arg-type]
    return out


def report_findings(checks: Iterable[dict[str, Any]]) -> list[Finding]:
    """A report's ``checks`` entries back as findings (what the verdict was computed from)."""
    return [Finding(c["code"], c["status"], c.get("message", ""), c.get("remediation"), c.get("impact", "info")) for c in checks]


def judge(checks: Iterable[dict[str, Any]], proofs: Iterable[Any] = ()) -> tuple[str, int]:
    """(verdict, score) of a report's checks and proofs."""
    findings = report_findings(checks) + proof_findings(proofs)
    return verdict_of(findings), score_of(findings)
