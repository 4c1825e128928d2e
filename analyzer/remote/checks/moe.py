"""Mixture of experts, HFC808: experts in a child named ``experts`` vLLM can replace with FusedMoE."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from hfcheck.analyzer.remote.ast_helpers import is_call_to
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex, FileIndex
from hfcheck.analyzer.remote.roles import Roles
from hfcheck.analyzer.terms.vocabulary import EXPERT_COUNT_FIELDS

# --------------------------------------------------------------------------- HFC808: MoE experts


_EXPERT_COUNT = re.compile(r"experts\b|experts$|^n_?experts", re.IGNORECASE)


def counts_experts(node: ast.AST) -> bool:
    """A ``range(...)`` whose bound is an expert count (``config.num_experts``, ``self.n_routed_experts``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "range":
            for arg in sub.args:
                for n in ast.walk(arg):
                    name = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else None
                    if name and (name in EXPERT_COUNT_FIELDS or _EXPERT_COUNT.search(name)):
                        return True
    return False


def param_rank(file: FileIndex, value: ast.expr) -> int | None:
    """Rank of ``nn.Parameter(torch.empty(a, b, c))`` (or ``torch.zeros((a, b, c))``)."""
    if not (isinstance(value, ast.Call) and is_call_to(file, value, "Parameter")) or not value.args:
        return None
    inner = value.args[0]
    if not isinstance(inner, ast.Call):
        return None
    args = [a for a in inner.args if not isinstance(a, ast.Starred)]
    if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
        return len(args[0].elts)
    if any(isinstance(a, ast.Starred) for a in inner.args):
        return None
    return len(args) if args else None


def check_moe(index: CodeIndex, roles: Roles, config: dict[str, Any]) -> Iterator[CodeFinding]:
    declared = any(isinstance(n := config.get(f), int) and n > 0 for f in EXPERT_COUNT_FIELDS) if isinstance(config, dict) else False
    found_any = False
    for cls in index.classes:
        if not index.is_module(cls):
            continue
        for attr, assigns in cls.self_assigns.items():
            for value, line, method in assigns:
                if method != "__init__" or not isinstance(value, ast.Call):
                    continue
                file = index.file_of(cls)
                is_list = is_call_to(file, value, "ModuleList")
                inner = index.instantiated_classes(cls, value)
                expertish = (is_list and (counts_experts(value) or any(re.search(r"Expert(?!s)", c.name) for c in inner))) or (
                    not is_list and any(re.search(r"experts$", c.name, re.IGNORECASE) for c in inner)
                ) or attr == "experts"
                if not expertish:
                    continue
                found_any = True
                what = f"nn.ModuleList of {inner[0].name}" if is_list and inner else (inner[0].name if inner else ast.unparse(value.func))
                if attr != "experts":
                    yield CodeFinding("HFC808", "fail", cls.file, line, f"{cls.name}.{attr} holds the experts ({what}) but vLLM only replaces a child named `experts`: they run as plain PyTorch, unfused",
                                      f"Rename `self.{attr}` to `self.experts` (and the checkpoint keys with it).")
                    continue
                if is_list:
                    yield CodeFinding("HFC808", "pass", cls.file, line, f"{cls.name}.experts is an nn.ModuleList: replaced by FusedMoE")
                    continue
                if not inner:
                    continue
                yield from _check_experts_class(index, cls, inner[0], line)
    if declared and not found_any:
        yield CodeFinding("HFC808", "warn", None, None, "config.json declares experts but no experts module was found in the code",
                          "Hold the experts in a child named `experts` (nn.ModuleList, or 3-D parameters with forward(hidden_states, top_k_index, top_k_weights)).")


def _check_experts_class(index: CodeIndex, block: ClassInfo, experts: ClassInfo, line: int) -> Iterator[CodeFinding]:
    bad = False
    for c in index.mro(experts):
        file = index.file_of(c)
        for attr, assigns in c.self_assigns.items():
            for value, aline, method in assigns:
                if method != "__init__":
                    continue
                rank = param_rank(file, value)
                if rank is not None and rank != 3:
                    bad = True
                    yield CodeFinding("HFC808", "fail", c.file, aline, f"{experts.name}.{attr} is a {rank}-D parameter: vLLM replaces experts only when every parameter is 3-D [experts, out, in]",
                                      "Store expert weights as 3-D tensors (gate_up_proj [E, 2I, H], down_proj [E, H, I]); fold biases away or keep them outside `experts`.")
                elif isinstance(value, ast.Call) and (is_call_to(file, value, "Linear") or is_call_to(file, value, "Embedding")):
                    bad = True
                    yield CodeFinding("HFC808", "fail", c.file, aline, f"{experts.name}.{attr} is a {ast.unparse(value.func)} (2-D weight) inside the experts module",
                                      "Keep only 3-D expert parameters in `experts`.")
    found = index.method(experts, "forward")
    if found is not None:
        owner, forward = found
        params = [a.arg for a in forward.args.args[1:]]
        conventional = ["hidden_states", "top_k_index", "top_k_weights"]
        if forward.args.vararg is not None:
            pass  # forward(*args): takes anything
        elif len(params) < 3 or len(params) - len(forward.args.defaults) > 3:
            bad = True
            yield CodeFinding("HFC808", "fail", owner.file, forward.lineno, f"{experts.name}.forward({', '.join(params)}) cannot be called as experts(hidden_states, top_k_index, top_k_weights)",
                              "Give the experts forward the signature (hidden_states, top_k_index, top_k_weights).")
        elif looks_swapped(params[1], params[2]):
            bad = True
            yield CodeFinding("HFC808", "fail", owner.file, forward.lineno, f"{experts.name}.forward takes ({', '.join(params[:3])}): weights before indices, but vLLM passes (hidden_states, top_k_index, top_k_weights)",
                              "Reorder the parameters to (hidden_states, top_k_index, top_k_weights).")
        elif params[:3] != conventional:
            yield CodeFinding("HFC808", "info", owner.file, forward.lineno, f"{experts.name}.forward takes ({', '.join(params[:3])}); vLLM passes (hidden_states, top_k_index, top_k_weights) positionally")
    if not bad:
        yield CodeFinding("HFC808", "pass", block.file, line, f"{block.name}.experts ({experts.name}) holds 3-D parameters with the (hidden_states, top_k_index, top_k_weights) forward")


def looks_swapped(second: str, third: str) -> bool:
    weights = re.compile(r"weight|prob|score|gate", re.IGNORECASE)
    indices = re.compile(r"idx|index|indices|ids|selected|expert", re.IGNORECASE)
    return bool(weights.search(second) and indices.search(third) and not weights.search(third))


# --------------------------------------------------------------------------- the codes, documented


class ExpertsLayout(RemoteCodeRule):
    code = "HFC808"
    name = "remote-moe-experts-layout"
    impact = "speed"
    what = "MoE experts live in a child named `experts` that is an nn.ModuleList or holds only 3-D parameters, with forward(hidden_states, top_k_index, top_k_weights)."
    why = (
        "vLLM replaces exactly that child with its FusedMoE kernel and calls it as experts(x, ids, weights). "
        "Experts under another name, with 2-D parameters (biases, Linear layers) or another argument order stay "
        "plain PyTorch: correct but much slower, and no expert parallelism."
    )
    example = "self.moe_experts = nn.ModuleList([Expert(config) for _ in range(config.num_experts)])"
    fix = "self.experts = MyExperts(config)   # gate_up_proj [E, 2I, H], down_proj [E, H, I]; forward(hidden_states, top_k_index, top_k_weights)"
    vllm_source = (
        "model_executor/models/transformers/moe.py::MoEMixin.recursive_replace",
        "model_executor/models/transformers/fusers/moe.py::MoEBlockFuser._match_experts",
    )
    none = "no mixture-of-experts block in the code"
    observed_by = "HFC401"


RULES = (ExpertsLayout,)
