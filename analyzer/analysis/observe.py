"""Walk a tiny instance the way vLLM's ``recursive_replace`` does and record what it sees.

The one home of that walk: scan observes the structural instance with it, the sandbox the
remote classes, and ``verify`` its runnable instance (``verify.fusion.find_sites`` reads the
fusions to apply from these observations, so it proves exactly what scan would predict for
that instance, the fp16 routing rule included: ``FusionContext.divides_shared_output``).

The result is raw observation (no verdicts): per module instance, the fusions it takes
(with the matches that say how) and why others were refused; per decoder layer, the modules that would serve its
attention; MoE blocks; the decoder's ModuleLists; and a networkx graph of modules
(containment) and data flow between sibling modules (from each class's fx trace).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

import networkx as nx
from torch import fx, nn

from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.fusions.attention import layer_index, scaling_problem, sinks_problem
from hfcheck.analyzer.fusions.base import FusionContext, Match
from hfcheck.analyzer.fusions.detect import ClassFusions, class_fusions, instance_fusions
from hfcheck.analyzer.fusions.moe import (
    EXPERTS_NAME,
    MoEBlock,
    MoEBlockFusion,
    expert_count_problem,
    experts_replaceable,
    vllm_expert_count,
)
from hfcheck.analyzer.graph.nodes import attention_key_value_linears, linears_share_an_input
from hfcheck.analyzer.terms.tolerances import PLAIN_LINEAR


@dataclass
class ModuleObservation:
    path: str
    cls: str
    fusions: list[str]
    rejected: list[tuple[str, str]]
    refused: list[tuple[str, str]]
    trace_complete: bool | None
    trace_error: str | None
    attention: bool = False
    layer_idx: int | None = None
    attention_problem: str | None = None
    sinks: bool = False
    linear_children: int = 0
    projections: dict[str, tuple[str, ...]] = field(default_factory=dict)
    row_parallel: dict[str, str] = field(default_factory=dict)
    matches: list[Match] = field(default_factory=list)
    """The chosen fusions, attention included, as the patterns matched them (what to apply)."""
    key_value_widths: tuple[int, int] | None = None
    """For an attention module: the out-features of its key and of its value projection, where
    each is a linear of its own (kv heads x the key / value head size)."""
    linears_share_input: bool | None = None
    """Whether two of its linear children read the same value (None: no complete trace to tell)."""
    component: str | None = None
    """For a multimodal model: the top-level child outside the language model that holds this
    module (``vision_tower``, ``multi_modal_projector``, ...); None inside the language model."""


@dataclass
class Observations:
    modules: list[ModuleObservation]
    attention_by_layer: dict[int, list[str]]
    attention_problems: list[str]
    moe_blocks: list[tuple[str, MoEBlock]]
    decoder_class: str | None
    decoder_module_lists: list[str]
    encoder_attention: list[str]
    tp_plan: dict[str, str]
    pp_plan: dict[str, object] | None
    graph: nx.DiGraph
    linear_forwards_lost: list[tuple[str, str, str]] = field(default_factory=list)
    """(path, class, what its own forward does beyond ``x @ W.T + b``) for each nn.Linear subclass
    vLLM replaces by its own linear (``linear_forward_lost``)."""
    decoder_path: str = ""
    """Where ``get_decoder()`` sits in the model ("" when the model is its own decoder)."""
    language_model_attr: str | None = None
    """The first of ``language_model`` / ``text_model`` the model has (vLLM's ``get_language_model``)."""
    encoder_classes: dict[str, str] = field(default_factory=dict)
    """Modality -> encoder class, as vLLM's ``_find_encoder_classes`` finds them (``get_encoder``)."""
    multihead_attention: list[str] = field(default_factory=list)
    """Paths of ``nn.MultiheadAttention`` modules (their ``out_proj`` is an nn.Linear subclass)."""

    def module_classes(self, keep=lambda m: True) -> list[ModuleObservation]:
        """The first instance of each module class that ``keep`` accepts (rules judge classes)."""
        return list({m.cls: m for m in reversed(self.modules) if keep(m)}.values())[::-1]

    def moe_classes(self) -> list[MoEBlock]:
        """The first MoE block of each class."""
        return list({b.block_class: b for _, b in reversed(self.moe_blocks)}.values())[::-1]


_NO_RECURSE = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _decoder(model: nn.Module) -> nn.Module:
    try:
        decoder = cast(Any, model).get_decoder()  # a transformers model's, where it has one (else the except)
        if isinstance(decoder, nn.Module):
            return decoder
    except Exception:  # noqa: BLE001, S110 - no usable get_decoder: the model is its own decoder
        pass
    return model


def _dataflow_edges(graph: fx.Graph | None, prefix: str) -> list[tuple[str, str]]:
    """Edges child -> child when one module's output reaches another's input directly
    or through parameter-free ops."""
    if graph is None:
        return []
    edges = []
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        stack, seen = list(node.users), set()
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_module":
                edges.append((f"{prefix}.{node.target}".lstrip("."), f"{prefix}.{user.target}".lstrip(".")))
            elif user.op in ("call_function", "call_method"):
                stack.extend(user.users)
    return edges


def linear_forward_lost(linear: nn.Linear) -> str | None:
    """What vLLM loses when it replaces this linear, else None.

    vLLM's ``recursive_replace`` swaps every ``nn.Linear`` child, subclasses included
    (``isinstance``), for its own linear layer, which computes ``x @ W.T + b`` and nothing
    else: a subclass's own forward is dropped. Whether that forward is only a linear is decided
    by running it once on a copy with random weights (a probe of the instance's small size)."""

    import torch

    if type(linear).forward is nn.Linear.forward:
        return None
    probe = copy.deepcopy(linear)
    if any(t.is_meta for t in (*probe.parameters(), *probe.buffers())):
        probe = probe.to_empty(device="cpu")
    probe.eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in (*probe.parameters(), *probe.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
        x = torch.randn(3, probe.in_features, generator=generator, dtype=probe.weight.dtype)
        try:
            out = probe(x)
        except Exception as exc:  # noqa: BLE001 - a forward that needs more than one input is not a plain linear
            return f"its forward does not run as a plain linear ({type(exc).__name__}: {str(exc)[:80]})"
        if not isinstance(out, torch.Tensor):
            return f"its forward returns a {type(out).__name__}, where vLLM's linear returns one tensor"
        plain = nn.functional.linear(x, probe.weight, probe.bias)
        if out.shape != plain.shape or not torch.allclose(out.to(plain.dtype), plain, rtol=PLAIN_LINEAR[0], atol=PLAIN_LINEAR[1]):
            return "its forward computes more than x @ W.T + b"
    return None


def _vllm_expert_count(model: nn.Module) -> int | None:
    """The expert count vLLM reads from the instance's own (text) config."""

    config = getattr(model, "config", None)
    try:
        return vllm_expert_count(text_config_of(config)) if config is not None else None
    except Exception:  # noqa: BLE001 - a config without a text config: no count to compare with
        return None


@dataclass
class _Walk:
    """The walk's accumulating state: what ``visit`` records as it goes, in visiting order."""

    ctx: FusionContext
    expert_count: int | None
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    modules: list[ModuleObservation] = field(default_factory=list)
    attention_by_layer: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    problems: list[str] = field(default_factory=list)
    moe_blocks: list[tuple[str, MoEBlock]] = field(default_factory=list)
    encoder: list[str] = field(default_factory=list)
    linear_lost: list[tuple[str, str, str]] = field(default_factory=list)

    def visit(self, module: nn.Module, path: str) -> None:
        """Record one module, then its children depth-first, in ``recursive_replace``'s order."""
        self.graph.add_node(path or "<model>", cls=type(module).__name__)
        if getattr(module, "is_causal", True) is False:
            self.encoder.append(path)
        cf = class_fusions(module)
        self.modules.append(self._module_observation(module, path, cf))
        if cf.trace is not None:
            self.graph.add_edges_from(_dataflow_edges(cf.trace.graph, path), kind="dataflow")
        kept_by_moe = self._record_moe_block(module, path)
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            self.graph.add_edge(path or "<model>", child_path, kind="contains")
            if isinstance(child, nn.Linear) and name not in kept_by_moe and (lost := linear_forward_lost(child)):
                self.linear_lost.append((child_path, type(child).__name__, lost))
            if not self._record_leaf(name, child, child_path):
                self.visit(child, child_path)

    def _module_observation(self, module: nn.Module, path: str, cf: ClassFusions) -> ModuleObservation:
        """One module's fusions (chosen, rejected, refused) and trace, as the rules read them."""
        inst = instance_fusions(module, self.ctx)
        names = [m.fusion for m in inst.chosen]
        obs = ModuleObservation(
            path=path,
            cls=type(module).__name__,
            fusions=[n for n in names if n != "attention"],
            rejected=inst.rejected,
            refused=cf.refused,
            trace_complete=cf.trace.complete if cf.trace else None,
            trace_error=cf.trace.error if cf.trace else None,
            linear_children=sum(isinstance(c, nn.Linear) for c in module.children()),
            matches=list(inst.chosen),
        )
        if cf.trace is not None and cf.trace.graph is not None and cf.trace.complete:
            obs.linears_share_input = linears_share_an_input(cf.trace.graph, module)
        for m in inst.chosen:
            if m.projections:
                obs.projections[m.fusion] = m.projections
            if m.row_parallel:
                obs.row_parallel[m.fusion] = m.row_parallel
            if m.fusion == "attention":
                self._record_attention(obs, m, module, cf)
        return obs

    def _record_attention(self, obs: ModuleObservation, m: Match, module: nn.Module, cf: ClassFusions) -> None:
        """The attention match's layer, scaling or sinks problem and key / value widths."""
        obs.attention = True
        obs.layer_idx = layer_index(module)
        obs.attention_problem = scaling_problem(m, module) or sinks_problem(m, module)
        obs.sinks = m.details.get("s_aux") is not None
        if obs.attention_problem:
            self.problems.append(f"{obs.path}: {obs.attention_problem}")
        if obs.layer_idx is not None:
            self.attention_by_layer[obs.layer_idx].append(obs.path)
        if cf.trace is not None and cf.trace.graph is not None and (kv := attention_key_value_linears(cf.trace.graph, module)):
            k_proj, v_proj = (cast(nn.Linear, module.get_submodule(name)) for name in kv)  # linears, as found
            obs.key_value_widths = (k_proj.out_features, v_proj.out_features)

    def _record_moe_block(self, module: nn.Module, path: str) -> set[str]:
        """Record the module as an MoE block where it is one; the names of the linears vLLM keeps as written."""
        kept_by_moe: set[str] = set()
        if MoEBlockFusion.find(None, module) is not None:
            block = MoEBlockFusion.analyse(module, self.ctx)
            if block.experts_replaceable:
                experts = module.get_submodule(EXPERTS_NAME)
                block = dataclasses.replace(block, expert_count_problem=expert_count_problem(experts, self.expert_count))
            self.moe_blocks.append((path, block))
            if block.block_taken_over and block.gate:
                kept_by_moe.add(block.gate)  # the router then runs inside vLLM's MoE runner, as written
        return kept_by_moe

    def _record_leaf(self, name: str, child: nn.Module, child_path: str) -> bool:
        """Add a child vLLM replaces whole as a leaf node; False when the walk descends into it."""
        if isinstance(child, _NO_RECURSE):
            self.graph.add_node(child_path, cls=type(child).__name__)
            return True
        if name == EXPERTS_NAME and experts_replaceable(child)[0]:
            self.graph.add_node(child_path, cls=type(child).__name__, replaced="FusedMoE")
            return True
        return False


def observe(model: nn.Module, ctx: FusionContext) -> Observations:
    walk = _Walk(ctx, _vllm_expert_count(model))
    walk.visit(model, "")
    decoder = _decoder(model)
    decoder_path = next((name for name, m in model.named_modules() if m is decoder), "")
    components = _components(model, decoder_path)
    for obs in walk.modules:
        obs.component = components(obs.path)
    lists = _decoder_module_lists(decoder)
    tp_plan = dict(getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {})
    pp_plan = getattr(model, "_pp_plan", None) or None
    return Observations(
        modules=walk.modules,
        attention_by_layer=dict(walk.attention_by_layer),
        attention_problems=walk.problems,
        moe_blocks=walk.moe_blocks,
        decoder_class=type(decoder).__name__,
        decoder_module_lists=lists,
        encoder_attention=walk.encoder,
        tp_plan=tp_plan,
        pp_plan=dict(pp_plan) if pp_plan else None,
        graph=walk.graph,
        linear_forwards_lost=walk.linear_lost,
        decoder_path=decoder_path,
        language_model_attr=_language_model_attr(model),
        encoder_classes=_encoder_classes(model),
        multihead_attention=[name for name, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)],
    )


def _decoder_module_lists(decoder: nn.Module) -> list[str]:
    """The decoder's ModuleLists that hold parameters (the layer stacks vLLM splits for pipeline parallelism)."""
    return [n for n, c in decoder.named_children() if isinstance(c, nn.ModuleList) and next(c.parameters(), None) is not None]


def _language_model_attr(model: nn.Module) -> str | None:
    """vLLM's ``get_language_model``: the first of ``language_model`` / ``text_model`` the model has."""
    return next((n for n in ("language_model", "text_model") if getattr(model, n, None) is not None), None)


def _components(model: nn.Module, decoder_path: str):
    """path -> the top-level child outside the language model that holds it (None inside it).
    A text model (its own decoder) has no such components."""
    if not decoder_path:
        return lambda path: None
    language = decoder_path.split(".")[0]

    def component(path: str) -> str | None:
        top = path.split(".")[0]
        if not path or top == language or path == decoder_path or path.startswith(decoder_path + "."):
            return None
        return top

    return component


def _encoder_classes(model: nn.Module) -> dict[str, str]:
    """vLLM's ``MultiModalMixin._find_encoder_classes``: for each modality, ``get_encoder``'s class
    where it is not the model itself (what ``compile_mm_encoder`` decorates)."""
    out: dict[str, str] = {}
    get_encoder = getattr(model, "get_encoder", None)
    if get_encoder is None:
        return out
    for modality in ("image", "video", "audio"):
        try:
            encoder = get_encoder(modality=modality)
        except (TypeError, ValueError):
            continue
        if type(encoder) is not type(model):
            out[modality] = type(encoder).__name__
    return out
