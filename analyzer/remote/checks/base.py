"""What a remote-code check family yields (``CodeFinding``) and how its rules turn that into
report findings (``RemoteCodeRule``). Each family module (``files``, ``attention``, ``moe``,
``pipeline``, ``imports``, ``packed_qkv``, ``security``) holds its checks and, beside them,
the rules that document its codes (``hfcheck explain HFC8xx``, docs/checks.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from hfcheck.analyzer.findings.rule import Finding, Rule


@dataclass(frozen=True)
class CodeFinding:
    code: str
    status: str  # "pass" | "fail" | "warn" | "info" | "inconclusive"
    file: str | None
    line: int | None
    message: str
    remediation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RemoteCodeRule(Rule):
    """A rule whose findings come from the static analysis, filtered by ``code``: the
    documentation of one HFC8xx code, kept beside the check that reports it."""

    none: ClassVar[str | None] = "nothing to report"
    """Pass message when the code was read and this check found nothing (None: no finding)."""
    observed_by: ClassVar[str | None] = None
    """The rule that decides the same question on the built model. When the sandbox built it
    (--trust-remote-code), this rule's failures and warnings become notes, so that one
    problem is not scored twice; without the sandbox they stand."""

    def check(self, analysis) -> list[Finding]:
        findings = analysis.code
        if findings is None:
            return []
        mine = [f for f in findings if f.code == self.code]
        if not mine:
            readable = any(f.code == "HFC800" and f.status == "pass" for f in findings)
            return [self.passed(self.none)] if readable and self.none else []
        sandbox = getattr(analysis, "sandbox", None)
        observed = bool(self.observed_by and sandbox is not None and getattr(sandbox, "ok", False) and getattr(analysis, "observations", None) is not None)
        # vLLM resolves `getattr(transformers, architecture)` before auto_map: when that class
        # exists, the model's own modeling code is not what vLLM runs.
        unused = getattr(analysis, "class_origin", None) == "transformers" and self.impact != "info"
        out = []
        for f in mine:
            details = {"file": f.file, "line": f.line}
            if unused and f.status in ("fail", "warn", "inconclusive"):
                cls = analysis.transformers_class.__name__
                out.append(self.noted(f"{f.message} (not what vLLM runs: it uses transformers' own {cls})", **details, static_status=f.status))
            elif observed and f.status in ("fail", "warn"):
                out.append(self.noted(f"{f.message} (static reading; {self.observed_by} decides on the built model)", **details, static_status=f.status))
            elif f.status == "fail":
                out.append(self.failed(f.message, f.remediation, **details))
            elif f.status == "warn":
                out.append(self.warned(f.message, f.remediation, **details))
            elif f.status == "info":
                out.append(self.noted(f.message, **details))
            elif f.status == "inconclusive":
                out.append(self.inconclusive(f.message, **details))
            else:
                out.append(self.passed(f.message, **details))
        return out
