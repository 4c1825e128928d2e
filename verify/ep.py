"""Expert-parallel proof: every MoE block's experts spread over 2 ranks (``moe_ep``), as
``--enable-expert-parallel`` does beside TP 2 (attention and dense layers sharded by the
predicted TP 2 plan; replicated when scan predicts TP 2 does not load); partial expert
outputs are all-reduced. Compared with the unsharded model."""

from __future__ import annotations

from collections.abc import Sized

from hfcheck.verify.common import Proof, Subject, Timer, generic
from hfcheck.verify.fusion import find_sites, fusion_context
from hfcheck.verify.shard import predicted_plan
from hfcheck.verify.tp import prove_sharded


def ep_plan(subject: Subject, facts, size: int, with_tp: bool, sites) -> dict[str, str]:
    if with_tp:
        plan = predicted_plan(subject, facts, size, sites)
    else:
        plan = {}
    experts = [k for k, v in plan.items() if v == "moe_tp"] if with_tp else []
    if not experts:

        experts = sorted({generic(f"{s.path}.experts" if s.path else "experts") for s in sites if s.fusion == "moe"})
    for key in experts:
        plan[key] = "moe_ep"
    return plan


def prove_ep(subject: Subject, facts, size: int = 2, with_tp: bool = True, timeout_s: float = 120.0) -> Proof:
    timer = Timer()
    sites = find_sites(subject.model, fusion_context(subject, facts, size if with_tp else 1))
    blocks = [s for s in sites if s.fusion == "moe"]
    if not blocks:
        return Proof(f"EP {size}", "ep", "not_applicable", None, timer.seconds, "no MoE block whose experts vLLM replaces")
    plan = ep_plan(subject, facts, size, with_tp, sites)
    experts = subject.model.get_submodule(blocks[0].path).experts
    count = getattr(experts, "num_experts", None) or (len(experts) if isinstance(experts, Sized) else None)
    claim = f"EP {size}: {count or '?'} experts per MoE block over {size} ranks" + (" (with TP 2 elsewhere)" if with_tp else "") + " reproduces the unsharded output"
    return prove_sharded(subject, plan, sites, claim, "ep", size, timeout_s, timer)
