"""Parse every remote-code file once, with ``ast`` only, into an index the checks read.

Nothing here imports or executes the files: ``ast.parse`` builds a syntax tree from the
text, and every question the checks ask (which classes exist, what they inherit, what
``__init__`` assigns to ``self``, what the file imports and under which guard) is answered
from that tree. Names are resolved through the file's own imports, so
``F.scaled_dot_product_attention`` after ``import torch.nn.functional as F`` reads as
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass
class ImportRecord:
    """One imported name (``import a.b as c`` / ``from a.b import c as d``)."""

    module: str  # absolute dotted module for level 0, the dotted tail for relative imports
    name: str | None  # the imported name of a from-import, None for ``import x``
    local: str  # the name bound in the file
    level: int  # relative import level (0: absolute)
    line: int
    in_try: bool  # inside a try block (its ImportError is caught)
    guarded: bool  # skipped by transformers' get_imports (try block or ``if is_*_available()``)
    import_time: bool  # runs when the module is imported (not inside a function)

    @property
    def qualified(self) -> str:
        """``a.b.c`` for ``from a.b import c``; ``a.b`` for ``import a.b``."""
        return f"{self.module}.{self.name}" if self.name else self.module


@dataclass
class ClassInfo:
    name: str
    file: str
    line: int
    node: ast.ClassDef
    bases: list[str]  # dotted names, resolved through the file's imports ("" when not a name)
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    class_assigns: dict[str, tuple[ast.expr, int]] = field(default_factory=dict)
    self_assigns: dict[str, list[tuple[ast.expr, int, str]]] = field(default_factory=dict)
    """attr -> [(value, line, method)] for every ``self.attr = value`` in any method."""


@dataclass
class FileIndex:
    path: str
    text: str
    tree: ast.Module | None
    error: str | None = None
    error_line: int | None = None
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imports: list[ImportRecord] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    """local name -> dotted origin (relative origins start with '.')."""
    module_assigns: dict[str, tuple[ast.expr, int]] = field(default_factory=dict)
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @property
    def module_name(self) -> str:
        return PurePosixPath(self.path).stem

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def dotted(self, node: ast.AST | None) -> str | None:
        """``a.b.c`` for a Name/Attribute chain, with the first name resolved through imports."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def call_name(self, call: ast.Call) -> str | None:
        return self.dotted(call.func)

    def import_time(self, node: ast.AST) -> bool:
        """Does ``node`` run when the file is imported? (not inside a function, not under
        ``if __name__ == "__main__"``)."""
        current = self.parent(node)
        child = node
        while current is not None:
            if isinstance(current, FUNCTION_NODES):
                return False
            if isinstance(current, ast.If) and child in current.body and is_main_guard(current.test):
                return False
            child, current = current, self.parent(current)
        return True

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        current = self.parent(node)
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return current
            current = self.parent(current)
        return None

    def enclosing_class(self, node: ast.AST) -> ast.ClassDef | None:
        current = self.parent(node)
        while current is not None:
            if isinstance(current, ast.ClassDef):
                return current
            current = self.parent(current)
        return None


def is_main_guard(test: ast.expr) -> bool:
    """``if __name__ == "__main__":`` (code a module import never runs)."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _availability_guard(test: ast.expr, is_check) -> bool:
    """transformers' get_imports rule: an ``if`` whose test calls ``is_flash_attn*available``
    or any function ``transformers.utils.import_utils`` defines."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", "")
            if (name.endswith("available") and name.startswith("is_flash_attn")) or is_check(name):
                return True
    return False


def _import_utils_names():
    """Names defined by the installed ``transformers.utils.import_utils`` (trusted, installed
    code; the remote files are never imported)."""
    try:
        from transformers.utils import import_utils
    except Exception:  # noqa: BLE001  # pragma: no cover - transformers is a dependency
        return lambda name: False
    return lambda name: bool(name) and hasattr(import_utils, name)


def index_file(path: str, text: str, is_check=None) -> FileIndex:
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        return FileIndex(path, text, None, f"SyntaxError: {exc.msg}", exc.lineno or 1)
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        return FileIndex(path, text, None, f"{type(exc).__name__}: {str(exc)[:120]}", 1)
    index = FileIndex(path, text, tree)
    index.parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    is_check = is_check or _import_utils_names()
    _collect_imports(index, tree, is_check)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            index.classes[stmt.name] = _class_info(index, stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.functions[stmt.name] = stmt
        else:
            _record_assign(stmt, index.module_assigns)
    # classes defined inside if/try blocks at module level (rare, but real)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name not in index.classes and index.enclosing_function(node) is None and index.enclosing_class(node) is None:
            index.classes[node.name] = _class_info(index, node)
    return index


def _record_assign(stmt: ast.stmt, assigns: dict[str, tuple[ast.expr, int]]) -> None:
    """``name = value`` / ``name: T = value`` at this level: the value and its line, by name."""
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                assigns[target.id] = (stmt.value, stmt.lineno)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        assigns[stmt.target.id] = (stmt.value, stmt.lineno)


def _collect_imports(index: FileIndex, tree: ast.Module, is_check) -> None:
    def visit(node: ast.AST, in_try: bool, guarded: bool) -> None:
        if isinstance(node, ast.Try) or (hasattr(ast, "TryStar") and isinstance(node, ast.TryStar)):
            in_try = guarded = True
        elif isinstance(node, ast.If) and _availability_guard(node.test, is_check):
            guarded = True
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                origin = alias.name if alias.asname else alias.name.split(".")[0]
                index.aliases.setdefault(local, origin)
                index.imports.append(ImportRecord(alias.name, None, local, 0, node.lineno, in_try, guarded, index.import_time(node)))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                local = alias.asname or alias.name
                prefix = "." * node.level
                if alias.name != "*":
                    index.aliases.setdefault(local, f"{prefix}{module}.{alias.name}" if module else f"{prefix}{alias.name}")
                index.imports.append(ImportRecord(module, alias.name, local, node.level, node.lineno, in_try, guarded, index.import_time(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, in_try, guarded)

    visit(tree, False, False)


def _class_info(index: FileIndex, node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(node.name, index.path, node.lineno, node, [index.dotted(b) or "" for b in node.bases])
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            info.methods[stmt.name] = stmt
        else:
            _record_assign(stmt, info.class_assigns)
    for name, method in info.methods.items():
        for sub in ast.walk(method):
            targets: list[ast.expr]
            value: ast.expr
            if isinstance(sub, ast.Assign):
                targets, value = sub.targets, sub.value
            elif isinstance(sub, ast.AnnAssign) and sub.value is not None:
                targets, value = [sub.target], sub.value
            else:
                continue
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        v = value
                        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                            v = value.elts[target.elts.index(t)]
                        info.self_assigns.setdefault(t.attr, []).append((v, sub.lineno, name))
    return info


class CodeIndex:
    """Every file's index plus cross-file class lookup (by name, as relative imports bind them)."""

    def __init__(self, code_files: dict[str, str]):
        is_check = _import_utils_names()
        self.files: dict[str, FileIndex] = {path: index_file(path, text, is_check) for path, text in sorted(code_files.items())}
        self.by_module: dict[str, FileIndex] = {f.module_name: f for f in self.files.values()}

    @cached_property
    def classes(self) -> list[ClassInfo]:
        return [c for f in self.files.values() for c in f.classes.values()]

    def file_of(self, cls: ClassInfo) -> FileIndex:
        return self.files[cls.file]

    def lookup(self, name: str, file: FileIndex | None = None) -> ClassInfo | None:
        """A local class by (possibly dotted / relative) name as seen from ``file``."""
        if not name:
            return None
        if file is not None:
            if name in file.classes:
                return file.classes[name]
            origin = file.aliases.get(name, name)
        else:
            origin = name
        if origin.startswith("."):
            module, _, cls = origin.lstrip(".").rpartition(".")
            target = self.by_module.get(module.rpartition(".")[2] if module else "")
            if target is not None and cls in target.classes:
                return target.classes[cls]
        short = origin.rpartition(".")[2]
        if "." in origin and not origin.startswith("."):
            return None  # an absolute import: transformers, torch, ...
        for f in self.files.values():
            if short in f.classes:
                return f.classes[short]
        return None

    def local_bases(self, cls: ClassInfo) -> list[ClassInfo]:
        file = self.file_of(cls)
        out = []
        for base in cls.bases:
            found = self.lookup(base, file)
            if found is not None and found is not cls:
                out.append(found)
        return out

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """``cls`` and its local ancestors, depth first (good enough for single inheritance)."""
        seen: list[ClassInfo] = []
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if any(current is s for s in seen):
                continue
            seen.append(current)
            stack.extend(self.local_bases(current))
        return seen

    def external_bases(self, cls: ClassInfo) -> list[str]:
        """Dotted names of the non-local bases anywhere in ``cls``'s local ancestry."""
        out = []
        for c in self.mro(cls):
            file = self.file_of(c)
            for base in c.bases:
                if base and self.lookup(base, file) is None:
                    out.append(base)
        return out

    def is_module(self, cls: ClassInfo) -> bool:
        """Subclasses torch.nn.Module (directly, through a transformers class, or locally)."""
        return any(b.startswith(("torch.nn", "nn.", "transformers")) or b.endswith(("Module", "PreTrainedModel")) for b in self.external_bases(cls))

    def is_pretrained_model(self, cls: ClassInfo) -> bool:
        return any(b.rpartition(".")[2] in ("PreTrainedModel", "PretrainedModel") for b in self.external_bases(cls))

    def method(self, cls: ClassInfo, name: str) -> tuple[ClassInfo, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        for c in self.mro(cls):
            if name in c.methods:
                return c, c.methods[name]
        return None

    def self_assign(self, cls: ClassInfo, attr: str) -> tuple[ClassInfo, ast.expr, int] | None:
        for c in self.mro(cls):
            if attr in c.self_assigns:
                value, line, _ = c.self_assigns[attr][0]
                return c, value, line
        return None

    def auto_class(self, auto_map: Any, key: str) -> ClassInfo | None:
        """The class an ``auto_map`` entry names (``"module.Class"`` or ``"repo--module.Class"``), if it is here."""
        ref = auto_map.get(key) if isinstance(auto_map, dict) else None
        if not isinstance(ref, str) or "." not in ref:
            return None
        module, _, name = (ref.partition("--")[2] if "--" in ref else ref).rpartition(".")
        file = self.by_module.get(module.rpartition(".")[2])
        return file.classes.get(name) if file is not None else None

    def class_attr(self, cls: ClassInfo, attr: str) -> tuple[ClassInfo, ast.expr, int] | None:
        for c in self.mro(cls):
            if attr in c.class_assigns:
                value, line = c.class_assigns[attr]
                return c, value, line
        return None

    def instantiated_classes(self, cls: ClassInfo, node: ast.AST) -> list[ClassInfo]:
        """Local classes called anywhere inside ``node`` (``Foo(...)``), also through a
        module-level dict of classes (``ATTENTION_CLASSES[impl](...)``)."""
        file = self.file_of(cls)
        out: list[ClassInfo] = []
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Call):
                continue
            func = sub.func
            names: list[str] = []
            if isinstance(func, (ast.Name, ast.Attribute)):
                names.append(file.dotted(func) or "")
            elif isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
                table = file.module_assigns.get(func.value.id)
                if table is not None and isinstance(table[0], ast.Dict):
                    names.extend(file.dotted(v) or "" for v in table[0].values)
            for name in names:
                found = self.lookup(name, file)
                if found is not None and not any(found is o for o in out):
                    out.append(found)
        return out


def config_class_keys(config: dict, code_files: dict[str, str]) -> frozenset[str]:
    """The attributes the remote config class (``auto_map["AutoConfig"]``) sets on itself:
    the config object a loader reads has them beside config.json's keys."""
    if not code_files:
        return frozenset()
    try:
        cls = CodeIndex(dict(code_files)).auto_class(config.get("auto_map"), "AutoConfig")
    except SyntaxError:
        return frozenset()
    return frozenset(cls.self_assigns) if cls is not None else frozenset()
