"""HFC501 / HFC601: declare ``base_model_tp_plan`` and ``base_model_pp_plan`` on the config class.

Read off the ported module structure: in each decoder layer, a child whose linears are all
recognised (q/k/v-like and gate/up-like colwise, o-like and down-like rowwise) gets those
entries; a child with any other linear is left out (its dataflow is unknown, so it stays
replicated, which is always correct). The pp plan names the base model's embedding, its one
ModuleList of layers and the final norm, in the order the forward runs them. Existing entries
are never changed; missing ones are appended in the dict's own formatting.
"""

from __future__ import annotations

import ast
import re

import libcst as cst
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

COLWISE = re.compile(r"(q|k|v|query|key|value)(_proj)?|(gate|up)(_proj)?|w1|w3|fc1|c_fc|fc_in|wi(_[01])?")
ROWWISE = re.compile(r"(o|out|dense|down)(_proj)?|w2|fc2|c_proj|fc_out|wo")
QKV = re.compile(r"(q|k|v|query|key|value)(_proj)?")


class ParallelPlans(Codemod):
    name = "parallel-plans"
    codes = ("HFC501", "HFC601")

    def apply(self, state) -> None:
        index, roles = state.roles()
        config_cls = state.config_class(index)
        base = roles.base_model
        if config_cls is None or base is None:
            return
        if len(roles.layer_lists) != 1:
            state.refuse("HFC601", config_cls.file, config_cls.name, "no pp plan: the base model does not hold exactly one ModuleList of layers")
            return
        list_attr = roles.layer_lists[0][0]
        existing_tp = _dict_keys(config_cls.class_assigns.get("base_model_tp_plan"))
        existing_pp = _dict_keys(config_cls.class_assigns.get("base_model_pp_plan"))
        tp = {k: v for k, v in self._tp(index, roles, list_attr).items() if k not in (existing_tp or set())}
        pp = {} if existing_pp is not None else self._pp(index, base, list_attr)
        if not tp and not pp:
            return
        module = parse(state, config_cls.file)
        cls = cu.the_class(module, config_cls.name)
        if tp:
            cls = _merge(cls, "base_model_tp_plan", {k: repr(v).replace("'", '"') for k, v in tp.items()})
        if pp:
            cls = _merge(cls, "base_model_pp_plan", {k: repr(v).replace("'", '"') for k, v in pp.items()})
        save(state, config_cls.file, cu.replace_top(module, cu.the_class(module, config_cls.name), cls))
        if tp:
            state.change("HFC501", config_cls.file, config_cls.name, f"base_model_tp_plan: added {', '.join(f'{k}: {v}' for k, v in tp.items())}",
                         "vLLM shards the linears the plan names (colwise in, rowwise out); without a plan it replicates every linear it does not fuse")
        if pp:
            state.change("HFC601", config_cls.file, config_cls.name, f"base_model_pp_plan: {', '.join(pp)}",
                         "vLLM splits the model along the declared stages instead of inferring them (and warning) at load")

    def _tp(self, index, roles, list_attr: str) -> dict[str, str]:
        plan: dict[str, str] = {}
        for layer in roles.decoder_layers:
            for attr, assigns in layer.self_assigns.items():
                for value, _, method in assigns:
                    if method != "__init__":
                        continue
                    for child in index.instantiated_classes(layer, value):
                        plan.update(self._child(index, child, f"{list_attr}.*.{attr}", depth=0))
        return plan

    def _child(self, index, cls, prefix: str, depth: int) -> dict[str, str]:
        linears, children = {}, {}
        for c in index.mro(cls):
            for attr, assigns in c.self_assigns.items():
                for value, _, method in assigns:
                    if method != "__init__" or not isinstance(value, ast.Call):
                        continue
                    if ast.unparse(value.func).endswith("Linear"):
                        linears[attr] = value
                    elif depth == 0:
                        inner = index.instantiated_classes(c, value)
                        if inner and not ast.unparse(value.func).endswith("ModuleList"):
                            children[attr] = inner[0]
        out: dict[str, str] = {}
        if linears:
            styles = {}
            for attr in linears:
                if COLWISE.fullmatch(attr):
                    styles[attr] = "colwise"
                elif ROWWISE.fullmatch(attr):
                    styles[attr] = "rowwise"
                else:
                    return {}  # an unknown linear: leave the module replicated
            if "colwise" in styles.values() and list(styles.values()).count("rowwise") == 1:
                qkv = [a for a in styles if QKV.fullmatch(a)]
                if qkv and len(qkv) != 3:
                    return {}
                out.update({f"{prefix}.{a}": s for a, s in styles.items()})
        for attr, child in children.items():
            out.update(self._child(index, child, f"{prefix}.{attr}", depth + 1))
        return out

    def _pp(self, index, base, list_attr: str) -> dict[str, tuple]:
        order = []
        for c in index.mro(base):
            for attr, assigns in c.self_assigns.items():
                for value, line, method in assigns:
                    if method == "__init__" and isinstance(value, ast.Call):
                        order.append((line, attr, ast.unparse(value.func), [x.name for x in index.instantiated_classes(c, value)]))
        order.sort()
        attrs = [a for _, a, _, _ in order]
        embed = next((a for _, a, f, _ in order if f.endswith("Embedding")), None)
        if embed is None or list_attr not in attrs:
            return {}
        after = attrs[attrs.index(list_attr) + 1:]
        norm = next((a for _, a, f, names in reversed(order) if a in after and ("Norm" in f or any("Norm" in n for n in names))), None)
        if norm is None:
            return {}
        return {
            embed: (["input_ids"], ["inputs_embeds"]),
            list_attr: (["hidden_states", "attention_mask"], ["hidden_states"]),
            norm: (["hidden_states"], ["hidden_states"]),
        }


def _dict_keys(entry) -> set[str] | None:
    if entry is None:
        return None
    value = entry[0]
    if isinstance(value, ast.Dict):
        return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def _merge(cls: cst.ClassDef, attr: str, entries: dict[str, str]) -> cst.ClassDef:
    body = cu.body_of(cls)
    for i, s in enumerate(body):
        small = cu.simple(s)
        if isinstance(small, cst.Assign) and m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name(attr))])):
            if isinstance(small.value, cst.Dict):
                body[i] = s.with_changes(body=[small.with_changes(value=_append(small.value, entries))])
                return cu.with_body(cls, body)
            return cls
    new = cu.template("{attr} = {plan}\n", attr=attr, plan=_one_entry_a_line(entries))
    last = max((i for i, s in enumerate(body) if isinstance(cu.simple(s), (cst.Assign, cst.AnnAssign)) or (i == 0 and isinstance(cu.simple(s), cst.Expr))), default=-1)
    body.insert(last + 1, new)
    return cu.with_body(cls, body)


PLAN_SHAPE = cst.ensure_type(cst.parse_expression('{\n    "a": x,\n    "b": y,\n}'), cst.Dict)
"""How a plan is written, one entry a line as transformers writes its plans: the commas between
entries and after the last are taken from here."""


def _one_entry_a_line(entries: dict[str, str]) -> cst.Dict:
    first, last = PLAN_SHAPE.elements
    elements = [cst.DictElement(cst.SimpleString(f'"{k}"'), cst.parse_expression(v), comma=first.comma) for k, v in entries.items()]
    elements[-1] = elements[-1].with_changes(comma=last.comma)
    return PLAN_SHAPE.with_changes(elements=elements)


def _append(d: cst.Dict, entries: dict[str, str]) -> cst.Dict:
    elements = list(d.elements)
    new = [cst.DictElement(cst.SimpleString(f'"{k}"'), cst.parse_expression(v)) for k, v in entries.items()]
    if not elements:
        return d.with_changes(elements=[e.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for e in new[:-1]] + new[-1:])
    if len(elements) >= 2 and isinstance(elements[-2].comma, cst.Comma):
        mid = elements[-2].comma
    else:
        ws = d.lbrace.whitespace_after
        mid = cst.Comma(whitespace_after=ws if isinstance(ws, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" "))
    last = elements[-1].comma
    elements[-1] = elements[-1].with_changes(comma=mid)
    new = [e.with_changes(comma=mid) for e in new[:-1]] + [new[-1].with_changes(comma=last)]
    return d.with_changes(elements=elements + new)
