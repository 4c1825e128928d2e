"""v5: the parameters the original shares (an output head tied to the input embeddings) are
declared in ``_tied_weights_keys = {"lm_head.weight": "<embeddings>.weight"}``.

transformers 4.x tied the output embeddings to the input embeddings through
``get_output_embeddings()`` whenever ``tie_word_embeddings`` held (default True); transformers 5
ties only what ``_tied_weights_keys`` maps (a dict, target -> source), and only when the config
sets ``tie_word_embeddings`` (no default), which the port then writes into config.json. 4.x code declares nothing, or a list, so
in v5 its ``lm_head`` becomes a separate parameter that a checkpoint without it (a tied
checkpoint stores the matrix once) leaves uninitialised. Which parameters are tied is read from
the original's own run in its release (the reference records shared parameters), not guessed.
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.porter.rewrite.codemods.base import Codemod, Place, parse, save, set_class_attribute

KEY = "_tied_weights_keys"


class TiedWeights(Codemod):
    name = "tied-weights"
    codes = ("v5",)

    def apply(self, state) -> None:
        pairs = state.tied or []
        ref = (state.config.get("auto_map") or {}).get("AutoModelForCausalLM")
        if not pairs or not isinstance(ref, str):
            return
        module_name, _, cls_name = (ref.partition("--")[2] or ref).rpartition(".")
        index = state.index()
        file = index.by_module.get(module_name.rpartition(".")[2])
        info = file.classes.get(cls_name) if file is not None else None
        if info is None:
            return
        mapping = {}
        for first, second in pairs:  # the run names the earlier-registered parameter first: that is the source
            target, source = (second, first) if "embed" in first or "wte" in first else (first, second)
            mapping[target] = source
        if "tie_word_embeddings" not in state.config and "tie_word_embeddings" not in state.config_defaults():
            # 4.x's PretrainedConfig defaulted it to True; 5.x's reads it from the config only
            state.config_edits.append({"op": "set", "key": "tie_word_embeddings", "value": True})
            state.change("v5", "config.json", "tie_word_embeddings", "set tie_word_embeddings = true (4.x's default, which the original ran with)",
                         "transformers 5 ties the declared parameters only when the config says so")
        existing = index.class_attr(info, KEY)
        if existing is not None and existing[0] is not info:
            return  # declared on a base class the port does not own here
        if existing is not None:
            try:
                current = ast.literal_eval(existing[1])
            except (ValueError, SyntaxError):
                return
            if isinstance(current, dict) and all(current.get(k) == v for k, v in mapping.items()):
                return
        module = set_class_attribute(parse(state, info.file), cls_name, KEY, cst.parse_expression(repr(mapping)), Place.after_docstring)
        if module is None:
            return
        save(state, info.file, module)
        state.change("v5", info.file, cls_name, f"{KEY} = {mapping!r} (shared in the original's own run)",
                     "transformers 5 ties only what _tied_weights_keys maps; without it the output head is a separate, uninitialised "
                     "parameter when the checkpoint stores the tied matrix once")
