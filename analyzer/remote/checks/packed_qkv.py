"""HFC813: one q/k/v projection split the only way vLLM shards it, ``.split((q, kv, kv))``."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from hfcheck.analyzer.remote.ast_helpers import is_call_to, is_self_attr
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex, FileIndex
from hfcheck.analyzer.remote.roles import Roles

# --------------------------------------------------------------------------- HFC813: fused QKV


PACKED_NAME = re.compile(r"qkv|query_key_value|c_attn|in_proj|w_pack", re.IGNORECASE)


def check_fused_qkv(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    for name, (cls, _) in roles.attention.items():
        linears = []
        for c in index.mro(cls):
            for attr, assigns in c.self_assigns.items():
                for value, line, method in assigns:
                    if method == "__init__" and is_call_to(index.file_of(c), value, "Linear"):
                        linears.append((attr, line, c))
        names = [a for a, _, _ in linears]
        packed = [(a, line, c) for a, line, c in linears if PACKED_NAME.search(a)]
        if not packed or any(re.fullmatch(r"(q|query)(_proj)?", a) for a in names):
            continue
        attr, line, _ = packed[0]
        found = index.method(cls, "forward")
        if found is None:
            continue
        owner, forward = found
        file = index.file_of(owner)
        derived = _derived_names(forward, attr)
        splits = [
            n for n in ast.walk(forward)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "split"
            and n.args and isinstance(n.args[0], (ast.Tuple, ast.List)) and len(n.args[0].elts) == 3
            and _reads(n.func.value, derived, attr)
        ]
        if len(splits) == 1:
            yield CodeFinding("HFC813", "pass", owner.file, splits[0].lineno, f"{name}.{attr} is split with .split((q, kv, kv)): vLLM shards it as a packed QKV projection")
            continue
        how = _how_split(file, forward, derived, attr)
        call_line = next((n.lineno for n in ast.walk(forward) if isinstance(n, ast.Call) and is_self_attr(n.func, attr)), forward.lineno)
        yield CodeFinding("HFC813", "fail", owner.file, call_line,
                          f"{name}.{attr} packs q, k and v in one projection split {how}: vLLM reads only `.split((q_size, kv_size, kv_size), dim=-1)`, so it stays one replicated GEMM (no TP sharding, no qkv fusion)",
                          f"Split it as `q, k, v = self.{attr}(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)` with int sizes, or use separate q_proj/k_proj/v_proj.")


def _derived_names(forward: ast.AST, attr: str) -> set[str]:
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(forward):
            if isinstance(node, ast.Assign) and _reads(node.value, names, attr):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id not in names:
                            names.add(n.id)
                            changed = True
    return names


def _reads(node: ast.AST, names: set[str], attr: str) -> bool:
    return any((isinstance(n, ast.Name) and n.id in names) or is_self_attr(n, attr) for n in ast.walk(node))


def _how_split(file: FileIndex, forward: ast.AST, derived: set[str], attr: str) -> str:
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and _reads(node, derived, attr):
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            name = file.call_name(node) or ""
            if method in ("chunk", "unbind", "split") or name.endswith((".chunk", ".unbind", ".split", "rearrange")):
                return f"with .{method or name.rpartition('.')[2]}(...) (line {node.lineno})"
    for node in ast.walk(forward):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in derived:
            return f"by indexing/slicing (line {node.lineno})"
    return "in a way vLLM does not read"


# --------------------------------------------------------------------------- the codes, documented


class PackedQKVUnreadable(RemoteCodeRule):
    code = "HFC813"
    name = "remote-packed-qkv"
    impact = "speed"
    what = "A single q/k/v projection (Wqkv, qkv_proj, query_key_value, c_attn, W_pack) is split with `.split((q, kv, kv))`, the only form vLLM shards."
    why = "vLLM turns such a projection into QKVParallelLinear only through that split; `.chunk(3)`, `.view(..., 3, ...)` or indexing leave one replicated GEMM (no TP sharding of attention, no fusion)."
    example = "q, k, v = self.Wqkv(x).chunk(3, dim=-1)"
    fix = "q, k, v = self.Wqkv(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)   # int sizes; or separate q/k/v projections"
    vllm_source = (
        "model_executor/models/transformers/fusers/packed_qkv.py::PackedQKVFuser.match",
        "model_executor/models/transformers/fusers/packed_qkv.py::PackedQKVFuser._packed_sizes",
    )
    none = "no packed q/k/v projection"
    observed_by = "HFC301"


RULES = (PackedQKVUnreadable,)
