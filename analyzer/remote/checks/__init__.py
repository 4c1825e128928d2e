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

from collections.abc import Iterable
from typing import Any

from hfcheck.analyzer.remote.ast_helpers import attention_by_hand, dispatch_names, is_call_to
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
from hfcheck.analyzer.remote.checks.moe import check_moe, counts_experts, looks_swapped, param_rank
from hfcheck.analyzer.remote.checks.packed_qkv import PACKED_NAME, check_fused_qkv
from hfcheck.analyzer.remote.checks.pipeline import check_pipeline
from hfcheck.analyzer.remote.checks.security import check_security
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.analyzer.remote.roles import Roles, auto_map_classes, find_roles

# The private names ``porter`` imported from ``checks.py`` before the split; porter now imports
# their public homes (``ast_helpers``, ``roles``, the family modules). Kept while porter is being
# edited elsewhere, so that in-flight code importing the old names still runs.
_is_call_to, _installed, _auto_map_classes, _PACKED_NAME = is_call_to, installed, auto_map_classes, PACKED_NAME
_counts_experts, _looks_swapped, _param_rank = counts_experts, looks_swapped, param_rank

FAMILIES = (files, attention, moe, pipeline, imports, layers, packed_qkv, security)

RULES: tuple[type[RemoteCodeRule], ...] = tuple(sorted((r for f in FAMILIES for r in f.RULES), key=lambda r: r.code))
"""Every static remote-code rule, in code order (``rules/remote_code.py`` adds HFC830)."""

__all__ = ["FAMILIES", "RULES", "CodeFinding", "RemoteCodeRule", "Roles", "attention_by_hand", "dispatch_names", "find_roles",
           "installed", "run_checks", "unguarded_imports",
           "_PACKED_NAME", "_auto_map_classes", "_counts_experts", "_installed", "_is_call_to", "_looks_swapped", "_param_rank"]


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
