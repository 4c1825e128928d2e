"""The port's result, and the results its stages return: ``assemble`` makes the one of the others.

Each stage of ``orchestrate.port`` (the reference run, the retarget search and folder, the
rewrite, its writing, its proof, the re-scan) returns what it found as one small frozen record;
``PortStages`` holds those a port reached, and ``assemble`` is the one place ``PortResult``'s
fields are filled (its JSON, ``render_text`` and PORT.md read them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from hfcheck.porter.output.weights import quantized_tensors
from hfcheck.shared.command import EXIT_CLEAN as EXIT_OK
from hfcheck.shared.command import EXIT_FINDINGS as EXIT_REFUSED  # a refused port is a finding

if TYPE_CHECKING:
    from hfcheck.porter.output.served import Served
    from hfcheck.porter.reference.establish import Reference
    from hfcheck.porter.retarget.stage import RetargetOutcome
    from hfcheck.porter.rewrite.state import PortState


@dataclass
class PortResult:
    status: str  # "ported" | "nothing_to_port" | "served_natively" | "refused" | "failed"
    message: str
    src: str
    out: str | None
    model: dict[str, Any] = field(default_factory=dict)
    path: str = "none"  # "retarget" | "rewrite" | "refused" | "none"
    reference: dict[str, Any] | None = None
    retarget: dict[str, Any] | None = None
    served: dict[str, Any] | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    not_ported: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, Any] | None = None
    proof: dict[str, Any] | None = None
    rescan: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    serve: dict[str, Any] | None = None
    lint: dict[str, Any] | None = None  # transformers-mlinter on the original and the port (lint.py)
    quantized: str | None = None  # what the port did with the quantized tensors its config declares (None: float weights)

    @property
    def exit_code(self) -> int:
        if self.status in ("ported", "nothing_to_port", "served_natively"):
            return EXIT_OK if (self.serve is None or self.serve.get("ok")) else EXIT_REFUSED
        return EXIT_REFUSED

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["exit_code"] = self.exit_code
        return out


@dataclass(frozen=True)
class Verdict:
    """Where the port ended and why: PortResult's status and message."""

    status: str
    message: str


@dataclass(frozen=True)
class NativeCheck:
    """Whether vLLM's own class of the architecture computes the model (``served_natively``); fits None: vLLM has no such class."""

    fits: bool | None = None
    why: str = ""

    def model_facts(self) -> dict[str, Any]:
        if self.fits is None:
            return {}
        return {"vllm_native": self.fits} if self.fits else {"vllm_native": False, "vllm_native_mismatch": self.why}


@dataclass(frozen=True)
class ReferenceStage:
    """The original's run in its own release; reference None or refusal set: nothing can be proven against it."""

    reference: Reference | None
    summary: dict[str, Any] | None = None
    seconds: float | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class SearchStage:
    """The retarget search (None for --path rewrite) and its record."""

    outcome: RetargetOutcome | None
    record: dict[str, Any]
    seconds: float


@dataclass(frozen=True)
class RetargetStage:
    """The native folder written (or why not) and what was proven and served; record None: the search's record stands."""

    verdict: Verdict
    record: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    proof: dict[str, Any] | None = None
    served: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """A construct the transformers backend cannot keep (ALiBi), where it is and where the dataflow sees it."""

    message: str
    not_ported: list[dict[str, Any]]


@dataclass(frozen=True)
class RewriteStage:
    """The codemods' work on the recorded state: what changed and what they could not rewrite."""

    state: PortState
    changed: frozenset[str]
    not_ported: list[dict[str, Any]]
    seconds: float


@dataclass(frozen=True)
class PortedCode:
    """What the rewritten output declares: its auto_map, the config defaults, its config.json and the changes (with the findings they fix)."""

    auto_map: dict[str, Any]
    defaults: dict[str, Any]
    config: dict[str, Any]
    changes: list[dict[str, Any]]


@dataclass(frozen=True)
class WriteStage:
    """The rewritten folder's files and its checkpoint conversion; failure: why the checkpoint could not be converted."""

    files: list[str]
    weights: dict[str, Any] | None = None
    failure: str | None = None


@dataclass(frozen=True)
class ProofStage:
    """The rewrite against the original's run (and on the converted checkpoint); failure: what it does not reproduce."""

    proof: dict[str, Any]
    seconds: float
    failure: str | None = None


@dataclass(frozen=True)
class ServedStage:
    """The output's re-scan and how vLLM serves it."""

    rescan: list[dict[str, Any]]
    served: Served
    seconds: float


@dataclass(frozen=True)
class PortStages:
    """What the stages returned, up to where the port ended; ``assemble`` makes the PortResult of it."""

    src: str
    out: str | None
    model: dict[str, Any]
    verdict: Verdict
    path: str = "none"
    native: NativeCheck = NativeCheck()
    reference: ReferenceStage | None = None
    search: SearchStage | None = None
    retarget: RetargetStage | None = None
    refusal: Refusal | None = None
    rewrite: RewriteStage | None = None
    code: PortedCode | None = None
    written: WriteStage | None = None
    proof: ProofStage | None = None
    served: ServedStage | None = None
    total: float | None = None
    lint: dict[str, Any] | None = None
    source_config: dict[str, Any] = field(default_factory=dict)  # the original's config.json


def assemble(stages: PortStages) -> PortResult:
    """The PortResult of the stages' results: the one place its fields are filled."""
    s = stages
    seconds: dict[str, float] = {}
    if s.reference is not None and s.reference.seconds is not None:
        seconds["reference"] = s.reference.seconds
    if s.search is not None:
        seconds["retarget_search"] = s.search.seconds
    if s.retarget is not None:
        seconds.update(s.retarget.seconds)
    if s.rewrite is not None:
        seconds["rewrite"] = s.rewrite.seconds
    if s.proof is not None:
        seconds["proof"] = s.proof.seconds
    if s.served is not None:
        seconds["rescan"] = s.served.seconds
    if s.total is not None:
        seconds["total"] = s.total
    retarget = s.search.record if s.search is not None else None
    if s.retarget is not None and s.retarget.record is not None:
        retarget = s.retarget.record
    not_ported = s.refusal.not_ported if s.refusal is not None else (s.rewrite.not_ported if s.rewrite is not None else [])
    if s.retarget is not None:
        weights, proof, served, files = s.retarget.weights, s.retarget.proof, s.retarget.served, list(s.retarget.files)
    else:
        weights = s.written.weights if s.written is not None else None
        proof = s.proof.proof if s.proof is not None else None
        served = s.served.served.to_dict() if s.served is not None else None
        files = list(s.written.files) if s.written is not None else []
    return PortResult(
        s.verdict.status, s.verdict.message, s.src, s.out, {**s.model, **s.native.model_facts()}, path=s.path,
        reference=s.reference.summary if s.reference is not None else None, retarget=retarget, served=served,
        changes=s.code.changes if s.code is not None else [], not_ported=not_ported, weights=weights, proof=proof,
        rescan=s.served.rescan if s.served is not None else [], files=files, seconds=seconds, lint=s.lint,
        quantized=quantized_tensors(s.code.config, s.rewrite.state.weight_rules) if s.code is not None and s.rewrite is not None
        else (quantized_tensors(s.source_config, None) if s.retarget is not None else None),
    )
