"""Findings -> verdict and score. Judgement lives here and only here.

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
"""

from __future__ import annotations

from hfcheck.analyzer.rules.base import Finding

PENALTY = {("fail", "speed"): 15, ("fail", "parallel"): 10}


def verdict_of(findings: list[Finding]) -> str:
    if any(f.status == "fail" and f.impact == "blocker" for f in findings):
        return "blocked"
    if any(f.status == "inconclusive" and f.impact == "blocker" for f in findings):
        return "inconclusive"
    if any(f.status in ("fail", "warn") and f.impact in ("speed", "parallel") for f in findings):
        return "runs"
    return "native-speed"


def score_of(findings: list[Finding]) -> int:
    score = 100
    for f in findings:
        score -= PENALTY.get((f.status, f.impact), 0)
        if f.status == "warn":
            score -= 4
        if f.status == "inconclusive":
            score -= 5
    blockers = sum(1 for f in findings if f.status == "fail" and f.impact == "blocker")
    if blockers:
        score = min(score, 20) - 10 * (blockers - 1)
    return max(0, min(100, score))
