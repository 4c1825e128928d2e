"""What a rule is: a stable code, its documentation, and ``check(analysis) -> findings``.

Ruff-style: every rule documents itself (what, why, example, fix) so
``hfcheck explain CODE`` can print it. Scorecard-style: rules read raw facts and
observations gathered elsewhere, and "inconclusive" is a status, not a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hfcheck.analyzer.vllm.release import modelled_version
from hfcheck.analyzer.vllm.sources import cite_all

if TYPE_CHECKING:
    from hfcheck.analyzer.analysis import Analysis
    from hfcheck.analyzer.analysis.observe import Observations

PLATFORM_LABELS = {"cuda": "CUDA GPUs", "cpu": "vLLM's CPU build"}

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
    vllm_source: ClassVar[tuple[str, ...]] = ()
    """What of vLLM's code the rule models, as ``"<path under vllm/>::<qualified name>"``: printed
    with the line of the release predicted for (``vllm.sources.cite``)."""
    platforms: ClassVar[tuple[str, ...]] = ("cuda", "cpu")
    """The platforms whose vLLM code path the rule's evidence is (``vllm.release.PLATFORMS``).
    On any other, a failure becomes an ``info`` finding that names where it fails
    (``details["fails_on"]``) and why it does not fail here (``elsewhere``): ``on_platform``."""
    elsewhere: ClassVar[str] = ""
    """Why the failure does not happen on the platforms outside ``platforms`` (vLLM's code there)."""

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
    def on_platform(cls, findings: list[Finding], platform: str) -> list[Finding]:
        """``findings`` as they hold on ``platform``: a failure measured on another platform's code
        path is recorded, not counted (status ``info``, ``details["fails_on"]``)."""
        if platform in cls.platforms:
            return findings
        where = " and ".join(PLATFORM_LABELS.get(p, p) for p in cls.platforms)
        here = PLATFORM_LABELS.get(platform, platform)
        out = []
        for f in findings:
            if f.status in ("fail", "warn"):
                why = f" ({cls.elsewhere})" if cls.elsewhere else ""
                f = Finding(f.code, "info", f"on {where} only, not on {here}{why}: {f.message}", None, f.impact,
                            {**f.details, "fails_on": cls.platforms[0]})
            out.append(f)
        return out

    @classmethod
    def documentation(cls) -> str:
        text = (
            f"{cls.code} {cls.name}\n\n"
            f"What it checks\n  {cls.what}\n\n"
            f"Why it matters\n  {cls.why}\n\n"
            f"Example\n{_indent(cls.example)}\n\n"
            f"Fix\n  {cls.fix}\n"
        )
        if cls.platforms != ("cuda", "cpu"):
            text += (f"\nPlatforms\n  holds on {' and '.join(PLATFORM_LABELS.get(p, p) for p in cls.platforms)} only"
                     + (f": {cls.elsewhere}" if cls.elsewhere else "") + "\n")
        if cls.vllm_source:
            text += f"\nvLLM source (vLLM {modelled_version()})\n" + "\n".join(f"  {c}" for c in cite_all(cls.vllm_source)) + "\n"
        return text



class ObservedRule(Rule):
    """A rule that reads what the walk of the tiny instance observed (``check_observed``).
    Without an instance it says ``without_instance`` as an inconclusive finding, or nothing
    where it is None (another rule already says why there is no instance)."""

    without_instance: ClassVar[str | None] = None

    def check(self, analysis: Analysis) -> list[Finding]:
        obs = analysis.observations
        if obs is None:
            return [self.inconclusive(self.without_instance)] if self.without_instance else []
        return self.check_observed(analysis, obs)

    def check_observed(self, analysis: Analysis, obs: Observations) -> list[Finding]:
        raise NotImplementedError

def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.strip("\n").splitlines())
