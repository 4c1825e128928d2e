"""Attention, HFC801-807: dispatch through the attention interface (801), resolvable
``scaling=`` / ``s_aux=`` (802), attention by hand (803), ``**kwargs`` down to the interface
(804), the backend flag or transformers' source test (805), ``layer_idx`` (806), ``is_causal`` (807)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import cast

from hfcheck.analyzer.remote.ast_helpers import (
    accepts_kwargs,
    attention_by_hand,
    dispatch_calls,
    dispatch_names,
    has_kwargs_expansion,
    is_self_attr,
    layer_loop_names,
    passes_source_test,
)
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex, FileIndex
from hfcheck.analyzer.remote.roles import Roles
from hfcheck.analyzer.terms import vocabulary as V

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
        elif is_self_attr(value):
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
            owners = _owners(index, cls)
            for mname, method in cls.methods.items():
                hit = attention_by_hand(file, method)
                if hit is None:
                    continue
                node, what = hit
                if not dispatching.get(cls.name) and owners and all(dispatching.get(o.name) for o in owners):
                    # a helper module whose only owners dispatch themselves (MixFormer's SelfAttention
                    # once MHA calls the interface): left on a path vLLM never runs
                    yield CodeFinding("HFC803", "warn", file.path, node.lineno,
                                      f"{cls.name}.{mname} {what}; {owners[0].name}, which builds it, dispatches through the interface instead: a path vLLM never runs",
                                      "Drop the hand-written module; the interface covers eager, sdpa and flash attention.")
                elif dispatching.get(cls.name):
                    yield CodeFinding("HFC803", "warn", file.path, node.lineno, f"{cls.name}.{mname} {what} beside the interface dispatch; vLLM never runs that path",
                                      "Drop the hand-written branch; the interface covers eager, sdpa and flash attention.")
                else:
                    yield CodeFinding("HFC803", "fail", file.path, node.lineno, f"{cls.name}.{mname} {what} instead of dispatching through ALL_ATTENTION_FUNCTIONS",
                                      "Replace it with `attention_interface(self, query, key, value, attention_mask, scaling=self.scaling, **kwargs)` bound from ALL_ATTENTION_FUNCTIONS.")


# --------------------------------------------------------------------------- HFC804: kwargs


def _owners(index: CodeIndex, cls: ClassInfo) -> list[ClassInfo]:
    """Local classes whose ``__init__`` builds ``cls``."""
    return [c for c in index.classes if c is not cls and any(
        method == "__init__" and any(found is cls for found in index.instantiated_classes(c, value))
        for assigns in c.self_assigns.values() for value, _, method in assigns)]


def _layer_call_sites(file: FileIndex, forward: ast.AST, list_attrs: set[str], sequential: frozenset[str] = frozenset()) -> list[ast.Call]:
    """Calls of a decoder layer in ``forward``: through a loop over a layer list, or a
    subscript of one (``self.layers[i](...)``); in an ``nn.Sequential`` a constant index is
    its embedding or head (MixFormer's ``self.layers[0](input_ids)``), not a layer."""
    loop_names = layer_loop_names(forward, list_attrs)
    calls = []
    for node in ast.walk(forward):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        one_off = isinstance(func, ast.Subscript) and any(is_self_attr(func.value, a) for a in sequential) and _constant_index(func.slice)
        if (isinstance(func, ast.Name) and func.id in loop_names) or (
                isinstance(func, ast.Subscript) and any(is_self_attr(func.value, a) for a in list_attrs) and not one_off):
            calls.append(node)
        elif any(isinstance(a, ast.Attribute) and a.attr == "__call__" and isinstance(a.value, ast.Name) and a.value.id in loop_names for a in node.args):
            calls.append(node)  # self._gradient_checkpointing_func(layer.__call__, ...)
    return calls


def _constant_index(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int)


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
            if not accepts_kwargs(forward):
                problems += 1
                yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{base.name}.forward takes no **kwargs: vLLM's attention arguments cannot reach the layers",
                                  "Add `**kwargs` to the model's forward and pass it to every decoder layer call.")
            calls = _layer_call_sites(file, forward, {a for a, _, _ in roles.layer_lists}, roles.sequential)
            if calls and not any(has_kwargs_expansion(c) for c in calls):
                problems += 1
                yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{base.name}.forward calls the decoder layer without **kwargs",
                                  "Call the layer as `decoder_layer(hidden_states, ..., **kwargs)`.")
    for layer in roles.decoder_layers:
        found = index.method(layer, "forward")
        if found is None:
            continue
        owner, forward = found
        hops.append(layer.name)
        if not accepts_kwargs(forward):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{layer.name}.forward takes no **kwargs",
                              "Add `**kwargs` to the decoder layer's forward and pass it to the attention call.")
        attrs = {attr for _, (cls, attr) in roles.attention.items() if attr}
        calls = [n for n in ast.walk(forward) if isinstance(n, ast.Call) and any(is_self_attr(n.func, a) for a in attrs)]
        if calls and not any(has_kwargs_expansion(c) for c in calls):
            problems += 1
            called = cast(ast.Attribute, calls[0].func).attr  # is_self_attr: an attribute of self
            yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{layer.name}.forward calls self.{called} without **kwargs",
                              f"Call `self.{called}(..., **kwargs)`.")
    for name, (cls, _) in roles.attention.items():
        found = index.method(cls, "forward")
        if found is None:
            continue
        owner, forward = found
        hops.append(name)
        if not accepts_kwargs(forward):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, forward.lineno, f"{name}.forward takes no **kwargs",
                              "Add `**kwargs` to the attention forward and pass it to the attention interface.")
        calls = dispatch_calls(forward)
        if len(calls) == 1 and not has_kwargs_expansion(calls[0]):
            problems += 1
            yield CodeFinding("HFC804", "fail", owner.file, calls[0].lineno, f"{name} calls the attention interface without **kwargs",
                              "Pass `**kwargs` to attention_interface(...).")
    if not problems and hops:
        yield CodeFinding("HFC804", "pass", None, None, f"**kwargs reach the attention interface: {' -> '.join(dict.fromkeys(hops))}")


def check_forward_arguments(index: CodeIndex, roles: Roles) -> Iterator[CodeFinding]:
    """HFC816: the base model's forward names every argument vLLM's backend decorates it with."""
    base = roles.base_model
    found = index.method(base, "forward") if base is not None else None
    if base is None or found is None:
        return
    owner, forward = found
    params = {a.arg for a in forward.args.posonlyargs + forward.args.args + forward.args.kwonlyargs}
    absent = [name for name in V.DECODER_FORWARD_ARGUMENTS if name not in params]
    if absent:
        yield CodeFinding("HFC816", "fail", owner.file, forward.lineno,
                          f"{base.name}.forward has no {', '.join(absent)} parameter: vLLM's transformers backend fails at load "
                          f"(\"Argument {absent[0]} not found in the forward method\")",
                          "Name them in the signature: `def forward(self, input_ids=None, ..., inputs_embeds=None, position_ids=None, **kwargs)`.")
    else:
        yield CodeFinding("HFC816", "pass", None, None, f"{base.name}.forward names {', '.join(V.DECODER_FORWARD_ARGUMENTS)}")


# --------------------------------------------------------------------------- HFC805: backend flag


def _external_flag(bases: list[str]) -> bool | None:
    """``_supports_attention_backend`` of an installed transformers base class (trusted code)."""
    for base in bases:
        if not base.startswith("transformers."):
            continue
        module, _, name = base.rpartition(".")
        try:
            import importlib

            value = getattr(getattr(importlib.import_module(module), name), "_supports_attention_backend", None)
        except Exception:  # noqa: BLE001 - a transformers base that does not import: undecided
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
            if passes_source_test(file.text):
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
        if passes_source_test(file.text):
            yield CodeFinding("HFC805", "warn", root.file, root.line, f"{root.name} does not set _supports_attention_backend; vLLM accepts {cls.name} only through transformers' source test",
                              f"Add `_supports_attention_backend = True` to {root.name}.")
        else:
            yield CodeFinding("HFC805", "fail", root.file, root.line,
                              f"{root.name} does not set _supports_attention_backend and {file.path} fails transformers' source test (an *Attention(nn.Module) class, no ALL_ATTENTION_FUNCTIONS.get_interface): vLLM refuses {cls.name}",
                              f"Add `_supports_attention_backend = True` to {root.name} and dispatch attention through ALL_ATTENTION_FUNCTIONS.")


# --------------------------------------------------------------------------- the codes, documented


class AttentionInterfaceDispatch(RemoteCodeRule):
    code = "HFC801"
    name = "remote-attention-interface"
    impact = "blocker"
    what = "Each attention module the decoder layers build dispatches through `ALL_ATTENTION_FUNCTIONS` (`[impl]` or `.get_interface(...)`) and calls it exactly once."
    why = (
        "vLLM serves attention only through the transformers attention interface: a layer whose attention "
        "does not dispatch through it fails at load ('Layer i does not dispatch through the Transformers "
        "attention interface'). vLLM reads the dispatch from the forward's source, so two calls are refused too."
    )
    example = "attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)   # no ALL_ATTENTION_FUNCTIONS"
    fix = (
        "attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward); "
        "attn_output, attn_weights = attention_interface(self, q, k, v, attention_mask, scaling=self.scaling, **kwargs)"
    )
    vllm_source = (
        "model_executor/models/transformers/fusers/attention.py::interface_call",
        "model_executor/models/transformers/base.py::Base._create_attention_instances",
    )
    none = None
    observed_by = "HFC201"


class AttentionScalingResolvable(RemoteCodeRule):
    code = "HFC802"
    name = "remote-attention-scaling"
    impact = "blocker"
    what = "The `scaling=` (and `s_aux=`) passed to the attention interface is a number literal or a `self.<attr>` the module sets."
    why = "vLLM resolves these from the forward's source on the built module; an expression raises 'Cannot resolve attention scaling expression' at load."
    example = "attention_interface(self, q, k, v, mask, scaling=1 / math.sqrt(self.head_dim))"
    fix = "In __init__: `self.scaling = self.head_dim ** -0.5`; in forward: `scaling=self.scaling`."
    vllm_source = (
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.scale",
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.sinks",
    )
    none = None
    observed_by = "HFC203"


class HandWrittenAttention(RemoteCodeRule):
    code = "HFC803"
    name = "remote-hand-written-attention"
    impact = "blocker"
    what = "softmax(Q K^T) V written with matmuls, or direct calls to F.scaled_dot_product_attention / flash_attn / xformers, outside the interface's eager fallback."
    why = (
        "Attention computed by hand bypasses vLLM's paged attention and KV cache: the layer is refused when it is "
        "the only path (fail), and dead code under vLLM when the module also dispatches through the interface (warn)."
    )
    example = "attn_output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # in *SdpaAttention.forward"
    fix = "Keep one attention module that dispatches through ALL_ATTENTION_FUNCTIONS; the hand-written version may only be the `eager` fallback function."
    vllm_source = (
        "model_executor/models/transformers/fusers/attention.py::interface_call",
        "model_executor/models/transformers/base.py::Base._create_attention_instances",
    )
    none = None


class KwargsPropagation(RemoteCodeRule):
    code = "HFC804"
    name = "remote-kwargs-propagation"
    impact = "blocker"
    what = "`**kwargs` flow model.forward -> decoder layer -> attention module -> attention interface call."
    why = (
        "vLLM passes its attention state (which vLLM attention layer serves each module) as keyword arguments "
        "through the base model's forward; a hop that drops **kwargs makes vLLM's attention function miss it "
        "at the first forward. `_supports_attention_backend` promises exactly this."
    )
    example = "def forward(self, hidden_states, attention_mask=None):   # no **kwargs\n    hidden_states = self.self_attn(hidden_states, attention_mask)"
    fix = "Accept `**kwargs` in every forward on the path and pass them on: `self.self_attn(..., **kwargs)`, `attention_interface(..., **kwargs)`."
    vllm_source = (
        "model_executor/models/transformers/base.py::Base.forward",
        "model_executor/models/transformers/__init__.py::vllm_attention_forward",
    )
    none = None


class ForwardArguments(RemoteCodeRule):
    code = "HFC816"
    name = "remote-forward-arguments"
    impact = "blocker"
    what = "The base model's forward names `input_ids`, `inputs_embeds` and `position_ids` as parameters."
    why = (
        "vLLM's transformers backend decorates the base model class for torch.compile with those three arguments "
        "(`DynamicArgDims(input_ids=1, inputs_embeds=1, position_ids=-1)`) and `support_torch_compile` checks each "
        "against the forward's signature: one missing (taken only through `**kwargs`) fails the load with "
        "'Argument position_ids not found in the forward method', --enforce-eager or not."
    )
    example = "def forward(self, input_ids=None, past_key_values=None, attention_mask=None, inputs_embeds=None, **kwargs):"
    fix = "def forward(self, input_ids=None, ..., inputs_embeds=None, position_ids=None, **kwargs):"
    vllm_source = ("model_executor/models/transformers/base.py::Base._decorate_for_torch_compile",)
    none = None


class AttentionBackendFlag(RemoteCodeRule):
    code = "HFC805"
    name = "remote-attention-backend-flag"
    impact = "blocker"
    what = "The PreTrainedModel subclass sets `_supports_attention_backend = True`, or its module passes transformers' source test."
    why = (
        "vLLM checks `is_backend_compatible()` (the flag) or `_can_set_attn_implementation()` (a module defining "
        "`class *Attention*(nn.Module)` must contain `ALL_ATTENTION_FUNCTIONS.get_interface(`). Neither: "
        "'The Transformers implementation of X is not compatible with vLLM'. Passing only the source test is a warning."
    )
    example = "class MyPreTrainedModel(PreTrainedModel):\n    _supports_sdpa = True   # no _supports_attention_backend"
    fix = "class MyPreTrainedModel(PreTrainedModel):\n    _supports_attention_backend = True"
    vllm_source = ("model_executor/models/registry.py::_ModelRegistry._try_resolve_transformers",)
    none = None
    observed_by = "HFC102"


class AttentionLayerIndex(RemoteCodeRule):
    code = "HFC806"
    name = "remote-attention-layer-idx"
    impact = "blocker"
    what = "Each attention module stores the index of its decoder layer in `self.layer_idx`."
    why = "vLLM maps each dispatching module to its attention layer and KV-cache slot by the int `layer_idx`; without it the layer counts as not dispatching."
    example = "class MyAttention(nn.Module):\n    def __init__(self, config):   # no layer_idx"
    fix = "def __init__(self, config, layer_idx):\n    self.layer_idx = layer_idx   # and build it as MyAttention(config, layer_idx)"
    vllm_source = (
        "model_executor/models/transformers/fusers/attention.py::AttentionFuser.layer_index",
        "model_executor/models/transformers/base.py::Base._create_attention_instances",
    )
    none = None
    observed_by = "HFC201"


class AttentionIsCausal(RemoteCodeRule):
    code = "HFC807"
    name = "remote-attention-is-causal"
    impact = "info"
    what = "Whether attention modules declare `is_causal` (True: decoder; False: encoder-only)."
    why = "vLLM serves a text model with any `is_causal = False` module as encoder-only (pooling, no generation); an undeclared value is read as causal."
    example = "self.is_causal = False   # a bidirectional encoder"
    fix = "Set `self.is_causal = True` in decoder attention modules (False only for encoders)."
    vllm_source = ("model_executor/models/transformers/base.py::Base._get_attn_cls",)
    none = None


RULES = (AttentionInterfaceDispatch, AttentionScalingResolvable, HandWrittenAttention, KwargsPropagation, ForwardArguments, AttentionBackendFlag, AttentionLayerIndex, AttentionIsCausal,)
