"""v5: a config that names its layer count otherwise (ChatGLM's ``num_layers``, GPT-style
``n_layer``) gets ``attribute_map = {"num_hidden_layers": ...}``.

transformers 5 reads ``config.num_hidden_layers`` where 4.x did not (``generate`` sizes its
``DynamicCache`` from it), so an unchanged 4.x config fails with "object has no attribute
'num_hidden_layers'". ``PretrainedConfig.attribute_map`` is the documented alias mechanism: the
stored key and ``config.json`` stay as they were.
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.analyzer.terms.vocabulary import LAYER_FIELDS
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

CANONICAL = "num_hidden_layers"


class ConfigAliases(Codemod):
    name = "config-aliases"
    codes = ("v5",)

    def apply(self, state) -> None:
        index = state.index()
        cls = state.config_class(index)
        if cls is None or CANONICAL in state.config:
            return
        key = next((k for k in LAYER_FIELDS if k != CANONICAL and k in state.config), None)
        if key is None or index.self_assign(cls, CANONICAL) is not None:
            return
        existing = index.class_attr(cls, "attribute_map")
        mapping: dict = {}
        if existing is not None:
            try:
                mapping = ast.literal_eval(existing[1])
            except (ValueError, SyntaxError):
                state.refuse("v5", cls.file, cls.name, "attribute_map is not a literal dict; add num_hidden_layers to it by hand")
                return
            if CANONICAL in mapping:
                return
            if existing[0] is not cls:
                mapping = dict(mapping)
        mapping[CANONICAL] = key
        module = parse(state, cls.file)
        classdef = cu.top_class(module, cls.name)
        if classdef is None:
            return
        body = cu.body_of(classdef)
        line = cu.template("attribute_map = {mapping}\n", mapping=repr(mapping))
        at = next((i for i, s in enumerate(body) if _assigns(s, "attribute_map")), None)
        if at is not None:
            body[at] = cu.carry_leading(body[at], line)
        else:
            at = next((i for i, s in enumerate(body) if _assigns(s, "model_type")), -1) + 1
            body.insert(at, line)
        save(state, cls.file, cu.replace_top(module, classdef, cu.with_body(classdef, body)))
        state.change("v5", cls.file, cls.name, f"attribute_map maps num_hidden_layers to {key}",
                     "transformers 5 reads config.num_hidden_layers (generate sizes its cache from it); this config stores the count as "
                     f"{key}")


def _assigns(s: cst.CSTNode, name: str) -> bool:
    targets, _ = cu.assign_of(s)
    return bool(targets) and targets == [name]
