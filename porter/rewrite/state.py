"""What a port carries from codemod to codemod: the code text, the config edits, the weight
renames, and the record of every change (and every refusal) for PORT.md."""

from __future__ import annotations

import ast
import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from hfcheck.analyzer.remote.index import ClassInfo, CodeIndex
from hfcheck.analyzer.remote.roles import Roles, find_roles


@dataclass
class Change:
    code: str
    """The finding it fixes (HFC8xx), or the check it satisfies (HFC501 tp plan, HFC601 pp plan)."""
    file: str
    where: str
    """``Class.method`` (or ``Class``, or ``module``) in the ported file."""
    what: str
    why: str
    fixes: list[int] = field(default_factory=list)
    """Lines of the original findings this change answers (filled in by the orchestrator)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Refusal:
    code: str
    file: str | None
    where: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PortState:
    files: dict[str, str]
    config: dict[str, Any]
    """The original config.json (never edited in place: see ``config_edits``)."""
    config_edits: list[dict[str, Any]] = field(default_factory=list)
    weight_rules: list[dict[str, Any]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    observed: list[Any] | None = None
    """What the original did when it ran in its own release: the attention regions its recorded
    dataflow proved (``porter.rewrite.dataflow`` plans and refusals); None for a static port."""
    sdpa_unsupported: list[str] = field(default_factory=list)
    """Why the ported classes must not claim an sdpa path (a softcap sdpa cannot apply)."""
    tied: list[list[str]] | None = None
    """Parameter names the original shared in its own run (pairs), or None for a static port."""
    built_classes: dict[str, bool] | None = None
    """Classes of the modules the original built in that run -> whether they hold weights of
    their own (None for a static port)."""

    # ------------------------------------------------------------------ analysis of the current text

    def index(self) -> CodeIndex:
        return CodeIndex(dict(self.files))

    def roles(self, index: CodeIndex | None = None) -> tuple[CodeIndex, Roles]:
        index = index or self.index()
        return index, find_roles(index, self.ported_config())

    def ported_config(self) -> dict[str, Any]:
        return apply_config_edits(self.config, self.config_edits, self.config_defaults())

    def config_class(self, index: CodeIndex | None = None) -> ClassInfo | None:
        return (index or self.index()).auto_class(self.config.get("auto_map"), "AutoConfig")

    def config_defaults(self) -> dict[str, Any]:
        """Literal defaults of the config class's ``__init__`` (what a missing config.json key means)."""
        try:
            cls = self.config_class()
        except SyntaxError:
            return {}
        init = cls.methods.get("__init__") if cls is not None else None
        if init is None:
            return {}
        args = init.args
        out: dict[str, Any] = {}
        positional = args.args[len(args.args) - len(args.defaults):] if args.defaults else []
        for arg, default in list(zip(positional, args.defaults)) + [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]:
            try:
                out[arg.arg] = ast.literal_eval(default)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
        return out

    def config_value(self, name: str, default: Any = None) -> Any:
        if name in self.config:
            return self.config[name]
        return self.config_defaults().get(name, default)

    # ------------------------------------------------------------------ records

    def change(self, code: str, file: str, where: str, what: str, why: str) -> None:
        self.changes.append(Change(code, file, where, what, why))

    def refuse(self, code: str, file: str | None, where: str, reason: str) -> None:
        if not any(r.code == code and r.file == file and r.where == where and r.reason == reason for r in self.refusals):
            self.refusals.append(Refusal(code, file, where, reason))


def apply_config_edits(config: dict[str, Any], edits: list[dict[str, Any]], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ported config.json for an original one (also applied to the tiny proof configs)."""
    out = copy.deepcopy(config)
    defaults = defaults or {}
    for edit in edits:
        op = edit["op"]
        if op == "merge_layer_count":
            layers, extra = edit["layers_field"], edit["count_field"]
            n_extra = out.get(extra, defaults.get(extra, edit.get("default", 0)))
            out[layers] = int(out.get(layers, defaults.get(layers, 0))) + int(n_extra or 0)
            out[extra] = 0
        elif op == "set":
            out[edit["key"]] = edit["value"]
        else:  # pragma: no cover - a codemod wrote an edit this function does not know
            raise ValueError(f"unknown config edit {op!r}")
    return out
