"""Convert a checkpoint to the ported module names, tensor by tensor.

The codemods leave plain-data rules (JSON-able dicts) that say how a tensor name and shape
change; the same ``Converter`` applies them to a safetensors checkpoint on disk (streamed:
each tensor is read with ``safe_open``, converted and handed to a shard writer that flushes
every ``max_shard_bytes``; only the experts of one layer are ever held together, for
stacking) and to an in-memory state dict (the random-weight proof uses that, so the proof
also checks the rules).

Rules:
- ``offset_index``: ``extra_layers.<i>.rest`` -> ``layers.<i + n>.rest`` (``n`` read from the
  original config);
- ``chunk_rows``: ``Wqkv.weight`` -> three equal row blocks ``q_proj/k_proj/v_proj.weight``;
- ``stack_experts``: ``moe_experts.<e>.{gate,up,down}_proj.weight`` -> ``experts.gate_up_proj``
  ``[E, 2I, H]`` (gate rows then up rows per expert) and ``experts.down_proj`` ``[E, H, I]``;
- ``regroup_rows``: a packed q/k/v weight (or bias) whose rows are per head (``head``:
  ``[h, 3, d]``) or per key/value group (``group``: ``[kv, h / kv + 2, d]``) -> the same tensor
  with rows ``[q | k | v]`` (head counts read from the config), for a ``.split((q, kv, kv))``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

DEFAULT_SHARD_BYTES = 4 * 1024**3
INDEX_NAME = "model.safetensors.index.json"


def quantized_tensors(config: dict, rules: list[dict] | None) -> str | None:
    """What the port does with the quantized tensors its config declares (None: float weights).
    ``rules``: the rewrite's weight rules; None for a retarget, whose plan is for float weights."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method") or "quantized"
    declared = f"the original's config declares{' ' + str(quant['bits']) + '-bit' if quant.get('bits') else ''} {method} weights"
    if rules is None:
        return (f"{declared}: the native config and weight plan are for float weights (its {method} tensors are not converted; "
                "port the float checkpoint, then quantize the native model)")
    if rules:
        kinds = ", ".join(sorted({str(r.get("kind")) for r in rules}))
        return (f"{declared}: the rewrite's weight rules ({kinds}) rename or reshape parameters and are written for float tensors, "
                f"so its {method} tensors are not converted (port the float checkpoint, then quantize the ported model)")
    return (f"{declared}: the rewrite renames and reshapes no parameter, so its {method} tensors load under the names they were "
            "published with (quantization_config is kept in config.json)")


class ConvertError(Exception):
    pass


ROW_LAYOUTS = ("qkv", "head", "group")


def row_order(layout: str, heads: int, kv_heads: int, head_dim: int) -> list[int]:
    """For each row of ``[q | k | v]``, the row of a packed projection laid out as ``layout``."""
    d = head_dim
    if layout == "qkv":
        return list(range((heads + 2 * kv_heads) * d))
    if layout == "head":
        if heads != kv_heads:
            return []
        return [h * 3 * d + j * d + i for j in range(3) for h in range(heads) for i in range(d)]
    if layout == "group":
        if not kv_heads or heads % kv_heads:
            return []
        g = heads // kv_heads
        q = [(kv * (g + 2) + i) * d + x for kv in range(kv_heads) for i in range(g) for x in range(d)]
        k = [(kv * (g + 2) + g) * d + x for kv in range(kv_heads) for x in range(d)]
        v = [(kv * (g + 2) + g + 1) * d + x for kv in range(kv_heads) for x in range(d)]
        return q + k + v
    return []


def _resolve(spec: dict | None, config: dict, defaults: dict) -> int | None:
    if not spec:
        return None
    if "field" in spec:
        value = config.get(spec["field"], defaults.get(spec["field"]))
        return int(value) if isinstance(value, int) else None
    return spec.get("value")


class Converter:
    def __init__(self, rules: list[dict[str, Any]], config: dict[str, Any], defaults: dict[str, Any] | None = None):
        self.rules = rules
        self.config = config
        self.defaults = defaults or {}
        self.pending: dict[tuple[int, str], dict[str, dict[int, torch.Tensor]]] = {}
        self.renamed = 0
        self.split = 0
        self.stacked = 0

    def rename(self, name: str) -> str:
        for rule in self.rules:
            if rule["kind"] == "offset_index":
                m = re.match(rule["pattern"], name)
                if m:
                    offset = _resolve(rule.get("offset"), self.config, self.defaults)
                    if offset is None:
                        raise ConvertError(f"cannot resolve the layer offset for {name}")
                    groups = m.groupdict()
                    groups["i"] = int(groups["i"]) + offset
                    name = rule["template"].format(**groups)
                    self.renamed += 1
        return name

    def feed(self, name: str, get: Callable[[], torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        name = self.rename(name)
        for n, rule in enumerate(self.rules):
            kind = rule["kind"]
            if kind == "chunk_rows":
                m = re.match(rule["pattern"], name)
                if m:
                    tensor = get()
                    parts = len(rule["parts"])
                    if tensor.shape[0] % parts:
                        raise ConvertError(f"{name}: {tensor.shape[0]} rows do not split into {parts}")
                    self.split += 1
                    return [(tpl.format(**m.groupdict()), piece.contiguous().clone()) for tpl, piece in zip(rule["parts"], tensor.chunk(parts, dim=0))]
            elif kind == "regroup_rows":
                m = re.match(rule["pattern"], name)
                if m:
                    tensor = get()
                    heads = _resolve(rule["heads"], self.config, self.defaults)
                    kv = _resolve(rule["kv_heads"], self.config, self.defaults)
                    if not heads or not kv or tensor.shape[0] % (heads + 2 * kv):
                        raise ConvertError(f"{name}: {tensor.shape[0]} rows are not (heads {heads} + 2 x kv heads {kv}) x head_dim")
                    order = row_order(rule["layout"], heads, kv, tensor.shape[0] // (heads + 2 * kv))
                    if len(order) != tensor.shape[0]:
                        raise ConvertError(f"{name}: no {rule['layout']} row order for {heads} heads and {kv} kv heads")
                    self.split += 1
                    return [(name, tensor[torch.tensor(order)].contiguous())]
            elif kind == "stack_experts":
                m = re.match(rule["pattern"], name)
                if m:
                    groups = m.groupdict()
                    key = (n, groups["pre"])
                    role = {rule["gate"]: "gate", rule["up"]: "up", rule["down"]: "down"}[groups["proj"]]
                    slot = self.pending.setdefault(key, {"gate": {}, "up": {}, "down": {}})
                    slot[role][int(groups["e"])] = get()
                    return self._maybe_stack(rule, key, groups)
        return [(name, get())]

    def _maybe_stack(self, rule, key, groups) -> list[tuple[str, torch.Tensor]]:
        num = _resolve(rule.get("num"), self.config, self.defaults)
        slot = self.pending[key]
        if num is None or any(len(slot[r]) < num for r in ("gate", "up", "down")):
            return []
        del self.pending[key]
        experts = range(num)
        try:
            gate_up = torch.stack([torch.cat([slot["gate"][e], slot["up"][e]], dim=0) for e in experts])
            down = torch.stack([slot["down"][e] for e in experts])
        except KeyError as exc:
            raise ConvertError(f"{groups['pre']}: expert {exc} is missing from the checkpoint") from None
        self.stacked += 1
        return [(rule["gate_up"].format(**groups), gate_up), (rule["down_out"].format(**groups), down)]

    def finish(self) -> None:
        if self.pending:
            (_, pre), slot = next(iter(self.pending.items()))
            counts = {r: len(v) for r, v in slot.items()}
            raise ConvertError(f"{pre or '(root)'}: incomplete experts in the checkpoint ({counts})")


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def convert_state_dict(state: dict[str, torch.Tensor], rules: list[dict], config: dict, defaults: dict | None = None) -> dict[str, torch.Tensor]:
    conv = Converter(rules, config, defaults)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        for new_name, new in conv.feed(name, functools.partial(_same, tensor)):
            out[new_name] = new
    conv.finish()
    return out


# ---------------------------------------------------------------------- checkpoints on disk


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return [folder / f for f in sorted(set(weight_map.values()))]
    return sorted(folder.glob("*.safetensors"))


class ShardWriter:
    """Collect converted tensors and flush a shard whenever ``max_bytes`` is reached."""

    def __init__(self, folder: Path, max_bytes: int = DEFAULT_SHARD_BYTES):
        self.folder = folder
        self.max_bytes = max_bytes
        self.buffer: dict[str, torch.Tensor] = {}
        self.size = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.buffer or any(name in names for _, names in self.shards):
            raise ConvertError(f"two tensors convert to {name}")
        nbytes = tensor.numel() * tensor.element_size()
        if self.buffer and self.size + nbytes > self.max_bytes:
            self.flush()
        self.buffer[name] = tensor.contiguous()
        self.size += nbytes
        self.total += nbytes

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.buffer:
            return
        path = self.folder / f".hfcheck-shard-{len(self.shards):05d}.safetensors"
        save_file(self.buffer, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.buffer)))
        self.buffer, self.size = {}, 0

    def close(self) -> list[str]:
        self.flush()
        if len(self.shards) == 1:
            final = self.folder / "model.safetensors"
            os.replace(self.shards[0][0], final)
            return [final.name]
        names, weight_map = [], {}
        n = len(self.shards)
        for i, (path, tensors) in enumerate(self.shards, start=1):
            final = self.folder / f"model-{i:05d}-of-{n:05d}.safetensors"
            os.replace(path, final)
            names.append(final.name)
            weight_map.update({t: final.name for t in tensors})
        (self.folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
        return names


def convert_checkpoint(src: Path, out: Path, rules: list[dict], config: dict, defaults: dict | None = None,
                       max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict[str, Any]:
    """Stream every tensor of ``src``'s safetensors through the rules into shards in ``out``."""
    from safetensors import safe_open

    files = checkpoint_files(src)
    if not files:
        raise ConvertError(f"no *.safetensors in {src}")
    conv = Converter(rules, config, defaults)
    writer = ShardWriter(out, max_shard_bytes)
    n_in = n_out = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                n_in += 1
                for new_name, tensor in conv.feed(name, functools.partial(f.get_tensor, name)):
                    writer.add(new_name, tensor)
                    n_out += 1
    conv.finish()
    shards = writer.close()
    return {"tensors_in": n_in, "tensors_out": n_out, "shards": shards, "bytes": writer.total,
            "renamed": conv.renamed, "split": conv.split, "stacked_groups": conv.stacked}


def iter_names(src: Path) -> Iterator[str]:
    from safetensors import safe_open

    for path in checkpoint_files(src):
        with safe_open(str(path), framework="pt") as f:
            yield from f.keys()
