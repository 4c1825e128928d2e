"""What a rule is: a stable code, its documentation, and ``check(analysis) -> findings``.

Ruff-style: every rule documents itself (what, why, example, fix) so
``hfcheck explain CODE`` can print it. Scorecard-style: rules read raw facts and
observations gathered elsewhere, and "inconclusive" is a status, not a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from hfcheck.analyzer.analysis import Analysis

Status = Literal["pass", "fail", "warn", "info", "inconclusive"]
Impact = Literal["blocker", "speed", "parallel", "info"]
"""What a failure costs: vLLM refuses to load / slower than native / fewer parallel options / nothing."""


@dataclass
class Finding:
    code: str
    status: Status
    message: str
    remediation: str | None = None
    impact: Impact = "info"
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "status": self.status,
            "impact": self.impact,
            "message": self.message,
            "remediation": self.remediation,
            "details": self.details,
        }


class Rule:
    """Subclass, fill the class attributes, implement ``check``, add it to ``registry.RULES``."""

    code: ClassVar[str]
    name: ClassVar[str]
    impact: ClassVar[Impact]
    what: ClassVar[str]
    why: ClassVar[str]
    example: ClassVar[str]
    fix: ClassVar[str]

    def check(self, analysis: Analysis) -> list[Finding]:
        raise NotImplementedError

    # helpers so each rule reads as prose
    def passed(self, message: str, **details: Any) -> Finding:
        return Finding(self.code, "pass", message, None, self.impact, details)

    def failed(self, message: str, remediation: str | None = None, **details: Any) -> Finding:
        return Finding(self.code, "fail", message, remediation or self.fix, self.impact, details)

    def warned(self, message: str, remediation: str | None = None, **details: Any) -> Finding:
        return Finding(self.code, "warn", message, remediation or self.fix, self.impact, details)

    def noted(self, message: str, **details: Any) -> Finding:
        return Finding(self.code, "info", message, None, self.impact, details)

    def inconclusive(self, message: str, **details: Any) -> Finding:
        return Finding(self.code, "inconclusive", message, None, self.impact, details)

    @classmethod
    def documentation(cls) -> str:
        return (
            f"{cls.code} {cls.name}\n\n"
            f"What it checks\n  {cls.what}\n\n"
            f"Why it matters\n  {cls.why}\n\n"
            f"Example\n{_indent(cls.example)}\n\n"
            f"Fix\n  {cls.fix}\n"
        )


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.strip("\n").splitlines())
