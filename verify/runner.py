"""Every proof for one analysed model, in order: fusions, TP sizes, PP, EP.

A claim scan does not make (a TP size it predicts is refused, PP without a single layer
list, EP on a dense model) is ``not_applicable``; a proof hfcheck could not run is
``error``; the rest are ``proven`` or ``failed`` (relative error <= 1e-5 in float32).
"""

from __future__ import annotations

import os
from typing import Any

from hfcheck.analyzer.instance import InstanceError
from hfcheck.analyzer.report import run_rules
from hfcheck.analyzer.report.verdict import verdict_of
from hfcheck.analyzer.rules.parallel import tp_refusals
from hfcheck.verify.common import Proof, Timer, build_subject, generic, single_thread
from hfcheck.verify.ep import prove_ep
from hfcheck.verify.fusion import prove_fusions
from hfcheck.verify.pp import prove_pp
from hfcheck.verify.tp import prove_tp

DEFAULT_TP_SIZES = (2, 4)


def observed_fusions(analysis) -> set[tuple[str, str]] | None:
    obs = analysis.observations
    if obs is None:
        return None
    return {(generic(m.path), f) for m in obs.modules for f in m.fusions}


def verify_analysis(analysis, *, tp_sizes: tuple[int, ...] = DEFAULT_TP_SIZES, parallel: bool = True, seed: int = 0,
                    timeout_s: float = 120.0, blocked: bool | None = None) -> list[Proof]:
    """Prove scan's claims for ``analysis`` (from ``hfcheck.analyzer.analysis.analyse``).

    ``blocked``: scan's verdict is ``blocked`` (vLLM refuses to load the model, so no
    parallel claim is made); worked out from the rules when not given."""

    if blocked is None:

        blocked = verdict_of(run_rules(analysis)) == "blocked"
    with single_thread():
        return _verify(analysis, tp_sizes, parallel, seed, timeout_s, blocked)


def _verify(analysis, tp_sizes: tuple[int, ...], parallel: bool, seed: int, timeout_s: float, blocked: bool) -> list[Proof]:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    timer = Timer()
    facts, cfg = analysis.facts, analysis.config_object
    if cfg is None:
        why = analysis.instance_error or "no transformers config class (remote code is not executed)"
        return [Proof("a runnable tiny instance", "fusion", "error", None, timer.seconds, why)]
    try:
        subject = build_subject(facts, cfg, seed=seed)
    except (InstanceError, Exception) as exc:  # noqa: BLE001 - recorded, never raised
        return [Proof("a runnable tiny instance", "fusion", "error", None, timer.seconds, f"{type(exc).__name__}: {exc}")]
    proofs = prove_fusions(subject, facts, observed_fusions(analysis))
    if any(p.claim == "the tiny instance runs" for p in proofs):
        return proofs  # nothing else can be shown on an instance that does not run
    if not parallel:
        return proofs
    if blocked:
        why = "scan predicts vLLM refuses to load the model"
        proofs += [Proof(f"TP {s}", "tp", "not_applicable", None, 0.0, why) for s in tp_sizes]
        return proofs + [Proof("PP 2", "pp", "not_applicable", None, 0.0, why), Proof("EP 2", "ep", "not_applicable", None, 0.0, why)]
    obs = analysis.observations
    for size in tp_sizes:
        refused = tp_refusals(analysis, size) if analysis.instance is not None else []
        if refused:
            proofs.append(Proof(f"TP {size}", "tp", "not_applicable", None, 0.0, "scan predicts it does not load: " + "; ".join(refused)))
        elif subject.num_heads % size:
            proofs.append(Proof(f"TP {size}", "tp", "not_applicable", None, 0.0,
                                f"the tiny instance ({subject.shrink} widths, {subject.num_heads} heads) cannot be split {size} ways"))
        else:
            proofs.append(_guard(lambda size=size: prove_tp(subject, facts, size, timeout_s=timeout_s), f"TP {size}", "tp"))
    pp_supported = bool(obs and (obs.pp_plan or len(obs.decoder_module_lists) == 1))
    if pp_supported:
        proofs.append(_guard(lambda: prove_pp(subject, 2, timeout_s=timeout_s), "PP 2", "pp"))
    else:
        proofs.append(Proof("PP 2", "pp", "not_applicable", None, 0.0, "scan predicts pipeline parallel is refused"))
    ep_supported = bool(obs and facts.is_moe and obs.moe_blocks and all(b.experts_replaceable for _, b in obs.moe_blocks))
    if ep_supported:
        with_tp = not (tp_refusals(analysis, 2) if analysis.instance is not None else []) and subject.num_heads % 2 == 0
        proofs.append(_guard(lambda: prove_ep(subject, facts, 2, with_tp, timeout_s=timeout_s), "EP 2", "ep"))
    else:
        proofs.append(Proof("EP 2", "ep", "not_applicable", None, 0.0, "not an MoE model whose experts vLLM replaces"))
    return proofs


def _guard(run, claim: str, kind: str) -> Proof:
    timer = Timer()
    try:
        return run()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - a verifier bug is a recorded error, never a crash
        return Proof(claim, kind, "error", None, timer.seconds, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")


def summary(proofs: list[Proof] | list[dict[str, Any]]) -> dict[str, int]:
    counts = {"proven": 0, "failed": 0, "not_applicable": 0, "error": 0}
    for p in proofs:
        status = p["status"] if isinstance(p, dict) else p.status
        counts[status] = counts.get(status, 0) + 1
    return counts
