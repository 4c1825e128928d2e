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
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, pretrained_roots, save

WHY = ("from_pretrained in transformers 5 builds on the meta device and leaves a custom module's non-persistent buffers "
       "uninitialised (garbage positions); vLLM recomputes them the same way (init_buffers)")

BRANCH = """if isinstance({param}, {classes}):  # non-persistent buffers computed in __init__ (hfcheck port)
    fresh = type({param})({built_from})
    with torch.no_grad():
        for name, buffer in fresh.named_buffers(recurse=False):
            getattr({param}, name).copy_(buffer)
"""
REMEMBER = "self._hfcheck_init_args = {call}  # to rebuild it after loading\n"
INIT_WEIGHTS = cst.ensure_type(cst.parse_statement("def _init_weights(self, module):\n    super()._init_weights(module)\n"), cst.FunctionDef)
NO_SPACE = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


class BufferInit(Codemod):
    name = "buffers"
    codes = ("v5",)

    def apply(self, state) -> None:
        index, roles = state.roles()
        roots = pretrained_roots(index)
        if not roots:
            return
        root = roots[0]
        targets: dict[str, str] = {}  # class -> config expression (seen from the PreTrainedModel)
        recorded: list[str] = []  # classes rebuilt from the arguments they were built with
        for cls in index.classes:
            if cls.file != root.file or index.is_pretrained_model(cls) or "__init__" not in cls.methods:
                continue
            if not _registers_transient_buffer(cls.methods["__init__"]) or "original_inv_freq" in cls.self_assigns:
                continue
            init = cls.methods["__init__"]
            arg = _construction_arg(index, cls.name) if len(init.args.args) - len(init.args.defaults) == 2 else None
            if arg is not None:
                targets[cls.name] = arg
            elif init.args.vararg is None and init.args.kwarg is None:
                recorded.append(cls.name)
            else:
                state.refuse("v5", cls.file, cls.name, "its non-persistent buffers stay uninitialised after from_pretrained; it is built "
                                                       "neither as Cls(config) nor from named arguments alone")
        config_exprs = set(targets.values())
        if (not targets and not recorded) or len(config_exprs) > 1:
            return
        module = parse(state, root.file)
        for name in recorded:  # remember the arguments, so the buffers can be recomputed after loading
            module = cu.edit_class(module, name, lambda c: cu.edit_method(c, "__init__", _remember_arguments))
        rootdef = cu.the_class(module, root.name)
        existing = cu.method(rootdef, "_init_weights")
        param = cu.param_names(existing)[1] if existing is not None and len(cu.param_names(existing)) > 1 else "module"
        branches = [_branch(param, sorted(targets), cst.parse_expression(next(iter(config_exprs))))] if targets else []
        if recorded:
            arguments = cu.template_expr("{param}._hfcheck_init_args", param=param)
            branches.append(_branch(param, sorted(recorded), cst.Arg(arguments, star="**")))
        if existing is not None:
            rootdef = cu.replace_in_body(rootdef, existing, cu.with_body(existing, cu.body_of(existing) + branches))
        else:
            init_weights = cu.with_body(INIT_WEIGHTS, cu.body_of(INIT_WEIGHTS) + branches).with_changes(leading_lines=[cst.EmptyLine()])
            rootdef = cu.with_body(rootdef, cu.body_of(rootdef) + [init_weights])
        module = cu.replace_top(module, cu.the_class(module, root.name), rootdef)
        module = cu.ensure_import(module, "import torch\n", "torch")
        save(state, root.file, module)
        names = ", ".join(sorted(targets) + sorted(recorded))
        how = " from the arguments it was built with" if recorded else " from the config"
        state.change("v5", root.file, f"{root.name}._init_weights", f"rebuilds {names}{how} after loading and copies its non-persistent buffers",
                     WHY)


def _remember_arguments(func: cst.FunctionDef) -> cst.FunctionDef:
    """``self._hfcheck_init_args = dict(a=a, ...)`` first in ``__init__`` (after a docstring)."""
    params = cu.param_names(func)[1:]
    body = cu.body_of(func)
    at = 1 if body and m.matches(body[0], cu.DOCSTRING) else 0
    body.insert(at, _remembered(params))
    return cu.with_body(func, body)


def _remembered(params: list[str]) -> cst.BaseStatement:
    """``self._hfcheck_init_args = dict(a=a, ...)``: the arguments ``__init__`` was called with."""
    arguments = [cst.Arg(cst.Name(p), keyword=cst.Name(p), equal=NO_SPACE) for p in params]
    return cu.template(REMEMBER, call=cst.Call(cst.Name("dict"), arguments))


def _branch(param: str, names: list[str], built_from: cst.BaseExpression | cst.Arg) -> cst.BaseStatement:
    """The ``_init_weights`` branch that rebuilds the ``names`` modules ``built_from`` the config
    (or their remembered arguments) and copies their non-persistent buffers."""
    classes = cst.Tuple([cst.Element(cst.Name(n)) for n in names])
    return cu.template(BRANCH, param=param, classes=classes, built_from=built_from)


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
