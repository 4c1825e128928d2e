"""Trace one module's forward the way vLLM's fusers see it.

vLLM traces each module class with a torch.fx tracer for which *every* child module is
a leaf (so a GLU stays `act(gate(x)) * up(x)` instead of being decomposed), runs each
traced op on meta tensors so shape unpacks and `*splats` keep tracing, turns the
attention-interface call into one opaque node, and keeps whatever partial graph it got
when tracing stops. Patterns are then matched on that graph. hfcheck must see the same
graph to predict the same fusions, so this module rebuilds that behaviour:

- only a placeholder named ``hidden_states`` gets a meta value, shaped ``[1, 8, H]`` from
  the module's first linear (or 1-D/2-D parameter), as in vLLM;
- ``past_key_values`` is made concrete ``None`` when the forward has it;
- iterating ``**kwargs`` yields nothing;
- any exception ends the trace and the partial graph is returned with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any, cast
from unittest import mock

import torch
from torch import fx, nn

UNKNOWN: Any = object()
"""Meta value of a proxy whose value could not be inferred (``None`` is a real value)."""

_REAL_CALL = nn.Module.__call__
_REAL_GETATTR = nn.Module.__getattr__


@contextlib.contextmanager
def _real_module_hooks() -> Iterator[None]:
    """fx patches Module.__call__/__getattr__ while tracing; meta execution needs the originals."""
    with (
        mock.patch.object(nn.Module, "__call__", _REAL_CALL),
        mock.patch.object(nn.Module, "__getattr__", _REAL_GETATTR),
    ):
        yield


def _reference_weight(module: nn.Module) -> torch.Tensor | None:
    """A weight whose last dimension is the module's hidden size."""
    for child in module.modules():
        if isinstance(child, nn.Linear):
            return child.weight
    return next((p for p in module.parameters() if p.ndim in (1, 2)), None)


class _ValueProxy(fx.Proxy):
    """A proxy that also carries the meta-tensor value of its expression."""

    meta: Any = UNKNOWN

    def __len__(self) -> int:
        if self.meta is not UNKNOWN:
            return len(self.meta)
        return super().__len__()

    def __getattr__(self, name: str) -> _ValueAttribute:
        return _ValueAttribute(self, name)

    def __setitem__(self, key: object, value: object) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


class _ValueAttribute(_ValueProxy, fx.proxy.Attribute):
    """``x.shape`` and friends, with the attribute of the meta value attached."""

    def __init__(self, root: fx.Proxy, attr: str):
        super().__init__(root, attr)
        root_value = getattr(root, "meta", UNKNOWN)
        if root_value is not UNKNOWN:
            with contextlib.suppress(Exception):
                self.meta = getattr(root_value, attr)


class LeafTracer(fx.Tracer):
    """fx tracer whose leaves are all child modules, with meta-value propagation."""

    kwargs_name: str | None = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ValueProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, *rest, **rest_kwargs):
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **rest_kwargs)
        if isinstance(proxy, _ValueProxy) and proxy.meta is UNKNOWN:
            with contextlib.suppress(Exception):
                proxy.meta = self._evaluate(kind, target, args, kwargs)
        return proxy

    def _evaluate(self, kind: str, target: object, args: tuple, kwargs: dict) -> Any:
        """Run one op on meta values so PyTorch itself infers the result."""
        if kind == "placeholder":
            weight = _reference_weight(self.root)
            if str(target) == "hidden_states" and weight is not None:
                return torch.empty(1, 8, weight.shape[-1], dtype=weight.dtype, device="meta")
            return UNKNOWN
        if kind == "get_attr":
            with _real_module_hooks():
                value = operator.attrgetter(str(target))(self.root)
            return torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value
        missing = False

        def value_of(arg: Any) -> Any:
            nonlocal missing
            if isinstance(arg, fx.Proxy):
                value = getattr(arg, "meta", UNKNOWN)
                missing = missing or value is UNKNOWN
                return value
            return arg

        meta_args = fx.node.map_aggregate(args, value_of)
        meta_kwargs = fx.node.map_aggregate(kwargs, value_of)
        if missing:
            return UNKNOWN
        if kind == "call_function":
            return target(*meta_args, **meta_kwargs)  # type: ignore[operator]
        if kind == "call_method":
            receiver, *rest = meta_args
            return getattr(receiver, str(target))(*rest, **meta_kwargs)
        if kind == "call_module":
            child = self.root.get_submodule(str(target))
            state = {
                name: torch.empty_like(t, device="meta")
                for name, t in chain(child.named_parameters(), child.named_buffers())
            }
            with _real_module_hooks():
                return torch.func.functional_call(child, state, meta_args, meta_kwargs)
        return UNKNOWN

    def _is_kwargs(self, node: object) -> bool:
        return (
            isinstance(node, fx.Node)
            and node.op == "placeholder"
            and str(node.target).lstrip("*") == self.kwargs_name
        )

    def iter(self, obj: fx.Proxy):
        node = obj.node
        if self._is_kwargs(node) or (
            node.op == "call_method" and node.target == "keys" and self._is_kwargs(node.args[0])
        ):
            return iter(())
        value = getattr(obj, "meta", UNKNOWN)
        if value is UNKNOWN:
            return super().iter(obj)
        # fx.Proxy gains __getitem__ at runtime (its magic methods are set in a loop), unseen by mypy
        return iter([obj[i] for i in range(len(value))])  # type: ignore[index]


def is_opaque_call(node: object) -> bool:
    """Is ``node`` an opaque call recorded for an attention interface."""
    return isinstance(node, fx.Node) and node.meta.get("opaque_call", False)


def _opaque(fn: Callable, outputs: int) -> Callable:
    """Wrap ``fn`` so tracing records it as one node returning ``outputs`` values."""

    def call(*args: Any, **kwargs: Any) -> Any:
        proxies = tuple(a for a in args if isinstance(a, fx.Proxy))
        if not proxies:
            return fn(*args, **kwargs)
        # only installed while LeafTracer traces, whose proxies are _ValueProxy
        proxy = cast(_ValueProxy, proxies[0].tracer.create_proxy("call_function", fn, proxies, {}))
        proxy.node.meta["opaque_call"] = True
        proxy.meta = (UNKNOWN,) * outputs
        return proxy

    return call


def _opaque_attention_interfaces():
    """Make ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` return an opaque call, as vLLM does."""
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface.get_interface

    def get_interface(self, *args, **kwargs):
        return _opaque(original(self, *args, **kwargs), outputs=2)

    return mock.patch.object(AttentionInterface, "get_interface", get_interface)


CACHE_RENAMES = frozenset({"past_key_values", "cache_params"})


def cache_rename_wrapper(fn: Callable) -> bool:
    """Is ``fn`` wrapped in the ``@deprecate_kwarg(<old>, new_name="cache")`` transformers 5.24
    put on forwards when it renamed the cache argument? vLLM's fx trace of such a
    ``(*args, **kwargs)`` wrapper stops after the placeholders (vLLM 0.34 with transformers
    5.24 forced: ``get_fusers(LlamaAttention)`` finds only the AttentionFuser; with 5.22.2 the
    qkv and merged-column fusers too), and so does hfcheck's: the wrapper is traced as vLLM
    traces it, never peeled. No transformers release a modelled vLLM admits has it."""
    while hasattr(fn, "__wrapped__"):
        try:
            names = inspect.getclosurevars(fn).nonlocals
        except (TypeError, ValueError):
            return False
        if names.get("new_name") == "cache" and names.get("old_name") in CACHE_RENAMES:
            return True
        fn = fn.__wrapped__
    return False


def forward_parameters(cls: type[nn.Module]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return {}


@dataclass
class Trace:
    """The fx graph of one module's forward, complete or cut short."""

    graph: fx.Graph | None
    complete: bool
    error: str | None = None


def trace_module(module: nn.Module) -> Trace:
    """Trace ``module.forward`` with every child a leaf; never raises."""
    parameters = forward_parameters(type(module))
    # vLLM makes ``past_key_values`` concrete None; 5.24 renamed it ``cache``, same treatment.
    cache_names: tuple[str, ...] = ("past_key_values", "cache")
    concrete: dict[str, Any] | None = next(({name: None} for name in cache_names if name in parameters), None)
    tracer = LeafTracer()
    tracer.kwargs_name = next(
        (p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
    )
    graph: fx.Graph | None
    try:
        with _opaque_attention_interfaces():
            graph = tracer.trace(module, concrete_args=concrete)
        return Trace(graph, complete=True)
    except Exception as exc:  # noqa: BLE001 - any failure is a fact about the class, not a crash
        graph = getattr(tracer, "graph", None)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip(": ")
        if cache_rename_wrapper(type(module).forward):
            reason = ("transformers' @deprecate_kwarg(..., new_name='cache') wrapper on forward: the fx trace stops after the "
                      f"placeholders, in vLLM's tracer as here ({reason})")
        return Trace(graph, complete=False, error=reason[:300])
