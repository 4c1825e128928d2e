"""Native transformers classes a remote model can be retargeted to, one class per target.

Like vLLM's fusers, each target has ``match`` (does the anatomy fit at all, and if not, why)
and ``hypotheses`` (every reading of the anatomy the shapes leave open, most likely first);
``search`` proves them numerically against the reference run and keeps the first that
reproduces the original. ``TARGETS`` is the registry, in priority order; ``search`` tries the
classes vLLM runs natively before those only its transformers backend runs (``serving_rank``),
each group in the registry's order, and the first proven hypothesis wins.

A hypothesis knows how to write the native config for any size (``config(dims)``), and the
weight plan for any size (``plan(dims)``, see ``plan.py``), so the shrunk proof and the
full-size output use the same mapping.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hfcheck.porter.retarget.anatomy import Anatomy, Dims, Linear
from hfcheck.porter.retarget.plan import Recipe

TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
ROPE_BASE_FIELDS = ("rope_theta", "rotary_emb_base", "rotary_base", "rope_base", "rope_ratio")


@dataclass
class Hypothesis:
    target: str  # native model_type
    architecture: str  # native class name
    choices: dict[str, str]  # the readings this hypothesis takes (shown in PORT.md)
    config: Callable[[Dims | None, dict[str, Any]], dict[str, Any]]  # (dims, original config) -> native config; dims None: sizes as they are
    plan: Callable[[Dims], list[Recipe]]
    notes: list[str] = field(default_factory=list)


def _name_score(path: str, words: tuple[str, ...]) -> bool:
    leaf = path.rpartition(".")[2].lower()
    return any(re.search(rf"(^|_){w}(_|$|proj)", leaf) or leaf == w for w in words)


def trained_length(config: dict[str, Any]) -> int | None:
    """The context the model was trained for (``seq_length`` where a config has it, as Qwen and
    ChatGLM do beside a larger ``max_position_embeddings``)."""
    for key in ("seq_length", "max_position_embeddings", "max_seq_len", "n_positions", "model_max_length", "max_sequence_length"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def length_notes(config: dict[str, Any]) -> list[str]:
    """Where the original's function depends on the sequence length beyond what a native class does."""
    notes = []
    length = trained_length(config)
    past = f"past {length} tokens" if length else "past the trained length"
    if config.get("use_logn_attn"):
        notes.append(f"`use_logn_attn`: the original scales queries by log(position)/log({length}) {past}; the native class does not (equal up to {length} tokens)")
    if config.get("use_dynamic_ntk"):
        notes.append(f"`use_dynamic_ntk`: the original enlarges the rotary base {past} (dynamic NTK); the native class keeps it (equal up to {length} tokens)")
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and str(scaling.get("type") or scaling.get("rope_type")) == "dynamic":
        notes.append(f"`rope_scaling` dynamic: the original rescales the rotary base {past}; the native config keeps the base (equal up to {length} tokens)")
    return notes


def _common_config(model_type: str, arch: str, dims: Dims, original: dict[str, Any], anatomy: Anatomy) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [arch], "model_type": model_type, "vocab_size": dims.vocab, "hidden_size": dims.hidden,
        "num_hidden_layers": dims.layers, "num_attention_heads": dims.heads, "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim, "tie_word_embeddings": anatomy.tied,
    }
    length = trained_length(original)
    if length:
        cfg["max_position_embeddings"] = length
    for key in TOKEN_FIELDS:
        if key in original:
            cfg[key] = original[key]
    if not (isinstance(cfg.get("pad_token_id"), int) and 0 <= cfg["pad_token_id"] < dims.vocab):
        # no padding row the original names: none, not the native class's default (GlmConfig's
        # 151329 lies outside CodeGeeX2's vocabulary, and its embedding refuses to build)
        cfg["pad_token_id"] = None
    dtype = original.get("torch_dtype") or original.get("dtype")
    if isinstance(dtype, str):
        cfg["dtype"] = dtype.replace("torch.", "")
    elif original.get("bf16"):
        cfg["dtype"] = "bfloat16"
    elif original.get("fp16"):
        cfg["dtype"] = "float16"
    return cfg


def _rope(anatomy: Anatomy, original: dict[str, Any], partial: float | None = None) -> dict[str, Any]:
    base = anatomy.rotary["base"] if anatomy.rotary else 10000.0
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": base}
    scaling = original.get("rope_scaling")
    if isinstance(scaling, dict) and str(scaling.get("type") or scaling.get("rope_type")) == "linear" and scaling.get("factor"):
        params = {"rope_type": "linear", "rope_theta": base, "factor": float(scaling["factor"])}
    if partial is not None and partial != 1.0:
        params["partial_rotary_factor"] = partial
    return params


# ---------------------------------------------------------------------- attention inputs


def _qkv_readings(anatomy: Anatomy) -> Iterator[tuple[dict[str, str], Callable[[Dims, str], list[Recipe]]]]:
    """Ways to read the attention input projections as q, k, v: (choices, recipes(dims, part))."""
    inputs = anatomy.layer.attention_inputs
    lp = anatomy.layer_src
    if len(inputs) == 1:
        packed = inputs[0]
        layouts: list[tuple[str, int]] = [("contiguous", 0), ("grouped", 0)]  # grouped with group 1: per-head [q, k, v]
        if anatomy.dims.kv_heads == anatomy.dims.heads:
            # CodeGen: the heads in blocks (its `mp_num`, 4 or 8), each block [q, v, k] of its heads
            layouts += [("blocks", n) for n in (4, 8, 2) if anatomy.dims.heads % n == 0 and anatomy.dims.heads > n // 2]
        for layout, blocks in layouts:
            def recipes(dims: Dims, out_prefix: str, layout=layout, blocks=blocks, packed=packed) -> list[Recipe]:
                out: list[Recipe] = []
                group = dims.heads // dims.kv_heads
                sizes = [dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.kv_heads * dims.head_dim]
                for n, part in enumerate("qkv"):
                    take = ({"layout": "contiguous", "sizes": sizes, "part": n} if layout == "contiguous" else
                            {"layout": "blocks", "blocks": blocks, "order": "qvk", "part": part} if layout == "blocks" else
                            {"layout": "grouped", "kv": dims.kv_heads, "group": group, "head_dim": dims.head_dim, "part": part})
                    for kind in ("weight", "bias") if packed.bias else ("weight",):
                        out.append({"out": f"{out_prefix}{part}_proj.{kind}", "src": f"{lp}.{packed.path}.{kind}", "take": take, "role": part})
                return out
            shown = f"{blocks} blocks of heads, each [q, v, k]" if layout == "blocks" else f"{layout} rows"
            yield {"q/k/v": f"{packed.path} packed, {shown}"}, recipes
        return
    if len(inputs) == 3:
        by_name = {}
        for part, words in (("q", ("q", "wq", "query", "q_proj")), ("k", ("k", "wk", "key", "k_proj")), ("v", ("v", "wv", "value", "v_proj"))):
            hits = [lin for lin in inputs if _name_score(lin.path, words)]
            if len(hits) == 1:
                by_name[part] = hits[0]
        orders: list[tuple[Linear, Linear, Linear]] = []
        if len({id(v) for v in by_name.values()}) == 3:
            orders.append((by_name["q"], by_name["k"], by_name["v"]))
        q_size = anatomy.dims.heads * anatomy.dims.head_dim
        for perm in itertools.permutations(inputs, 3):
            if perm[0].out == q_size and perm not in orders:
                orders.append(perm)
        for q, k, v in orders:
            def separate_recipes(dims: Dims, out_prefix: str, q=q, k=k, v=v) -> list[Recipe]:
                out: list[Recipe] = []
                for part, lin in zip("qkv", (q, k, v)):
                    for kind in ("weight", "bias") if lin.bias else ("weight",):
                        out.append({"out": f"{out_prefix}{part}_proj.{kind}", "src": f"{lp}.{lin.path}.{kind}", "role": part})
                return out
            yield {"q/k/v": f"q={q.path}, k={k.path}, v={v.path}"}, separate_recipes
        return
    if len(inputs) == 2:
        q_size = anatomy.dims.heads * anatomy.dims.head_dim
        q = next(lin for lin in inputs if lin.out == q_size)
        kv = next(lin for lin in inputs if lin is not q)
        for layout in ("contiguous", "grouped"):
            def packed_kv_recipes(dims: Dims, out_prefix: str, q=q, kv=kv, layout=layout) -> list[Recipe]:
                out: list[Recipe] = []
                for kind in ("weight", "bias") if q.bias else ("weight",):
                    out.append({"out": f"{out_prefix}q_proj.{kind}", "src": f"{lp}.{q.path}.{kind}", "role": "q"})
                for n, part in enumerate("kv"):
                    take = ({"layout": "halves", "part": n} if layout == "contiguous" else
                            {"layout": "grouped", "kv": dims.kv_heads, "group": 0, "head_dim": dims.head_dim, "part": part})
                    for kind in ("weight", "bias") if kv.bias else ("weight",):
                        out.append({"out": f"{out_prefix}{part}_proj.{kind}", "src": f"{lp}.{kv.path}.{kind}", "take": take, "role": part})
                return out
            yield {"q/k/v": f"q={q.path}, k/v={kv.path} packed, {layout} rows"}, packed_kv_recipes


def _mlp_readings(anatomy: Anatomy) -> Iterator[tuple[dict[str, str], Callable[[Dims, str, bool], list[Recipe]]]]:
    """Ways to read the MLP inputs as gate and up: (choices, recipes(dims, prefix, packed_out))."""
    inputs = anatomy.layer.mlp_inputs
    lp = anatomy.layer_src
    if len(inputs) == 2:
        a, b = inputs
        gate_first = [(a, b), (b, a)]
        named = [lin for lin in inputs if _name_score(lin.path, ("gate", "w1", "gate_proj", "wg"))]
        if len(named) == 1 and named[0] is b:
            gate_first.reverse()
        for gate, up in gate_first:
            def recipes(dims: Dims, prefix: str, packed_out: bool, gate=gate, up=up) -> list[Recipe]:
                kinds = ("weight", "bias") if gate.bias else ("weight",)
                if packed_out:
                    raise ValueError("separate gate/up into a packed native projection is not planned")
                return ([{"out": f"{prefix}gate_proj.{k}", "src": f"{lp}.{gate.path}.{k}", "role": "gate"} for k in kinds]
                        + [{"out": f"{prefix}up_proj.{k}", "src": f"{lp}.{up.path}.{k}", "role": "up"} for k in kinds])
            yield {"gate/up": f"gate={gate.path}, up={up.path}"}, recipes
    elif len(inputs) == 1 and inputs[0].out == 2 * anatomy.dims.intermediate:
        packed = inputs[0]
        for gate_half in (0, 1):
            def packed_recipes(dims: Dims, prefix: str, packed_out: bool, gate_half=gate_half, packed=packed) -> list[Recipe]:
                kinds = ("weight", "bias") if packed.bias else ("weight",)
                if packed_out:
                    if gate_half != 0:
                        return [{"out": f"{prefix}gate_up_proj.{k}", "src": f"{lp}.{packed.path}.{k}", "swap_halves": True, "role": "gate_up"} for k in kinds]
                    return [{"out": f"{prefix}gate_up_proj.{k}", "src": f"{lp}.{packed.path}.{k}", "role": "gate_up"} for k in kinds]
                return ([{"out": f"{prefix}gate_proj.{k}", "src": f"{lp}.{packed.path}.{k}", "take": {"layout": "halves", "part": gate_half}, "role": "gate"} for k in kinds]
                        + [{"out": f"{prefix}up_proj.{k}", "src": f"{lp}.{packed.path}.{k}", "take": {"layout": "halves", "part": 1 - gate_half}, "role": "up"} for k in kinds])
            yield {"gate/up": f"{packed.path} packed, gate = {'first' if gate_half == 0 else 'second'} half"}, packed_recipes


def _permute(recipes: list[Recipe], dims: Dims, rotary_dim: int, inverse: bool = False) -> list[Recipe]:
    out: list[Recipe] = []
    for r in recipes:
        if r.get("role") in ("q", "k"):
            r = dict(r)
            r["permute_rotary"] = {"head_dim": dims.head_dim, "rotary_dim": rotary_dim, **({"inverse": True} if inverse else {})}
        out.append(r)
    return out


def _norm_recipes(anatomy: Anatomy, out: str, norm, layer: bool) -> list[Recipe]:
    src = f"{anatomy.layer_src}.{norm.path}" if layer else norm.path
    recipes: list[Recipe] = [{"out": f"{out}.weight", "src": f"{src}.{norm.weight_name}"}]
    if norm.bias:
        recipes.append({"out": f"{out}.bias", "src": f"{src}.bias"})
    return recipes


def _head_recipes(anatomy: Anatomy) -> Iterator[tuple[dict[str, str], list[Recipe]]]:
    if anatomy.head is None:
        yield {}, []
        return
    yield {}, [{"out": "lm_head.weight", "src": f"{anatomy.head}.weight"}]
    if anatomy.head_class not in (None, "Linear"):
        yield {"head": f"{anatomy.head} ({anatomy.head_class}) normalises its rows"}, [{"out": "lm_head.weight", "src": f"{anatomy.head}.weight", "normalize_rows": True}]


def _finish(anatomy: Anatomy, recipes: list[Recipe]) -> list[Recipe]:
    """Mark the recipes that read a weight stored ``[in, out]`` (GPT-2's ``Conv1D``) to be
    transposed: every target's plan ends here, so the readings above stay layout-free."""
    stored_transposed = anatomy.transposed()
    if not stored_transposed:
        return recipes

    def mark(r: Recipe) -> Recipe:
        r = dict(r)
        if r.get("src") in stored_transposed:
            r["transpose"] = True
        if "cat" in r:
            r["cat"] = [mark(part) for part in r["cat"]]
        return r

    return [mark(r) for r in recipes]


# ---------------------------------------------------------------------- targets


class Target:
    """One native class family. ``match`` returns None when it fits, else the reason."""

    name = ""

    def match(self, anatomy: Anatomy | None, original: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def hypotheses(self, anatomy: Anatomy | None, original: dict[str, Any]) -> Iterator[Hypothesis]:
        """The readings to prove (``anatomy`` is None only for a target whose ``match`` takes a model without one)."""
        raise NotImplementedError


class LlamaFamily(Target):
    """A norm before attention and before a gated MLP, rotary position embedding:
    ``llama`` (vLLM native; any bias pattern through ``attention_bias``/``mlp_bias`` and zero
    biases), ``qwen2`` when exactly q/k/v carry a bias (Qwen v1), ``glm`` when the rotary covers
    part of the head with interleaved pairs and gate/up are packed (ChatGLM 2/3), ``stablelm``
    when the norms are LayerNorms with a bias (StableLM-Epoch, partial rotary)."""

    name = "llama family (llama, qwen2, glm, stablelm)"

    def match(self, anatomy, original):
        if anatomy is None:
            return "no anatomy"
        layer = anatomy.layer
        if layer.parallel or len(layer.norms) != 2:
            return f"{len(layer.norms)} norm(s) per layer in {'parallel' if layer.parallel else 'sequence'}; the llama family has two, in sequence"
        norms = layer.norms + ([anatomy.final_norm] if anatomy.final_norm else [])
        if anatomy.final_norm is None:
            return "no final norm"
        kinds = {n.kind for n in norms}
        if "layer" in kinds and not all(n.bias for n in norms):
            return "LayerNorm without a bias (neither RMSNorm nor transformers' LayerNorm-with-bias classes)"
        if "layer" not in kinds and any(n.bias for n in norms):
            return "RMS norms with a bias"
        if anatomy.positions:
            return f"learned absolute positions ({anatomy.positions}), not rotary"
        if anatomy.rotary is None:
            return "no rotary embedding (inv_freq) was found: position information comes another way (ALiBi, learned positions)"
        if layer.other_params or anatomy.extra_params:
            return f"parameters outside projections and norms: {', '.join((layer.other_params + anatomy.extra_params)[:3])}"
        if not (len(layer.mlp_inputs) == 2 or (len(layer.mlp_inputs) == 1 and layer.mlp_inputs[0].out == 2 * anatomy.dims.intermediate)):
            return "the MLP is not gated (no gate and up projections)"
        if anatomy.head_bias:
            return "the output head has a bias (the llama family's has none)"
        return None

    def hypotheses(self, anatomy, original):
        layer = anatomy.layer
        dims = anatomy.dims
        rot_dim = anatomy.rotary["dim"]
        partial = rot_dim / dims.head_dim
        qkv_bias = any(lin.bias for lin in layer.attention_inputs)
        o_bias = layer.attention_output.bias
        mlp_bias = any(lin.bias for lin in layer.mlp_inputs) or layer.mlp_output.bias
        act = anatomy.hidden_act or "silu"
        notes = length_notes(original)
        layer_norm = layer.norms[0].kind == "layer"
        if layer_norm:
            if o_bias or mlp_bias:
                return
            targets = [("stablelm", "StableLmForCausalLM")]
        elif partial != 1.0:
            if o_bias or mlp_bias:
                return
            targets = [("glm", "GlmForCausalLM")]
        elif qkv_bias and not o_bias and not mlp_bias:
            targets = [("qwen2", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")]
        else:
            targets = [("llama", "LlamaForCausalLM")]
        rotary_styles = ["half", "interleaved"]
        for (model_type, arch), (qkv_choice, qkv), (mlp_choice, mlp), style, (head_choice, head) in itertools.product(
                targets, list(_qkv_readings(anatomy)), list(_mlp_readings(anatomy)), rotary_styles, list(_head_recipes(anatomy))):
            packed_out = model_type == "glm"
            if packed_out and len(layer.mlp_inputs) != 1:
                continue
            choices = {"target": arch, **qkv_choice, **mlp_choice, "rotary pairs": style, **head_choice}

            def config(d: Dims, original: dict[str, Any], model_type=model_type, arch=arch) -> dict[str, Any]:
                cfg = _common_config(model_type, arch, d, original, anatomy)
                eps = layer.norms[0].eps or (1e-5 if model_type == "stablelm" else 1e-6)
                cfg.update(intermediate_size=d.intermediate, hidden_act=act,
                           rope_parameters=_rope(anatomy, original, partial if model_type in ("glm", "stablelm") else None))
                if model_type == "stablelm":
                    cfg.update(layer_norm_eps=eps, use_qkv_bias=bool(qkv_bias), qk_layernorm=False, use_parallel_residual=False,
                               partial_rotary_factor=partial)
                else:
                    cfg.update(rms_norm_eps=eps)
                if model_type == "llama":
                    cfg.update(attention_bias=bool(qkv_bias or o_bias), mlp_bias=bool(mlp_bias))
                elif model_type == "glm":
                    cfg.update(attention_bias=bool(qkv_bias), partial_rotary_factor=partial)
                return cfg

            def plan(d: Dims, model_type=model_type, qkv=qkv, mlp=mlp, style=style, head=head, packed_out=packed_out) -> list[Recipe]:
                prefix = "model.layers.{i}."
                attn = qkv(d, prefix + "self_attn.")
                rot = int(round(partial * d.head_dim))
                if model_type == "glm" and style == "half":
                    attn = _permute(attn, d, rot, inverse=True)
                elif model_type != "glm" and style == "interleaved":
                    attn = _permute(attn, d, rot)
                recipes: list[Recipe] = [{"out": "model.embed_tokens.weight", "src": f"{anatomy.embed}.weight"}]
                recipes += _norm_recipes(anatomy, prefix + "input_layernorm", layer.norms[0], True)
                recipes += attn
                recipes += [{"out": f"{prefix}self_attn.o_proj.weight", "src": f"{anatomy.layer_src}.{layer.attention_output.path}.weight"}]
                if o_bias:
                    recipes.append({"out": f"{prefix}self_attn.o_proj.bias", "src": f"{anatomy.layer_src}.{layer.attention_output.path}.bias"})
                if model_type == "llama" and (qkv_bias or o_bias):
                    have = {r["out"] for r in recipes}
                    sizes = {"q": d.heads * d.head_dim, "k": d.kv_heads * d.head_dim, "v": d.kv_heads * d.head_dim, "o": d.hidden}
                    for part, size in sizes.items():
                        name = f"{prefix}self_attn.{part}_proj.bias"
                        if name not in have:
                            recipes.append({"out": name, "zeros": [size]})
                recipes += _norm_recipes(anatomy, prefix + "post_attention_layernorm", layer.norms[1], True)
                recipes += mlp(d, prefix + "mlp.", packed_out)
                recipes.append({"out": f"{prefix}mlp.down_proj.weight", "src": f"{anatomy.layer_src}.{layer.mlp_output.path}.weight"})
                if layer.mlp_output.bias:
                    recipes.append({"out": f"{prefix}mlp.down_proj.bias", "src": f"{anatomy.layer_src}.{layer.mlp_output.path}.bias"})
                if model_type == "llama" and mlp_bias:
                    have = {r["out"] for r in recipes}
                    for part, size in (("gate", d.intermediate), ("up", d.intermediate), ("down", d.hidden)):
                        if f"{prefix}mlp.{part}_proj.bias" not in have:
                            recipes.append({"out": f"{prefix}mlp.{part}_proj.bias", "zeros": [size]})
                recipes += _norm_recipes(anatomy, "model.norm", anatomy.final_norm, False)
                recipes += head
                return _finish(anatomy, recipes)

            yield Hypothesis(model_type, arch, choices, config, plan, notes)


class SameNames(Target):
    """A native class whose parameter names and shapes equal the original's, once the config
    is translated: Falcon for RefinedWeb (``RWForCausalLM``), and the remote code of a
    ``model_type`` transformers implements itself (DeepSeek-V2/V3, Llama copies...)."""

    name = "same parameter names (falcon for RefinedWeb, native model_type)"

    def match(self, anatomy, original):
        return None

    def hypotheses(self, anatomy, original):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        model_type = str(original.get("model_type") or "")
        if model_type in ("RefinedWebModel", "RefinedWeb") or "RWForCausalLM" in (original.get("architectures") or []):
            yield Hypothesis("falcon", "FalconForCausalLM", {"target": "FalconForCausalLM", "config": "RefinedWeb fields renamed"},
                             lambda d, o: falcon_config(o), None, length_notes(original))
        elif model_type in CONFIG_MAPPING and model_type not in ("llama",):
            arch = _native_arch(model_type, original)
            if arch:
                yield Hypothesis(model_type, arch, {"target": arch, "config": "model_type is native to transformers"},
                                 lambda d, o: native_config(o), None, length_notes(original))


def _native_arch(model_type: str, original: dict[str, Any]) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if isinstance(arch, (list, tuple)):
        arch = arch[0]
    return arch


def native_config(original: dict[str, Any]) -> dict[str, Any]:
    cfg = {k: v for k, v in original.items() if k not in ("auto_map", "transformers_version", "_name_or_path")}
    arch = _native_arch(str(original.get("model_type")), original)
    if arch:
        cfg["architectures"] = [arch]
    return cfg


def falcon_config(original: dict[str, Any]) -> dict[str, Any]:
    """RefinedWeb config fields in transformers' FalconConfig spelling."""
    o = original
    new_arch = o.get("model_type") == "RefinedWeb" or bool(o.get("new_decoder_architecture"))
    heads = o.get("n_head", o.get("num_attention_heads"))
    cfg = {
        "architectures": ["FalconForCausalLM"], "model_type": "falcon",
        "vocab_size": o.get("vocab_size"), "hidden_size": o.get("hidden_size"),
        "num_hidden_layers": o.get("n_layer", o.get("num_hidden_layers")), "num_attention_heads": heads,
        "num_kv_heads": o.get("n_head_kv", 1 if o.get("multi_query") else heads) if new_arch or not o.get("multi_query") else None,
        "multi_query": bool(o.get("multi_query", False)), "parallel_attn": bool(o.get("parallel_attn", True)),
        "new_decoder_architecture": new_arch, "bias": bool(o.get("bias", False)), "alibi": bool(o.get("alibi", False)),
        "layer_norm_epsilon": o.get("layer_norm_epsilon", 1e-5), "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(o.get("rope_theta", 10000.0))},
        "max_position_embeddings": o.get("max_position_embeddings", 2048),
        "apply_residual_connection_post_layernorm": bool(o.get("apply_residual_connection_post_layernorm", False)),
    }
    for key in TOKEN_FIELDS + ("torch_dtype",):
        if key in o:
            cfg["dtype" if key == "torch_dtype" else key] = o[key]
    return {k: v for k, v in cfg.items() if v is not None}


def _layernorm_plain_mlp(anatomy: Anatomy) -> str | None:
    """What GPT-style layers share (the parallel and learned-positions families): LayerNorms,
    a final one, nothing but projections and norms, a plain two-layer MLP, heads that make up
    the hidden size. None when all hold, else the first that does not."""
    layer, d = anatomy.layer, anatomy.dims
    if anatomy.final_norm is None:
        return "no final norm"
    if any(n.kind != "layer" for n in layer.norms + [anatomy.final_norm]):
        return "the norms are not LayerNorms"
    if layer.other_params or anatomy.extra_params:
        return f"parameters outside projections and norms: {', '.join((layer.other_params + anatomy.extra_params)[:3])}"
    if len(layer.mlp_inputs) != 1 or layer.mlp_inputs[0].out != d.intermediate:
        return "the MLP is not a plain two-layer MLP (one projection up, one down)"
    if d.heads * d.head_dim != d.hidden:
        return f"{d.heads} heads of {d.head_dim} do not make the hidden size {d.hidden}"
    return None


class ParallelFamily(Target):
    """One LayerNorm per layer feeding attention and a plain two-layer MLP side by side, their
    sum added to the residual, rotary on part or all of each head, a final LayerNorm and a head
    that may carry a bias: ``phi`` (vLLM native; biases on q/k/v, the output, the MLP and the
    head, zeros where the original has none), and ``gptj`` (vLLM native) where attention has no
    bias at all, every head is a query head and the rotary base is GPT-J's 10000. MixFormer's
    phi-1/1.5 and CodeGen-style code are this network."""

    name = "parallel family (phi, gptj)"

    def match(self, anatomy, original):
        if anatomy is None:
            return "no anatomy"
        layer = anatomy.layer
        if not layer.parallel:
            return f"{len(layer.norms)} norms per layer: attention and MLP do not read one normalised input"
        if anatomy.positions:
            return f"learned absolute positions ({anatomy.positions}), not rotary"
        if anatomy.rotary is None:
            return "no rotary embedding (inv_freq) was found: position information comes another way (ALiBi, learned positions)"
        return _layernorm_plain_mlp(anatomy)

    def hypotheses(self, anatomy, original):
        layer = anatomy.layer
        dims = anatomy.dims
        partial = anatomy.rotary["dim"] / dims.head_dim
        attention_bias = any(lin.bias for lin in layer.attention_inputs) or layer.attention_output.bias
        targets = [("phi", "PhiForCausalLM")]
        if not attention_bias and dims.kv_heads == dims.heads and anatomy.rotary["base"] == 10000.0:
            targets.insert(0, ("gptj", "GPTJForCausalLM"))
        act = anatomy.hidden_act or "gelu_new"
        eps = layer.norms[0].eps or 1e-5
        for (model_type, arch), (qkv_choice, qkv), style, (head_choice, head) in itertools.product(
                targets, list(_qkv_readings(anatomy)), ("half", "interleaved"), list(_head_recipes(anatomy))):
            if head_choice:
                continue  # a normalising head has no parallel-family counterpart
            choices = {"target": arch, **qkv_choice, "rotary pairs": style}

            def config(d: Dims, original: dict[str, Any], model_type=model_type, arch=arch) -> dict[str, Any]:
                cfg = _common_config(model_type, arch, d, original, anatomy)
                if model_type == "phi":
                    cfg.update(intermediate_size=d.intermediate, hidden_act=act, layer_norm_eps=eps, qk_layernorm=False,
                               resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, rope_parameters=_rope(anatomy, original, partial))
                else:
                    for key in ("num_key_value_heads", "head_dim"):
                        cfg.pop(key, None)
                    cfg.update(n_inner=d.intermediate, activation_function=act, layer_norm_epsilon=eps, rotary_dim=int(round(partial * d.head_dim)),
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_positions=cfg.pop("max_position_embeddings", 2048))
                return cfg

            def plan(d: Dims, model_type=model_type, qkv=qkv, style=style, head=head) -> list[Recipe]:
                phi = model_type == "phi"
                base, attn_name, out_name, up, down, final = (
                    ("model", "self_attn", "dense", "fc1", "fc2", "model.final_layernorm") if phi else
                    ("transformer", "attn", "out_proj", "fc_in", "fc_out", "transformer.ln_f"))
                prefix = f"{base}.{'layers' if phi else 'h'}.{{i}}."
                rot = int(round(partial * d.head_dim))
                attn = qkv(d, f"{prefix}{attn_name}.")
                if phi and style == "interleaved":
                    attn = _permute(attn, d, rot)
                elif not phi and style == "half":
                    attn = _permute(attn, d, rot, inverse=True)
                src = anatomy.layer_src
                recipes: list[Recipe] = [{"out": f"{base}.{'embed_tokens' if phi else 'wte'}.weight", "src": f"{anatomy.embed}.weight"}]
                recipes += _norm_recipes(anatomy, prefix + ("input_layernorm" if phi else "ln_1"), layer.norms[0], True)
                recipes += attn
                recipes.append({"out": f"{prefix}{attn_name}.{out_name}.weight", "src": f"{src}.{layer.attention_output.path}.weight"})
                if layer.attention_output.bias:
                    recipes.append({"out": f"{prefix}{attn_name}.{out_name}.bias", "src": f"{src}.{layer.attention_output.path}.bias"})
                for native, lin in ((up, layer.mlp_inputs[0]), (down, layer.mlp_output)):
                    recipes.append({"out": f"{prefix}mlp.{native}.weight", "src": f"{src}.{lin.path}.weight"})
                    if lin.bias:
                        recipes.append({"out": f"{prefix}mlp.{native}.bias", "src": f"{src}.{lin.path}.bias"})
                recipes += _norm_recipes(anatomy, final, anatomy.final_norm, False)
                recipes += head
                if anatomy.head_bias:
                    recipes.append({"out": "lm_head.bias", "src": f"{anatomy.head}.bias"})
                # the native class has a bias wherever a parallel-family layer may: zeros where the original has none
                sizes = {f"{prefix}mlp.{up}.bias": d.intermediate, f"{prefix}mlp.{down}.bias": d.hidden, "lm_head.bias": d.vocab,
                         f"{prefix}{'input_layernorm' if phi else 'ln_1'}.bias": d.hidden, f"{final}.bias": d.hidden}
                if phi:
                    sizes.update({f"{prefix}self_attn.q_proj.bias": d.heads * d.head_dim, f"{prefix}self_attn.k_proj.bias": d.kv_heads * d.head_dim,
                                  f"{prefix}self_attn.v_proj.bias": d.kv_heads * d.head_dim, f"{prefix}self_attn.dense.bias": d.hidden})
                have = {r["out"] for r in recipes}
                recipes += [{"out": name, "zeros": [size]} for name, size in sizes.items() if name not in have]
                return _finish(anatomy, recipes)

            yield Hypothesis(model_type, arch, choices, config, plan, length_notes(original))


def _packed_qkv(recipes: list[Recipe], out: str, dims: Dims, bias: bool) -> list[Recipe]:
    """One ``[q | k | v]`` projection (GPTBigCode's ``c_attn``) from a q/k/v reading's recipes,
    whatever the original packed: the parts' rows stacked, zeros for a bias the original lacks."""
    by = {(r["role"], r["out"].rpartition(".")[2]): r for r in recipes}
    sizes = {"q": dims.heads * dims.head_dim, "k": dims.kv_heads * dims.head_dim, "v": dims.kv_heads * dims.head_dim}

    def part(role: str, kind: str) -> Recipe:
        r = by.get((role, kind))
        if r is None:
            return {"zeros": [sizes[role]]}
        return {k: v for k, v in r.items() if k not in ("out", "role")}

    packed = [{"out": f"{out}.weight", "cat": [part(role, "weight") for role in "qkv"]}]
    if bias:
        packed.append({"out": f"{out}.bias", "cat": [part(role, "bias") for role in "qkv"]})
    return packed


class LearnedPositionsFamily(Target):
    """GPT-2-style layers: learned absolute positions added to the token embedding, two
    LayerNorms in sequence, a plain two-layer MLP, a final LayerNorm. ``gpt2`` (vLLM native)
    where every head has its own key and value; ``gpt_bigcode`` (vLLM's transformers backend)
    where the heads share one (multi-query, SantaCoder/StarCoder). The original's projections
    may be ``nn.Linear`` or GPT-2's ``Conv1D``, q/k/v packed or not: the plan stacks them into
    the native ``c_attn`` and writes each weight in the native class's own layout (GPT-2
    keeps ``Conv1D``'s ``[in, out]``)."""

    name = "learned positions family (gpt2, gpt_bigcode)"

    def match(self, anatomy, original):
        if anatomy is None:
            return "no anatomy"
        layer = anatomy.layer
        if not anatomy.positions:
            return "no learned absolute position embedding"
        if anatomy.rotary is not None and anatomy.rotary.get("from") != "config":
            return "rotary embedding besides learned positions"
        if layer.parallel or len(layer.norms) != 2:
            return f"{len(layer.norms)} norm(s) per layer; GPT-2 has two, in sequence"
        if (reason := _layernorm_plain_mlp(anatomy)) is not None:
            return reason
        d = anatomy.dims
        if d.kv_heads not in (1, d.heads):
            return f"{d.kv_heads} key/value heads for {d.heads} query heads: GPT-2 has one per head, GPTBigCode one in all"
        if anatomy.head_bias:
            return "the output head has a bias"
        return None

    def hypotheses(self, anatomy, original):
        layer = anatomy.layer
        dims = anatomy.dims
        multi_query = dims.kv_heads == 1 and dims.heads > 1
        model_type, arch = ("gpt_bigcode", "GPTBigCodeForCausalLM") if multi_query else ("gpt2", "GPT2LMHeadModel")
        act = anatomy.hidden_act or "gelu_new"
        eps = layer.norms[0].eps or 1e-5
        for (qkv_choice, qkv), (head_choice, head) in itertools.product(list(_qkv_readings(anatomy)), list(_head_recipes(anatomy))):
            if head_choice:
                continue  # a normalising head has no counterpart here
            choices = {"target": arch, **qkv_choice}

            def config(d: Dims, original: dict[str, Any], model_type=model_type, arch=arch) -> dict[str, Any]:
                cfg = _common_config(model_type, arch, d, original, anatomy)
                for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
                    cfg.pop(key, None)
                cfg.update(n_embd=d.hidden, n_layer=d.layers, n_head=d.heads, n_inner=d.intermediate, n_positions=trained_length(original) or 1024,
                           activation_function=act, layer_norm_epsilon=eps, scale_attn_weights=bool(original.get("scale_attn_weights", True)),
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
                if model_type == "gpt_bigcode":
                    cfg.update(multi_query=True, attention_softmax_in_fp32=True, scale_attention_softmax_in_fp32=True)
                else:
                    cfg.update(scale_attn_by_inverse_layer_idx=bool(original.get("scale_attn_by_inverse_layer_idx", False)),
                               reorder_and_upcast_attn=False)
                return cfg

            def plan(d: Dims, model_type=model_type, qkv=qkv, head=head) -> list[Recipe]:
                prefix = "transformer.h.{i}."
                src = anatomy.layer_src
                qkv_bias = any(lin.bias for lin in layer.attention_inputs)
                attn = _packed_qkv(qkv(d, prefix + "attn."), prefix + "attn.c_attn", d, True)
                recipes: list[Recipe] = [{"out": "transformer.wte.weight", "src": f"{anatomy.embed}.weight"},
                           {"out": "transformer.wpe.weight", "src": f"{anatomy.positions}.weight"}]
                recipes += _norm_recipes(anatomy, prefix + "ln_1", layer.norms[0], True)
                if not qkv_bias:
                    attn[1] = {"out": attn[1]["out"], "zeros": [d.heads * d.head_dim + 2 * d.kv_heads * d.head_dim]}
                recipes += attn
                for native, lin in (("attn.c_proj", layer.attention_output), ("mlp.c_fc", layer.mlp_inputs[0]), ("mlp.c_proj", layer.mlp_output)):
                    recipes.append({"out": f"{prefix}{native}.weight", "src": f"{src}.{lin.path}.weight"})
                    recipes.append({"out": f"{prefix}{native}.bias", **({"src": f"{src}.{lin.path}.bias"} if lin.bias else {"zeros": [lin.out]})})
                    if native == "attn.c_proj":
                        recipes += _norm_recipes(anatomy, prefix + "ln_2", layer.norms[1], True)
                recipes += _norm_recipes(anatomy, "transformer.ln_f", anatomy.final_norm, False)
                recipes += head
                for norm_out in (prefix + "ln_1", prefix + "ln_2", "transformer.ln_f"):
                    if not any(r["out"] == f"{norm_out}.bias" for r in recipes):
                        recipes.append({"out": f"{norm_out}.bias", "zeros": [d.hidden]})
                recipes = _finish(anatomy, recipes)
                if model_type == "gpt2":  # GPT-2 keeps Conv1D: every projection weight stored [in, out]
                    recipes = [_stored_transposed(r) if r["out"].endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else r for r in recipes]
                return recipes

            yield Hypothesis(model_type, arch, choices, config, plan, length_notes(original))


def _stored_transposed(recipe: Recipe) -> Recipe:
    """The recipe's tensor written ``[in, out]`` (the native class is a Conv1D)."""
    inner = {k: v for k, v in recipe.items() if k != "out"}
    return {"out": recipe["out"], "cat": [inner], "transpose": True}


TARGETS: tuple[Target, ...] = (SameNames(), LlamaFamily(), ParallelFamily(), LearnedPositionsFamily())
