"""`hfcheck verify`: scan's fusion and parallel claims proven numerically on tiny CPU instances."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import from_a_terminal, write_model
from leftovers import children, no_leftover_processes  # noqa: F401 - autouse: a leaked process fails its own test only

MODELS = ["qwen3", "qwen3_moe", "llama", "deepseek_v3", "gemma3_text", "phi3", "olmo2"]
MOE = {"qwen3_moe", "deepseek_v3"}

_ANALYSES: dict = {}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """analysed("olmo2", **overrides) -> the Analysis of that architecture's default config."""
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.sources import resolve

    def get(model_type: str, **overrides):
        key = (model_type, json.dumps(overrides, sort_keys=True))
        if key not in _ANALYSES:
            folder = write_model(tmp_path_factory.mktemp(model_type), model_type, **overrides)
            _ANALYSES[key] = analyse(resolve(str(folder)))
        return _ANALYSES[key]

    return get


def _subject(analysis):
    from hfcheck.verify.common import build_subject

    return build_subject(analysis.facts, analysis.config_object)


def _children_of_me() -> list[int]:
    """Running child processes of this test process (multiprocessing's resource tracker, which
    lives as long as its process by design, left out)."""
    return [pid for pid, _ in children()]


@pytest.mark.parametrize("model_type", MODELS)
def test_every_claim_is_proven(model_type, analysed):
    from hfcheck.verify.runner import verify_analysis

    proofs = verify_analysis(analysed(model_type))
    by_kind: dict[str, list] = {}
    for p in proofs:
        by_kind.setdefault(p.kind, []).append(p)
        assert p.status in ("proven", "not_applicable"), p.to_dict()
        if p.status == "proven":
            assert p.max_rel_error is not None and p.max_rel_error <= 1e-5, p.to_dict()
    assert by_kind["fusion"] and all(p.status == "proven" for p in by_kind["fusion"])
    assert [p.claim[:4] for p in by_kind["tp"] if p.status == "proven"] == ["TP 2", "TP 4"]
    assert by_kind["pp"][0].status == "proven"
    assert by_kind["ep"][0].status == ("proven" if model_type in MOE else "not_applicable")
    assert not _children_of_me()


def test_fusions_proven_are_the_ones_scan_predicts(analysed):
    from hfcheck.verify.fusion import prove_fusions
    from hfcheck.verify.runner import observed_fusions

    analysis = analysed("deepseek_v3")
    claims = [p.claim for p in prove_fusions(_subject(analysis), analysis.facts, observed_fusions(analysis))]
    assert any(c.startswith("fusion mla: DeepseekV3Attention (q_a_proj + kv_a_proj_with_mqa -> fused_qkv_a_proj") for c in claims)
    assert any(c.startswith("fusion moe: DeepseekV3MoE") and "vLLM sigmoid routing" in c for c in claims)
    assert any(c.startswith("fusion glu: DeepseekV3MLP") for c in claims)
    assert not any(c.startswith("the tiny instance fuses as scan predicts") for c in claims)


def test_naive_column_split_of_full_width_qk_norms_fails_and_names_the_norm(analysed):
    """OLMo-2's q/k norms span all heads: splitting their weight with the columns (no
    all-gather) normalises each shard by its own RMS, which is wrong."""
    from hfcheck.verify.shard import predicted_plan
    from hfcheck.verify.tp import prove_tp

    analysis = analysed("olmo2")
    subject = _subject(analysis)
    predicted = predicted_plan(subject, analysis.facts, 2)
    assert predicted["layers.*.self_attn.q_norm"] == "tp_aware"
    naive = {
        "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise", "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.q_norm": "colwise", "layers.*.self_attn.k_norm": "colwise", "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
    }
    proof = prove_tp(subject, analysis.facts, 2, plan=naive)
    assert proof.status == "failed"
    assert proof.module == "layers.0.self_attn.q_norm"
    assert "layers.0.self_attn.q_norm" in proof.detail and proof.max_rel_error > 1e-3
    # the same plan with vLLM's TP-aware norms is right
    fixed = dict(naive, **{"layers.*.self_attn.q_norm": "tp_aware", "layers.*.self_attn.k_norm": "tp_aware"})
    assert prove_tp(subject, analysis.facts, 2, plan=fixed).status == "proven"
    # a replicated full-width norm on a sharded input does not even run: named too
    crashed = prove_tp(subject, analysis.facts, 2, plan=dict(naive, **{"layers.*.self_attn.q_norm": "replicate"}))
    assert crashed.status == "failed" and crashed.module == "layers.0.self_attn.q_norm"
    assert not _children_of_me()


def test_kv_heads_replicate_when_tp_exceeds_them(analysed):
    from hfcheck.verify.shard import predicted_plan
    from hfcheck.verify.tp import prove_tp

    analysis = analysed("qwen3", num_attention_heads=16, num_key_value_heads=2)
    subject = _subject(analysis)
    assert subject.num_kv_heads == 2
    assert prove_tp(subject, analysis.facts, 4).status == "proven"
    naive = dict(predicted_plan(subject, analysis.facts, 4), **{"layers.*.self_attn.k_proj": "colwise", "layers.*.self_attn.v_proj": "colwise"})
    proof = prove_tp(subject, analysis.facts, 4, plan=naive)
    assert proof.status == "failed" and proof.module.startswith("layers.0.self_attn")


def test_a_wrong_fusion_is_caught(analysed):
    """Gemma's norms are zero-centred: applying a plain RMSNorm there must fail the proof."""
    from hfcheck.verify.common import run_model
    from hfcheck.verify.fusion import _prove, find_sites, fusion_context

    analysis = analysed("gemma3_text")
    subject = _subject(analysis)
    sites = [s for s in find_sites(subject.model, fusion_context(subject, analysis.facts)) if s.fusion == "rms_norm"]
    assert sites and all(s.details["zero_centered"] for s in sites)
    for s in sites:
        s.details = dict(s.details, zero_centered=False)
    proof = _prove(subject, run_model(subject.model, subject.input_ids), sites, "plain RMSNorm on Gemma")
    assert proof.status == "failed" and proof.max_rel_error > 1e-3


def test_workers_are_cleaned_up_when_one_fails():
    from hfcheck.verify.dist import LaunchError, launch

    def task(rank: int, world: int):
        import torch.distributed as dist

        if rank == 1:
            raise RuntimeError("boom")
        dist.barrier()  # rank 0 would wait for ever

    started = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1: RuntimeError: boom"):
        launch(2, task, timeout_s=60)
    assert time.monotonic() - started < 20
    assert not _children_of_me()


def test_ctrl_c_ends_every_worker(tmp_path):
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, time
        from hfcheck.verify.dist import launch

        def task(rank, world):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(60)

        launch(2, task, timeout_s=120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stderr=subprocess.PIPE, preexec_fn=from_a_terminal)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
            time.sleep(0.1)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])


def test_attach_proofs_downgrades_verdict_and_score(analysed):
    from hfcheck.analyzer.report import build_report
    from hfcheck.verify.cli import attach_proofs
    from hfcheck.verify.common import Proof

    analysis = analysed("olmo2")
    report = build_report(analysis)
    assert report["verdict"] == "native-speed" and report["score"] == 100
    failed = [Proof("TP 2", "tp", "failed", 0.06, 0.1, "diverges", "layers.0.self_attn.q_norm"), Proof("glu", "fusion", "proven", 0.0, 0.1)]
    out = attach_proofs(dict(report), analysis, failed)
    assert out["verdict"] == "runs" and out["score"] == 90
    assert out["proofs"][0]["module"] == "layers.0.self_attn.q_norm"
    proven = attach_proofs(dict(report), analysis, tp_sizes=(2,))
    assert proven["verdict"] == "native-speed" and proven["score"] == 100
    assert {"claim", "status", "max_rel_error", "seconds"} <= set(proven["proofs"][0])


def test_cli_verify_json(tmp_path, capsys):
    from hfcheck.verify import cli

    parser = argparse.ArgumentParser(prog="hfcheck")
    cli.add_parser(parser.add_subparsers(dest="command"))
    folder = write_model(tmp_path / "llama", "llama")
    args = parser.parse_args(["verify", str(folder), "--format", "json", "--tp-sizes", "2"])
    assert cli.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    statuses = {p["claim"].split(":")[0]: p["status"] for p in report["proofs"]}
    assert statuses["TP 2"] == "proven" and statuses["PP 2"] == "proven" and statuses["EP 2"] == "not_applicable"
    assert cli.run(parser.parse_args(["verify", str(tmp_path / "missing")])) == 2
    assert cli.run(parser.parse_args(["verify", str(folder), "--no-parallel"])) == 0
    assert "Proofs" in capsys.readouterr().out


class PackedAttention(__import__("torch").nn.Module):
    """A packed q/k/v projection split three ways (GQA: 8 query heads, 2 KV heads of 4)."""

    def __init__(self):
        import torch

        super().__init__()
        self.head_dim = 4
        self.qkv_proj = torch.nn.Linear(16, 32 + 8 + 8)
        self.o_proj = torch.nn.Linear(32, 16)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        q, k, v = self.qkv_proj(hidden_states).split((32, 8, 8), dim=-1)
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = ((q @ k.transpose(2, 3)) * 0.5).softmax(-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("size", [2, 4])
def test_packed_qkv_fuses_and_shards_by_heads(size):
    """The packed projection is split per rank as QKVParallelLinear (KV heads replicated at TP 4)
    and its `.split` rewritten to per-rank sizes; a plain column split of it is wrong."""
    import copy
    import types

    import torch

    from hfcheck.analyzer.fusions.base import FusionContext
    from hfcheck.verify.common import rel_error
    from hfcheck.verify.dist import launch
    from hfcheck.verify.fusion import apply_site, find_sites
    from hfcheck.verify.shard import shard

    torch.manual_seed(0)
    module = PackedAttention().eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ref = module(x)
    sites = [s for s in find_sites(module, FusionContext(head_size=4)) if s.fusion == "packed_qkv"]
    assert [s.details for s in sites] == [{"q_size": 32, "kv_size": 8}] and sites[0].row_parallel == "o_proj"
    fused = copy.deepcopy(module)
    apply_site(fused, sites[0], None)
    with torch.no_grad():
        assert rel_error(fused(x), ref) <= 1e-5
    subject = types.SimpleNamespace(head_dim=4)

    def task(plan):
        def run(rank, world):
            shard(module, plan, subject, sites, rank, world, __import__("torch.distributed").distributed.group.WORLD)
            with torch.no_grad():
                return rel_error(module(x), ref)

        return run

    assert max(launch(size, task({"qkv_proj": "packed_qkv(32,8)", "o_proj": "rowwise"}))) <= 1e-5
    from hfcheck.verify.dist import LaunchError

    with pytest.raises(LaunchError, match="split_with_sizes"):  # the packed split no longer fits
        launch(size, task({"qkv_proj": "colwise", "o_proj": "rowwise"}))
