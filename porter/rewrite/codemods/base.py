"""What every codemod shares: LibCST's ``Codemod`` as the base, parse/save one file of the
port, and add ``self.x = ...`` to the ``__init__`` that owns a class's attributes.

A port rewrites several files at once (the modeling file, its configuration, helpers it
imports), and what a codemod may change depends on all of them (which class is the decoder
layer, what the config calls its fields). So each codemod's work is ``apply(state)`` on the
whole ``PortState``. As a LibCST ``Codemod`` it also transforms one module by itself
(``transform_module``, what LibCST's ``CodemodTest`` and ``python -m libcst.tool codemod`` drive):
the module, with the other files and the config given to the constructor, becomes a
``PortState``, and each refusal comes back as a LibCST warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod as LibCSTCodemod
from libcst.codemod import CodemodContext

from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.state import PortState


class Codemod(LibCSTCodemod):
    """One fixable remote-code finding (``codes``): ``apply`` edits the port's files and records
    a ``Change`` per edit and a ``Refusal`` for what it recognises but cannot rewrite safely."""

    name = "codemod"
    codes: tuple[str, ...] = ()
    DEFAULT_FILE = "modeling.py"

    def __init__(self, context: CodemodContext | None = None, *, config: dict[str, Any] | None = None,
                 files: dict[str, str] | None = None, recorded: dict[str, Any] | None = None) -> None:
        """``recorded``: what the original's own run showed, as ``PortState`` fields (``tied``,
        ``observed``, ``built_classes``); without it the codemod works statically."""
        super().__init__(context or CodemodContext())
        self.config = dict(config or {})
        self.other_files = dict(files or {})
        self.recorded = dict(recorded or {})

    def apply(self, state: PortState) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """LibCST's entry: this module (named by the context's filename) beside ``files``; the
        port's changes and refusals land in ``context.scratch`` and refusals also as warnings."""
        name = os.path.basename(self.context.filename or self.DEFAULT_FILE)
        state = PortState({**self.other_files, name: tree.code}, dict(self.config), **self.recorded)
        self.apply(state)
        self.context.scratch.setdefault("changes", []).extend(state.changes)
        self.context.scratch.setdefault("refusals", []).extend(state.refusals)
        self.context.scratch["files"] = dict(state.files)
        for refusal in state.refusals:
            self.warn(f"{refusal.code} {refusal.where}: {refusal.reason}")
        return cst.parse_module(state.files[name])


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


def pretrained_roots(index: CodeIndex) -> list[ClassInfo]:
    """The classes that subclass transformers' ``PreTrainedModel`` themselves (4.x code also
    spelled it ``PretrainedModel``): where class-wide flags and ``_init_weights`` go."""
    return [c for c in index.classes if any(b.rpartition(".")[2] in ("PreTrainedModel", "PretrainedModel") for b in c.bases)]


def assigned(index: CodeIndex, cls: ClassInfo, attr: str) -> bool:
    return index.self_assign(cls, attr) is not None or index.class_attr(cls, attr) is not None


def add_init_assign(module: cst.Module, class_name: str, attr: str, value: str, position: str = "end") -> cst.Module:
    """``self.attr = value`` in ``class_name.__init__``: after ``super().__init__(...)``
    (``position="start"``) or as the last statement (``"end"``)."""

    def edit_init(func: cst.FunctionDef) -> cst.FunctionDef:
        body = cu.body_of(func)
        new = cu.template("self.{attr} = {value}\n", attr=attr, value=value)
        if position == "start":
            at = 0
            for i, s in enumerate(body):
                small = cu.simple(s)
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and "super" in cu.code(small.value.func):
                    at = i + 1
                    break
                if i == 0 and m.matches(s, cu.DOCSTRING):
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


def class_attribute_name(s: cst.CSTNode) -> str | None:
    """The name a class-body line ``name = ...`` or ``name: T = ...`` binds."""
    small = cu.simple(s)
    if isinstance(small, cst.Assign) and m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        return cst.ensure_type(small.targets[0].target, cst.Name).value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
        return small.target.value
    return None


Placement = Callable[[Sequence[cst.BaseStatement]], int]
"""Where in a class body a new line goes (its index), given the body."""


class SetClassAttribute(cu.Scoped):
    """``attr = value`` in the body of the top-level class ``cls``: the value of an existing
    assignment is replaced (the line keeps its comments and annotation), else a new line goes
    where ``place`` says. ``done`` tells whether the class was found."""

    def __init__(self, cls: str, attr: str, value: cst.BaseExpression, place: Placement) -> None:
        super().__init__()
        self.cls, self.attr, self.value, self.place = cls, attr, value, place
        self.done = False

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        updated = super().leave_ClassDef(original, updated)
        if self.classes or self.functions or updated.name.value != self.cls:
            return updated
        self.done = True
        body = cu.body_of(updated)
        for i, s in enumerate(body):
            if class_attribute_name(s) == self.attr:
                line = cst.ensure_type(s, cst.SimpleStatementLine)
                small = line.body[0]
                assert isinstance(small, (cst.Assign, cst.AnnAssign))  # class_attribute_name found one
                body[i] = line.with_changes(body=[small.with_changes(value=self.value)])
                return cu.with_body(updated, body)
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(self.attr))], self.value)])
        body.insert(self.place(body), line)
        return cu.with_body(updated, body)


def set_class_attribute(module: cst.Module, cls: str, attr: str, value: cst.BaseExpression, place: Placement) -> cst.Module | None:
    """``module`` with ``cls.attr = value`` (``SetClassAttribute``); None without a top-level ``cls``."""
    edit = SetClassAttribute(cls, attr, value, place)
    new = module.visit(edit)
    return new if edit.done else None


class Place:
    """Where a new class-body line goes (``Placement``s)."""

    @staticmethod
    def after_docstring(body: Sequence[cst.BaseStatement]) -> int:
        return 1 if body and m.matches(body[0], cu.DOCSTRING) else 0

    @staticmethod
    def after_last_attribute(body: Sequence[cst.BaseStatement]) -> int:
        return max((i for i, s in enumerate(body) if class_attribute_name(s) is not None), default=-1) + 1

    @staticmethod
    def after(name: str) -> Placement:
        """Right after the line that binds ``name`` (first in the body when there is none)."""
        return lambda body: next((i for i, s in enumerate(body) if class_attribute_name(s) == name), -1) + 1
