"""Remote code (``auto_map``): static analysis by default, sandboxed execution only on request.

- ``static_findings(source)``: parse every file of ``source.code_files`` once with ``ast``
  (``index.py``) and run the HFC8xx checks (``checks/``, one module per check family, the
  shared readings in ``ast_helpers.py`` and ``roles.py``) on it. Nothing is imported or
  executed; the result is cached per code text, so every rule and the report share one run.
- ``code_findings(source)``: the report's ``code_findings[{code, file, line, message}]``
  (problems only: fail / warn / info / inconclusive).
- ``sandbox.run_sandboxed(source)``: only for ``--trust-remote-code``: builds the model from
  the remote classes in a separate, time-limited, network-less Python process and brings
  back the same observations a native model gets.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from hfcheck.analyzer.remote.checks import CodeFinding, run_checks
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.analyzer.vocabulary import EXPERT_COUNT_FIELDS

__all__ = ["CodeFinding", "CodeIndex", "analyse_code", "code_findings", "has_remote_code", "static_findings"]

_CACHE: OrderedDict[tuple, list[CodeFinding]] = OrderedDict()
_CACHE_SIZE = 16


def has_remote_code(source) -> bool:
    config = source.config if isinstance(source.config, dict) else {}
    return bool(source.code_files) or bool(config.get("auto_map"))


def analyse_code(code_files: dict[str, str], config: dict[str, Any] | None = None, missing: tuple[str, ...] = ()) -> list[CodeFinding]:
    """Every static finding (passes included) for these files; cached on their text."""
    config = config if isinstance(config, dict) else {}
    key = (tuple(sorted(code_files.items())), json.dumps(config.get("auto_map"), sort_keys=True, default=str),
           json.dumps({k: config.get(k) for k in EXPERT_COUNT_FIELDS}, default=str), tuple(missing))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    findings = run_checks(CodeIndex(dict(code_files)), config, missing)
    _CACHE[key] = findings
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return findings


def static_findings(source) -> list[CodeFinding] | None:
    """The static findings for a ModelSource, or None when it carries no remote code."""
    if not has_remote_code(source):
        return None
    return analyse_code(source.code_files, source.config, tuple(source.missing_code))


def code_findings(source) -> list[dict[str, Any]]:
    """``[{code, file, line, message, status, remediation}]``: every problem the static
    analysis found, in check order (empty for models without remote code)."""
    findings = static_findings(source) or []
    return [
        {"code": f.code, "file": f.file, "line": f.line, "message": f.message, "status": f.status, "remediation": f.remediation}
        for f in findings
        if f.status != "pass"
    ]
