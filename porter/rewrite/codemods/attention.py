"""HFC801 / HFC803 (and HFC802, HFC807 on the way): route attention through the transformers
attention interface.

Recognised, in an attention module's ``forward`` (top-level statements only):

- hand-written ``softmax(Q K^T) V``: the statement computing ``W = Q @ K^T [/ sqrt(d) | * s]``,
  then only mask additions (also under ``if mask is not None:``), scaling, softmax, dropout and
  dtype casts of ``W``, up to ``O = W @ V``;
- a direct ``F.scaled_dot_product_attention(q, k, v, attn_mask=..., ...)`` call;
- a direct ``flash_attn_func(q, k, v, ..., causal=True)`` call ([batch, seq, heads, dim] layout).

The span becomes ``attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
self.config._attn_implementation, eager_attention_forward)`` and one call
``O, W = attention_interface(self, q, k, v, mask, dropout=..., scaling=self.scaling, **kwargs)``;
the interface returns [batch, seq, heads, dim], so the ``O.transpose(1, 2)`` that followed is
dropped (or, when there is none, one is added). ``self.scaling``, ``self.config`` and
``self.is_causal = True`` are added to ``__init__`` when missing, and an ``eager_attention_forward``
(the same softmax(QK^T)V, now the interface's eager fallback) when the file has none.
Anything else in the span (softcapping, ALiBi, masked_fill with a model-specific mask) is
refused with the statement that stopped it: the interface cannot express it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote.ast_helpers import attention_by_hand, dispatch_names
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import (
    Codemod,
    add_init_assign,
    assigned,
    init_owner,
    init_param_of_config,
    parse,
    save,
)

SDPA = "scaled_dot_product_attention"
FLASH = {"flash_attn_func"}
CASTS = {"to", "type_as", "float", "half", "bfloat16", "type", "contiguous"}

EAGER = '''def {name}(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """softmax(Q K^T) V on [batch, heads, seq, head_dim] tensors: the `eager` entry of the
    attention interface (added by hfcheck port; sdpa, flash and vLLM replace it)."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    n_rep = query.shape[1] // key.shape[1]
    if n_rep > 1:
        key = key.repeat_interleave(n_rep, dim=1)
        value = value.repeat_interleave(n_rep, dim=1)
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = torch.tanh(attn_weights / softcap) * softcap
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attn_weights = attn_weights.masked_fill(~attention_mask[:, :, :, : key.shape[-2]], torch.finfo(attn_weights.dtype).min)
    elif attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key.shape[-2]]
    elif getattr(module, "is_causal", False) and query.shape[2] > 1:
        q_len, kv_len = query.shape[2], key.shape[2]
        future = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).triu(kv_len - q_len + 1)
        attn_weights = attn_weights.masked_fill(future, torch.finfo(attn_weights.dtype).min)
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights
'''

HEAD_COUNTS = {"num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "num_kv", "n_head", "n_heads", "n_kv_heads",
               "num_attention_heads_per_partition", "num_multi_query_groups_per_partition"}
WHY_DISPATCH = "vLLM serves attention only through ALL_ATTENTION_FUNCTIONS; a layer computing it itself is refused at load"


TRUE = m.Name("True")
NAME_IS_NOT_NONE = m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None", lpar=[], rpar=[]))])
"""``if mask is not None:``, the guard of a mask branch."""

class Refused(Exception):
    pass


class _Plan:
    def __init__(self, start: int, end: int, q: str, k: str, v: str, out: str, weights: str | None, mask: str, scale: str | None,
                 scale_kind: str, dropout: str | None, layout: str, what: str):
        self.start, self.end = start, end
        self.q, self.k, self.v, self.out, self.weights = q, k, v, out, weights
        self.mask, self.scale, self.scale_kind, self.dropout, self.layout, self.what = mask, scale, scale_kind, dropout, layout, what


class AttentionInterface(Codemod):
    name = "attention-interface"
    codes = ("HFC801", "HFC803", "HFC802", "HFC807")

    def apply(self, state) -> None:
        tried: set[str] = set()
        ported: set[str] = set()
        if state.observed is not None:  # the original ran: locate each core by its dataflow
            tried, ported = self._apply_observed(state)
            tried |= self._drop_uncalled(state, ported)
        while True:
            index = state.index()
            target = None
            for cls in index.classes:
                if cls.name in tried or "forward" not in cls.methods or index.is_pretrained_model(cls):
                    continue
                forward = cls.methods["forward"]
                if dispatch_names(forward):
                    continue
                if attention_by_hand(index.file_of(cls), forward) is not None:
                    target = cls
                    break
            if target is None:
                break
            tried.add(target.name)
            try:
                self._port(state, index, target)
                ported.add(target.name)
            except Refused as exc:
                state.refuse("HFC803", target.file, f"{target.name}.forward", str(exc))
        if ported:
            self._select_directly(state, ported)

    # ------------------------------------------------------------------ one class

    def _port(self, state, index, cls) -> None:
        file = cls.file
        module = parse(state, file)
        classdef = cu.top_class(module, cls.name)
        if classdef is None:
            raise Refused("the class is not defined at module level")
        func = cu.the_method(classdef, "forward")
        body = cu.body_of(func)
        plan = self._recognise(body)
        owner = init_owner(index, cls)
        if owner is None or owner.file != file:
            raise Refused("its __init__ is not in the same file (or is inherited from transformers)")
        owner_init = cu.the_method(cu.the_class(module, owner.name), "__init__")
        config_name = init_param_of_config(owner_init)
        init_adds: list[tuple[str, str, str]] = []  # (attr, value, position)
        if not assigned(index, cls, "config"):
            if config_name is None:
                raise Refused("the module keeps no config and its __init__ takes none (the interface reads config._attn_implementation)")
            init_adds.append(("config", config_name, "start"))
        # scaling: vLLM reads `scaling=` from the source; it must be a literal or self.<attr>
        scaling_arg = self._scaling(index, cls, plan, init_adds)
        if not assigned(index, cls, "is_causal"):
            init_adds.append(("is_causal", "True", "end"))
        kwargs = cu.star_kwargs(func) or "kwargs"
        iface = "attention_interface" if "attention_interface" not in cu.names_in(func) else "attention_fn"
        eager = self._eager_name(module)
        weights = plan.weights or ("attn_weights" if "attn_weights" not in cu.names_in(func) else "_attn_weights")
        q, k, v = (f"{x}.transpose(1, 2)" for x in (plan.q, plan.k, plan.v)) if plan.layout == "bshd" else (plan.q, plan.k, plan.v)
        keywords = [("dropout", _dropout(plan.dropout)), *([("scaling", scaling_arg)] if scaling_arg is not None else [])]
        new = [
            cu.carry_leading(body[plan.start], cu.template(GET_INTERFACE, iface=iface, eager=eager)),
            _interface_call(plan.out, weights, iface, [q, k, v, plan.mask], keywords, kwargs),
        ]
        rest = body[plan.end + 1:]
        if plan.layout == "bhsd":
            fixed = _drop_transpose(rest[0], plan.out) if rest else None
            if fixed is not None:
                rest = [fixed] + rest[1:]
            else:
                new.append(cu.template("{out} = {out}.transpose(1, 2)  # the interface returns [batch, seq, heads, head_dim]\n", out=plan.out))
        func = cu.with_body(func, body[: plan.start] + new + rest)
        func = cu.add_star_kwargs(func, kwargs)
        module = cu.replace_top(module, classdef, cu.replace_in_body(classdef, cu.the_method(classdef, "forward"), func))
        for attr, value, position in init_adds:
            module = add_init_assign(module, owner.name, attr, value, position)
        module = cu.ensure_import(module, "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n", "ALL_ATTENTION_FUNCTIONS")
        if eager not in cu.bound_names(module):
            module = cu.ensure_import(module, "import torch\n", "torch")
            fn = cu.template(EAGER, name=eager).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            first = next((s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value in (cls.name, owner.name)), None)
            module = cu.insert_before_class(module, first.name.value if first is not None else cls.name, [fn])
            state.change("HFC801", file, eager, "added the eager fallback of the attention interface (softmax(QK^T)V)",
                         "get_interface(impl, eager_attention_forward) needs a fallback for attn_implementation='eager'")
        save(state, file, module)
        where = f"{cls.name}.forward"
        state.change("HFC803", file, where, f"replaced {plan.what} with one attention-interface call", WHY_DISPATCH)
        state.change("HFC801", file, where, f"dispatches through ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, {eager}) once",
                     "vLLM swaps in its paged attention through this lookup (and transformers' sdpa/flash backends too)")
        self._record_init_adds(state, file, owner.name, init_adds)

    # ------------------------------------------------------------------ by dataflow

    def _apply_observed(self, state) -> tuple[set[str], set[str]]:
        """Rewrite each region the reference run proved to be attention (``porter.rewrite.dataflow``);
        refuse, at file:line, each it proved is not. Classes whose attention did not run in the
        recorded layer are left to the statement patterns below."""
        from hfcheck.porter.rewrite.dataflow import CorePlan

        tried: set[str] = set()
        ported: set[str] = set()
        by_file: dict[str, list] = {}
        index = state.index()
        for plan in state.observed:
            info = index.files[plan.file].classes.get(plan.cls) if plan.file in index.files else None
            forward = info.methods.get("forward") if info is not None else None
            if forward is not None and dispatch_names(forward):
                tried.add(plan.cls)
                continue  # it already goes through the interface (the core ran inside transformers)
            tried.add(plan.cls)
            if isinstance(plan, CorePlan):
                by_file.setdefault(plan.file, []).append(plan)
            else:
                state.refuse(plan.code, plan.file, f"{plan.cls}.forward", f"line {plan.line}: {plan.reason}")
        for file, file_plans in by_file.items():
            module = parse(state, file)
            done = []
            for plan in sorted(file_plans, key=lambda p: -p.start_line):  # bottom-up: earlier lines keep their numbers
                index = CodeIndex(dict(state.files, **{file: module.code}))
                cls = index.files[file].classes.get(plan.cls) if file in index.files else None
                try:
                    if cls is None:
                        raise Refused(f"{plan.cls} is not a class of {file}")
                    module = self._rewrite_region(state, index, cls, module, plan)
                    done.append(plan)
                except Refused as exc:
                    state.refuse("HFC803", file, f"{plan.cls}.forward", f"line {plan.start_line}: {exc}")
            window = state.config.get("sliding_window")
            if done and isinstance(window, int) and window > 0 and "sliding_attention" not in (state.config.get("layer_types") or []):
                state.refuse("HFC803", file, f"{done[0].cls}.forward",
                             f"config.json sets sliding_window = {window}: the proof runs a few tokens, far inside any window, so whether the "
                             "original windows its attention is not checked; vLLM windows only layers whose layer_types say sliding_attention")
            if done:
                for plan in done:
                    module = self._per_rank_views(state, module, plan)
                module = self._module_level(state, module, file, done[0].cls)
                save(state, file, module)
                ported.update(p.cls for p in done)
        return tried, ported

    def _drop_uncalled(self, state, ported: set[str]) -> set[str]:
        """Attention classes without weights of their own that nothing calls once the rewritten
        ``forward`` no longer takes their branch (Qwen's ``FlashSelfAttention``, never built
        without flash_attn; ChatGLM's ``CoreAttention``, whose call was inside the region): their
        ``self.x = Cls(...)`` and the class itself are removed. Returns the classes removed."""
        if not ported or state.built_classes is None:
            return set()
        removed: set[str] = set()
        index = state.index()
        for cls in index.classes:
            forward = cls.methods.get("forward")
            if state.built_classes.get(cls.name) or cls.name in ported or forward is None or index.is_pretrained_model(cls):
                continue
            computes_attention = attention_by_hand(index.file_of(cls), forward) is not None
            if not computes_attention and state.built_classes.get(cls.name) is not False:
                continue  # neither attention nor a weightless module the original built
            if self._remove_class(state, cls, only_if_assigned=not computes_attention):
                removed.add(cls.name)
        return removed

    def _remove_class(self, state, cls, only_if_assigned: bool = False) -> bool:
        """Remove ``cls`` and the ``self.<attr> = cls(...)`` that build it, when no other code
        names the class or reads those attributes (``only_if_assigned``: and at least one such
        attribute exists, so a class built elsewhere, in a list, is kept)."""
        texts = dict(state.files)
        attrs: set[str] = set()
        for text in texts.values():
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                        and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"
                        and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == cls.name):
                    attrs.add(node.targets[0].attr)
        if only_if_assigned and not attrs:
            return False
        for text in texts.values():
            tree = ast.parse(text)
            own = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.name]
            inside = {id(n) for c in own for n in ast.walk(c)}  # `super(Cls, self)` in its own body does not count
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in attrs and isinstance(node.ctx, ast.Load):
                    return False
                if isinstance(node, ast.Name) and node.id == cls.name and id(node) not in inside and not _builds(tree, node, cls.name):
                    return False

        class Drop(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original, updated):
                small = cu.simple(updated)
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and cu.is_self_attr(small.targets[0].target) \
                        and small.targets[0].target.attr.value in attrs and isinstance(small.value, cst.Call) \
                        and cu.code(small.value.func) == cls.name:
                    return cst.RemovalSentinel.REMOVE
                return updated

            def leave_If(self, original, updated):
                if isinstance(updated.body, cst.IndentedBlock) and not updated.body.body and updated.orelse is None:
                    return cst.RemovalSentinel.REMOVE
                if isinstance(updated.body, cst.IndentedBlock) and not updated.body.body:
                    return updated.with_changes(body=updated.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
                return updated

            def leave_ClassDef(self, original, updated):
                return cst.RemovalSentinel.REMOVE if updated.name.value == cls.name else updated

        for file in texts:
            module = parse(state, file)
            new = module.visit(Drop())
            if new.code != module.code:
                save(state, file, new)
        state.change("HFC803", cls.file, cls.name,
                     f"removed {cls.name} and {', '.join(f'self.{a}' for a in sorted(attrs)) or 'nothing else'}: it holds no weights, and once the "
                     "attention was rewritten nothing called it",
                     "a class computing attention outside the interface makes the model count as not dispatching; this one was dead code")
        return True

    def _rewrite_region(self, state, index, cls, module: cst.Module, plan) -> cst.Module:
        """The region the reference run proved to be attention -> one interface call: decide what
        the module lacks (refusing what the interface cannot hold), build the statements, put
        them in place of the region's lines, and record why."""
        owner = init_owner(index, cls)
        if owner is None or owner.file != plan.file:
            raise Refused("its __init__ is not in the same file (or is inherited from transformers)")
        classdef = cu.the_class(module, plan.cls)
        forward = cu.the_method(classdef, "forward")
        init_adds = self._region_init_adds(index, cls, module, owner.name, plan)
        scaling = plan.scaling
        if scaling is None and plan.scaling_init is not None:
            scaling = self._scaling_attr(index, cls, plan.scaling_init, init_adds)
        if not assigned(index, cls, "is_causal"):
            init_adds.append(("is_causal", "True", "end"))
        if plan.groups and not assigned(index, cls, "num_key_value_groups"):
            init_adds.append(("num_key_value_groups", plan.groups, "end"))
        names = _RegionNames.free_in(forward, cu.the_method(classdef, plan.function), plan)
        shape, keep_shape = _input_shape(forward, cu.names_in(forward))
        reshape = _reshape_output(plan, forward, shape)
        softcap = [("softcap", "self.config.attn_logit_softcapping")] if plan.softcap is not None else []
        call = [cu.template(GET_INTERFACE, iface=names.iface, eager=self._eager_name(module)),
                _interface_call(plan.out, names.weights, names.iface, [names.q, names.k, names.v, plan.mask],
                                [("dropout", _dropout(plan.dropout)), *([("scaling", scaling)] if scaling else []), *softcap], names.kwargs),
                reshape]
        spans = _region_spans(plan, names, call)
        module, replaced = cu.replace_spans(module, plan.cls, spans)
        for span in sorted(spans, key=lambda span: -span.start):  # the lowest unplaced span is named, as before
            if span not in replaced:
                raise Refused(f"lines {span.start}-{span.end} are not whole statements of one block of {span.method}")
        removed = sum(n for span, n in replaced.items() if span.method == plan.function)
        self._carry_softcap(state, plan)
        if keep_shape is not None:
            module = cu.edit_class(module, plan.cls, partial(cu.edit_method, name="forward", fn=_first_in_forward(keep_shape)))
        calling = "forward" if plan.returns else plan.function  # the method the call now stands in takes the **kwargs it passes on
        module = cu.edit_class(module, plan.cls, partial(cu.edit_method, name=calling, fn=partial(cu.add_star_kwargs, name=names.kwargs)))
        module = self._split_packed(state, index, cls, module, plan, init_adds)
        for attr, value, position in init_adds:
            module = add_init_assign(module, owner.name, attr, value, position)
        self._record_region(state, plan, removed)
        self._record_init_adds(state, plan.file, owner.name, init_adds)
        return module

    def _region_init_adds(self, index, cls, module: cst.Module, owner: str, plan) -> list[tuple[str, str, str]]:
        """What ``__init__`` must store for the interface: ``self.config`` where the module keeps none."""
        if assigned(index, cls, "config"):
            return []
        config_name = init_param_of_config(cu.the_method(cu.the_class(module, owner), "__init__"))
        if config_name is None:
            raise Refused("the module keeps no config and its __init__ takes none (the interface reads config._attn_implementation)")
        return [("config", config_name, "start")]

    def _carry_softcap(self, state, plan) -> None:
        """A region that caps its scores calls with ``softcap=self.config.attn_logit_softcapping``:
        vLLM applies that config key to every layer, so config.json carries the cap."""
        if plan.softcap is None:
            return
        if state.config.get("attn_logit_softcapping") != plan.softcap:
            state.config_edits.append({"op": "set", "key": "attn_logit_softcapping", "value": plan.softcap})
            state.change("HFC803", "config.json", "attn_logit_softcapping", f"set attn_logit_softcapping = {plan.softcap:g}",
                         "the original caps its scores with c * tanh(scores / c); vLLM applies that cap from this config key")
        state.sdpa_unsupported.append(f"{plan.cls}: a logit softcap (transformers' sdpa backend has none)")

    def _record_region(self, state, plan, removed: int) -> None:
        where = f"{plan.cls}.{plan.function}"
        state.change("HFC803", plan.file, where,
                     f"replaced lines {plan.start_line}-{plan.end_line} ({plan.what}; {removed} statement(s)) with one attention-interface call"
                     + (f" in forward (line {plan.caller_line}; {plan.function} now returns q, k and v)" if plan.returns else "") + ", "
                     f"proven equal on the original's recorded values (max relative error {plan.max_rel_error:.1e})", WHY_DISPATCH)
        state.change("HFC801", plan.file, where, "dispatches through ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, ...) once",
                     "vLLM swaps in its paged attention through this lookup (and transformers' sdpa/flash backends too)")

    def _split_packed(self, state, index, cls, module: cst.Module, plan, init_adds: list) -> cst.Module:
        """The packed q/k/v projection's cut (lines above the attention region, so unmoved)
        becomes ``.split((self.q_size, self.kv_size, self.kv_size), dim=-1)`` plus views."""
        from hfcheck.porter.rewrite.dataflow import SplitPlan

        split = plan.split
        if split is None:
            return module
        if not isinstance(split, SplitPlan):
            state.refuse("HFC813", split.file, f"{plan.cls}.forward", f"line {split.line}: {split.reason}")
            return module
        q, k, v = split.names
        new = [cu.template("{q}, {k}, {v} = {packed}.split((self.q_size, self.kv_size, self.kv_size), dim=-1)\n", q=q, k=k, v=v, packed=split.packed_var)]
        assert split.head_attr is not None  # the dataflow refuses a packed projection whose module keeps no head size
        new += [cu.template(VIEW[layout], name=name, head=split.head_attr) for name, layout in zip(split.names, split.views) if layout in VIEW]
        span = cu.LineSpan("forward", split.start_line, split.end_line, tuple(new))
        module, replaced = cu.replace_spans(module, plan.cls, [span])
        if span not in replaced:
            state.refuse("HFC813", plan.file, f"{plan.cls}.forward", f"lines {split.start_line}-{split.end_line} are not whole statements of one block")
            return module
        for attr, value in (("q_size", split.q_size), ("kv_size", split.kv_size)):
            if not assigned(index, cls, attr):
                init_adds.append((attr, value, "end"))
        rows = "(its rows are [q | k | v]: matched column by column on the recorded run; no weight change)"
        if split.regroup is not None:
            state.weight_rules.append({"kind": "regroup_rows", "pattern": rf"^(?:.*\.)?{re.escape(split.packed)}\.(?:weight|bias)$", **split.regroup})
            rows = (f"(its rows are grouped {'per head' if split.regroup['layout'] == 'head' else 'per key/value group'}, matched column by "
                    "column on the recorded run; the checkpoint's rows are reordered to [q | k | v])")
        state.change("HFC813", plan.file, f"{plan.cls}.forward",
                     f"lines {split.start_line}-{split.end_line}: the cut of self.{split.packed}'s output -> "
                     f".split((self.q_size, self.kv_size, self.kv_size), dim=-1) {rows}",
                     "vLLM shards and fuses a packed projection only when it reads this split")
        return module

    def _per_rank_views(self, state, module: cst.Module, plan) -> cst.Module:
        """``x.view(b, s, self.num_heads, self.head_dim)`` -> ``x.view(b, s, -1, self.head_dim)`` in the
        rewritten forward: under tensor parallelism each rank's projection holds only its share of
        the heads, so a view naming the total count fails ("shape ... is invalid for input of size
        ..."); transformers' own models write -1 there."""
        done: list[str] = []

        def swap(node):
            if not m.matches(node, m.Call(func=m.Attribute(attr=m.Name("view") | m.Name("reshape")))):
                return None
            heads = [i for i, a in enumerate(node.args) if cu.is_self_attr(a.value) and a.value.attr.value in HEAD_COUNTS]
            if len(heads) != 1 or any(cu.code(a.value).strip() == "-1" for a in node.args):
                return None
            done.append(cu.code(node.args[heads[0]].value))
            return node.with_changes(args=[a.with_changes(value=cst.UnaryOperation(cst.Minus(), cst.Integer("1"))) if i == heads[0] else a
                                           for i, a in enumerate(node.args)])

        classdef = cu.the_class(module, plan.cls)
        for name in {plan.function, "forward"}:
            method = cu.method(classdef, name)
            if method is not None:
                classdef = cu.replace_in_body(classdef, method, cu.replace_nodes(method, swap))
        if done:
            module = cu.replace_top(module, cu.the_class(module, plan.cls), classdef)
            state.change("HFC501", plan.file, f"{plan.cls}.forward", f"{len(done)} view(s) of the projections take -1 for the head count "
                         f"({', '.join(sorted(set(done)))})", "under tensor parallelism each rank holds only its share of the heads")
        return module

    def _module_level(self, state, module: cst.Module, file: str, cls_name: str) -> cst.Module:
        eager = self._eager_name(module)
        module = cu.ensure_import(module, "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n", "ALL_ATTENTION_FUNCTIONS")
        if eager not in cu.bound_names(module):
            module = cu.ensure_import(module, "import torch\n", "torch")
            fn = cu.template(EAGER, name=eager).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            first = next((s.name.value for s in module.body if isinstance(s, cst.ClassDef)), cls_name)
            module = cu.insert_before_class(module, first, [fn])
            state.change("HFC801", file, eager, "added the eager fallback of the attention interface (softmax(QK^T)V)",
                         "get_interface(impl, eager_attention_forward) needs a fallback for attn_implementation='eager'")
        return module

    def _scaling_attr(self, index, cls, expr: str, init_adds: list) -> str:
        for attr in ("scaling", "softmax_scale", "attn_scaling"):
            existing = index.self_assign(cls, attr)
            if existing is None:
                init_adds.append((attr, expr, "end"))
                return f"self.{attr}"
            if ast.dump(existing[1]) == ast.dump(ast.parse(expr, mode="eval").body):
                return f"self.{attr}"
        raise Refused("no free attribute name for the softmax scale")

    def _record_init_adds(self, state, file: str, owner: str, init_adds: list) -> None:
        for attr, value, _ in init_adds:
            if attr == "is_causal":
                state.change("HFC807", file, f"{owner}.__init__", "set self.is_causal = True",
                             "sdpa and vLLM read is_causal to apply the causal mask; an explicit decoder flag")
            elif attr == "config":
                state.change("HFC801", file, f"{owner}.__init__", f"stored self.config = {value}", "the interface is looked up from self.config._attn_implementation")
            elif attr == "num_key_value_groups":
                state.change("HFC801", file, f"{owner}.__init__", f"set self.num_key_value_groups = {value}",
                             "the sdpa and eager backends repeat the key/value heads by it (grouped-query attention)")
            elif attr in ("q_size", "kv_size"):
                state.change("HFC813", file, f"{owner}.__init__", f"set self.{attr} = {value}", "the sizes the packed split reads")
            else:
                state.change("HFC802", file, f"{owner}.__init__", f"set self.{attr} = {value} (passed as scaling=self.{attr})",
                             "vLLM resolves scaling= from the source: it must be a number or a self.<attr>")

    # ------------------------------------------------------------------ scaling

    def _scaling(self, index, cls, plan: _Plan, init_adds: list) -> str | None:
        if plan.scale_kind == "none":
            return "1.0"  # the original applied no scale at all
        if plan.scale_kind == "default":
            if assigned(index, cls, "head_dim"):
                plan.scale, plan.scale_kind = "self.head_dim**-0.5", "expr"
            else:
                return None  # the backends' default, 1/sqrt(head_dim)
        src = plan.scale
        if src is None:  # kind "expr" always carries its source
            raise Refused("the softmax scale was recognised without its source")
        node = cst.parse_expression(src)
        if cu.is_self_attr(node) or isinstance(node, (cst.Integer, cst.Float)):
            return src
        names = cu.names_in(node)
        if names & {plan.q, plan.k}:
            if re.fullmatch(rf"(math\.sqrt\()?{re.escape(plan.q)}\.(size\(-1\)|shape\[-1\])\)?( \*\* -0\.5)?", src.replace("1 / ", "")):
                return None
            raise Refused(f"the softmax scale `{src}` depends on the tensors; compute it in __init__ first")
        if not names <= {"self", "math", "torch"}:
            raise Refused(f"the softmax scale `{src}` uses local variables of forward; compute it in __init__ first")
        return self._scaling_attr(index, cls, src, init_adds)

    # ------------------------------------------------------------------ recognition

    def _recognise(self, body: list[cst.BaseStatement]) -> _Plan:
        for i, s in enumerate(body):
            targets, value = cu.assign_of(s)
            if value is None:
                continue
            if isinstance(value, cst.Call) and cu.short(cu.call_name(value)) in ({SDPA} | FLASH) and targets and len(targets) == 1:
                return self._direct(i, targets[0], value)
            qk = _qk(value)
            if qk is not None and targets and len(targets) == 1:
                return self._hand(body, i, targets[0], *qk)
        raise Refused("no softmax(QK^T)V span or direct SDPA/flash call among the top-level statements of forward")

    def _direct(self, i: int, out: str, call: cst.Call) -> _Plan:
        name = cu.short(cu.call_name(call))
        q, k, v = (cu.arg(call, n, kw) for n, kw in ((0, "query"), (1, "key"), (2, "value")))
        if q is None or k is None or v is None:
            raise Refused(f"{name}(...) without query, key and value arguments")
        if name == SDPA:
            mask = cu.arg(call, 3, "attn_mask")
            dropout = cu.arg(call, 4, "dropout_p")
            causal = cu.arg(call, 5, "is_causal")
            scale = cu.arg(call, 99, "scale")
            causal_true = causal is not None and m.matches(causal, TRUE)
            if mask is None and not causal_true:
                raise Refused("scaled_dot_product_attention without a mask and without is_causal=True is bidirectional attention")
            if mask is not None and causal_true:
                raise Refused("scaled_dot_product_attention with both a mask and is_causal=True")
            layout, mask_src = "bhsd", (cu.code(mask) if mask is not None else "None")
        else:
            dropout = cu.arg(call, 3, "dropout_p")
            scale = cu.arg(call, 4, "softmax_scale")
            causal = cu.arg(call, 5, "causal")
            if causal is None or not m.matches(causal, TRUE):
                raise Refused(f"{name}(...) without causal=True (bidirectional or windowed flash attention)")
            layout, mask_src = "bshd", "None"
        scale_src = cu.code(scale) if scale is not None and not m.matches(scale, m.Name("None")) else None
        drop_src = cu.code(dropout) if dropout is not None else None
        if drop_src is not None and re.fullmatch(r"0(\.0*)?", drop_src):
            drop_src = None
        elif drop_src is not None:
            drop_src = re.sub(r"^\s*(.+?)\s+if\s+self\.training\s+else\s+0(\.0*)?\s*$", r"\1", drop_src)
        return _Plan(i, i, cu.code(q), cu.code(k), cu.code(v), out, None, mask_src, scale_src, "expr" if scale_src else "default",
                     drop_src, layout, f"the direct {name}(...) call")

    def _hand(self, body, start: int, weights: str, q: str, k: str, scale) -> _Plan:
        derived = {weights}
        mask: str | None = None
        scale_src, scale_kind = _scale_src(scale)
        dropout = None
        softmax = False
        for j in range(start + 1, len(body)):
            s = body[j]
            targets, value = cu.assign_of(s)
            if isinstance(s, cst.If):
                mask = self._mask_if(s, derived, mask)
                continue
            if targets is None or len(targets) != 1 or value is None:
                raise Refused(f"unrecognised step between QK^T and the value product: `{cu.code(s).strip()}`")
            target = targets[0]
            mm = _matmul(value)
            if mm is not None and isinstance(mm[0], cst.Name) and mm[0].value in derived:
                if not softmax:
                    raise Refused("no softmax between QK^T and the value product")
                if mask is None:
                    raise Refused("the hand-written attention applies no mask; the interface would make it causal")
                return _Plan(start, j, q, k, cu.code(mm[1]), target, weights, mask,
                             scale_src, scale_kind, dropout, "bhsd", "softmax(QK^T)V written by hand")
            step = _step(value, derived)
            if step is None:
                raise Refused(f"unrecognised step between QK^T and the value product: `{cu.code(s).strip()}`")
            kind, detail = step
            if kind == "softmax":
                softmax = True
            elif kind == "dropout":
                dropout = detail
            elif kind == "mask":
                if mask is not None and mask != detail:
                    raise Refused("two different masks are added")
                mask = detail
            elif kind in ("div", "mul"):
                if scale_kind != "none":
                    raise Refused("the scores are scaled twice")
                scale_src, scale_kind = _scale_src((kind, detail))
            derived.add(target)
        raise Refused("no value product (W @ V) after the softmax")

    def _mask_if(self, s: cst.If, derived: set[str], mask: str | None) -> str | None:
        body = cu.body_of(s)
        if body and all(m.matches(b, m.SimpleStatementLine(body=[m.Raise()])) for b in body) and s.orelse is None:
            return mask  # a shape check
        test = s.test
        if not m.matches(test, NAME_IS_NOT_NONE) or s.orelse is not None:
            raise Refused(f"unrecognised condition between QK^T and the value product: `if {cu.code(test)}:`")
        name = cst.ensure_type(cst.ensure_type(test, cst.Comparison).left, cst.Name).value  # NAME_IS_NOT_NONE matched
        aliases = {name}
        for b in body:
            targets, value = cu.assign_of(b)
            if targets is None or len(targets) != 1:
                raise Refused(f"unrecognised step in the mask branch: `{cu.code(b).strip()}`")
            base = _base_name(value)
            if base in aliases and targets[0] not in derived:
                aliases.add(targets[0])
                continue
            step = _step(value, derived) if value is not None else None
            if step is None or step[0] != "mask" or step[1] not in aliases:
                raise Refused(f"unrecognised step in the mask branch: `{cu.code(b).strip()}`")
            derived.add(targets[0])
        if mask is not None and mask != name:
            raise Refused("two different masks are added")
        return name

    # ------------------------------------------------------------------ helpers

    def _eager_name(self, module: cst.Module) -> str:
        for s in module.body:
            if isinstance(s, cst.FunctionDef) and s.name.value == "eager_attention_forward":
                params = cu.param_names(s)
                return "eager_attention_forward" if len(params) >= 5 else "_eager_attention_forward_port"
        return "eager_attention_forward"

    def _select_directly(self, state, ported: set[str]) -> None:
        """``ATTENTION_CLASSES[config._attn_implementation](config)`` -> the eager class: vLLM sets
        ``_attn_implementation = "vllm"``, which no such table has."""
        for file in list(state.files):
            module = parse(state, file)
            tables: dict[str, str] = {}
            for s in module.body:
                targets, value = cu.assign_of(s)
                if targets and len(targets) == 1 and isinstance(value, cst.Dict) and value.elements:
                    entries: dict[str, str] = {}
                    for el in value.elements:
                        if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) and isinstance(el.value, cst.Name):
                            key = el.key.evaluated_value
                            entries[key if isinstance(key, str) else key.decode()] = el.value.value
                    if entries and set(entries.values()) & ported and len(entries) == len(value.elements):
                        tables[targets[0]] = entries.get("eager") or next(iter(entries.values()))
            if not tables:
                continue
            changed: list[tuple[str, str]] = []

            def swap(node):
                if m.matches(node, m.Subscript(value=m.Name(m.MatchIfTrue(lambda name: name in tables)))) and "_attn_implementation" in cu.code(node.slice[0]):
                    changed.append((node.value.value, tables[node.value.value]))
                    return cst.Name(tables[node.value.value])
                return None

            module = cu.replace_nodes(module, swap)
            if changed:
                save(state, file, module)
                for table, cls in sorted(set(changed)):
                    state.change("HFC801", file, table, f"builds {cls} directly instead of looking it up in {table}[config._attn_implementation]",
                                 f"vLLM sets _attn_implementation='vllm', which is not a key of {table}; every backend now goes through the interface")


def _builds(tree: ast.Module, name_node: ast.Name, cls_name: str) -> bool:
    """Is this use of the class name its definition's own name, or ``self.x = Cls(...)``?"""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.func is name_node
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)):
            return True
    return False



# ---------------------------------------------------------------------- the interface call

GET_INTERFACE = "{iface} = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, {eager})\n"
ONE_ARGUMENT_A_LINE = cst.ensure_type(cst.parse_expression("f(\n    a,\n    b,\n)"), cst.Call)
"""How transformers writes a call too long for one line; its commas and bracket are taken from here."""
VIEW = {
    "bshd": "{name} = {name}.view(*{name}.shape[:-1], -1, {head})\n",
    "sbhd": "{name} = {name}.view(*{name}.shape[:-1], -1, {head})\n",
    "bhsd": "{name} = {name}.view(*{name}.shape[:-1], -1, {head}).transpose(1, 2)\n",
    "Bsd": "{name} = {name}.view(*{name}.shape[:-1], -1, {head}).transpose(1, 2).flatten(0, 1)\n",
}
"""Each of q, k and v after the split, in the layout the statements after it read."""
RESHAPE = {
    "bsD": "{o} = {o}.reshape(*{shape}[:-1], -1).contiguous()\n",
    "bshd": "{o} = {o}.reshape(*{shape}[:-1], -1, {head})\n",
    "bhsd": "{o} = {o}.reshape(*{shape}[:-1], -1, {head}).transpose(1, 2)\n",
    "sbD": "{o} = {o}.reshape({shape}[1], {shape}[0], -1).transpose(0, 1).contiguous()\n",
    "sbhd": "{o} = {o}.reshape({shape}[1], {shape}[0], -1, {head}).transpose(0, 1)\n",
}
"""The interface returns [batch, seq, heads, head_dim] in transformers and [tokens, heads * head_dim]
in vLLM: the output is reshaped by the layer input's own shape, as transformers' models do, into
the layout the statements after the region expect. ``{shape}``: the input's shape as forward
received it (``x.shape``, or ``input_shape`` kept first where forward rebinds ``x``)."""
INPUT_SHAPE = "{name} = {x}.shape  # as forward received it (hfcheck port: the attention output is reshaped by it)\n"


NO_SPACE = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def _interface_call(out: str, weights: str, iface: str, tensors: list[str], keywords: list[tuple[str, str]], kwargs: str) -> cst.BaseStatement:
    """``out, weights = iface(self, q, k, v, mask, key=value..., **kwargs)`` (``tensors``: the
    sources of q, k, v and the mask); over 100 characters, one argument a line."""
    args = [cst.Arg(cst.Name("self")), *(cst.Arg(cst.parse_expression(t)) for t in tensors),
            *(cst.Arg(cst.parse_expression(value), keyword=cst.Name(key), equal=NO_SPACE) for key, value in keywords),
            cst.Arg(cst.Name(kwargs), star="**")]
    call = cst.Call(cst.Name(iface), args)
    line = cu.template("{out}, {weights} = {call}\n", out=out, weights=weights, call=call)
    if len(cu.code(line)) <= 100:
        return line
    between, after_last = (a.comma for a in ONE_ARGUMENT_A_LINE.args)
    args = [a.with_changes(comma=between) for a in call.args[:-1]] + [call.args[-1].with_changes(comma=after_last)]
    call = call.with_changes(args=args, whitespace_before_args=ONE_ARGUMENT_A_LINE.whitespace_before_args)
    return cu.template("{out}, {weights} = {call}\n", out=out, weights=weights, call=call)


def _dropout(p: str | None) -> str:
    return f"0.0 if not self.training else {p}" if p else "0.0"


@dataclass(frozen=True)
class _RegionNames:
    """The names the rewritten code uses: the interface, the weights it returns, q/k/v as the
    call reads them, and forward's ``**kwargs``."""

    iface: str
    weights: str
    q: str
    k: str
    v: str
    kwargs: str

    @classmethod
    def free_in(cls, forward: cst.FunctionDef, func: cst.FunctionDef, plan) -> _RegionNames:
        taken = cu.names_in(forward) | cu.names_in(func)
        q, k, v = plan.q, plan.k, plan.v
        if plan.returns:  # the helper hands q, k and v back; forward makes the call (vLLM reads forward's source)
            forward_names = cu.names_in(forward)
            q, k, v = (n if n not in forward_names else f"_{n}" for n in ("query_states", "key_states", "value_states"))
        return cls(iface="attention_interface" if "attention_interface" not in taken else "attention_fn",
                   weights=plan.weights or ("attn_weights" if "attn_weights" not in taken else "_attn_weights"),
                   q=q, k=k, v=v, kwargs=cu.star_kwargs(forward) or "kwargs")


def _reshape_output(plan, forward: cst.FunctionDef, shape: str) -> cst.BaseStatement:
    if plan.out_layout in ("bshd", "bhsd", "sbhd") and plan.head_attr is None:
        raise Refused("the statements after the attention want heads split, and the module keeps no head size attribute")
    head = {"head": plan.head_attr} if plan.head_attr is not None and plan.out_layout in ("bshd", "bhsd", "sbhd") else {}
    return cu.template(RESHAPE[plan.out_layout], o=plan.out, shape=shape, **head)


def _input_shape(forward: cst.FunctionDef, taken: set[str]) -> tuple[str, cst.BaseStatement | None]:
    """How the rewritten code reads the input's shape: ``x.shape``, or, where forward rebinds
    ``x`` (``hidden_states = hidden_states.transpose(0, 1)``), a name bound to it first."""
    params = cu.param_names(forward)
    if len(params) < 2:
        raise Refused("forward takes no input to read the token shape from")
    x = params[1]
    rebound = m.findall(forward, m.AssignTarget(target=m.Name(x)) | m.AugAssign(target=m.Name(x)))
    if not rebound:
        return f"{x}.shape", None
    name = next(n for n in ("input_shape", "_input_shape", "_hfcheck_input_shape") if n not in taken)
    return name, cu.template(INPUT_SHAPE, name=name, x=x)


def _first_in_forward(statement: cst.BaseStatement) -> Callable[[cst.FunctionDef], cst.FunctionDef]:
    def insert(func: cst.FunctionDef) -> cst.FunctionDef:
        body = cu.body_of(func)
        at = 1 if body and m.matches(body[0], cu.DOCSTRING) else 0
        return cu.with_body(func, body[:at] + [statement] + body[at:])
    return insert


def _region_spans(plan, names: _RegionNames, call: list[cst.BaseStatement]) -> list[cu.LineSpan]:
    """Where the call goes: in place of the region, or (a helper that ends with the region) in
    place of forward's call of the helper, which then returns q, k and v."""
    if not plan.returns:
        return [cu.LineSpan(plan.function, plan.start_line, plan.end_line, tuple(call))]
    helper_call = cu.template("{q}, {k}, {v} = {call}\n", q=names.q, k=names.k, v=names.v, call=plan.caller_call)
    returned = cu.template("return {q}, {k}, {v}  # [batch, heads, seq, head_dim]: forward calls the attention\n", q=plan.q, k=plan.k, v=plan.v)
    return [cu.LineSpan("forward", plan.caller_line, plan.caller_line, (helper_call, *call)),
            cu.LineSpan(plan.function, plan.start_line, plan.end_line, (returned,))]


# ---------------------------------------------------------------------- expression patterns


def _matmul(e: cst.BaseExpression):
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.MatrixMultiply):
        return e.left, e.right
    if isinstance(e, cst.Call) and cu.short(cu.call_name(e)) in ("matmul", "bmm"):
        positional = [a.value for a in e.args if a.keyword is None and not a.star]
        head = (cu.dotted(e.func) or "").split(".")[0]
        if len(positional) == 2 and head in ("torch", "th"):
            return positional[0], positional[1]
        if len(positional) == 1 and isinstance(e.func, cst.Attribute):
            return e.func.value, positional[0]
    return None


_LAST_TWO = {("2", "3"), ("3", "2"), ("-1", "-2"), ("-2", "-1")}


def _transposed(e: cst.BaseExpression) -> str | None:
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "contiguous":
        e = e.func.value
    if isinstance(e, cst.Attribute) and e.attr.value == "mT" and isinstance(e.value, cst.Name):
        return e.value.value
    if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and isinstance(e.func.value, cst.Name):
        args = tuple(cu.code(a.value).replace(" ", "") for a in e.args)
        if e.func.attr.value == "transpose" and args in _LAST_TWO:
            return e.func.value.value
        if e.func.attr.value == "permute" and args == ("0", "1", "3", "2"):
            return e.func.value.value
    return None


def _qk(value: cst.BaseExpression):
    scale = None
    mm = _matmul(value)
    if mm is None and isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Divide, cst.Multiply)):
        kind = "div" if isinstance(value.operator, cst.Divide) else "mul"
        mm, other = _matmul(value.left), value.right
        if mm is None and kind == "mul":
            mm, other = _matmul(value.right), value.left
        if mm is None:
            return None
        scale = (kind, other)
    if mm is None or not isinstance(mm[0], cst.Name):
        return None
    k = _transposed(mm[1])
    if k is None:
        return None
    return mm[0].value, k, scale


def _scale_src(scale) -> tuple[str | None, str]:
    """(source of the multiplier, kind): kind "none" (no scale), "expr"."""
    if scale is None:
        return None, "none"
    kind, node = scale
    if kind == "mul":
        return cu.code(node), "expr"
    if isinstance(node, cst.Call) and cu.short(cu.call_name(node)) == "sqrt" and len(node.args) == 1:
        inner = node.args[0].value
        text = cu.code(inner)
        if not isinstance(inner, (cst.Name, cst.Attribute, cst.Integer, cst.Float)):
            text = f"({text})"
        return f"{text}**-0.5", "expr"
    text = cu.code(node)
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Integer, cst.Float)):
        text = f"({text})"
    return f"1 / {text}", "expr"


def _unwrap_casts(e: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in CASTS:
        e = e.func.value
    return e


def _base_name(e) -> str | None:
    while isinstance(e, cst.Subscript):
        e = e.value
    return e.value if isinstance(e, cst.Name) else None


def _step(value: cst.BaseExpression, derived: set[str]):
    """Classify one assignment of the score tensor: (kind, detail) or None."""
    e = _unwrap_casts(value)
    if isinstance(e, cst.Name) and e.value in derived:
        return "cast", None
    if isinstance(e, cst.Call):
        name = cu.short(cu.call_name(e))
        positional = [a.value for a in e.args if a.keyword is None and not a.star]
        receiver = e.func.value if isinstance(e.func, cst.Attribute) else None
        first = positional[0] if positional else None
        subject = first if (first is not None and isinstance(first, cst.Name) and first.value in derived) else receiver
        if not (isinstance(subject, cst.Name) and subject.value in derived):
            return None
        if name == "softmax":
            dim = cu.arg(e, 1 if subject is first else 0, "dim")
            if dim is not None and cu.code(dim).replace(" ", "") not in ("-1", "3"):
                return None
            return "softmax", None
        if name == "dropout":
            if cu.is_self_attr(e.func):  # self.attn_dropout(W): an nn.Dropout module
                return "dropout", f"{cu.code(e.func)}.p"
            p = cu.arg(e, 1, "p")
            training = cu.arg(e, 2, "training")
            p_src = cu.code(p) if p is not None else "0.5"
            if training is None and not re.fullmatch(r"0(\.0*)?", p_src):
                return None
            return "dropout", None if re.fullmatch(r"0(\.0*)?", p_src) else p_src
        if isinstance(e.func, cst.Attribute) and cu.is_self_attr(e.func) and "drop" in e.func.attr.value.lower():
            return "dropout", f"{cu.code(e.func)}.p"
        return None
    if isinstance(e, cst.BinaryOperation) and isinstance(e.left, cst.Name) and e.left.value in derived:
        if derived & cu.names_in(e.right):
            return None
        if isinstance(e.operator, cst.Add):
            base = _base_name(e.right)  # an additive mask; any other additive bias (ALiBi, ...) is refused
            return ("mask", base) if base is not None and "mask" in base.lower() else None
        if isinstance(e.operator, cst.Divide):
            return "div", e.right
        if isinstance(e.operator, cst.Multiply):
            return "mul", e.right
    return None


def _drop_transpose(s: cst.BaseStatement, out: str) -> cst.BaseStatement | None:
    """``s`` with its ``out.transpose(1, 2)`` replaced by ``out``, when that is the statement's
    only use of ``out``; else None."""
    targets, value = cu.assign_of(s)
    if cu.count_name(value if value is not None else s, out) != 1:
        return None
    done: list[bool] = []

    def swap(node):
        if done or not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return None
        if node.func.attr.value == "transpose" and isinstance(node.func.value, cst.Name) and node.func.value.value == out:
            args = tuple(cu.code(a.value).replace(" ", "") for a in node.args)
            if args in (("1", "2"), ("2", "1")):
                done.append(True)
                return cst.Name(out)
        return None

    new = cu.replace_nodes(s, swap)
    return new if done else None
