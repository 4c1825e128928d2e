"""Weight plans: how each tensor of the native model is made from the original's tensors.

A plan is plain data (JSON in ``PORT.md`` and ``weight_plan.json``), one recipe per output
tensor, with ``{i}`` standing for the decoder layer index:

``{"out": "model.layers.{i}.self_attn.q_proj.weight", "src": "model.layers.{i}.self_attn.W_pack.weight",
  "take": {"layout": "contiguous", "sizes": [4096, 4096, 4096], "part": 0}}``

- ``take`` selects rows of a packed tensor: ``contiguous`` blocks of the given sizes, ``grouped``
  per key/value head (``[q_1..q_g, k, v]`` repeated ``kv`` times, rows of ``head_dim``: InternLM2's
  ``wqkv``, Falcon-40B's ``query_key_value``, GPT-NeoX's per-head ``[q, k, v]`` when ``group`` is
  1), or ``halves`` of a packed gate/up projection;
- ``permute_rotary`` reorders each head's rows from interleaved rotary pairs (GPT-J/GLM style)
  to the half-split layout that ``rotate_half`` expects;
- ``swap_halves`` exchanges the two row halves of a packed gate/up projection;
- ``normalize_rows`` applies a head that normalises its weight rows at inference (Baichuan 2's
  ``NormHead``) once, so a plain linear head computes the same;
- ``zeros`` makes a tensor the original does not have (a bias the native class insists on);
- ``transpose`` turns a weight stored ``[in, out]`` (GPT-2's ``Conv1D``) into ``[out, in]``,
  before any ``take``;
- ``cat`` stacks the rows of several part recipes (each with its own ``src``, ``take``...):
  GPTBigCode's one ``c_attn`` from a separate query and a packed key/value projection.

``convert_state`` applies a plan to an in-memory state dict (the proofs) and ``convert_folder``
streams a checkpoint on disk (safetensors, or PyTorch ``.bin`` read with
``weights_only=True``) tensor by tensor into shards.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from hfcheck.porter.output.weights import DEFAULT_SHARD_BYTES, ShardWriter, checkpoint_files

Recipe = dict[str, Any]


LAYER_INDEX = re.compile(r"\{i(?:\+(\d+))?\}")
"""``{i}`` in a recipe's source, or ``{i+1}`` where layer 0 is not its container's first module."""
AFTER_LAYERS = re.compile(r"\{n\+(\d+)\}")
"""``{n+1}``: a module after the layers in their container (MixFormer's head at index layers + 1)."""


class PlanError(Exception):
    pass


def _with_sources(recipe: Recipe, name: Callable[[str], str]) -> Recipe:
    """The recipe with ``name`` applied to its source (and to each ``cat`` part's)."""
    r = dict(recipe)
    if "src" in r:
        r["src"] = name(r["src"])
    if "cat" in r:
        r["cat"] = [_with_sources(part, name) for part in r["cat"]]
    return r


def _at_layer(i: int, src: str) -> str:
    """``src`` with each ``{i}`` / ``{i+k}`` index written for layer ``i``."""
    return LAYER_INDEX.sub(lambda m: str(i + int(m.group(1) or 0)), src)


def expand(plan: list[Recipe], layers: int) -> list[Recipe]:
    """The recipes with ``{i}`` replaced by every layer index (``{n+k}``: the k-th module
    after the last layer)."""
    out = []
    for recipe in plan:
        if "{i}" in recipe["out"]:
            for i in range(layers):
                r = _with_sources(recipe, functools.partial(_at_layer, i))
                r["out"] = recipe["out"].replace("{i}", str(i))
                out.append(r)
        else:
            out.append(_with_sources(recipe, lambda src: AFTER_LAYERS.sub(lambda m: str(layers + int(m.group(1))), src)))
    return out


def _take(tensor: torch.Tensor, take: dict[str, Any]) -> torch.Tensor:
    layout = take["layout"]
    if layout == "contiguous":
        sizes = [int(s) for s in take["sizes"]]
        if sum(sizes) != tensor.shape[0]:
            raise PlanError(f"{tensor.shape[0]} rows do not split into {sizes}")
        return torch.split(tensor, sizes, dim=0)[int(take["part"])]
    if layout == "halves":
        if tensor.shape[0] % 2:
            raise PlanError(f"{tensor.shape[0]} rows do not split into halves")
        return tensor.chunk(2, dim=0)[int(take["part"])]
    if layout == "grouped":
        kv, group, d = int(take["kv"]), int(take["group"]), int(take["head_dim"])
        if tensor.shape[0] != kv * (group + 2) * d:
            raise PlanError(f"{tensor.shape[0]} rows are not {kv} groups of ({group} + 2) heads of {d}")
        view = tensor.reshape(kv, group + 2, d, *tensor.shape[1:])
        part = take["part"]
        if part == "q":
            return view[:, :group].reshape(kv * group * d, *tensor.shape[1:])
        index = group if part == "k" else group + 1
        return view[:, index].reshape(kv * d, *tensor.shape[1:])
    if layout == "blocks":  # CodeGen: `blocks` groups of heads, each [q, v, k] (in `order`) for its heads
        blocks, order = int(take["blocks"]), str(take["order"])
        if tensor.shape[0] % (3 * blocks):
            raise PlanError(f"{tensor.shape[0]} rows do not split into {blocks} blocks of three parts")
        view = tensor.reshape(blocks, 3, tensor.shape[0] // (3 * blocks), *tensor.shape[1:])
        return view[:, order.index(take["part"])].reshape(tensor.shape[0] // 3, *tensor.shape[1:])
    raise PlanError(f"unknown layout {layout!r}")


def _permute_rotary(tensor: torch.Tensor, spec: dict[str, Any]) -> torch.Tensor:
    """Interleaved rotary pairs (0,1), (2,3)... -> half-split (0, r/2), (1, r/2 + 1)... per head
    (``inverse``: the other way)."""
    d, rot = int(spec["head_dim"]), int(spec["rotary_dim"])
    heads = tensor.shape[0] // d
    view = tensor.reshape(heads, d, *tensor.shape[1:])
    order = list(range(0, rot, 2)) + list(range(1, rot, 2)) + list(range(rot, d))
    if spec.get("inverse"):
        order = sorted(range(d), key=order.__getitem__)
    return view[:, order].reshape(tensor.shape)


def make(recipe: Recipe, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
    if "zeros" in recipe:
        return torch.zeros([int(s) for s in recipe["zeros"]], dtype=getattr(torch, recipe.get("dtype", "float32")))
    if "cat" in recipe:  # ``transpose`` here applies to the stacked rows
        stacked = torch.cat([make(part, get) for part in recipe["cat"]], dim=0)
        return (stacked.t() if recipe.get("transpose") else stacked).contiguous()
    tensor = get(recipe["src"])
    if recipe.get("transpose"):
        tensor = tensor.t()
    if recipe.get("take"):
        tensor = _take(tensor, recipe["take"])
    if recipe.get("swap_halves"):
        first, second = tensor.chunk(2, dim=0)
        tensor = torch.cat([second, first], dim=0)
    if recipe.get("permute_rotary"):
        tensor = _permute_rotary(tensor, recipe["permute_rotary"])
    if recipe.get("normalize_rows"):
        tensor = torch.nn.functional.normalize(tensor.float(), dim=-1).to(tensor.dtype)
    return tensor.contiguous()


def sources(plan: Iterable[Recipe]) -> set[str]:
    """Every original tensor the recipes read (``cat`` parts included)."""
    found: set[str] = set()
    for r in plan:
        if "src" in r:
            found.add(r["src"])
        found |= sources(r.get("cat", ()))
    return found


def convert_state(plan: list[Recipe], layers: int, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise PlanError(f"the original has no tensor {name}")
        return state[name]

    return {r["out"]: make(r, get).clone() for r in expand(plan, layers)}


class CheckpointReader:
    """Random access to the tensors of a checkpoint folder: safetensors (``safe_open``) or
    PyTorch pickles loaded with ``weights_only=True`` and ``mmap`` (no code is unpickled)."""

    def __init__(self, folder: Path):

        self.folder = folder
        self.where: dict[str, Path] = {}
        self._open: dict[Path, Any] = {}
        files = checkpoint_files(folder)
        self.kind = "safetensors" if files else None
        if files:
            from safetensors import safe_open

            for path in files:
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():
                        self.where[key] = path
        else:
            bins = self._bin_files(folder)
            if bins:
                self.kind = "pytorch"
                for path in bins:
                    for key in self._load_bin(path):
                        self.where[key] = path

    @staticmethod
    def _bin_files(folder: Path) -> list[Path]:
        index = folder / "pytorch_model.bin.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            return [folder / f for f in sorted(set(weight_map.values()))]
        return sorted(p for p in folder.glob("*.bin") if p.name != "training_args.bin")

    def _load_bin(self, path: Path) -> dict[str, torch.Tensor]:
        if path not in self._open:
            self._open.clear()  # one pickle mapped at a time
            try:
                self._open[path] = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # noqa: BLE001 - any unpickling refusal is a conversion error
                raise PlanError(f"{path.name}: cannot be read as a weights-only checkpoint ({type(exc).__name__}: {str(exc)[:200]})") from None
        return self._open[path]

    def keys(self) -> list[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        path = self.where.get(name)
        if path is None:
            raise PlanError(f"the checkpoint has no tensor {name}")
        if self.kind == "safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(name)
        return self._load_bin(path)[name]

    def shape(self, name: str) -> list[int]:
        if self.kind == "safetensors":
            from safetensors import safe_open

            with safe_open(str(self.where[name]), framework="pt") as f:
                return list(f.get_slice(name).get_shape())
        return list(self.get(name).shape)


def convert_folder(plan: list[Recipe], layers: int, src: Path, out: Path, dtype: str | None = None,
                   max_shard_bytes: int | None = None) -> dict[str, Any]:
    """Stream the checkpoint in ``src`` through ``plan`` into safetensors shards in ``out``."""

    reader = CheckpointReader(src)
    if reader.kind is None:
        raise PlanError(f"no checkpoint (*.safetensors or *.bin) in {src}")
    recipes = expand(plan, layers)
    used = sources(recipes)
    writer = ShardWriter(out, max_shard_bytes or DEFAULT_SHARD_BYTES)
    cache: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor:
        if name not in cache:
            cache.clear()  # a packed tensor serves its consecutive recipes; then it goes
            cache[name] = reader.get(name)
        return cache[name]

    for recipe in recipes:
        tensor = make(recipe, get)
        if dtype and tensor.is_floating_point():
            tensor = tensor.to(getattr(torch, dtype))
        writer.add(recipe["out"], tensor.clone())
    shards = writer.close()
    unused = sorted(set(reader.keys()) - used)
    return {"format": reader.kind, "tensors_in": len(reader.keys()), "tensors_out": len(recipes), "shards": shards,
            "bytes": writer.total, "unused": unused}
