"""HFC811 (a v4 behaviour gone in v5): ``generate`` on the model classes that produce logits.

Until transformers 4.50 every ``PreTrainedModel`` inherited ``GenerationMixin``; in v5 a class
has ``generate`` only when it lists ``GenerationMixin`` among its bases itself. Remote code of
the 4.x era relies on the old inheritance, so its ``*ForCausalLM`` / ``*LMHeadModel`` classes
lose ``generate`` (``AttributeError: ... has no attribute 'generate'``). The codemod adds the
base, as transformers' own classes do: ``class XForCausalLM(XPreTrainedModel, GenerationMixin)``.
"""

from __future__ import annotations

import re

import libcst as cst

from hfcheck.porter.port import cstutil as cu
from hfcheck.porter.port.codemods.base import Codemod, parse, save

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
