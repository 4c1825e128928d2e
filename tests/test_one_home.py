"""vLLM's semantics live in one place: what scan predicts is what verify applies and proves.

Each test here failed while the behaviour was written twice (issue 14, "One home for vLLM's
semantics"): the forward rewrite (``analyzer/graph/forward_source.py`` and a copy in verify),
the ``recursive_replace`` walk (``analyzer/analysis/observe.py`` and a copy in verify), and the
verdict arithmetic (``analyzer/report/verdict.py``, verify's own penalties, the policy score).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hfcheck.analyzer.fusions.base import FusionContext
from hfcheck.analyzer.fusions.detect import class_fusions, clear_cache
from hfcheck.analyzer.graph.forward_source import RewriteRefused


def _attend(q, k, v, o_proj, head_dim: int):
    b, s, _ = q.shape
    q, k, v = (t.view(b, s, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    out = ((q @ k.transpose(2, 3)) * head_dim**-0.5).softmax(-1) @ v
    return o_proj(out.transpose(1, 2).reshape(b, s, -1))


class _QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = 4
        self.q_proj = nn.Linear(16, 16)
        self.k_proj = nn.Linear(16, 8)
        self.v_proj = nn.Linear(16, 8)
        self.o_proj = nn.Linear(16, 16)


class MangledAttention(_QKV):
    """Reads a name-mangled attribute: vLLM refuses to recompile this forward outside its class."""

    def __init__(self):
        super().__init__()
        self.__gain = 1.0

    def forward(self, hidden_states):
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return _attend(q, k, v, self.o_proj, self.head_dim) * self.__gain


class OldTemporaryAttention(_QKV):
    """Uses the name verify's own copy of the rewrite once gave its temporaries (vLLM's are
    ``_vllm_merged_<i>``): nothing for vLLM to refuse."""

    def forward(self, hidden_states):
        _hfc_merged_0 = hidden_states
        q, k, v = self.q_proj(_hfc_merged_0), self.k_proj(_hfc_merged_0), self.v_proj(_hfc_merged_0)
        return _attend(q, k, v, self.o_proj, self.head_dim)


class VllmTemporaryAttention(_QKV):
    """Uses vLLM's own temporary name: vLLM refuses the fusion, and so must scan and verify."""

    def forward(self, hidden_states):
        _vllm_merged_0 = hidden_states
        q, k, v = self.q_proj(_vllm_merged_0), self.k_proj(_vllm_merged_0), self.v_proj(_vllm_merged_0)
        return _attend(q, k, v, self.o_proj, self.head_dim)


def _qkv_site(module: nn.Module):
    from hfcheck.verify.fusion import Site

    return Site("", type(module).__name__, "qkv", ("q_proj", "k_proj", "v_proj"), "o_proj")


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.mark.parametrize("cls", [MangledAttention, VllmTemporaryAttention])
def test_verify_refuses_the_forward_rewrite_scan_refuses(cls):
    """The refusal (name mangling; a temporary that would shadow a name) is scan's, word for word."""
    from hfcheck.verify.fusion import apply_site

    module = cls().eval()
    refused = dict(class_fusions(module).refused)
    assert "qkv" in refused
    with pytest.raises(RewriteRefused) as caught:
        apply_site(copy.deepcopy(module), _qkv_site(module), None)
    assert str(caught.value) == refused["qkv"]


def test_verify_applies_the_fusion_scan_predicts_with_vllms_temporaries():
    from hfcheck.verify.common import rel_error
    from hfcheck.verify.fusion import apply_site, find_sites

    torch.manual_seed(0)
    module = OldTemporaryAttention().eval()
    sites = [s for s in find_sites(module, FusionContext(head_size=4)) if s.fusion == "qkv"]
    assert [s.projections for s in sites] == [("q_proj", "k_proj", "v_proj")]
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        reference = module(x)
        fused = copy.deepcopy(module)
        apply_site(fused, sites[0], None)
        assert hasattr(fused, "qkv_proj") and not hasattr(fused, "q_proj")
        assert rel_error(fused(x), reference) <= 1e-6


class TwoHeads(nn.Module):
    """Two sibling projections of one input: a merged column, named as vLLM names it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b_c = nn.Linear(8, 6)

    def forward(self, hidden_states):
        return torch.cat([self.a(hidden_states), self.b_c(hidden_states)], -1)


def test_merged_column_gets_vllms_name():
    from hfcheck.verify.common import rel_error
    from hfcheck.verify.fusion import apply_site, find_sites

    module = TwoHeads().eval()
    (site,) = [s for s in find_sites(module, FusionContext(head_size=1)) if s.fusion == "merged_column"]
    fused = copy.deepcopy(module)
    apply_site(fused, site, None)
    assert hasattr(fused, "merged_proj_1_a_3_b_c")
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert rel_error(fused(x), module(x)) <= 1e-6


# --- the recursive_replace walk: verify proves what scan observes ------------------------


def test_verify_keeps_the_models_routing_where_scan_predicts_it_fp16(tmp_path):
    """DeepSeek-V3 in float16 (routed_scaling_factor 2.5, a shared expert): vLLM divides the shared
    expert's output and keeps transformers routing. Scan says so; verify must prove that, not
    vLLM's own sigmoid routing (it did, while its walk did not get scan's fp16 flag)."""
    from conftest import write_model

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.sources import resolve
    from hfcheck.verify.common import build_subject
    from hfcheck.verify.fusion import find_sites, fusion_context, prove_fusions
    from hfcheck.verify.runner import observed_fusions

    analysis = analyse(resolve(str(write_model(tmp_path / "ds", "deepseek_v3", dtype="float16"))))
    assert analysis.facts.dtype == "float16" and analysis.facts.routed_scaling_factor != 1.0
    assert analysis.fusion_context.divides_shared_output
    blocks = [b for _, b in analysis.observations.moe_blocks]
    assert blocks and not any(b.internal_routing for b in blocks) and all(b.shared_expert for b in blocks)
    subject = build_subject(analysis.facts, analysis.config_object)
    ctx = fusion_context(subject, analysis.facts)
    assert ctx.divides_shared_output
    moe = [s for s in find_sites(subject.model, ctx) if s.fusion == "moe"]
    assert moe and not any(s.details["internal"] for s in moe)
    claims = [p for p in prove_fusions(subject, analysis.facts, observed_fusions(analysis)) if p.claim.startswith("fusion moe")]
    assert claims and all("model's own routing" in p.claim and p.status == "proven" for p in claims), [p.to_dict() for p in claims]


class _Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 16))

    def forward(self, hidden_states):
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        weights, ids = torch.topk(logits.softmax(-1), 2, dim=-1)
        return logits, weights / weights.sum(-1, keepdim=True), ids


class _Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(4, 16, 16) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(4, 16, 8) * 0.2)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for expert in range(self.gate_up_proj.shape[0]):
            token, slot = torch.where(top_k_index == expert)
            gate, up = torch.nn.functional.linear(hidden_states[token], self.gate_up_proj[expert]).chunk(2, -1)
            out = out.index_add(0, token, torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, self.down_proj[expert]) * top_k_weights[token, slot, None])
        return out


class RenamedRouterMoE(nn.Module):
    """vLLM routes this block itself; its router is not called ``gate``."""

    def __init__(self):
        super().__init__()
        self.router = _Router()
        self.experts = _Experts()
        self.shared_expert = nn.Sequential(nn.Linear(16, 8), nn.SiLU(), nn.Linear(8, 16))
        self.shared_expert_gate = nn.Linear(16, 1, bias=False)

    def forward(self, hidden_states):
        _, weights, ids = self.router(hidden_states)
        out = self.experts(hidden_states, ids, weights)
        return out + torch.sigmoid(self.shared_expert_gate(hidden_states)) * self.shared_expert(hidden_states)


def test_moe_router_and_shared_gate_names_come_from_the_analysis():
    """The router and the shared-expert gate verify applies are the children scan's analysis
    found (structured fields), not names parsed out of its human-readable reason."""
    import types

    from hfcheck.analyzer.fusions.moe import analyse_block
    from hfcheck.verify.common import rel_error
    from hfcheck.verify.fusion import apply_site, find_sites
    from hfcheck.verify.layers import StackedExperts

    torch.manual_seed(0)
    block = RenamedRouterMoE().eval()
    analysed = analyse_block(block)
    assert analysed.internal_routing and (analysed.gate, analysed.shared_expert, analysed.shared_gate) == ("router", "shared_expert", "shared_expert_gate")
    (site,) = [s for s in find_sites(block, FusionContext(head_size=1)) if s.fusion == "moe"]
    assert (site.details["gate"], site.details["shared_gate"]) == ("router", "shared_expert_gate")
    x = torch.randn(6, 16)
    text = types.SimpleNamespace(hidden_size=16, num_experts_per_tok=2, norm_topk_prob=True, architectures=[])
    with torch.no_grad():
        reference = block(x)
        fused = copy.deepcopy(block)
        apply_site(fused, site, text)
        assert isinstance(fused.experts, StackedExperts)
        assert rel_error(fused(x), reference) <= 1e-5


# --- the verdict: one arithmetic for scan, verify, the policy and the TUI ----------------


@pytest.fixture(scope="module")
def llama_report(tmp_path_factory):
    from conftest import write_model

    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    analysis = analyse(resolve(str(write_model(tmp_path_factory.mktemp("llama"), "llama"))))
    return analysis, build_report(analysis)


def test_a_failed_proof_costs_what_the_failing_check_of_its_impact_costs(llama_report):
    from hfcheck.analyzer.report.verdict import PENALTY, judge
    from hfcheck.verify.cli import attach_proofs
    from hfcheck.verify.common import Proof

    analysis, report = llama_report
    assert (report["verdict"], report["score"]) == ("native-speed", 100) == judge(report["checks"])
    for kind, impact in (("fusion", "speed"), ("tp", "parallel"), ("pp", "parallel"), ("ep", "parallel")):
        out = attach_proofs(copy.deepcopy(report), analysis, [Proof(f"{kind} claim", kind, "failed", 0.1, 0.0, "diverges")])
        assert (out["verdict"], out["score"]) == ("runs", 100 - PENALTY[("fail", impact)])
    # a blocked model's score is capped the same way whether a check or a proof fails
    blocker = {"code": "HFC201", "status": "fail", "impact": "blocker", "message": "m"}
    blocked = dict(copy.deepcopy(report), checks=[*report["checks"], blocker])
    out = attach_proofs(blocked, analysis, [Proof("fusion", "fusion", "failed", 0.1, 0.0)])
    speed = {"code": "HFC301", "status": "fail", "impact": "speed", "message": "m"}
    assert (out["verdict"], out["score"]) == judge([*report["checks"], blocker, speed]) == ("blocked", 20)


def test_policy_score_counts_the_failed_proofs_the_report_counts(llama_report):
    from hfcheck.analyzer.report.policy import parse_policy
    from hfcheck.verify.cli import attach_proofs
    from hfcheck.verify.common import Proof

    analysis, report = llama_report
    out = attach_proofs(copy.deepcopy(report), analysis, [Proof("TP 2", "tp", "failed", 0.1, 0.0, "diverges")])
    assert out["score"] == 90
    assert parse_policy({}).apply(out)["policy"]["score"] == 90
    assert parse_policy({"fail-under": 95}).exit_code(parse_policy({"fail-under": 95}).apply(out)) == 1


def test_every_verdict_is_named_once():
    import json
    from importlib import resources

    from hfcheck.analyzer.report.verdict import LOADS, VERDICTS
    from hfcheck.tui import rows

    schema = json.loads(resources.files("hfcheck.analyzer.report").joinpath("scan.schema.json").read_text())
    assert set(schema["properties"]["verdict"]["enum"]) == set(VERDICTS)
    assert rows.VERDICTS is VERDICTS and set(VERDICTS) > LOADS


def test_packages_vllms_environment_lacks_stay_unimportable(tmp_path):
    """transformers 5.25 requires the kernels hub; installed, it rewrites models' forwards
    (vLLM 0.33's environment has no kernels, so vLLM traces the plain code). hfcheck keeps each
    package of ABSENT_FROM_VLLM unimportable, and each is really absent from vLLM's environment
    table. Checked with a stand-in `kernels` on the path: found without hfcheck, hidden with it."""
    import json
    import subprocess
    import sys
    from importlib import resources

    import hfcheck
    from hfcheck.analyzer.vllm.release import releases

    for release in releases():
        table = json.loads(resources.files("hfcheck.analyzer").joinpath(f"data/vllm/{release}/environment.json").read_text())
        for name in hfcheck.ABSENT_FROM_VLLM:
            assert name not in table["distributions"] and name not in table["modules"], (release, name)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    probe = "import importlib.util, sys; {} print(importlib.util.find_spec('kernels') is None)"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    bare = subprocess.run([sys.executable, "-c", probe.format("")], capture_output=True, text=True, env=env, check=True)
    hidden = subprocess.run([sys.executable, "-c", probe.format("import hfcheck;")], capture_output=True, text=True, env=env, check=True)
    assert bare.stdout.strip() == "False" and hidden.stdout.strip() == "True"
