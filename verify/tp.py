"""Tensor-parallel proof: shard the tiny instance by a plan over ``size`` gloo workers and
compare every rank's output with the unsharded model; name the first diverging module."""

from __future__ import annotations

import math
from typing import Any

import torch

from hfcheck.verify import layers as L
from hfcheck.verify.common import (
    TOLERANCE,
    Comparator,
    Proof,
    Recorder,
    Subject,
    Timer,
    input_embeddings,
    rel_error,
    run_model,
    single_thread,
)
from hfcheck.verify.dist import LaunchError, launch
from hfcheck.verify.fusion import Site, find_sites, fusion_context
from hfcheck.verify.shard import PlanError, predicted_plan, shard


def reference_recording(subject: Subject) -> tuple[dict, torch.Tensor, torch.Tensor]:
    with torch.no_grad(), single_thread(), Recorder(subject.model) as rec:
        hidden, logits = run_model(subject.model, subject.input_ids)
    return rec.values, hidden, logits


def sharded_run(subject: Subject, plan: dict[str, str], sites: list[Site], reference: dict, outputs: tuple[torch.Tensor, torch.Tensor],
                rank: int, world: int, group=None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Shard the (forked, private) model for this rank, run it, compare as it goes; only plain
    numbers and strings go back to the parent."""
    import torch.distributed as dist

    model = subject.model
    group = group if group is not None else dist.group.WORLD
    try:
        info = shard(model, plan, subject, sites, rank, world, group)
    except PlanError as exc:
        return {"abort": True, "failed": f"the plan cannot be applied: {exc}", "module": exc.module}
    comparator = Comparator(model, reference, skip)
    try:
        with torch.no_grad(), comparator:
            hidden = model(input_ids=subject.input_ids).last_hidden_state
            table = info.get("vocab_table")
            if table is not None:
                local = input_embeddings(model).weight
                logits = L.all_gather_last(hidden @ local.t(), group)[..., : table.shape[0]]
            else:
                logits = hidden @ input_embeddings(model).weight.t()
    except Exception as exc:  # noqa: BLE001 - a plan that crashes the forward is a failed claim
        return crash_result(exc, comparator)
    err = max(rel_error(hidden, outputs[0]), rel_error(logits, outputs[1]))
    return {"error": err, "first": comparator.first_divergence(), "worst": comparator.worst()}


def crash_result(exc: BaseException, comparator: Comparator) -> dict[str, Any]:
    """A forward that raised: where (innermost running module, else after which one)."""
    module = comparator.failing_module
    first = comparator.first_divergence()
    message = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if module is None and comparator.last_finished:
        message += f" (in the model's own forward, after {comparator.last_finished})"
    return {"abort": True, "failed": message, "module": first[0] if first else module, "crashed_in": module}


def summarise(claim: str, kind: str, results: list[dict | None], timer: Timer) -> Proof:
    """Merge per-rank results into one proof."""
    crashed = [r for r in results if r and "failed" in r]
    if crashed:
        r = crashed[0]
        where = f" (raised in {r['crashed_in']})" if r.get("crashed_in") and r.get("crashed_in") != r.get("module") else ""
        return Proof(claim, kind, "failed", None, timer.seconds, r["failed"] + where, r.get("module"))
    errors = [r["error"] for r in results if r and "error" in r]
    if not errors:
        return Proof(claim, kind, "error", None, timer.seconds, "no rank produced an output")
    err = max(errors)
    if err <= TOLERANCE:
        return Proof(claim, kind, "proven", err, timer.seconds)
    firsts = [r["first"] for r in results if r and r.get("first")]
    worst = [r["worst"] for r in results if r and r.get("worst")]
    module = firsts[0][0] if firsts else (max(worst, key=lambda w: w[1] if math.isfinite(w[1]) else math.inf)[0] if worst else None)
    detail = f"sharded output differs from the unsharded model (relative error {err:.3g} > {TOLERANCE:g})"
    if module:
        detail += f"; first diverging module: {module}"
    return Proof(claim, kind, "failed", err, timer.seconds, detail, module)


def prove_sharded(subject: Subject, plan: dict[str, str], sites: list[Site], claim: str, kind: str, size: int,
                  timeout_s: float, timer: Timer) -> Proof:
    """Run ``subject`` sharded by ``plan`` on ``size`` gloo ranks against its unsharded
    recording: the one launcher of the TP and EP proofs."""
    reference, hidden, logits = reference_recording(subject)

    def task(rank: int, world: int) -> dict:
        return sharded_run(subject, plan, sites, reference, (hidden, logits), rank, world)

    try:
        results = launch(size, task, timeout_s)
    except LaunchError as exc:
        return Proof(claim, kind, "error", None, timer.seconds, str(exc))
    return summarise(claim, kind, results, timer)


def prove_tp(subject: Subject, facts, size: int, plan: dict[str, str] | None = None, timeout_s: float = 120.0,
             claim: str | None = None) -> Proof:
    """TP ``size`` with ``plan`` (default: the predicted plan) against the unsharded model."""
    timer = Timer()
    sites = find_sites(subject.model, fusion_context(subject, facts, size))
    if plan is None:
        plan = predicted_plan(subject, facts, size, sites)
        source = "predicted plan"
    else:
        source = "given plan"
    claim = claim or f"TP {size}: {source} ({len(plan)} entries) reproduces the unsharded output"
    return prove_sharded(subject, plan, sites, claim, "tp", size, timeout_s, timer)
