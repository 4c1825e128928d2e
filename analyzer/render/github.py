"""Report -> GitHub Actions workflow commands (annotations on the pull request's files).

One ``::error`` / ``::warning`` / ``::notice`` line per problem (the same problems, locations
and levels as the SARIF output: ``render.sarif.problems``), then one plain summary line:

    ::error file=my-model/modeling_x.py,line=42,title=HFC201 attention-interface::...
    hfcheck: my-model: BLOCKED, score 20/100; 1 error, 2 warnings, 0 notices

Values are escaped as the runner expects (``%``, CR, LF everywhere; ``:`` and ``,`` in
properties too), so a message never breaks the command.
"""

from __future__ import annotations

from typing import Any

from hfcheck.analyzer.analysis.crosscheck import summary_line
from hfcheck.analyzer.render.sarif import problems
from hfcheck.analyzer.rules.registry import BY_CODE

COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: dict[str, Any], model_dir: str | None = None) -> str:
    """The annotation lines (and a summary line), newline-terminated."""

    lines = []
    counts = {"error": 0, "warning": 0, "note": 0}
    for p in problems(report, model_dir):
        counts[p.level] += 1
        rule = BY_CODE.get(p.code)
        title = f"{p.code} {rule.name}" if rule else p.code
        message = p.message
        if p.remediation and p.status in ("fail", "warn"):
            message = f"{message.rstrip('.')}. Fix: {p.remediation}"
        props = f"file={_escape_property(p.file)},line={p.line},title={_escape_property(title)}"
        lines.append(f"::{COMMAND[p.level]} {props}::{_escape_data(message)}")
    model = report.get("model") or {}
    score = f"score {report.get('score')}/100"
    if report.get("policy"):
        score += f", policy score {report['policy']['score']}"
    lines.append(
        f"hfcheck: {model.get('ref', '?')}: {str(report.get('verdict', '?')).upper()}, {score}; "
        f"{counts['error']} error{'s' * (counts['error'] != 1)}, {counts['warning']} warning{'s' * (counts['warning'] != 1)}, "
        f"{counts['note']} notice{'s' * (counts['note'] != 1)}"
    )
    cross = report.get("cross_check")
    if cross and cross.get("available"):  # "unavailable" is said once, on stderr, by the command

        lines.append(summary_line(cross))
    return "\n".join(lines) + "\n"
