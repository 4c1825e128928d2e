"""Remote code (``auto_map``): static compliance and safety checks, HFC800-HFC830.

The static rules (HFC800-825) are documented beside their checks, one module per check
family in ``analyzer/remote/checks/`` (``RemoteCodeRule``: each reads the static analysis of
``analysis.code``, the static findings ``analyse`` computes once, ``ast`` only, and turns the findings
of its own code into ``Finding`` s with ``details = {"file": ..., "line": ...}``). Models
without remote code get no finding from these rules. HFC830, here, reports the sandboxed
build, which runs only with ``--trust-remote-code``.
"""

from __future__ import annotations

from hfcheck.analyzer.findings.rule import Finding, Rule
from hfcheck.analyzer.remote.checks import RULES as STATIC_RULES


class SandboxedBuild(Rule):
    code = "HFC830"
    name = "remote-sandboxed-build"
    impact = "blocker"
    what = "With --trust-remote-code: the remote classes were built on the meta device in a time-limited, network-less subprocess, and what the code tried there."
    why = (
        "Building the model from its own classes lets hfcheck run the same graph analysis as for native models. "
        "A build that fails there (missing package, broken code) fails in vLLM too; operations the sandbox refused "
        "(network, processes, writes outside its folder) are what the code does on load."
    )
    example = "hfcheck scan ./my-model --trust-remote-code"
    fix = "Fix the error the build reports; remove network, process and file-system access from the modeling code."
    vllm_source = ("model_executor/models/transformers/base.py::Base._create_model",)

    def check(self, analysis) -> list[Finding]:
        result = getattr(analysis, "sandbox", None)
        if result is None:
            return []
        out: list[Finding] = []
        if result.timed_out:
            out.append(self.inconclusive(f"the sandboxed build was stopped: {result.error}"))
        elif not result.ok:
            out.append(self.failed(f"the remote code does not build: {result.error}", "Fix the error; vLLM loads the same classes."))
        else:
            out.append(self.passed(f"built the remote classes in the sandbox ({result.seconds:.1f} s, meta device, no network)"))
        if result.blocked:
            out.append(
                Finding(self.code, "fail", f"the sandbox refused {len(result.blocked)} operation(s) the code attempted: {'; '.join(result.blocked[:3])}",
                        "Remove network, process and file-system access from the modeling code.", "info", {"blocked": list(result.blocked)})
            )
        return out


REMOTE_CODE_RULES: tuple[type[Rule], ...] = (*STATIC_RULES, SandboxedBuild)
"""In report order (code order); registry.RULES appends these."""
