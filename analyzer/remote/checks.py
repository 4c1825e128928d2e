"""Static compliance and safety checks on remote modeling code (``ast`` only, nothing executed).

Every check reads the ``CodeIndex`` of the files ``auto_map`` names and yields
``CodeFinding`` s with a stable ``HFC8xx`` code, the file and line, a message and a fix.
``status`` is ``fail`` / ``warn`` / ``info`` for problems and ``pass`` for the
(one-line) confirmation a rule prints when nothing is wrong; ``inconclusive`` when the
code could not be read. The rules in ``analyzer/rules/remote_code.py`` document each code.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from hfcheck.analyzer.remote import removed_apis
from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex, FileIndex
from hfcheck.analyzer.remote.serving import serving_environment

# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class CodeFinding:
    code: str
    status: str  # "pass" | "fail" | "warn" | "info" | "inconclusive"
    file: str | None
    line: int | None
    message: str
    remediation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Roles:
    """Which local classes play which part, as vLLM will meet them."""

    auto_classes: dict[str, ClassInfo]  # auto_map key -> local class
    base_model: ClassInfo | None
    layer_lists: list[tuple[str, int, str]]  # (attr, line, file) of nn.ModuleList assignments in the base model
    decoder_layers: list[ClassInfo]
    attention: dict[str, tuple[ClassInfo, str | None]]  # class name -> (class, attr in the decoder layer)


# --------------------------------------------------------------------------- helpers

EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
ATTENTION_ATTRS = ("self_attn", "attn", "attention", "self_attention", "attn_layer")
_ATTENTION_NAME = re.compile(r"Attention|Attn", re.IGNORECASE)


def _is_self_attr(node: ast.AST, attr: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _is_interface_lookup(node: ast.expr | None) -> bool:
    """vLLM's test, verbatim: ``ALL_ATTENTION_FUNCTIONS[...]`` or ``ALL_ATTENTION_FUNCTIONS.x(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name) and node.value.id == "ALL_ATTENTION_FUNCTIONS"


def dispatch_names(funcdef: ast.AST) -> dict[str, int]:
    """Names bound from the attention interface in ``funcdef`` -> line of the binding."""
    names: dict[str, int] = {}
    for node in ast.walk(funcdef):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_interface_lookup(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names.setdefault(t.id, node.lineno)
    return names


def dispatch_calls(funcdef: ast.AST) -> list[ast.Call]:
    names = dispatch_names(funcdef)
    return [n for n in ast.walk(funcdef) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names]


def _has_kwargs_expansion(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def _accepts_kwargs(funcdef: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return funcdef.args.kwarg is not None


def _calls_to(file: FileIndex, node: ast.AST, predicate: Callable[[str], bool]) -> Iterator[tuple[ast.Call, str]]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = file.call_name(sub)
            if name and predicate(name):
                yield sub, name


def _is_call_to(file: FileIndex, value: ast.expr, suffix: str) -> bool:
    if not isinstance(value, ast.Call):
        return False
    name = file.call_name(value) or ""
    return name == suffix or name.endswith("." + suffix)


def _self_attr_names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if _is_self_attr(n)}


def _location_status(file: FileIndex, node: ast.AST) -> str:
    """Red flags that run on import are failures; inside functions, warnings."""
    return "fail" if file.import_time(node) else "warn"


def _where(file: FileIndex, node: ast.AST) -> str:
    if file.import_time(node):
        return "at import time"
    func = file.enclosing_function(node)
    cls = file.enclosing_class(node)
    if func is not None and cls is not None:
        return f"in {cls.name}.{func.name}"
    return f"in {func.name}()" if func is not None else ""


# --------------------------------------------------------------------------- roles


def _auto_map_classes(index: CodeIndex, config: dict[str, Any]) -> dict[str, ClassInfo]:
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    out: dict[str, ClassInfo] = {}
    if not isinstance(auto_map, dict):
        return out
    for key, value in auto_map.items():
        if not isinstance(key, str):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str) or "." not in item:
                continue
            body = item.partition("--")[2] if "--" in item else item
            module, _, cls = body.rpartition(".")
            file = index.by_module.get(module.rpartition(".")[2])
            if file is not None and cls in file.classes:
                out.setdefault(key, file.classes[cls])
    return out


def _module_lists(index: CodeIndex, cls: ClassInfo) -> list[tuple[str, ast.expr, int, ClassInfo]]:
    """``self.x = nn.ModuleList(...)`` in ``cls.__init__`` (and its local bases), in source order."""
    out: list[tuple[str, ast.expr, int, ClassInfo]] = []
    for c in index.mro(cls):
        for attr, assigns in c.self_assigns.items():
            for value, line, method in assigns:
                if method == "__init__" and _is_call_to(index.file_of(c), value, "ModuleList"):
                    if not any(a == attr for a, _, _, _ in out):
                        out.append((attr, value, line, c))
    order = {id(c): i for i, c in enumerate(index.mro(cls))}
    return sorted(out, key=lambda item: (-order[id(item[3])], item[2]))


def find_roles(index: CodeIndex, config: dict[str, Any]) -> Roles:
    autos = _auto_map_classes(index, config)
    base = autos.get("AutoModel")
    if base is None:
        causal = next((c for k, c in autos.items() if k.startswith("AutoModelFor")), None)
        if causal is not None:
            for attr in ("model", "transformer", "backbone", "language_model"):
                found = index.self_assign(causal, attr)
                if found is not None:
                    inst = index.instantiated_classes(found[0], found[1])
                    if inst:
                        base = inst[0]
                        break
    if base is None:
        candidates = [c for c in index.classes if index.is_module(c) and any(index.instantiated_classes(c, v) for _, v, _, _ in _module_lists(index, c))]
        base = next((c for c in candidates if not c.name.endswith(("ForCausalLM", "LMHeadModel"))), None) or (candidates[0] if candidates else None)
    lists: list[tuple[str, int, str]] = []
    layers: list[ClassInfo] = []
    if base is not None:
        for attr, value, line, owner in _module_lists(index, base):
            lists.append((attr, line, owner.file))
            for cls in index.instantiated_classes(owner, value):
                if not any(cls is c for c in layers):
                    layers.append(cls)
    attention: dict[str, tuple[ClassInfo, str | None]] = {}
    for layer in layers:
        for c in index.mro(layer):
            for attr, assigns in c.self_assigns.items():
                for value, _, method in assigns:
                    if method != "__init__":
                        continue
                    for cls in index.instantiated_classes(c, value):
                        if attr in ATTENTION_ATTRS or _ATTENTION_NAME.search(cls.name):
                            attention.setdefault(cls.name, (cls, attr))
    # a wrapper (norm -> attention -> norm) that does not dispatch itself: look one level in
    for name, (cls, attr) in list(attention.items()):
        found = index.method(cls, "forward")
        if found is None or dispatch_names(found[1]):
            continue
        inner = [
            c
            for owner in index.mro(cls)
            for a, assigns in owner.self_assigns.items()
            for value, _, method in assigns
            if method == "__init__"
            for c in index.instantiated_classes(owner, value)
            if (a in ATTENTION_ATTRS or _ATTENTION_NAME.search(c.name)) and c is not cls
        ]
        dispatching = [c for c in inner if (m := index.method(c, "forward")) and dispatch_names(m[1])]
        if dispatching:
            del attention[name]
            for c in dispatching:
                attention.setdefault(c.name, (c, None))
    if not attention:
        for cls in index.classes:
            if _ATTENTION_NAME.search(cls.name) and index.is_module(cls) and "forward" in cls.methods and not index.is_pretrained_model(cls):
                attention.setdefault(cls.name, (cls, None))
    return Roles(autos, base, lists, layers, attention)


# --------------------------------------------------------------------------- HFC800: files parsed


def check_parsed(index: CodeIndex, config: dict, missing: Iterable[str]) -> Iterator[CodeFinding]:
    missing = list(missing)
    for file in index.files.values():
        if file.tree is None:
            yield CodeFinding("HFC800", "fail", file.path, file.error_line, f"{file.path} does not parse ({file.error}); transformers cannot import it either",
                              "Fix the syntax error; the file must be valid Python for the Python version vLLM runs on.")
    for line in missing:
        yield CodeFinding("HFC800", "inconclusive", None, None, f"remote code not available: {line}")
    if not index.files and not missing:
        yield CodeFinding("HFC800", "inconclusive", None, None, "config.json has auto_map but no code file could be read")
    parsed = [f for f in index.files.values() if f.tree is not None]
    if parsed and not missing and len(parsed) == len(index.files):
        yield CodeFinding("HFC800", "pass", None, None, f"read {len(parsed)} remote-code file(s) with ast only (nothing imported or executed): {', '.join(index.files)}")


# --------------------------------------------------------------------------- HFC801-807: attention


def check_attention(index: CodeIndex, roles: Roles, complete: bool = True) -> Iterator[CodeFinding]:
    """HFC801 dispatch, HFC802 scaling, HFC806 layer_idx, HFC807 is_causal."""
    if not roles.attention and not complete:
        return  # the attention may live in a file that could not be read (HFC800 says which)
    if not roles.attention:
        yield CodeFinding("HFC801", "fail", None, None, "no attention module found in the remote code (no *Attention class used by the decoder layers)",
                          "Give each decoder layer one attention module whose forward dispatches through ALL_ATTENTION_FUNCTIONS.")
        return
    reported: set[tuple[str | None, int | None]] = set()
    for name, (cls, _) in roles.attention.items():
        for finding in _check_layer_idx(index, cls):
            if finding.status == "pass" or (finding.file, finding.line) not in reported:
                reported.add((finding.file, finding.line))
                yield finding  # a subclass sharing its parent's __init__ is reported once
        yield from _check_is_causal(index, cls)
        found = index.method(cls, "forward")
        if found is None:
            external = index.external_bases(cls)
            yield CodeFinding("HFC801", "info", cls.file, cls.line, f"{name}.forward is inherited from {', '.join(external) or 'a base class'}; not checked here")
            continue
        owner, forward = found
        names = dispatch_names(forward)
        calls = dispatch_calls(forward)
        if not names:
            yield CodeFinding("HFC801", "fail", owner.file, forward.lineno,
                              f"{name}.forward does not dispatch through ALL_ATTENTION_FUNCTIONS: vLLM finds no attention to serve in these layers",
                              "Bind `attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)` and call it once.")
        elif len(calls) != 1:
            line = calls[1].lineno if len(calls) > 1 else forward.lineno
            yield CodeFinding("HFC801", "fail", owner.file, line,
                              f"{name}.forward calls the attention interface {len(calls)} times (vLLM needs exactly one call)",
                              "Call the bound attention function exactly once per forward.")
        else:
            call = calls[0]
            idiom = "get_interface" if any(
                isinstance(n, ast.Attribute) and n.attr == "get_interface" and isinstance(n.value, ast.Name) and n.value.id == "ALL_ATTENTION_FUNCTIONS"
                for n in ast.walk(forward)
            ) else "ALL_ATTENTION_FUNCTIONS[...]"
            yield CodeFinding("HFC801", "pass", owner.file, call.lineno, f"{name} dispatches through ALL_ATTENTION_FUNCTIONS ({idiom}), once")
            yield from _check_scaling(index, cls, owner, call)


def _check_scaling(index: CodeIndex, cls: ClassInfo, owner: ClassInfo, call: ast.Call) -> Iterator[CodeFinding]:
    for keyword, what in (("scaling", "scaling"), ("s_aux", "attention sinks (s_aux)")):
        values = [k.value for k in call.keywords if k.arg == keyword]
        if not values:
            if keyword == "scaling":
                yield CodeFinding("HFC802", "pass", owner.file, call.lineno, f"{cls.name}: no scaling= passed (the backend uses 1/sqrt(head_dim))")
            continue
        value = values[0]
        text = ast.unparse(value)
        if isinstance(value, ast.Constant):
            ok = isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
            if keyword == "s_aux":
                ok = value.value is None
            if ok:
                yield CodeFinding("HFC802", "pass", owner.file, call.lineno, f"{cls.name}: {keyword}={text} is a literal")
            else:
                yield CodeFinding("HFC802", "fail", owner.file, call.lineno, f"{cls.name}: {keyword}={text} is not a number vLLM can use",
                                  "Pass a numeric literal or `self.<attr>` set in __init__.")
        elif _is_self_attr(value):
            assigned = index.self_assign(cls, value.attr) or index.class_attr(cls, value.attr)
            if assigned is None:
                yield CodeFinding("HFC802", "fail", owner.file, call.lineno, f"{cls.name}: {keyword}={text} but self.{value.attr} is never assigned",
                                  f"Set `self.{value.attr}` in {cls.name}.__init__.")
            elif keyword == "scaling" and isinstance(assigned[1], ast.Constant) and not isinstance(assigned[1].value, (int, float)):
                yield CodeFinding("HFC802", "fail", owner.file, call.lineno, f"{cls.name}: self.{value.attr} is {ast.unparse(assigned[1])}, not a number",
                                  f"Store the softmax scale as a number in self.{value.attr}.")
            else:
                yield CodeFinding("HFC802", "pass", owner.file, call.lineno, f"{cls.name}: {keyword}=self.{value.attr} resolves on the module")
        else:
            yield CodeFinding("HFC802", "fail", owner.file, call.lineno,
                              f"{cls.name}: {what} passed as the expression `{text}`: vLLM raises 'Cannot resolve attention {keyword} expression'",
                              f"Compute it once in __init__ (`self.{keyword} = {text.replace('self.', 'self.')}`) and pass `{keyword}=self.{keyword}`.")


def _check_layer_idx(index: CodeIndex, cls: ClassInfo) -> Iterator[CodeFinding]:
    assigned = index.self_assign(cls, "layer_idx") or index.class_attr(cls, "layer_idx")
    if assigned is not None:
        yield CodeFinding("HFC806", "pass", assigned[0].file, assigned[2], f"{cls.name} stores layer_idx")
        return
    if "__init__" not in {m for c in index.mro(cls) for m in c.methods} and index.external_bases(cls):
        return  # __init__ inherited from transformers: it stores layer_idx
    init = index.method(cls, "__init__")
    line = init[1].lineno if init else cls.line
    file = init[0].file if init else cls.file
    yield CodeFinding("HFC806", "fail", file, line, f"{cls.name} does not store self.layer_idx: vLLM cannot tell which decoder layer (and KV cache) it serves",
                      f"Accept `layer_idx` in {cls.name}.__init__ and store it: `self.layer_idx = layer_idx`.")


def _check_is_causal(index: CodeIndex, cls: ClassInfo) -> Iterator[CodeFinding]:
    assigned = index.class_attr(cls, "is_causal") or index.self_assign(cls, "is_causal")
    if assigned is None:
        yield CodeFinding("HFC807", "info", cls.file, cls.line, f"{cls.name} does not set is_causal; vLLM treats it as causal (decoder) attention",
                          "Set `self.is_causal = True` (decoder) or `False` (encoder) so the intent is explicit.")
        return
    owner, value, line = assigned
    if isinstance(value, ast.Constant) and value.value is True:
        yield CodeFinding("HFC807", "pass", owner.file, line, f"{cls.name}.is_causal = True")
    elif isinstance(value, ast.Constant) and value.value is False:
        yield CodeFinding("HFC807", "info", owner.file, line, f"{cls.name}.is_causal = False: vLLM serves the model as encoder-only (pooling, no generation)")
    else:
        yield CodeFinding("HFC807", "info", owner.file, line, f"{cls.name}.is_causal is computed (`{ast.unparse(value)}`); vLLM reads the value on the built module")


_DIRECT_ATTENTION = {
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention",
    "flash_attn_func": "flash_attn",
    "flash_attn_varlen_func": "flash_attn",
    "flash_attn_qkvpacked_func": "flash_attn",
    "flash_attn_kvpacked_func": "flash_attn",
    "flash_attn_varlen_qkvpacked_func": "flash_attn",
    "flash_attn_varlen_kvpacked_func": "flash_attn",
    "flash_attn_with_kvcache": "flash_attn",
    "memory_efficient_attention": "xformers",
    "_flash_attention_forward": "transformers' flash-attention helper",
}


def _transposed(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in ("transpose", "permute"):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "mT":
            return True
    return False


def _matmuls(file: FileIndex, funcdef: ast.AST) -> list[ast.AST]:
    out: list[ast.AST] = []
    for node in ast.walk(funcdef):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            out.append(node)
        elif isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in ("torch.matmul", "torch.bmm", "torch.einsum", "torch.baddbmm") or method in ("matmul", "bmm"):
                out.append(node)
    return out


def _softmaxes(file: FileIndex, funcdef: ast.AST) -> list[ast.Call]:
    out = []
    for node in ast.walk(funcdef):
        if isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name.endswith("softmax") or method == "softmax":
                out.append(node)
    return out


def attention_by_hand(file: FileIndex, funcdef: ast.AST) -> tuple[ast.AST, str] | None:
    """(node, what) when ``funcdef`` computes attention itself: a direct SDPA / flash_attn
    call, or softmax(Q K^T) V written with matmuls."""
    for node in ast.walk(funcdef):
        if isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            short = name.rpartition(".")[2] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
            if short in _DIRECT_ATTENTION:
                return node, f"calls {name or short} directly ({_DIRECT_ATTENTION[short]})"
    mm = _matmuls(file, funcdef)
    soft = _softmaxes(file, funcdef)
    if soft and len(mm) >= 2 and any(_transposed(m) for m in mm):
        return soft[0], "computes softmax(Q K^T) V by hand"
    return None


def check_hand_written(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    """HFC803: attention computed without the interface."""
    dispatching: dict[str, bool] = {}
    fallbacks: set[str] = set()
    for cls in index.classes:
        found = index.method(cls, "forward")
        names = dispatch_names(found[1]) if found else {}
        dispatching[cls.name] = bool(names)
        if found and names:
            for node in ast.walk(found[1]):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id in names for t in targets) and node.value is not None:
                        fallbacks |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    # module-level functions: who calls them?
    callers: dict[str, list[ClassInfo]] = {}
    for cls in index.classes:
        for method in cls.methods.values():
            for node in ast.walk(method):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    callers.setdefault(node.func.id, []).append(cls)
    emitted = 0
    for finding in _hand_written(index, dispatching, fallbacks, callers):
        emitted += 1
        yield finding
    if not emitted:
        yield CodeFinding("HFC803", "pass", None, None, "no attention computed by hand or called directly (outside the interface's eager fallback)")


def _hand_written(index: CodeIndex, dispatching: dict[str, bool], fallbacks: set[str], callers: dict[str, list[ClassInfo]]) -> Iterator[CodeFinding]:
    for file in index.files.values():
        if file.tree is None:
            continue
        for fname, func in file.functions.items():
            hit = attention_by_hand(file, func)
            if hit is None or fname in fallbacks:
                continue
            node, what = hit
            users = callers.get(fname, [])
            if any(not dispatching.get(u.name, False) for u in users):
                user = next(u for u in users if not dispatching.get(u.name, False))
                yield CodeFinding("HFC803", "fail", file.path, node.lineno, f"{fname}() {what}; {user.name} calls it instead of the attention interface",
                                  "Route attention through ALL_ATTENTION_FUNCTIONS; keep a hand-written version only as the `eager` fallback.")
            elif users:
                yield CodeFinding("HFC803", "warn", file.path, node.lineno, f"{fname}() {what}; {users[0].name} calls it beside the interface dispatch, a path vLLM never runs",
                                  "Drop the hand-written branch; the interface covers eager, sdpa and flash attention.")
            else:
                yield CodeFinding("HFC803", "warn", file.path, node.lineno, f"{fname}() {what} and is not the interface's eager fallback",
                                  "Remove it, or pass it as the fallback of ALL_ATTENTION_FUNCTIONS.get_interface(..., eager_attention_forward).")
        for cls in file.classes.values():
            for mname, method in cls.methods.items():
                hit = attention_by_hand(file, method)
                if hit is None:
                    continue
                node, what = hit
                if dispatching.get(cls.name):
                    yield CodeFinding("HFC803", "warn", file.path, node.lineno, f"{cls.name}.{mname} {what} beside the interface dispatch; vLLM never runs that path",
                                      "Drop the hand-written branch; the interface covers eager, sdpa and flash attention.")
                else:
                    yield CodeFinding("HFC803", "fail", file.path, node.lineno, f"{cls.name}.{mname} {what} instead of dispatching through ALL_ATTENTION_FUNCTIONS",
                                      "Replace it with `attention_interface(self, query, key, value, attention_mask, scaling=self.scaling, **kwargs)` bound from ALL_ATTENTION_FUNCTIONS.")


# --------------------------------------------------------------------------- HFC804: kwargs


def _layer_call_sites(file: FileIndex, forward: ast.AST, list_attrs: set[str]) -> list[ast.Call]:
    loop_names: set[str] = set()
    for node in ast.walk(forward):
        if isinstance(node, (ast.For, ast.AsyncFor)) and list_attrs & _self_attr_names(node.iter):
            target = node.target
            if isinstance(target, ast.Name):
                loop_names.add(target.id)
            elif isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[-1], ast.Name):
                loop_names.add(target.elts[-1].id)
    calls = []
    for node in ast.walk(forward):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in loop_names or isinstance(func, ast.Subscript) and any(_is_self_attr(func.value, a) for a in list_attrs):
            calls.append(node)
        elif any(isinstance(a, ast.Attribute) and a.attr == "__call__" and isinstance(a.value, ast.Name) and a.value.id in loop_names for a in node.args):
            calls.append(node)  # self._gradient_checkpointing_func(layer.__call__, ...)
    return calls


def check_kwargs(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    problems = 0
    hops: list[str] = []
    base = roles.base_model
    if base is not None and roles.layer_lists:
        found = index.method(base, "forward")
        if found is not None:
            owner, forward = found
            file = index.file_of(owner)
            hops.append(base.name)
            if not _accepts_kwargs(forward):
                problems += 1
                yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{base.name}.forward takes no **kwargs: vLLM's attention arguments cannot reach the layers",
                                  "Add `**kwargs` to the model's forward and pass it to every decoder layer call.")
            calls = _layer_call_sites(file, forward, {a for a, _, _ in roles.layer_lists})
            if calls and not any(_has_kwargs_expansion(c) for c in calls):
                problems += 1
                yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{base.name}.forward calls the decoder layer without **kwargs",
                                  "Call the layer as `decoder_layer(hidden_states, ..., **kwargs)`.")
    for layer in roles.decoder_layers:
        found = index.method(layer, "forward")
        if found is None:
            continue
        owner, forward = found
        hops.append(layer.name)
        if not _accepts_kwargs(forward):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{layer.name}.forward takes no **kwargs",
                              "Add `**kwargs` to the decoder layer's forward and pass it to the attention call.")
        attrs = {attr for _, (cls, attr) in roles.attention.items() if attr}
        calls = [n for n in ast.walk(forward) if isinstance(n, ast.Call) and any(_is_self_attr(n.func, a) for a in attrs)]
        if calls and not any(_has_kwargs_expansion(c) for c in calls):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{layer.name}.forward calls self.{calls[0].func.attr} without **kwargs",
                              f"Call `self.{calls[0].func.attr}(..., **kwargs)`.")
    for name, (cls, _) in roles.attention.items():
        found = index.method(cls, "forward")
        if found is None:
            continue
        owner, forward = found
        hops.append(name)
        if not _accepts_kwargs(forward):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{name}.forward takes no **kwargs",
                              "Add `**kwargs` to the attention forward and pass it to the attention interface.")
        calls = dispatch_calls(forward)
        if len(calls) == 1 and not _has_kwargs_expansion(calls[0]):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{name} calls the attention interface without **kwargs",
                              "Pass `**kwargs` to attention_interface(...).")
    if not problems and hops:
        yield CodeFinding("HFC804", "pass", None, None, f"**kwargs reach the attention interface: {' -> '.join(dict.fromkeys(hops))}")


# --------------------------------------------------------------------------- HFC805: backend flag


def _source_test(file: FileIndex) -> bool:
    """transformers' ``_can_set_attn_implementation`` on the module's source text."""
    if re.search(r"^class \w*Attention\w*\(nn\.Module\):", file.text, re.MULTILINE):
        return "ALL_ATTENTION_FUNCTIONS.get_interface(" in file.text
    return True


def _external_flag(bases: list[str]) -> bool | None:
    """``_supports_attention_backend`` of an installed transformers base class (trusted code)."""
    for base in bases:
        if not base.startswith("transformers."):
            continue
        module, _, name = base.rpartition(".")
        try:
            import importlib

            value = getattr(getattr(importlib.import_module(module), name), "_supports_attention_backend", None)
        except Exception:
            continue
        if isinstance(value, bool):
            return value
    return None


def check_backend_flag(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    classes = [c for k, c in roles.auto_classes.items() if k.startswith("AutoModel")]
    if not classes:
        classes = [c for c in index.classes if index.is_pretrained_model(c)]
    reported: set[str] = set()
    for cls in classes:
        assigned = index.class_attr(cls, "_supports_attention_backend")
        if assigned is not None:
            owner, value, line = assigned
            if owner.name in reported:
                continue
            reported.add(owner.name)
            if isinstance(value, ast.Constant) and value.value is True:
                yield CodeFinding("HFC805", "pass", owner.file, line, f"{owner.name}._supports_attention_backend = True")
                continue
            file = index.files[cls.file]
            if _source_test(file):
                yield CodeFinding("HFC805", "warn", owner.file, line, f"{owner.name}._supports_attention_backend is {ast.unparse(value)}; vLLM accepts {cls.name} only through transformers' source test",
                                  "Set `_supports_attention_backend = True` on the PreTrainedModel subclass.")
            else:
                yield CodeFinding("HFC805", "fail", owner.file, line,
                                  f"{owner.name}._supports_attention_backend is {ast.unparse(value)} and {file.path} fails transformers' source test: 'The Transformers implementation of {cls.name} is not compatible with vLLM'",
                                  "Dispatch through ALL_ATTENTION_FUNCTIONS.get_interface(...) and set `_supports_attention_backend = True`.")
            continue
        external = _external_flag(index.external_bases(cls))
        if external is True:
            yield CodeFinding("HFC805", "pass", cls.file, cls.line, f"{cls.name} inherits _supports_attention_backend = True from transformers")
            continue
        # the class that subclasses PreTrainedModel directly is where the flag belongs
        root = next((c for c in reversed(index.mro(cls)) if any(b.rpartition(".")[2] == "PreTrainedModel" for b in c.bases)), cls)
        if root.name in reported:
            continue
        reported.add(root.name)
        file = index.files[cls.file]
        if _source_test(file):
            yield CodeFinding("HFC805", "warn", root.file, root.line, f"{root.name} does not set _supports_attention_backend; vLLM accepts {cls.name} only through transformers' source test",
                              f"Add `_supports_attention_backend = True` to {root.name}.")
        else:
            yield CodeFinding("HFC805", "fail", root.file, root.line,
                              f"{root.name} does not set _supports_attention_backend and {file.path} fails transformers' source test (an *Attention(nn.Module) class, no ALL_ATTENTION_FUNCTIONS.get_interface): vLLM refuses {cls.name}",
                              f"Add `_supports_attention_backend = True` to {root.name} and dispatch attention through ALL_ATTENTION_FUNCTIONS.")


# --------------------------------------------------------------------------- HFC808: MoE experts


_EXPERT_COUNT = re.compile(r"experts\b|experts$|^n_?experts", re.IGNORECASE)


def _counts_experts(node: ast.AST) -> bool:
    """A ``range(...)`` whose bound is an expert count (``config.num_experts``, ``self.n_routed_experts``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "range":
            for arg in sub.args:
                for n in ast.walk(arg):
                    name = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else None
                    if name and (name in EXPERT_COUNT_FIELDS or _EXPERT_COUNT.search(name)):
                        return True
    return False


def _param_rank(file: FileIndex, value: ast.expr) -> int | None:
    """Rank of ``nn.Parameter(torch.empty(a, b, c))`` (or ``torch.zeros((a, b, c))``)."""
    if not _is_call_to(file, value, "Parameter") or not value.args:
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
    declared = any(isinstance(config.get(f), int) and config.get(f) > 0 for f in EXPERT_COUNT_FIELDS) if isinstance(config, dict) else False
    found_any = False
    for cls in index.classes:
        if not index.is_module(cls):
            continue
        for attr, assigns in cls.self_assigns.items():
            for value, line, method in assigns:
                if method != "__init__" or not isinstance(value, ast.Call):
                    continue
                file = index.file_of(cls)
                is_list = _is_call_to(file, value, "ModuleList")
                inner = index.instantiated_classes(cls, value)
                expertish = (is_list and (_counts_experts(value) or any(re.search(r"Expert(?!s)", c.name) for c in inner))) or (
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
                rank = _param_rank(file, value)
                if rank is not None and rank != 3:
                    bad = True
                    yield CodeFinding("HFC808", "fail", c.file, aline, f"{experts.name}.{attr} is a {rank}-D parameter: vLLM replaces experts only when every parameter is 3-D [experts, out, in]",
                                      "Store expert weights as 3-D tensors (gate_up_proj [E, 2I, H], down_proj [E, H, I]); fold biases away or keep them outside `experts`.")
                elif _is_call_to(file, value, "Linear") or _is_call_to(file, value, "Embedding"):
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
        elif _looks_swapped(params[1], params[2]):
            bad = True
            yield CodeFinding("HFC808", "fail", owner.file, forward.lineno, f"{experts.name}.forward takes ({', '.join(params[:3])}): weights before indices, but vLLM passes (hidden_states, top_k_index, top_k_weights)",
                              "Reorder the parameters to (hidden_states, top_k_index, top_k_weights).")
        elif params[:3] != conventional:
            yield CodeFinding("HFC808", "info", owner.file, forward.lineno, f"{experts.name}.forward takes ({', '.join(params[:3])}); vLLM passes (hidden_states, top_k_index, top_k_weights) positionally")
    if not bad:
        yield CodeFinding("HFC808", "pass", block.file, line, f"{block.name}.experts ({experts.name}) holds 3-D parameters with the (hidden_states, top_k_index, top_k_weights) forward")


def _looks_swapped(second: str, third: str) -> bool:
    weights = re.compile(r"weight|prob|score|gate", re.IGNORECASE)
    indices = re.compile(r"idx|index|indices|ids|selected|expert", re.IGNORECASE)
    return bool(weights.search(second) and indices.search(third) and not weights.search(third))


# --------------------------------------------------------------------------- HFC809 / HFC810: pipeline parallel


def _declares_pp_plan(index: CodeIndex, roles: Roles) -> bool:
    """A ``base_model_pp_plan`` on a config class, or a ``_pp_plan`` on the base model itself
    (the causal-LM wrapper's ``_pp_plan`` covers only ``lm_head``)."""
    if roles.base_model is not None and index.class_attr(roles.base_model, "_pp_plan"):
        return True
    return any("base_model_pp_plan" in cls.class_assigns for cls in index.classes)


def check_pipeline(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    base = roles.base_model
    if base is None:
        return
    lists = roles.layer_lists
    names = ", ".join(a for a, _, _ in lists)
    if len(lists) > 1:
        if _declares_pp_plan(index, roles):
            yield CodeFinding("HFC809", "pass", lists[0][2], lists[0][1], f"{base.name} holds {len(lists)} ModuleLists ({names}) but declares a pp plan")
        else:
            yield CodeFinding("HFC809", "fail", lists[1][2], lists[1][1],
                              f"{base.name} holds {len(lists)} ModuleLists ({names}): vLLM's pipeline parallel needs exactly one ('multiple ModuleLists ... not supported yet')",
                              "Keep every decoder layer in one nn.ModuleList, or declare base_model_pp_plan on the config class.")
    elif len(lists) == 1:
        yield CodeFinding("HFC809", "pass", lists[0][2], lists[0][1], f"{base.name}.{lists[0][0]} is the only ModuleList: pipeline parallel can split it")
    else:
        yield CodeFinding("HFC809", "fail", base.file, base.line, f"{base.name} holds no nn.ModuleList of decoder layers: vLLM cannot split it for pipeline parallel",
                          "Keep the decoder layers in one nn.ModuleList (e.g. self.layers).")
    yield from _forward_reads(index, roles)


def _forward_reads(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    """HFC810: reading attributes of submodules (PP swaps them for nn.Identity placeholders)."""
    base = roles.base_model
    found = index.method(base, "forward") if base else None
    if found is None:
        return
    owner, forward = found
    file = index.file_of(owner)
    list_attrs = {a for a, _, _ in roles.layer_lists}
    loop_names: set[str] = set()
    for node in ast.walk(forward):
        if isinstance(node, (ast.For, ast.AsyncFor)) and list_attrs & _self_attr_names(node.iter):
            t = node.target
            names = [t] if isinstance(t, ast.Name) else [e for e in getattr(t, "elts", []) if isinstance(e, ast.Name)][-1:]
            loop_names |= {n.id for n in names}
    custom_children = set()
    for c in index.mro(base):
        for attr, assigns in c.self_assigns.items():
            for value, _, method in assigns:
                if method == "__init__" and attr not in list_attrs and index.instantiated_classes(c, value):
                    custom_children.add(attr)
    seen = 0
    for node in ast.walk(forward):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        parent = file.parent(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            continue  # a method call on the layer (it exists on placeholders too when it is forward)
        if node.attr in ("__call__", "forward", "training"):
            continue
        base_node = node.value
        target = None
        if isinstance(base_node, ast.Name) and base_node.id in loop_names:
            target = f"{base_node.id}.{node.attr}"
        elif isinstance(base_node, ast.Subscript) and any(_is_self_attr(base_node.value, a) for a in list_attrs):
            target = f"{ast.unparse(base_node)}.{node.attr}"
        elif _is_self_attr(base_node) and base_node.attr in custom_children:
            target = f"self.{base_node.attr}.{node.attr}"
        if target is None:
            continue
        seen += 1
        yield CodeFinding("HFC810", "warn", owner.file, node.lineno,
                          f"{owner.name}.forward reads {target}: under pipeline parallel a layer on another rank is an nn.Identity placeholder without it",
                          "Read per-layer facts from the config (e.g. `self.config.layer_types[i]`), not from submodule attributes.")
    if not seen:
        yield CodeFinding("HFC810", "pass", owner.file, forward.lineno, f"{owner.name}.forward reads no submodule attributes")


# --------------------------------------------------------------------------- HFC811: removed APIs


def check_removed_apis(index: CodeIndex) -> Iterator[CodeFinding]:
    """Judged against the transformers releases the modelled vLLM accepts (where the code runs),
    not the transformers hfcheck itself runs on."""
    env = serving_environment()
    where = env.transformers_label
    hits = 0
    for file in index.files.values():
        if file.tree is None:
            continue
        for imp in file.imports:
            if imp.level:
                continue
            api = removed_apis.match_import(imp.module, imp.name)
            if api is None:
                continue
            hits += 1
            present = env.transformers_still_has(api.gone_in)
            what = f"imports {imp.qualified}"
            gone = f"removed in transformers {api.gone_in} (last in {api.last_seen})"
            if present == "all":
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: still in {where}, {gone}: a later vLLM will refuse the code",
                                  f"Stop using it before upgrading: {api.replacement}.")
            elif present == "some":
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: {gone}; only some of {where} still have it",
                                  f"Stop using it: {api.replacement}.")
            elif imp.in_try:
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: {gone}; the ImportError is caught here",
                                  f"Remove the fallback: {api.replacement}.")
            else:
                yield CodeFinding("HFC811", "fail", file.path, imp.line, f"{what}: {gone}; importing the code fails with {where}",
                                  f"{api.replacement[0].upper()}{api.replacement[1:]}.")
        for node in ast.walk(file.tree):
            if isinstance(node, ast.Attribute) and (api := removed_apis.match_attribute(node.attr)) is not None:
                hits += 1
                present = env.transformers_still_has(api.gone_in)
                state = {"all": f"still in {where}", "some": f"only some of {where} still have it"}.get(present, f"AttributeError with {where} when this path runs")
                yield CodeFinding("HFC811", "warn", file.path, node.lineno, f"uses .{node.attr} (a Cache method removed in transformers {api.gone_in}, last in {api.last_seen}): {state}",
                                  f"{api.replacement[0].upper()}{api.replacement[1:]}.")
    if not hits:
        yield CodeFinding("HFC811", "pass", None, None, f"no transformers API removed in v5 is used (judged for {where})")


# --------------------------------------------------------------------------- HFC812: packages


CUDA_ONLY = {
    "flash_attn": "flash-attention (CUDA kernels)",
    "flash_attn_2_cuda": "flash-attention (CUDA kernels)",
    "flash_attn_interface": "flash-attention 3 (Hopper CUDA kernels)",
    "xformers": "xformers (CUDA kernels)",
    "mamba_ssm": "mamba-ssm (CUDA kernels)",
    "causal_conv1d": "causal-conv1d (CUDA kernels)",
    "selective_scan_cuda": "mamba selective scan (CUDA kernel)",
    "fla": "flash-linear-attention (Triton GPU kernels)",
    "triton": "Triton (GPU kernels)",
    "apex": "NVIDIA apex (CUDA kernels)",
    "fused_dense_lib": "flash-attention fused dense (CUDA)",
    "rotary_emb": "flash-attention rotary (CUDA)",
    "dropout_layer_norm": "flash-attention layer norm (CUDA)",
    "flashinfer": "FlashInfer (CUDA kernels)",
    "transformer_engine": "Transformer Engine (CUDA)",
    "deep_gemm": "DeepGEMM (CUDA)",
    "megablocks": "MegaBlocks (CUDA)",
    "grouped_gemm": "grouped_gemm (CUDA)",
    "cupy": "CuPy (CUDA)",
    "pycuda": "PyCUDA (CUDA)",
    "liger_kernel": "Liger kernels (Triton GPU)",
}

_KERNEL_LOADERS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline", "torch.ops.load_library", "ctypes.CDLL", "ctypes.cdll.LoadLibrary", "ctypes.PyDLL")


def unguarded_imports(file: FileIndex) -> dict[str, int]:
    """Top-level packages transformers' ``get_imports`` would require -> first line
    (same skip rules: try blocks and ``if is_*_available()`` bodies; relative imports ignored)."""
    out: dict[str, int] = {}
    for imp in file.imports:
        if imp.guarded or imp.level:
            continue
        top = imp.module.split(".")[0]
        if top:
            out.setdefault(top, imp.line)
    return out


def _installed(top: str) -> bool:
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None  # top-level: nothing is imported
    except (ImportError, ValueError):
        return False


def check_packages(index: CodeIndex) -> Iterator[CodeFinding]:
    """Unguarded imports are judged in the serving environment (the modelled vLLM release's
    dependency closure), not in hfcheck's own venv: vLLM brings einops, not flash_attn."""
    env = serving_environment()
    hits = 0
    for file in index.files.values():
        if file.tree is None:
            continue
        for top, line in unguarded_imports(file).items():
            if env.provides(top):
                continue
            hits += 1
            if top in CUDA_ONLY:
                yield CodeFinding("HFC812", "fail", file.path, line, f"imports {top} unconditionally ({CUDA_ONLY[top]}), which is not in {env.label}: transformers' check_imports refuses to load the code ('requires the following packages that were not found')",
                                  f"Guard the import with `if is_*_available():` or try/except ImportError, or install {top} (a CUDA build) into vLLM's environment.")
            else:
                yield CodeFinding("HFC812", "fail", file.path, line, f"imports {top}, which is not in {env.label} (vLLM does not install it): transformers' check_imports refuses to load the code",
                                  f"pip install {top} into vLLM's environment on the serving machine, or guard the import.")
        for call, name in _calls_to(file, file.tree, lambda n: n in _KERNEL_LOADERS or n.endswith(("cpp_extension.load", "cpp_extension.load_inline"))):
            hits += 1
            yield CodeFinding("HFC812", "warn", file.path, call.lineno, f"{name}(...) builds or loads a custom native kernel {_where(file, call)}",
                              "Ship kernels as an installable package (or use the kernels hub) and guard their use; vLLM's backend expects plain PyTorch + the attention interface.")
    if not hits:
        yield CodeFinding("HFC812", "pass", None, None, f"every unconditional import is in {env.label}; no custom kernel")


# --------------------------------------------------------------------------- HFC813: fused QKV


_PACKED_NAME = re.compile(r"qkv|query_key_value|c_attn|in_proj|w_pack", re.IGNORECASE)


def check_fused_qkv(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    for name, (cls, _) in roles.attention.items():
        linears = []
        for c in index.mro(cls):
            for attr, assigns in c.self_assigns.items():
                for value, line, method in assigns:
                    if method == "__init__" and _is_call_to(index.file_of(c), value, "Linear"):
                        linears.append((attr, line, c))
        names = [a for a, _, _ in linears]
        packed = [(a, l, c) for a, l, c in linears if _PACKED_NAME.search(a)]
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
        call_line = next((n.lineno for n in ast.walk(forward) if isinstance(n, ast.Call) and _is_self_attr(n.func, attr)), forward.lineno)
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
    return any((isinstance(n, ast.Name) and n.id in names) or _is_self_attr(n, attr) for n in ast.walk(node))


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


# --------------------------------------------------------------------------- HFC820-825: security


_EXEC = {"exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile", "__import__", "builtins.__import__"}
_PROCESS_EXACT = {"os.system", "os.popen", "os.fork", "os.forkpty", "os.startfile", "pty.spawn", "commands.getoutput", "commands.getstatusoutput", "platform.popen"}
_PROCESS_PREFIX = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "asyncio.create_subprocess")
_NETWORK_MODULES = ("socket", "requests", "urllib.request", "urllib3", "http.client", "httpx", "aiohttp", "websocket", "websockets", "ftplib", "smtplib", "telnetlib", "paramiko", "pycurl", "xmlrpc.client")
_HUB_DOWNLOADS = ("hf_hub_download", "snapshot_download", "cached_download", "hf_hub_url")
_DESERIALIZE = {"pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "cPickle.load", "cPickle.loads", "dill.load", "dill.loads",
                "cloudpickle.load", "cloudpickle.loads", "joblib.load", "marshal.load", "marshal.loads", "shelve.open", "pandas.read_pickle", "numpy.load", "torch.load"}
_FILE_OPS = {"shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.make_archive", "shutil.unpack_archive", "shutil.chown",
             "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames", "os.replace", "os.makedirs", "os.mkdir", "os.chmod", "os.chown",
             "os.symlink", "os.link", "os.truncate", "torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "pathlib.Path.write_text"}
_WRITE_METHODS = ("write_text", "write_bytes", "unlink", "rmdir", "rename", "touch", "symlink_to")


def _network_module(dotted: str) -> str | None:
    for m in _NETWORK_MODULES:
        if dotted == m or dotted.startswith(m + "."):
            return m
    return None


def _call_kw(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _path_allowed(file: FileIndex, call: ast.Call, path: ast.expr | None) -> bool:
    """Writes into a cache/temp location, or to a path the caller passed in, are expected."""
    if path is None:
        return False
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(("/", "~", "\\")) for n in ast.walk(path)):
        return False  # an absolute location, whatever is joined to it
    func = file.enclosing_function(call)
    params = {a.arg for a in (func.args.args + func.args.kwonlyargs + func.args.posonlyargs)} if func else set()
    for node in ast.walk(path):
        token = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if token is None:
            continue
        if isinstance(node, ast.Name) and token in params - {"self", "cls"}:
            return True
        low = str(token).lower()
        if "cache" in low or "tempfile" in low or "tmpdir" in low or "temp_dir" in low or "mkdtemp" in low:
            return True
    return False


def _open_writes(call: ast.Call) -> bool | None:
    mode = _call_kw(call, "mode", 1)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(ch in mode.value for ch in "wax+")
    return None  # unknown mode


def classify_call(file: FileIndex, call: ast.Call) -> tuple[str, str] | None:
    """(code, description) for a security-relevant call, else None."""
    name = file.call_name(call) or ""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if name in _EXEC:
        return "HFC820", f"{name}()"
    if name == "importlib.import_module" and call.args and not isinstance(call.args[0], ast.Constant):
        return "HFC820", "importlib.import_module() of a computed name"
    if name == "getattr" and call.args and (file.dotted(call.args[0]) or "") in ("builtins", "__builtins__"):
        return "HFC820", "getattr(builtins, ...) (reaches exec/eval indirectly)"
    if name in _PROCESS_EXACT or name.startswith(_PROCESS_PREFIX):
        return "HFC821", f"{name}()"
    if (module := _network_module(name)) is not None:
        return "HFC822", f"{name}() ({module})"
    if name.rpartition(".")[2] in _HUB_DOWNLOADS and (name.startswith("huggingface_hub") or "." not in name or name.startswith(".")):
        return "HFC822", f"{name}() (downloads from the Hub at run time)"
    if name in _DESERIALIZE:
        if name == "torch.load":
            weights_only = _call_kw(call, "weights_only")
            if isinstance(weights_only, ast.Constant) and weights_only.value is True:
                return None
            why = "weights_only=False" if weights_only is not None else "no weights_only=True (safe only where torch >= 2.6 defaults it)"
            return "HFC823", f"torch.load() with {why}"
        if name == "numpy.load":
            allow = _call_kw(call, "allow_pickle")
            if not (isinstance(allow, ast.Constant) and allow.value is True):
                return None
            return "HFC823", "numpy.load(allow_pickle=True)"
        return "HFC823", f"{name}() (unpickles arbitrary objects)"
    if name in ("open", "io.open", "builtins.open", "os.open", "codecs.open"):
        writes = _open_writes(call) if name != "os.open" else None
        if writes is False and name != "os.open":
            return None
        if name == "os.open":
            flags = _call_kw(call, "flags", 1)
            attrs = {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)} if flags is not None else set()
            if attrs and not attrs & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}:
                return None
            writes = True if attrs else None
        if _path_allowed(file, call, _call_kw(call, "file", 0)):
            return None
        target = ast.unparse(call.args[0]) if call.args else "?"
        return "HFC824", f"{name}({target}, {'write mode' if writes else 'unknown mode'})"
    if name in _FILE_OPS or name.startswith("shutil."):
        dest = _call_kw(call, "dst", 1) if name.startswith(("shutil.copy", "shutil.move", "os.rename", "os.replace")) else (call.args[0] if call.args else None)
        if name in ("torch.save", "numpy.save", "numpy.savez", "numpy.savetxt"):
            dest = _call_kw(call, "f", 1) if name == "torch.save" else (call.args[0] if call.args else None)
        if _path_allowed(file, call, dest):
            return None
        return "HFC824", f"{name}()"
    if method in _WRITE_METHODS and not name.startswith("self."):
        if _path_allowed(file, call, call.func.value):
            return None
        return "HFC824", f".{method}() on {ast.unparse(call.func.value)}"
    return None


_SECURITY_TEXT = {
    "HFC820": ("runs dynamically built code", "Remove exec/eval/compile: parse values with int()/float()/json.loads and import modules by name."),
    "HFC821": ("starts a process", "Remove process execution from modeling code; nothing in a model's forward or load path needs a shell."),
    "HFC822": ("reaches the network", "Remove network access; ship needed files in the repo so they are fetched with the model."),
    "HFC823": ("deserializes with pickle", "Load tensors with safetensors, or torch.load(..., weights_only=True)."),
    "HFC824": ("writes files outside the cache", "Write only under the HF cache or a caller-given directory (save_pretrained), never to fixed or computed paths."),
}


def check_security(index: CodeIndex) -> Iterator[CodeFinding]:
    counts = {code: 0 for code in (*_SECURITY_TEXT, "HFC825")}
    for file in index.files.values():
        if file.tree is None:
            continue
        for imp in file.imports:
            module = _network_module(imp.qualified if imp.name else imp.module) or _network_module(imp.module)
            if module is None:
                continue
            counts["HFC822"] += 1
            yield CodeFinding("HFC822", "warn", file.path, imp.line, f"imports {imp.qualified} (network: {module})", _SECURITY_TEXT["HFC822"][1])
        flagged_lines: set[int] = set()
        for node in ast.walk(file.tree):
            if not isinstance(node, ast.Call):
                continue
            hit = classify_call(file, node)
            if hit is None:
                continue
            code, what = hit
            counts[code] += 1
            flagged_lines.add(node.lineno)
            where = _where(file, node)
            yield CodeFinding(code, _location_status(file, node), file.path, node.lineno, f"{what} {where}: {_SECURITY_TEXT[code][0]}".replace("  ", " "), _SECURITY_TEXT[code][1])
        for finding in _side_effects(file, flagged_lines):
            counts["HFC825"] += 1
            yield finding
    for code, n in counts.items():
        if not n:
            yield CodeFinding(code, "pass", None, None, _PASS_TEXT[code])


_PASS_TEXT = {
    "HFC820": "no exec / eval / compile",
    "HFC821": "no process execution",
    "HFC822": "no network access",
    "HFC823": "no pickle-based loading",
    "HFC824": "no file writes outside the cache",
    "HFC825": "no import-time side effects",
}

_SAFE_CALL_PREFIXES = ("logging.", "warnings.", "typing.", "collections.", "dataclasses.", "functools.", "re.", "enum.")
_SAFE_CALLS = {"torch.fx.wrap", "print"}


def _side_effects(file: FileIndex, flagged_lines: set[int]) -> Iterator[CodeFinding]:
    """HFC825: statements that do something when the file is merely imported."""
    defined = set(file.module_assigns) | set(file.classes) | set(file.functions)
    modules = {local for local, origin in file.aliases.items() if not origin.startswith(".")}

    def visit(stmts: list[ast.stmt]) -> Iterator[CodeFinding]:
        for stmt in stmts:
            if stmt.lineno in flagged_lines:
                continue
            if isinstance(stmt, ast.If):
                if not _is_main(stmt.test):
                    yield from visit(stmt.body)
                yield from visit(stmt.orelse)
                continue
            if isinstance(stmt, ast.Try):
                yield from visit(stmt.body)
                for h in stmt.handlers:
                    yield from visit(h.body)
                yield from visit(stmt.orelse)
                yield from visit(stmt.finalbody)
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"a module-level `{type(stmt).__name__.lower()}` runs when the file is imported",
                                  "Move work out of module level into functions the model calls.")
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                name = file.call_name(stmt.value) or ast.unparse(stmt.value.func)
                first = name.split(".")[0]
                method = name.rpartition(".")[2]
                if (
                    name in _SAFE_CALLS
                    or name.startswith(_SAFE_CALL_PREFIXES)
                    or first in ("logger", "log", "_logger")
                    or method in ("register", "register_for_auto_class")
                    or (first in defined and first not in modules)
                ):
                    continue
                yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"calls {name}() at import time",
                                  "Do not change global state when the file is imported; do it inside the model, or not at all.")
                continue
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, (ast.Attribute, ast.Subscript)):
                        root = t
                        while isinstance(root, (ast.Attribute, ast.Subscript)):
                            root = root.value
                        if isinstance(root, ast.Name) and root.id in modules:
                            yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"assigns {ast.unparse(t)} at import time (changes another module's state)",
                                              "Do not patch other modules or the environment from modeling code.")
                            break

    yield from visit(file.tree.body)


def _is_main(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


# --------------------------------------------------------------------------- all


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
        lambda: check_fused_qkv(index, roles),
        lambda: check_security(index),
    )
    for step in steps:
        try:
            findings.extend(step())
        except RecursionError:  # pathological nesting in a hostile file
            findings.append(CodeFinding("HFC800", "inconclusive", None, None, "a check gave up: the code nests too deeply to walk"))
    return sorted(findings, key=lambda f: (f.code, f.file or "", f.line or 0))
