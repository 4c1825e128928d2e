"""v5: every model class ends its ``__init__`` with ``self.post_init()``.

transformers 5's ``from_pretrained`` reads what ``post_init`` sets (``all_tied_weights_keys``,
the tied-weights and init bookkeeping); 4.x-era remote code often never calls it (ChatGLM2/3,
TeleChat: transformers-mlinter's TRF013), and the ported model then fails to load with
"object has no attribute 'all_tied_weights_keys'" although the port's own proof, which builds
from the config and loads a state dict, passes. The call goes last in each ``__init__`` of a
class below the remote ``PreTrainedModel``, as transformers' own classes have it.
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save

POST_INIT = cst.parse_statement("self.post_init()\n")


def _calls_post_init(init: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "post_init" for n in ast.walk(init))


class PostInit(Codemod):
    name = "post-init"
    codes = ("v5",)

    def apply(self, state) -> None:
        index = state.index()
        for cls in index.classes:
            init = cls.methods.get("__init__")
            if init is None or not index.is_pretrained_model(cls) or _calls_post_init(init):
                continue
            if "forward" not in cls.methods and not any(index.is_pretrained_model(c) for c in index.mro(cls)[1:]):
                continue  # the remote PreTrainedModel base itself (no forward, nothing of its own below transformers')
            module = parse(state, cls.file)
            module = cu.edit_class(module, cls.name, lambda c: cu.edit_method(c, "__init__", lambda f: cu.with_body(f, [*cu.body_of(f), POST_INIT])))
            save(state, cls.file, module)
            state.change("v5", cls.file, f"{cls.name}.__init__", "ends with self.post_init()",
                         "transformers 5's from_pretrained reads what post_init sets (all_tied_weights_keys); without it the ported "
                         "model does not load")
