"""What the original model is made of, read from its reference run (not from its names).

The reference run reports every module (class, parameter shapes, scalar attributes such as
``eps``, small buffers such as ``inv_freq``) and the order in which the forward pass called
them. From that, at the shrunk size where every width is known:

- the decoder layers are the ``ModuleList`` the run found; the embedding is the ``Embedding``
  with the vocabulary's rows; the head is the other ``[vocab, hidden]`` weight (none: tied);
  the final norm is the norm called after the last layer;
- inside layer 0, norms are modules whose parameters are ``[hidden]`` vectors; projections are
  grouped by the module that owns them and ordered by when they were called: the attention
  group's output projection is its last ``-> hidden`` linear, its inputs read ``hidden``
  (three q/k/v, two q + packed kv, or one packed q/k/v whose size gives the key/value heads);
  the MLP's down projection returns to ``hidden`` from the width its inputs produce (two:
  gate and up, one twice as wide: packed gate/up, one as wide: a plain two-layer MLP);
- rotary embedding: base and dimension from the ``inv_freq`` buffer itself
  (``inv_freq[1] = base ** (-2 / dim)``), so a hard-coded base in the code is seen too; where
  the code keeps no buffer, from the config's rotary size (the proof settles it).

Ambiguities the shapes cannot settle (which of two equal projections is the gate, the packing
order of a fused projection, interleaved or half-split rotary pairs) become alternatives that
``search`` settles numerically against the reference logits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hfcheck.analyzer.instance.shrink import first, head_counts
from hfcheck.porter.reference.run import ReferenceRun

NORM_PARAM_NAMES = {"weight", "bias", "scale", "g", "gamma", "beta"}
EPS_ATTRS = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "layernorm_epsilon", "norm_eps")


class AnatomyError(Exception):
    """The model is not made of parts a retarget knows (reason in one line)."""


@dataclass
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int


@dataclass
class Linear:
    path: str  # relative to the layer, e.g. "self_attn.q_proj"
    inp: int
    out: int
    bias: bool
    transposed: bool = False  # GPT-2's Conv1D: the weight is stored [in, out]


@dataclass
class Norm:
    path: str
    bias: bool
    cls: str
    eps: float | None
    weight_name: str = "weight"

    @property
    def kind(self) -> str:
        """``rms`` or ``layer`` when the class says so, ``layer`` when it has a bias, else ``?``."""
        name = self.cls.lower()
        if "rms" in name:
            return "rms"
        if self.bias or "layernorm" in name:
            return "layer"
        return "?"


@dataclass
class Layer:
    norms: list[Norm]
    attention_inputs: list[Linear]
    attention_output: Linear
    mlp_inputs: list[Linear]
    mlp_output: Linear
    parallel: bool  # attention and MLP read the same normalised input (one norm)
    other_params: list[str] = field(default_factory=list)


@dataclass
class Anatomy:
    layers_path: str
    embed: str
    head: str | None
    head_class: str | None
    final_norm: Norm | None
    layer: Layer
    dims: Dims
    rotary: dict[str, Any] | None
    extra_params: list[str]
    hidden_act: str | None = None
    head_bias: bool = False
    layer_offset: int = 0  # index of layer 0 in its container (MixFormer's nn.Sequential: 1, after the embedding)
    positions: str | None = None  # a learned absolute position embedding (GPT-2's ``wpe``), added to the tokens'

    def transposed(self) -> set[str]:
        """Weights of layer 0 stored ``[in, out]`` (Conv1D), as recipe sources (``{i}`` templates)."""
        layer = self.layer
        return {f"{self.layer_src}.{lin.path}.weight" for lin in layer.attention_inputs + [layer.attention_output] + layer.mlp_inputs + [layer.mlp_output]
                if lin.transposed}

    @property
    def tied(self) -> bool:
        return self.head is None

    def describe(self) -> list[str]:
        """The anatomy in words (PORT.md), read from the run at the shrunk size."""
        layer, d = self.layer, self.dims

        def norm(n: Norm) -> str:
            return f"{'RMSNorm' if n.kind == 'rms' else 'LayerNorm' if n.kind == 'layer' else n.cls} `{n.path}`" + (" with bias" if n.bias else "")

        def lin(items: list[Linear]) -> str:
            return ", ".join(f"`{x.path}` [{x.out} x {x.inp}]{' +bias' if x.bias else ''}" for x in items)

        mlp = ("gated (gate and up)" if len(layer.mlp_inputs) == 2 or layer.mlp_inputs[0].out == 2 * d.intermediate else "plain (up, down)")
        positions = f"learned absolute positions `{self.positions}`" if self.positions else ""
        rotary = (f"rotary on {self.rotary['dim']} of {d.head_dim} dims per head, base {self.rotary['base']:g}"
                  + (" (from the config: the code keeps no inv_freq buffer)" if self.rotary.get("from") == "config" else "")
                  + (f" (its inv_freq buffer reads back {self.rotary['measured_base']:.6g}: low precision)"
                     if abs(self.rotary.get("measured_base", self.rotary["base"]) - self.rotary["base"]) > 1e-6 * self.rotary["base"] else "")
                  if self.rotary else "no rotary embedding found")
        where = f"`{self.layers_path}`" + (f" (from index {self.layer_offset}, inside an nn.Sequential)" if self.layer_offset else "")
        return [
            f"decoder layers: {d.layers} in {where}",
            f"residual: {'attention and MLP side by side on one norm' if layer.parallel else f'{len(layer.norms)} norms, attention then MLP'}"
            f" ({'; '.join(norm(n) for n in layer.norms)})",
            f"attention: {d.heads} heads of {d.head_dim} ({d.kv_heads} key/value); inputs {lin(layer.attention_inputs)}; output {lin([layer.attention_output])}",
            f"MLP: {mlp}, activation {self.hidden_act or '-'}; inputs {lin(layer.mlp_inputs)}; output {lin([layer.mlp_output])}",
            "; ".join(x for x in (rotary if self.rotary or not self.positions else "", positions) if x),
            f"final norm: {norm(self.final_norm) if self.final_norm else 'none'}; head: "
            + ("tied to the embedding" if self.tied else f"`{self.head}`{' with bias' if self.head_bias else ''}"),
        ]

    @property
    def layer_src(self) -> str:
        """Layer ``{i}``'s path in the original's names, for a recipe's ``src`` (``plan.expand``
        adds the offset): ``transformer.h.{i}``, or ``layers.{i+1}`` inside a Sequential."""
        return f"{self.layers_path}.{{i}}" if not self.layer_offset else f"{self.layers_path}.{{i+{self.layer_offset}}}"


def _param_paths(module: dict[str, Any]) -> list[str]:
    return [f"{module['name']}.{p}" if module["name"] else p for p in module["params"]]


def _eps(module: dict[str, Any]) -> float | None:
    for attr in EPS_ATTRS:
        value = module["scalars"].get(attr)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _is_norm(module: dict[str, Any], hidden: int) -> bool:
    params = module["params"]
    return (bool(params) and "linear" not in module and "embedding" not in module and set(params) <= NORM_PARAM_NAMES
            and all(shape == [hidden] for shape in params.values()) and any(n in params for n in ("weight", "scale", "g", "gamma")))


def rotary_from_buffers(modules: list[dict[str, Any]], config: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Base and dimension of the rotary embedding from an ``inv_freq`` buffer.

    The buffer may be half precision (ChatGLM3 builds it in the config's float16), which reads
    the base back 0.1% off (10009.8 for 10000): a base the config states (or 10000 scaled by
    ChatGLM's ``rope_ratio``) within 1% of the measured one is taken, else a round number
    within 0.2%, else the measured value. The error would grow with the position, past what
    the shrunk proof checks."""
    for m in modules:
        values = m.get("small_buffers", {}).get("inv_freq")
        if values and len(values) >= 2 and values[0] > 0 and 0 < values[1] < 1:
            dim = 2 * len(values)
            measured = values[1] ** (-dim / 2)
            return {"dim": dim, "base": _settled_base(measured, config or {}), "measured_base": measured, "module": m["name"], "class": m["class"]}
    return None


def _settled_base(measured: float, config: dict[str, Any]) -> float:
    stated = [float(config[k]) for k in ("rope_theta", "rotary_emb_base", "rotary_base", "rope_base")
              if isinstance(config.get(k), (int, float)) and not isinstance(config.get(k), bool) and config[k] > 0]
    ratio = config.get("rope_ratio")
    stated.append(10000.0 * float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0 else 10000.0)
    near = [b for b in stated if abs(b - measured) / b < 0.01]
    if near:
        return min(near, key=lambda b: abs(b - measured))
    if measured > 0 and math.isfinite(measured):
        digits = 1 - int(math.floor(math.log10(measured)))
        nice = float(round(measured, digits))
        if nice > 0 and abs(nice - measured) / nice < 0.002:
            return nice
    return _round_base(measured)


def rotary_from_config(config: dict[str, Any], head_dim: int) -> dict[str, Any] | None:
    """Rotary dimension and base from the config, for code that computes its frequencies in
    the forward pass and keeps no ``inv_freq`` buffer (CodeGen's ``fixed_pos_embedding``): only
    where the config names a rotary size; the proof then settles whether it is right."""
    dim = next((config[k] for k in ("rotary_dim", "rotary_emb_dim", "rotary_ndims") if isinstance(config.get(k), int) and config[k] > 0), None)
    pct = next((config[k] for k in ("rotary_pct", "partial_rotary_factor") if isinstance(config.get(k), (int, float)) and 0 < config[k] <= 1), None)
    if dim is None and pct is not None:
        dim = int(round(head_dim * pct / 2)) * 2
    if dim is None:
        return None
    base = next((float(config[k]) for k in ("rope_theta", "rotary_emb_base", "rotary_base", "rope_base") if isinstance(config.get(k), (int, float))), 10000.0)
    return {"dim": min(int(dim), head_dim), "base": base, "module": None, "class": None, "from": "config"}


def _round_base(base: float) -> float:
    """10000.000003 read back from float32 -> 10000.0 (to 6 significant digits)."""
    if base <= 0 or not math.isfinite(base):
        return base
    digits = 6 - int(math.floor(math.log10(abs(base)))) - 1
    return float(round(base, digits))


GATED_ACTIVATIONS = {"swiglu": "silu", "silu_glu": "silu", "geglu": "gelu", "gelu_glu": "gelu", "reglu": "relu"}
"""A gated MLP's activation named after the whole unit (Qwen v1's ``activation: swiglu``): the gate's own function."""


def activation(name: Any) -> str | None:
    """The config's activation as transformers' ``ACT2FN`` names it (None: unknown, a target's default applies)."""
    from transformers.activations import ACT2FN

    if not isinstance(name, str):
        return None
    name = GATED_ACTIVATIONS.get(name.lower(), name)
    return name if name in ACT2FN else None


def layer_count(run: ReferenceRun) -> int:
    """Decoder layers of the reference run: the modules under the layers' path of layer 0's
    class (an nn.Sequential also holds the embedding and the head)."""
    modules = run.result.get("modules") or []
    path = run.result.get("layers_path") or ""
    block = next((m["class"] for m in modules if m["name"] == f"{path}.{int(run.result.get('layers_offset') or 0)}"), None)
    return len([m for m in modules if re.fullmatch(re.escape(path) + r"\.\d+", m["name"]) and m["class"] == block])


@dataclass(frozen=True)
class _Blocks:
    """The decoder layers' container in the run: its path, layer 0's index there, the layer count."""

    path: str
    offset: int
    count: int
    names: frozenset[str]

    @property
    def layer0(self) -> str:
        """Layer 0's module name (``transformer.h.0``; ``layers.1`` inside an nn.Sequential)."""
        return f"{self.path}.{self.offset}"

    @property
    def last(self) -> str:
        """The last layer's module name: the final norm is called after it."""
        return f"{self.path}.{self.offset + self.count - 1}"

    def holds(self, name: str) -> bool:
        """Whether a module is the container or inside a layer, so not the embedding, head or final norm."""
        return name == self.path or any(name == b or name.startswith(b + ".") for b in self.names)

    def generic(self, name: str) -> str:
        """A module after the layers in their container, by its place after the last layer."""
        m = re.fullmatch(re.escape(self.path) + r"\.(\d+)(\..*)?", name)
        if m and int(m.group(1)) >= self.offset + self.count:
            return f"{self.path}.{{n+{int(m.group(1)) - self.count}}}{m.group(2) or ''}"
        return name


def analyse(run: ReferenceRun, tiny_config: dict[str, Any]) -> Anatomy:
    """The original's anatomy, read from its reference run at the shrunk size (see the module doc)."""
    modules = run.result.get("modules") or []
    blocks = _decoder_blocks(run)
    embeds, vocab_embed = _token_embedding(modules, blocks)
    vocab, hidden = vocab_embed["embedding"]["num"], vocab_embed["embedding"]["dim"]
    order = _call_order(run)
    layer = _layer0(modules, blocks.layer0 + ".", order, hidden)
    dims = _dims(tiny_config, layer, hidden, vocab, blocks.count)

    outside = [m for m in modules if not blocks.holds(m["name"])]
    tied_pairs = run.result.get("tied") or []
    head = _head(outside, vocab_embed, vocab, hidden, tied_pairs)
    final_norm = _final_norm(outside, hidden, order, blocks.last)
    head_bias = head is not None and "bias" in head["params"]
    positions = _position_embedding(embeds, vocab_embed, hidden, order, blocks.layer0)
    used = _used_outside(modules, vocab_embed, positions, head, head_bias, final_norm)
    extra = [p for m in outside for p in _param_paths(m) if p not in used and not _tied_to(p, used, tied_pairs)]
    act = activation(tiny_config.get("hidden_act") or tiny_config.get("activation_function") or tiny_config.get("activation"))
    if final_norm is not None:
        final_norm.path = blocks.generic(final_norm.path)
    return Anatomy(blocks.path, blocks.generic(vocab_embed["name"]), blocks.generic(head["name"]) if head else None,
                   head["class"] if head else None, final_norm, layer, dims,
                   rotary_from_buffers(modules, tiny_config) or rotary_from_config(tiny_config, dims.head_dim), extra, act,
                   head_bias, blocks.offset, blocks.generic(positions["name"]) if positions else None)


def _decoder_blocks(run: ReferenceRun) -> _Blocks:
    """Where the run found the decoder layers; without them there is nothing to retarget."""
    layers_path = run.result.get("layers_path")
    if not layers_path:
        raise AnatomyError("no list of identical decoder layers was found")
    offset = int(run.result.get("layers_offset") or 0)
    n_layers = layer_count(run)
    return _Blocks(layers_path, offset, n_layers, frozenset(f"{layers_path}.{offset + k}" for k in range(n_layers)))


def _token_embedding(modules: list[dict[str, Any]], blocks: _Blocks) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(embeddings outside the layers, the one with most rows): the vocabulary and hidden sizes every shape is read against."""
    embeds = [m for m in modules if "embedding" in m and not blocks.holds(m["name"])]
    if not embeds:
        raise AnatomyError("no token embedding was found")
    return embeds, max(embeds, key=lambda m: m["embedding"]["num"])


def _call_order(run: ReferenceRun) -> dict[str, int]:
    """Each module's first call in the forward pass: the order that tells projections' roles apart."""
    order: dict[str, int] = {}
    for i, call in enumerate(run.result.get("calls", [])):
        order.setdefault(call["name"], i)
    return order


def _by_call(modules: list[dict[str, Any]], order: dict[str, int]) -> list[dict[str, Any]]:
    """Modules in the order the forward pass first called them (never called: last)."""
    return sorted(modules, key=lambda m: order.get(m["name"], 10**9))


def _norm_of(module: dict[str, Any], path: str) -> Norm:
    """A norm module as a ``Norm`` at ``path`` (relative to layer 0, or the final norm's own name)."""
    params = module["params"]
    return Norm(path, "bias" in params or "beta" in params, module["class"], _eps(module),
                next(n for n in ("weight", "scale", "g", "gamma") if n in params))


def _layer0(modules: list[dict[str, Any]], prefix: str, order: dict[str, int], hidden: int) -> Layer:
    """Layer 0's norms and projections, each in its role; a part of no known role is an error."""
    layer_mods = [m for m in modules if m["name"].startswith(prefix)]
    linears = _by_call([m for m in layer_mods if "linear" in m], order)
    norms = _by_call([m for m in layer_mods if _is_norm(m, hidden)], order)
    norm_objs = [_norm_of(m, m["name"][len(prefix):]) for m in norms]
    lin_objs = _called_linears(linears, prefix, order)
    # parameters that are neither in a Linear nor in a norm
    covered = {f"{m['name']}.{p}" for m in linears + norms for p in m["params"]}
    other = [p for m in layer_mods for p in _param_paths(m) if p not in covered]

    attn, mlp = _split_groups(lin_objs, norm_objs, order, prefix, hidden)
    attention_inputs, attention_output = _inputs_and_output(
        attn, hidden, "no attention output projection (a linear back to the hidden size) in layer 0")
    mlp_inputs, mlp_output = _inputs_and_output(mlp, hidden, "no MLP output projection in layer 0")
    stray = [lin.path for lin in attn + mlp if lin not in attention_inputs + [attention_output] + mlp_inputs + [mlp_output]]
    if stray:
        raise AnatomyError(f"layer 0 has projections of no known role: {', '.join(stray)}")
    if not attention_inputs or not mlp_inputs:
        raise AnatomyError("layer 0 lacks attention or MLP input projections")
    return Layer(norm_objs, attention_inputs, attention_output, mlp_inputs, mlp_output, parallel=len(norm_objs) == 1, other_params=other)


def _called_linears(linears: list[dict[str, Any]], prefix: str, order: dict[str, int]) -> list[Linear]:
    """Layer 0's linear modules as ``Linear``s; one the forward pass never used has no role to read."""
    lin_objs = [Linear(m["name"][len(prefix):], m["linear"]["in"], m["linear"]["out"], m["linear"]["bias"], bool(m["linear"].get("transposed")))
                for m in linears]
    if not lin_objs:
        raise AnatomyError("decoder layer 0 has no linear projections")
    uncalled = [lin.path for lin, m in zip(lin_objs, linears) if m["name"] not in order]
    if uncalled:
        raise AnatomyError(f"layer 0 has projections the forward pass never used: {', '.join(uncalled)}")
    return lin_objs


def _inputs_and_output(group: list[Linear], hidden: int, no_output: str) -> tuple[list[Linear], Linear]:
    """(inputs, output) of a group: output the last linear back to ``hidden``, inputs the others reading ``hidden``."""
    outputs = [lin for lin in group if lin.out == hidden]
    if not outputs:
        raise AnatomyError(no_output)
    output = outputs[-1]
    return [lin for lin in group if lin is not output and lin.inp == hidden], output


def _dims(tiny_config: dict[str, Any], layer: Layer, hidden: int, vocab: int, layers: int) -> Dims:
    """The shrunk sizes: head count from the config, head width and key/value heads from what the projections compute."""
    d = first(tiny_config, "head_dim")
    heads = first(tiny_config, "heads")
    if not isinstance(heads, int) or heads <= 0:
        raise AnatomyError("the config names no attention head count")
    q_rows = layer.attention_output.inp
    if not isinstance(d, int):
        d = q_rows // heads
    if heads * d != q_rows:
        raise AnatomyError(f"the attention output reads {q_rows} features, not {heads} heads of {d}")
    kv_heads = _kv_heads(layer.attention_inputs, heads, d)
    return Dims(hidden, heads, kv_heads, d, layer.mlp_output.inp, vocab, layers)


def _head(outside: list[dict[str, Any]], vocab_embed: dict[str, Any], vocab: int, hidden: int,
          tied_pairs: list[list[str]]) -> dict[str, Any] | None:
    """The output head: the other ``[vocab, hidden]`` weight outside the layers (None: tied to the embedding)."""
    found = [m for m in outside if m is not vocab_embed and m["params"].get("weight") == [vocab, hidden]]
    head = found[0] if found else None
    if head is not None and any(f"{head['name']}.weight" in pair for pair in tied_pairs):
        return None
    return head


def _final_norm(outside: list[dict[str, Any]], hidden: int, order: dict[str, int], last_layer: str) -> Norm | None:
    """The final norm: the first norm outside the layers called after the last one (None: there is none)."""
    after_layers = [m for m in outside if _is_norm(m, hidden) and order.get(m["name"], -1) > order.get(last_layer, 10**9)]
    final = sorted(after_layers, key=lambda m: order[m["name"]])
    return _norm_of(final[0], final[0]["name"]) if final else None


def _used_outside(modules: list[dict[str, Any]], vocab_embed: dict[str, Any], positions: dict[str, Any] | None,
                  head: dict[str, Any] | None, head_bias: bool, final_norm: Norm | None) -> set[str]:
    """Parameters outside the layers the anatomy accounts for; any other one is an extra a target lacks."""
    by_name = {m["name"]: m for m in modules}
    used = ({f"{vocab_embed['name']}.weight"} | ({f"{positions['name']}.weight"} if positions else set())
            | ({f"{head['name']}.weight"} if head else set()) | ({f"{head['name']}.bias"} if head and head_bias else set()))
    if final_norm:
        used |= {f"{final_norm.path}.{p}" for p in by_name[final_norm.path]["params"]}
    return used


def _position_embedding(embeds: list[dict[str, Any]], vocab_embed: dict[str, Any], hidden: int, order: dict[str, int],
                        layer0: str) -> dict[str, Any] | None:
    """A second embedding of the hidden width, called before layer 0: learned absolute
    positions (GPT-2's ``wpe``), added to the token embedding."""
    before = order.get(layer0, 10**9)
    found = [m for m in embeds if m is not vocab_embed and m["embedding"]["dim"] == hidden and order.get(m["name"], 10**9) < before]
    return found[0] if len(found) == 1 else None


def _tied_to(param: str, used: set[str], pairs: list[list[str]]) -> bool:
    return any(param in pair and any(p in used for p in pair) for pair in pairs)


def _kv_heads(inputs: list[Linear], heads: int, d: int) -> int:
    if len(inputs) == 1:
        rows = inputs[0].out
        if rows % d or (rows // d - heads) % 2 or rows // d <= heads:
            raise AnatomyError(f"a packed projection of {rows} rows is not q/k/v for {heads} heads of {d}")
        return (rows // d - heads) // 2
    sizes = sorted(lin.out for lin in inputs)
    if len(inputs) == 3:
        kv = sizes[0] // d
        if sizes[0] != sizes[1] or sizes[2] != heads * d:
            raise AnatomyError(f"three input projections of {sizes} rows are not q/k/v for {heads} heads of {d}")
        return kv
    if len(inputs) == 2:
        q = [lin for lin in inputs if lin.out == heads * d]
        kv_inputs = [lin for lin in inputs if lin not in q[:1]]
        if q and kv_inputs and kv_inputs[0].out % (2 * d) == 0:
            return kv_inputs[0].out // (2 * d)
    raise AnatomyError(f"{len(inputs)} attention input projections of {sizes} rows: no q/k/v split is known for them")


def _split_groups(linears: list[Linear], norms: list[Norm], order: dict[str, int], first: str, hidden: int) -> tuple[list[Linear], list[Linear]]:
    """(attention linears, MLP linears): by owning module when the layer has two owners,
    else by the second norm's call."""
    owners: dict[str, list[Linear]] = {}
    for lin in linears:
        owners.setdefault(lin.path.rpartition(".")[0], []).append(lin)
    if len(owners) == 2:
        a, b = list(owners.values())
        return a, b
    if len(norms) >= 2:
        cut = order.get(first + norms[1].path, 10**9)
        attn = [lin for lin in linears if order.get(first + lin.path, 0) < cut]
        mlp = [lin for lin in linears if order.get(first + lin.path, 0) > cut]
        return attn, mlp
    raise AnatomyError("cannot tell the attention projections of layer 0 from the MLP's")


def full_dims(anatomy: Anatomy, run: ReferenceRun, full_config: dict[str, Any], tiny_config: dict[str, Any]) -> Dims:
    """The real model's sizes: read off the full-size meta-device build of the original when
    the reference run made one (exact), else scaled from the config the way the shrunk copy
    relates to its config (e.g. Qwen's MLP is half its ``intermediate_size``)."""

    heads, kv_field = head_counts(full_config)
    if not isinstance(heads, int):
        raise AnatomyError("the config names no attention head count")
    meta = run.result.get("meta_params") or {}
    lp = anatomy.layers_path
    layer0 = f"{lp}.{anatomy.layer_offset}."
    hidden: int | None
    head_dim: int | None
    kv: int | None
    intermediate: int | None
    if meta and f"{anatomy.embed}.weight" in meta and f"{layer0}{anatomy.layer.attention_output.path}.weight" in meta:
        vocab, hidden = meta[f"{anatomy.embed}.weight"]

        def shape(lin: Linear) -> tuple[int, int]:
            """(out, in) of a projection's full-size weight (Conv1D stores it [in, out])."""
            rows, cols = meta[f"{layer0}{lin.path}.weight"]
            return (cols, rows) if lin.transposed else (rows, cols)

        q_rows = shape(anatomy.layer.attention_output)[1]
        head_dim = q_rows // heads
        ins = [shape(lin)[0] for lin in anatomy.layer.attention_inputs]
        if len(ins) == 1:
            kv = (ins[0] // head_dim - heads) // 2
        elif len(ins) == 2:
            kv = min(ins) // (2 * head_dim) if min(ins) != q_rows else max(ins) // (2 * head_dim)
        else:
            kv = sorted(ins)[0] // head_dim
        intermediate = shape(anatomy.layer.mlp_output)[1]
        out_path = re.compile(rf"{re.escape(lp)}\.\d+\.{re.escape(anatomy.layer.attention_output.path)}\.weight")
        layers = len([k for k in meta if out_path.fullmatch(k)])
        return Dims(hidden, heads, kv, head_dim, intermediate, vocab, layers)
    tiny = anatomy.dims
    hidden = first(full_config, "hidden")
    head_dim = first(full_config, "head_dim") or (hidden // heads if isinstance(hidden, int) else None)
    t_heads, t_kv_field = head_counts(tiny_config)
    if tiny.kv_heads == t_kv_field:
        kv = kv_field
    elif tiny.kv_heads == t_heads:
        kv = heads
    else:
        kv = tiny.kv_heads if tiny.kv_heads == 1 else None
    t_inter = first(tiny_config, "intermediate")
    f_inter = first(full_config, "intermediate")
    intermediate = int(round(f_inter * tiny.intermediate / t_inter)) if isinstance(t_inter, int) and isinstance(f_inter, int) and t_inter else None
    vocab = first(full_config, "vocab")
    layers = first(full_config, "layers")
    missing = [n for n, v in (("hidden size", hidden), ("head dim", head_dim), ("key/value heads", kv), ("MLP width", intermediate),
                              ("vocabulary", vocab), ("layers", layers)) if not isinstance(v, int)]
    if missing:
        raise AnatomyError(f"the full-size {', '.join(missing)} cannot be read from the config ({run.result.get('meta_error') or 'no meta build'})")
    assert kv is not None and head_dim is not None and intermediate is not None  # each an int, or named missing above
    return Dims(hidden, heads, kv, head_dim, intermediate, vocab, layers)
