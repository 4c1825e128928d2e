"""HFC811 (a v4 behaviour gone in v5): ``generate`` on the model classes that produce logits.

Until transformers 4.50 every ``PreTrainedModel`` inherited ``GenerationMixin``; in v5 a class
has ``generate`` only when it lists ``GenerationMixin`` among its bases itself. Remote code of
the 4.x era relies on the old inheritance, so its ``*ForCausalLM`` / ``*LMHeadModel`` classes
lose ``generate`` (``AttributeError: ... has no attribute 'generate'``). The codemod adds the
base, as transformers' own classes do: ``class XForCausalLM(XPreTrainedModel, GenerationMixin)``.
"""

from __future__ import annotations

import ast
import re
from functools import partial

import libcst as cst
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

HEADS = re.compile(r"(ForCausalLM|LMHeadModel|ForConditionalGeneration)$")


class GenerationBase(Codemod):
    name = "generation-mixin"
    codes = ("HFC811",)

    def apply(self, state) -> None:
        index = state.index()
        for cls in index.classes:
            if not HEADS.search(cls.name) or not any(index.is_pretrained_model(c) for c in index.mro(cls)):
                continue
            if any(b.rpartition(".")[2] == "GenerationMixin" for c in index.mro(cls) for b in c.bases):
                continue
            module = parse(state, cls.file)
            node = cu.top_class(module, cls.name)
            if node is None:
                continue
            bases = [*node.bases, cst.Arg(cst.Name("GenerationMixin"))]
            module = cu.replace_top(module, node, node.with_changes(bases=bases))
            module = cu.ensure_import(module, "from transformers.generation import GenerationMixin\n", "GenerationMixin")
            save(state, cls.file, module)
            state.change("HFC811", cls.file, cls.name, "added GenerationMixin to the bases",
                         "transformers 5 gives generate() only to classes that inherit GenerationMixin themselves (4.x gave it to every PreTrainedModel)")


SHIM = "legacy_past_key_values"
SHIM_DEF = '''def {name}(past):
    """transformers 5's generate hands the model an empty Cache object where 4.x passed None; this
    model keeps its KV cache as the tuples it returns (added by hfcheck port)."""
    if past is None or isinstance(past, (tuple, list)):
        return past
    if past.get_seq_length() == 0:
        return None
    raise ValueError("this model keeps its KV cache as tuples: pass back the past_key_values it returned")
'''


def _indexed_params(func: ast.FunctionDef, passed_to: set[str] | None = None) -> set[str]:
    """The parameters ``func`` indexes (``past_key_values[0]``), or passes by keyword to a
    parameter of that name which a forward of the file indexes (``kv_caches=past_key_values``,
    ChatGLM's encoder then reads ``kv_caches[index]``)."""
    params = {a.arg for a in func.args.args + func.args.kwonlyargs}
    found = {n.value.id for n in ast.walk(func) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in params}
    for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
        found |= {k.value.id for k in call.keywords
                  if k.arg in (passed_to or set()) and isinstance(k.value, ast.Name) and k.value.id in params}
    return found


class TupleCache(Codemod):
    """HFC811: a forward that indexes ``past_key_values`` as 4.x tuples (``past_key_values[0][0]``)
    receives a ``DynamicCache`` from transformers 5's generate on its first step and fails
    ("'DynamicCache' object is not subscriptable"); its ``prepare_inputs_for_generation`` reads
    the (non-empty-looking) cache as "past tokens exist" and cuts the prompt to its last token.
    Their first statement now maps that empty cache to None, so the code's own tuple cache starts
    as in 4.x and generate carries the tuples it returns. vLLM passes no cache; nothing changes there."""

    name = "tuple-cache"
    codes = ("HFC811",)

    def apply(self, state) -> None:
        index = state.index()
        for file, text in list(state.files.items()):
            if "past_key_values" not in text:
                continue
            classes = index.files[file].classes.values()
            # a forward passing the cache on by keyword to one that indexes it (ChatGLM's `kv_caches=past_key_values`);
            # a callee taking `past_key_values` itself gets the shim itself
            indexed = {p for cls in classes if "forward" in cls.methods for p in _indexed_params(cls.methods["forward"])} - {"past_key_values"}
            targets = []  # (class, method): forwards that index the tuples, and the generation hook that tests them for truth
            for cls in classes:
                forward = cls.methods.get("forward")
                if forward is not None and "past_key_values" in _indexed_params(forward, passed_to=indexed):
                    targets.append((cls.name, "forward"))
                prep = cls.methods.get("prepare_inputs_for_generation")
                if prep is not None and "past_key_values" in [a.arg for a in prep.args.args + prep.args.kwonlyargs]:
                    targets.append((cls.name, "prepare_inputs_for_generation"))
            if not any(method == "forward" for _, method in targets):
                continue
            module = parse(state, file)
            for name, method in targets:
                def add_first(func: cst.FunctionDef) -> cst.FunctionDef:
                    body = cu.body_of(func)
                    at = 1 if body and cu.code(body[0]).lstrip().startswith(('"""', "'''", 'r"""')) else 0
                    body.insert(at, cu.template("past_key_values = {shim}(past_key_values)  # a transformers 5 Cache -> this code's tuples\n", shim=SHIM))
                    if func.name.value == "prepare_inputs_for_generation":
                        body[at + 1:at + 1] = _as_4x_generate_passed(func)
                    return cu.with_body(func, body)

                module = cu.edit_class(module, name, partial(cu.edit_method, name=method, fn=add_first))
            updates = [c.name for c in classes if "_update_model_kwargs_for_generation" in c.methods]
            for name in updates:
                module = cu.edit_class(module, name, partial(cu.edit_method, name="_update_model_kwargs_for_generation", fn=_mask_may_be_none))
            if SHIM not in cu.bound_names(module):
                fn = cu.template(SHIM_DEF, name=SHIM).with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
                first = next(s.name.value for s in module.body if isinstance(s, cst.ClassDef))
                module = cu.insert_before_class(module, first, [fn])
            if any(method == "prepare_inputs_for_generation" and _takes_mask(index.files[file].classes[name].methods[method])
                   for name, method in targets):
                module = cu.ensure_import(module, "import torch\n", "torch")
            save(state, file, module)
            for name in updates:
                state.change("HFC811", file, f"{name}._update_model_kwargs_for_generation", "extends the attention mask only where there is one",
                             "transformers 5's generate keeps the key with None where the mask was all ones (4.x always passed it)")
            for name, method in targets:
                state.change("HFC811", file, f"{name}.{method}", f"maps the empty Cache transformers 5's generate passes to None ({SHIM})",
                             "4.x-era code indexes past_key_values as tuples (and tests it for truth); v5's generate starts it as a DynamicCache")
                if method == "prepare_inputs_for_generation" and _takes_mask(index.files[file].classes[name].methods[method]):
                    state.change("HFC811", file, f"{name}.{method}", "passes the all-ones attention mask on when generate gives none",
                                 "transformers 5's generate drops an all-ones mask that 4.x always passed; 4.x code then sizes its own "
                                 "mask by the past length it computes")


RESTORE_MASK = cu.template(
    "if attention_mask is None and input_ids is not None:  # as in 4.x: transformers 5's generate drops an all-ones mask\n"
    "    attention_mask = torch.ones_like(input_ids)\n")


def _takes_mask(prep: ast.FunctionDef) -> bool:
    params = [a.arg for a in prep.args.args + prep.args.kwonlyargs]
    return "attention_mask" in params and "input_ids" in params


def _as_4x_generate_passed(prep: cst.FunctionDef) -> list[cst.BaseStatement]:
    """What 4.x's generate handed ``prepare_inputs_for_generation`` and 5's does not: the all-ones
    attention mask (5 drops it, and 4.x code then builds one sized by its own past length, which
    some compute wrongly: TeleChat reads the head size), and no ``position_ids`` (5 passes the
    prompt's, never cut, which would override the ones this code derives from the mask)."""
    added = []
    params = [p.name.value for p in (*prep.params.params, *prep.params.kwonly_params)]
    if "attention_mask" in params and "input_ids" in params:
        added.append(RESTORE_MASK)
    kw = cu.star_kwargs(prep)
    if kw and f'{kw}.get("position_ids"' in cu.code(prep):
        added.append(cu.template('{kw}.pop("position_ids", None)  # as in 4.x: this code derives them from the mask\n', kw=kw))
    return added


def _mask_may_be_none(func: cst.FunctionDef) -> cst.FunctionDef:
    """``"attention_mask" in model_kwargs`` -> ``model_kwargs.get("attention_mask") is not None``."""
    test = m.Comparison(left=m.SimpleString('"attention_mask"') | m.SimpleString("'attention_mask'"),
                        comparisons=[m.ComparisonTarget(operator=m.In(), comparator=m.Name())])
    return cst.ensure_type(m.replace(func, test, lambda node, _: cu.template_expr(
        '{kwargs}.get("attention_mask") is not None', kwargs=cst.ensure_type(node, cst.Comparison).comparisons[0].comparator)), cst.FunctionDef)
