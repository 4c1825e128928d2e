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
from hfcheck.porter.rewrite.codemods.base import Codemod, Place, parse, save, set_class_attribute

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
        module = set_class_attribute(parse(state, cls.file), cls.name, "attribute_map", cst.parse_expression(repr(mapping)), Place.after("model_type"))
        if module is None:
            return
        save(state, cls.file, module)
        state.change("v5", cls.file, cls.name, f"attribute_map maps num_hidden_layers to {key}",
                     "transformers 5 reads config.num_hidden_layers (generate sizes its cache from it); this config stores the count as "
                     f"{key}")

