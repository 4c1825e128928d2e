"""The dataflow of the original's first decoder layer, recorded while it runs (child side).

Loaded by path into the reference child (``child.py``), so it uses the standard library and
torch only. While the first decoder layer runs, every torch call (a ``TorchFunctionMode``),
every module call (global forward hooks) and every source line of the remote code (the
child's line tracer) is recorded against *tensor versions*: a node per tensor value, a new one
when an op returns a new tensor or writes into one in place. Each op carries the remote-code
frames it ran under (file, line), and each line event the remote frame's tensor locals at that
moment, so the parent can map any value back to the variable that held it and to the
statement that computed it (``porter.rewrite.dataflow``). Small values are saved with the
reference tensors (``df.<node>``) for the parent's numerical checks.

This is torch.fx's graph with shapes, taken from the real run instead of a symbolic trace:
control flow, helpers and branches are followed exactly as the original executed them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

VALUE_LIMIT = 1 << 18  # elements kept per value: the shrunk layer's activations are far below
MAX_OPS = 20000


def _tensors(obj, torch, out: list, depth: int = 0) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, torch, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, torch, out, depth + 1)
    return out


def _scalar(value) -> object:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value if not isinstance(value, str) or len(value) < 60 else value[:60]
    if isinstance(value, (tuple, list)) and len(value) <= 8 and all(isinstance(v, (int, float, bool)) or v is None for v in value):
        return list(value)
    return type(value).__name__


def _op_name(func) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a tensor property (.T, .mT, .data)
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", "property")
    return name


class DataflowRecorder:
    """Records while ``active``; the child switches it on around decoder layer 0."""

    def __init__(self, torch, package_dir: str):
        self.torch = torch
        self.package_dir = package_dir
        self.active = False
        self.done = False
        self.failed = False  # something could not be recorded: the graph is incomplete, not used
        self.current: dict[int, int] = {}  # id(tensor) -> node of its current value
        self.alive: list = []  # every tensor seen stays referenced, so ids are never reused
        self.nodes: list[dict] = []
        self.values: dict[int, Any] = {}  # tensors of the torch module this was given
        self.ops: list[dict] = []
        self.lines: list[list] = []
        self.frame_uid: dict[int, int] = {}
        self.frames: list[dict] = []
        self.frame_refs: list = []
        self.modules: list[dict] = []
        self.module_names: dict[int, str] = {}
        self.open_calls: list[int] = []

    # ------------------------------------------------------------------ values

    def _new(self, t) -> int:
        node = len(self.nodes)
        self.nodes.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")})
        self.current[id(t)] = node
        self.alive.append(t)
        if t.numel() <= VALUE_LIMIT and t.device.type != "meta" and (t.is_floating_point() or t.dtype == self.torch.bool):
            self.values[node] = t.detach().clone()
        return node

    def node(self, t) -> int:
        known = self.current.get(id(t))
        return known if known is not None else self._new(t)

    # ------------------------------------------------------------------ frames

    def _frame(self, frame) -> int:
        uid = self.frame_uid.get(id(frame))
        if uid is None:
            code = frame.f_code
            owner = frame.f_locals.get("self")
            uid = len(self.frames)
            self.frame_uid[id(frame)] = uid
            self.frame_refs.append(frame)
            self.frames.append({"file": os.path.relpath(code.co_filename, self.package_dir), "function": code.co_name,
                                "first_line": code.co_firstlineno, "self_class": type(owner).__name__ if owner is not None else None,
                                "self_module": self.module_names.get(id(owner)) if owner is not None else None})
        return uid

    def stack(self, start) -> list[list[int]]:
        """Remote-code frames from ``start`` outwards: [[frame uid, line], ...], innermost first."""
        out = []
        frame = start
        while frame is not None:
            if frame.f_code.co_filename.startswith(self.package_dir):
                out.append([self._frame(frame), frame.f_lineno])
            frame = frame.f_back
        return out

    def on_line(self, frame) -> None:
        if not self.active:
            return
        try:
            self._on_line(frame)
        except Exception:  # noqa: BLE001 - recording must never change the run
            self.failed = True

    def _on_line(self, frame) -> None:
        names: dict[str, int | None] = {}
        for name, value in frame.f_locals.items():
            if isinstance(value, self.torch.Tensor):
                names[name] = self.node(value)
            elif value is None:
                names[name] = None
        self.lines.append([self._frame(frame), frame.f_lineno, len(self.ops), names])

    # ------------------------------------------------------------------ ops and modules

    def on_op(self, func, args, kwargs, out) -> None:
        if not self.active or len(self.ops) >= MAX_OPS:
            return
        torch = self.torch
        produced = _tensors(out, torch, [])
        name = _op_name(func)
        inplace = (name.endswith("_") and not name.endswith("__")) or name in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")
        if not produced and not inplace:
            return
        inputs = _tensors(list(args) + list((kwargs or {}).values()), torch, [])
        in_nodes = [self.node(t) for t in inputs]
        if inplace and inputs:
            out_nodes = [self._new(inputs[0])]
        else:
            known = {id(t) for t in inputs}
            out_nodes = [self.node(t) if id(t) in known else self._new(t) for t in produced]
        scalars = [_scalar(a) for a in args if not isinstance(a, torch.Tensor)][:6]
        kw = {k: _scalar(v) for k, v in (kwargs or {}).items() if not isinstance(v, torch.Tensor)}
        self.ops.append({"op": name, "in": in_nodes, "out": out_nodes, "args": scalars, "kwargs": kw,
                         "at": self.stack(sys._getframe(2))})

    def pre_module(self, module, inputs) -> None:
        if not self.active:
            return
        try:
            self._pre_module(module, inputs)
        except Exception:  # noqa: BLE001 - recording must never change the run
            self.failed = True

    def _pre_module(self, module, inputs) -> None:
        torch = self.torch
        entry = {"name": self.module_names.get(id(module), "?"), "class": type(module).__name__,
                 "linear": isinstance(module, torch.nn.Linear), "dropout": isinstance(module, torch.nn.Dropout),
                 "p": getattr(module, "p", None) if isinstance(module, torch.nn.Dropout) else None,
                 "in": [self.node(t) for t in _tensors(inputs, torch, [])], "out": [], "start": len(self.ops), "end": None,
                 "at": self.stack(sys._getframe(1))}
        self.open_calls.append(len(self.modules))
        self.modules.append(entry)

    def post_module(self, module, inputs, output) -> None:
        if not self.active or not self.open_calls:
            return
        try:
            self._post_module(output)
        except Exception:  # noqa: BLE001 - recording must never change the run
            self.failed = True

    def _post_module(self, output) -> None:
        entry = self.modules[self.open_calls.pop()]
        entry["out"] = [self.node(t) for t in _tensors(output, self.torch, [])]
        entry["end"] = len(self.ops)

    # ------------------------------------------------------------------ wiring

    def attach(self, model, layer):
        """Install the hooks; returns (torch function mode, hook handles). Recording starts when
        ``layer`` (decoder layer 0) starts and stops when it returns, on its first call only."""
        torch = self.torch
        recorder = self
        self.module_names = {id(m): n for n, m in model.named_modules()}

        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if recorder.active:
                    try:
                        recorder.on_op(func, args, kwargs, out)
                    except Exception:  # noqa: BLE001 - recording must never change the run
                        recorder.failed = True
                return out

        def start(_m, _inp):
            if not recorder.done:
                recorder.active = True

        def stop(_m, _inp, _out):
            if recorder.active:
                recorder.active = False
                recorder.done = True

        handles = [layer.register_forward_pre_hook(start), layer.register_forward_hook(stop),
                   torch.nn.modules.module.register_module_forward_pre_hook(self.pre_module),
                   torch.nn.modules.module.register_module_forward_hook(self.post_module)]
        return Mode(), handles

    def result(self) -> tuple[dict, dict]:
        """(JSON-able graph, {"df.<node>": value}) — and drop every reference it kept."""
        graph = {"nodes": self.nodes, "ops": self.ops, "lines": self.lines, "frames": self.frames, "modules": self.modules,
                 "truncated": len(self.ops) >= MAX_OPS, "failed": self.failed}
        values = {f"df.{n}": (v.float() if v.dtype != self.torch.bool else v).contiguous() for n, v in self.values.items()}
        self.alive.clear()
        self.frame_refs.clear()
        return graph, values
