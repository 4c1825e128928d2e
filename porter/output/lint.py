"""transformers' own model linter (``transformers-mlinter``) over the original and the port.

The port must not add a finding of that linter: a rewrite that fixes vLLM's blockers while
teaching the code a new bad habit is not a port a model author can take back. Its rules are
called, not re-written here (``mlinter.analyze_file``, every rule enabled by default); this
module only runs it on both sides, matches the findings and says which of them matter to
vLLM and to loading.

Findings are matched per file and rule by their message, not by line: a rewrite moves lines.
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The rules whose findings change what vLLM or a loader does with the model, and why.
MATTERS: dict[str, str] = {
    "TRF004": "a tie_weights override is not what vLLM's loader calls: the head is tied (or not) by _tied_weights_keys",
    "TRF011": "pipeline parallelism replaces layers outside a stage with Identity; a forward reading their attributes fails there",
    "TRF013": "without post_init, weight init and the tied-weights setup of from_pretrained do not run",
    "TRF015": "tied weights that the config cannot switch off: a checkpoint with an untied head loads wrongly",
    "TRF025": "a mask built inside each layer is not the one the attention interface (vLLM's) is handed",
    "TRF048": "transformers 5 reads _tied_weights_keys as a dict; the 4.x list form is not tied in 5",
    "TRF049": "weights initialised in __init__ are lost on the meta device (transformers 5 and vLLM build there)",
    "TRF051": "branching on _attn_implementation bypasses the attention interface that vLLM's backend plugs into",
    "TRF052": "an *_ATTENTION_CLASSES table picks attention classes itself instead of the attention interface",
    "TRF056": ".item()/.tolist() in forward breaks torch.compile graphs (vLLM compiles the model)",
}


@dataclass
class Finding:
    file: str
    line: int
    rule: str
    message: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.rule, self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "rule": self.rule, "message": self.message, "matters": MATTERS.get(self.rule)}


def _beyond(these: list[Finding], those: list[Finding]) -> list[Finding]:
    """The findings of ``these`` left once each of ``those`` has cancelled one with its key."""
    left = collections.Counter(f.key for f in those)
    out = []
    for finding in these:
        if left[finding.key]:
            left[finding.key] -= 1
        else:
            out.append(finding)
    return out


@dataclass
class LintReport:
    available: bool
    version: str | None = None
    original: list[Finding] = field(default_factory=list)
    ported: list[Finding] = field(default_factory=list)
    error: str | None = None

    @property
    def introduced(self) -> list[Finding]:
        """Findings of the port that the original did not have (same file, rule and message)."""
        return _beyond(self.ported, self.original)

    @property
    def fixed(self) -> list[Finding]:
        """Findings of the original that the port no longer has."""
        return _beyond(self.original, self.ported)

    def to_dict(self) -> dict[str, Any]:
        return {"available": self.available, "version": self.version, "error": self.error,
                "original": [f.to_dict() for f in self.original], "ported": [f.to_dict() for f in self.ported],
                "introduced": [f.to_dict() for f in self.introduced], "fixed": [f.to_dict() for f in self.fixed]}


def lint_files(files: dict[str, str]) -> list[Finding]:
    """mlinter's findings on a set of model files (name -> text), laid out as one folder so
    that its companion-file rules (a modeling file's configuration) see both."""
    from mlinter import mlinter

    found: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="hfcheck-mlinter-") as tmp:
        root = Path(tmp)
        for name, text in files.items():
            if name.endswith(".py"):
                path = root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
        for name in sorted(n for n in files if n.endswith(".py")):
            path = root / name
            try:
                violations = mlinter.analyze_file(path, files[name])
            except SyntaxError:
                continue  # the port refuses unparsable code before it gets here
            for v in violations:
                found.append(Finding(name, int(v.line_number), str(v.rule_id), str(v.message).strip()))
    return found


def lint_port(original: dict[str, str], ported: dict[str, str] | None) -> LintReport:
    """The linter on the original's files and (for a rewrite) on the ported files; ``ported``
    None for a retarget, where no model code is written."""
    try:
        from importlib.metadata import version

        import mlinter  # noqa: F401 - presence check
    except ImportError:
        return LintReport(False, error="transformers-mlinter is not installed (pip install transformers-mlinter)")
    try:
        report = LintReport(True, version("transformers-mlinter"))
        report.original = lint_files(original)
        report.ported = lint_files(ported) if ported is not None else []
    except Exception as exc:  # noqa: BLE001 - the linter's own failure is reported, the port stands
        return LintReport(True, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return report
