"""Pipeline-parallel proof: the decoder split into stages as vLLM splits it, one process per
stage, activations passed with ``send``/``recv``; the last stage's output against the
unsplit model (and the boundary activation against the reference layer's output).

Like vLLM's transformers backend: the plan's modules before the layer list run on the first
stage only, those after it on the last; layers are partitioned as ``get_pp_indices`` does
(an uneven remainder goes to the earlier stages); a module not on a stage is a pass-through
(``PPMissingLayer``); a later stage calls the model with ``inputs_embeds`` = the received
activation.
"""

from __future__ import annotations

import torch
from torch import nn

from hfcheck.verify.common import Comparator, Proof, Subject, Timer, input_embeddings, rel_error
from hfcheck.verify.dist import LaunchError, launch
from hfcheck.verify.layers import PassThrough
from hfcheck.verify.tp import crash_result, reference_recording, summarise


def stage_bounds(layers: int, stages: int) -> list[tuple[int, int]]:
    sizes = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def pipeline_layout(model: nn.Module) -> tuple[list[str], str, list[str]] | None:
    """(modules before the layer list, its name, modules after) from the declared pp plan, else
    from the base model's children around its single parameter-holding ModuleList."""
    plan = getattr(model, "_pp_plan", None)
    names = list(plan) if plan else [n for n, c in model.named_children() if next(c.parameters(), None) is not None]
    lists = [n for n in names if isinstance(getattr(model, n, None), nn.ModuleList)]
    if len(lists) != 1:
        return None
    i = names.index(lists[0])
    return names[:i], lists[0], names[i + 1:]


def prove_pp(subject: Subject, stages: int = 2, timeout_s: float = 120.0) -> Proof:
    timer = Timer()
    model = subject.model
    layout = pipeline_layout(model)
    if layout is None:
        return Proof(f"PP {stages}", "pp", "not_applicable", None, timer.seconds, "no single layer list to split")
    before, list_name, after = layout
    layers = getattr(model, list_name)
    if len(layers) < stages:
        return Proof(f"PP {stages}", "pp", "not_applicable", None, timer.seconds, f"the tiny instance has {len(layers)} layer(s)")
    bounds = stage_bounds(len(layers), stages)
    claim = f"PP {stages}: {list_name} split " + " | ".join(f"{b - a}" for a, b in bounds) + f" over {stages} processes reproduces the unsplit output"
    returns_tuple: dict[str, bool] = {}

    def note_output(module, args, out) -> None:
        returns_tuple.setdefault("t", isinstance(out, tuple))

    handle = layers[0].register_forward_hook(note_output)
    try:
        reference, hidden, logits = reference_recording(subject)
    finally:
        handle.remove()
    table = input_embeddings(model).weight.detach().clone()

    def task(rank: int, world: int) -> dict:
        import torch.distributed as dist

        start, end = bounds[rank]
        skip = []
        for i in range(len(layers)):
            if not start <= i < end:
                layers[i] = PassThrough(returns_tuple.get("t", False))
                skip.append(f"{list_name}.{i}")
        if rank > 0:  # the first stage's modules are missing here (their output is received)
            for name in before:
                setattr(model, name, PassThrough())
                skip.append(name)
        if rank < world - 1:
            for name in after:
                setattr(model, name, PassThrough())
                skip.append(name)
        comparator = Comparator(model, reference, tuple(skip))
        try:
            with torch.no_grad(), comparator:
                if rank == 0:
                    out = model(input_ids=subject.input_ids).last_hidden_state
                else:
                    out = torch.empty_like(hidden)
                    dist.recv(out, src=rank - 1)
                    out = model(inputs_embeds=out).last_hidden_state
                if rank < world - 1:
                    dist.send(out.contiguous(), dst=rank + 1)
        except Exception as exc:  # noqa: BLE001 - a split that crashes the forward is a failed claim
            return crash_result(exc, comparator)
        if rank < world - 1:
            boundary = reference.get((f"{list_name}.{end - 1}", 0))
            err = rel_error(out, boundary) if boundary is not None else 0.0
        else:
            err = max(rel_error(out, hidden), rel_error(out @ table.t(), logits))
        return {"error": err, "first": comparator.first_divergence(), "worst": comparator.worst()}

    try:
        results = launch(stages, task, timeout_s)
    except LaunchError as exc:
        return Proof(claim, "pp", "error", None, timer.seconds, str(exc))
    return summarise(claim, "pp", results, timer)
