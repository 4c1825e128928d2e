"""Static compliance and safety checks on remote modeling code (``ast`` only, nothing executed).

Every check reads the ``CodeIndex`` of the files ``auto_map`` names and yields
``CodeFinding`` s with a stable ``HFC8xx`` code, the file and line, a message and a fix.
``status`` is ``fail`` / ``warn`` / ``info`` for problems and ``pass`` for the
(one-line) confirmation a rule prints when nothing is wrong; ``inconclusive`` when the
code could not be read.

One module per check family, each with the rules that document its codes beside its checks:

- ``files``: HFC800 (the files were read);
- ``attention``: HFC801-807 (interface dispatch, scaling, by-hand attention, kwargs, backend
  flag, layer_idx, is_causal);
- ``moe``: HFC808 (experts layout);
- ``pipeline``: HFC809-810 (ModuleLists, submodule reads);
- ``imports``: HFC811-812, HFC814 (removed transformers APIs, packages the serving environment lacks, `.cuda()`);
- ``layers``: HFC815 (long convolutions, state-space mixers, linear attention: no softmax);
- ``packed_qkv``: HFC813 (the packed projection's split);
- ``security``: HFC820-825 (red flags).

Shared pieces are public modules: ``analyzer/remote/ast_helpers.py`` (AST readings) and
``analyzer/remote/roles.py`` (which class plays which part).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from hfcheck.analyzer.remote.ast_helpers import attention_by_hand, dispatch_names
from hfcheck.analyzer.remote.checks import (
    attention,
    files,
    imports,
    layers,
    moe,
    packed_qkv,
    pipeline,
    security,
)
from hfcheck.analyzer.remote.checks.attention import (
    check_attention,
    check_backend_flag,
    check_forward_arguments,
    check_hand_written,
    check_kwargs,
)
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.checks.files import check_parsed
from hfcheck.analyzer.remote.checks.imports import (
    check_device_placement,
    check_packages,
    check_removed_apis,
    installed,
    unguarded_imports,
)
from hfcheck.analyzer.remote.checks.layers import check_layer_kinds
from hfcheck.analyzer.remote.checks.moe import check_moe
from hfcheck.analyzer.remote.checks.packed_qkv import check_fused_qkv
from hfcheck.analyzer.remote.checks.pipeline import check_pipeline
from hfcheck.analyzer.remote.checks.security import check_security
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.analyzer.remote.roles import Roles, find_roles
from hfcheck.analyzer.remote.source import has_remote_code
from hfcheck.analyzer.terms.vocabulary import EXPERT_COUNT_FIELDS

FAMILIES = (files, attention, moe, pipeline, imports, layers, packed_qkv, security)

RULES: tuple[type[RemoteCodeRule], ...] = tuple(sorted((r for f in FAMILIES for r in f.RULES), key=lambda r: r.code))
"""Every static remote-code rule, in code order (``rules/remote_code.py`` adds HFC830)."""

__all__ = ["FAMILIES", "RULES", "CodeFinding", "RemoteCodeRule", "Roles", "attention_by_hand", "dispatch_names", "find_roles",
           "analyse_code", "code_findings", "installed", "run_checks", "static_findings", "unguarded_imports"]


def run_checks(index: CodeIndex, config: dict[str, Any], missing: Iterable[str] = ()) -> list[CodeFinding]:
    config = config if isinstance(config, dict) else {}
    missing = tuple(missing)
    roles = find_roles(index, config)
    findings: list[CodeFinding] = list(check_parsed(index, config, missing))
    if not any(f.tree is not None for f in index.files.values()):
        return findings
    complete = not missing and all(f.tree is not None for f in index.files.values())
    steps = (
        lambda: check_attention(index, roles, complete),
        lambda: check_hand_written(index, roles),
        lambda: check_kwargs(index, roles),
        lambda: check_forward_arguments(index, roles),
        lambda: check_backend_flag(index, roles),
        lambda: check_moe(index, roles, config),
        lambda: check_pipeline(index, roles),
        lambda: check_removed_apis(index),
        lambda: check_packages(index),
        lambda: check_device_placement(index),
        lambda: check_fused_qkv(index, roles),
        lambda: check_layer_kinds(index),
        lambda: check_security(index),
    )
    for step in steps:
        try:
            findings.extend(step())
        except RecursionError:  # pathological nesting in a hostile file
            findings.append(CodeFinding("HFC800", "inconclusive", None, None, "a check gave up: the code nests too deeply to walk"))
    return sorted(findings, key=lambda f: (f.code, f.file or "", f.line or 0))


_CACHE: OrderedDict[tuple, list[CodeFinding]] = OrderedDict()
_CACHE_SIZE = 16


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
