"""transformers 5: non-persistent buffers that ``__init__`` computes (a hand-written rotary
embedding's ``inv_freq``) are left as uninitialised memory by ``from_pretrained``.

v5 builds the model on the meta device and re-initialises only what its ``_init_weights``
knows (its own rotary classes carry ``original_inv_freq`` and ``rope_type`` for that); a
custom module's buffer keeps whatever the allocator returned. vLLM recomputes such buffers
itself (``init_buffers``: it re-instantiates the module from the config), but
``from_pretrained`` (``transformers serve``, ``generate``) does not. The PreTrainedModel
subclass gets an ``_init_weights`` that rebuilds those modules from the config and copies
their buffers, as vLLM does. No hfcheck check reports this yet; PORT.md lists it as ``v5``.
"""

from __future__ import annotations

import ast

import libcst as cst

from hfcheck.porter.port import cstutil as cu
from hfcheck.porter.port.codemods.base import Codemod, parse, save

WHY = ("from_pretrained in transformers 5 builds on the meta device and leaves a custom module's non-persistent buffers "
       "uninitialised (garbage positions); vLLM recomputes them the same way (init_buffers)")


class BufferInit(Codemod):
    name = "buffers"
    codes = ("v5",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        roots = [c for c in index.classes if any(b.rpartition(".")[2] in ("PreTrainedModel", "PretrainedModel") for b in c.bases)]
        if not roots:
            return
        root = roots[0]
        targets: dict[str, str] = {}  # class -> config expression (seen from the PreTrainedModel)
        for cls in index.classes:
            if cls.file != root.file or index.is_pretrained_model(cls) or "__init__" not in cls.methods:
                continue
            if not _registers_transient_buffer(cls.methods["__init__"]) or "original_inv_freq" in cls.self_assigns:
                continue
            init = cls.methods["__init__"]
            if len(init.args.args) - len(init.args.defaults) != 2:
                continue  # built from more than a config: cannot be rebuilt generically
            arg = _construction_arg(index, cls.name)
            if arg is None:
                state.refuse("v5", cls.file, cls.name, "its non-persistent buffers stay uninitialised after from_pretrained; it is not built as Cls(config)")
                continue
            targets[cls.name] = arg
        if not targets:
            return
        module = parse(state, root.file)
        rootdef = cu.top_class(module, root.name)
        existing = cu.method(rootdef, "_init_weights")
        names = ", ".join(sorted(targets))
        config_exprs = set(targets.values())
        if len(config_exprs) != 1:
            return
        config_expr = next(iter(config_exprs))
        if existing is not None:
            param = cu.param_names(existing)[1] if len(cu.param_names(existing)) > 1 else "module"
            block = cu.stmts(_branch(param, names, config_expr))
            new = cu.with_body(existing, cu.body_of(existing) + block)
            rootdef = cu.replace_in_body(rootdef, existing, new)
        else:
            src = ("def _init_weights(self, module):\n    super()._init_weights(module)\n"
                   + "".join(f"    {line}\n" for line in _branch("module", names, config_expr).splitlines()))
            method = cu.stmt(src).with_changes(leading_lines=[cst.EmptyLine()])
            rootdef = cu.with_body(rootdef, cu.body_of(rootdef) + [method])
        module = cu.replace_top(module, cu.top_class(module, root.name), rootdef)
        module = cu.ensure_import(module, "import torch\n", "torch")
        save(state, root.file, module)
        state.change("v5", root.file, f"{root.name}._init_weights", f"rebuilds {names} from the config after loading and copies its non-persistent buffers", WHY)


def _branch(param: str, names: str, config_expr: str) -> str:
    classes = f"({names},)" if "," not in names else f"({names})"
    return (
        f"if isinstance({param}, {classes}):  # non-persistent buffers computed in __init__ (hfcheck port)\n"
        f"    fresh = type({param})({config_expr})\n"
        f"    with torch.no_grad():\n"
        f"        for name, buffer in fresh.named_buffers(recurse=False):\n"
        f"            getattr({param}, name).copy_(buffer)\n"
    )


def _registers_transient_buffer(init: ast.FunctionDef) -> bool:
    for node in ast.walk(init):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_buffer"
                and any(k.arg == "persistent" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords)):
            return True
    return False


def _construction_arg(index, name: str) -> str | None:
    """``self.config`` (or ``self.config.text_config``...) when every construction is ``Cls(config[.x])``."""
    exprs = set()
    for cls in index.classes:
        for method in cls.methods.values():
            for node in ast.walk(method):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    args = list(node.args) + [k.value for k in node.keywords if k.arg == "config"]
                    if len(args) != 1 or len(node.args) + len(node.keywords) != 1:
                        return None
                    text = ast.unparse(args[0])
                    if not (text == "config" or text.startswith("config.")):
                        return None
                    exprs.add("self." + text)
    return exprs.pop() if len(exprs) == 1 else None
