"""What every codemod shares: parse/save one file of the port, and add ``self.x = ...`` to the
``__init__`` that owns a class's attributes."""

from __future__ import annotations

import libcst as cst

from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex
from hfcheck.porter.port import cstutil as cu
from hfcheck.porter.port.state import PortState


class Codemod:
    name = "codemod"
    codes: tuple[str, ...] = ()

    def apply(self, state: PortState) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def parse(state: PortState, file: str) -> cst.Module:
    return cst.parse_module(state.files[file])


def save(state: PortState, file: str, module: cst.Module) -> None:
    state.files[file] = module.code


def init_owner(index: CodeIndex, cls: ClassInfo) -> ClassInfo | None:
    """The local class (``cls`` or a local base) whose ``__init__`` builds ``cls``."""
    for c in index.mro(cls):
        if "__init__" in c.methods:
            return c
    return None


def assigned(index: CodeIndex, cls: ClassInfo, attr: str) -> bool:
    return index.self_assign(cls, attr) is not None or index.class_attr(cls, attr) is not None


def add_init_assign(module: cst.Module, class_name: str, attr: str, value: str, position: str = "end") -> cst.Module:
    """``self.attr = value`` in ``class_name.__init__``: after ``super().__init__(...)``
    (``position="start"``) or as the last statement (``"end"``)."""

    def edit_init(func: cst.FunctionDef) -> cst.FunctionDef:
        body = cu.body_of(func)
        new = cu.stmt(f"self.{attr} = {value}\n")
        if position == "start":
            at = 0
            for i, s in enumerate(body):
                small = cu.simple(s)
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and "super" in cu.code(small.value.func):
                    at = i + 1
                    break
                if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)) and i == 0:
                    at = 1
            body.insert(at, new)
        else:
            body.append(new)
        return cu.with_body(func, body)

    return cu.edit_class(module, class_name, lambda c: cu.edit_method(c, "__init__", edit_init))


def init_param_of_config(func: cst.FunctionDef) -> str | None:
    """The name ``__init__`` receives the config under (``config`` by convention)."""
    names = cu.param_names(func)
    for n in names:
        if n in ("config", "cfg", "model_config"):
            return n
    return names[1] if len(names) > 1 else None
