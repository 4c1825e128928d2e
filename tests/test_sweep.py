"""``hfcheck sweep``: real worker processes, real scans, a fresh offline HF cache and result cache.

The full sweep of every causal-LM type is not run here (that is the atlas and the benchmark);
these sweep a handful of targets, including ones that fail, hang and crash on purpose
(``HFCHECK_TEST_HANG`` / ``HFCHECK_TEST_CRASH`` make the worker sleep or abort on a key).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import from_a_terminal
from jsonschema import validate
from leftovers import children, no_leftover_processes  # noqa: F401 - autouse: a leaked process fails its own test only

from hfcheck.analyzer.report import schema
from hfcheck.analyzer.sources.model_types import (
    Target,
    TargetError,
    atlas_types,
    causal_lm_mapping,
    causal_lm_types,
    parse_refs,
    read_ref_file,
)
from hfcheck.sweep.atlas import render_atlas
from hfcheck.sweep.cache import ResultCache
from hfcheck.sweep.run import SweepResult, instance_ok, sweep

BUNDLED_QWEN = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "bundled" / "Qwen__Qwen3-0.6B"


def _cli_has_sweep() -> bool:
    from hfcheck.cli import build_parser

    try:
        build_parser().parse_args(["sweep", "--help"])
    except SystemExit as exc:
        return exc.code == 0
    return False


def env_for(tmp_path: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "HFCHECK_CACHE_DIR": str(tmp_path / "cache"),
        **extra,
    }


IMPORTS_PROBE = """
import runpy, sys
module = sys.argv.pop(1)
try:
    runpy.run_module(module, run_name="__main__")
except SystemExit as exc:
    code = exc.code
sys.stderr.write(f"heavy imports: {sorted(m for m in ('torch', 'transformers') if m in sys.modules)}\\n")
raise SystemExit(code)
"""
"""``python -c IMPORTS_PROBE MODULE ARGS...``: run ``python -m MODULE ARGS...``, then say on stderr
which of torch and transformers it imported."""


def sweep_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "hfcheck.sweep", *args]


def run_sweep(*args: str, tmp_path: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_cmd(*args), capture_output=True, text=True, env=env_for(tmp_path, **env), timeout=timeout, cwd=tmp_path)


def cached_results(tmp_path: Path) -> list[Path]:
    """The result files of the sweep's cache (not its type index, not a write in progress)."""
    return [p for p in (tmp_path / "cache" / "sweep").glob("*/*.json") if not p.name.startswith(".tmp-")]


def session_processes(sid: int) -> list[str]:
    """Running (not zombie) processes of session ``sid``: state and command line."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) != sid:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if state != "Z":
                out.append(f"{entry.name} {cmd[:120]}")
    return out


def ends_alone(sid: int, seconds: float = 15) -> list[str]:
    """What is left of session ``sid`` after waiting up to ``seconds`` for it to end by itself."""
    deadline = time.monotonic() + seconds
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def model_folder(path: Path, config_text: str | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if config_text is None:
        config_text = (BUNDLED_QWEN / "config.json").read_text()
    (path / "config.json").write_text(config_text)
    return path


# ----------------------------------------------------------------------------- targets


def test_every_causal_lm_type_is_a_target():
    types = causal_lm_types()
    assert [t.key for t in types] == sorted(causal_lm_mapping())
    assert len(types) > 150 and all(t.is_type for t in types)
    assert {"llama", "qwen3", "gpt2"} <= {t.key for t in types}


def test_parse_refs_and_ref_file(tmp_path):
    listing = tmp_path / "models.txt"
    listing.write_text("# models\nQwen/Qwen3-4B\n\n./local  # a folder\ntype:llama\nQwen/Qwen3-4B\n")
    targets = parse_refs(read_ref_file(str(listing)))
    assert targets == [Target("Qwen/Qwen3-4B", ref="Qwen/Qwen3-4B"), Target("./local", ref="./local"), Target("llama", model_type="llama")]
    with pytest.raises(TargetError):
        parse_refs(["type:"])
    with pytest.raises(TargetError, match="cannot be read"):
        read_ref_file(str(tmp_path / "missing.txt"))


# ------------------------------------------------------------------------ end to end


def test_sweep_types_bundled_ref_and_broken_folders(tmp_path):
    garbage = model_folder(tmp_path / "garbage", "this is {not json")
    nonsense = model_folder(tmp_path / "nonsense", json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": "many"}))
    refs = ["type:llama", "type:qwen3", "type:gpt2", "Qwen/Qwen3-0.6B", str(garbage), str(nonsense)]
    run = run_sweep(*refs, "--format", "json", "--jobs", "2", "--atlas", str(tmp_path / "atlas.md"), tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert list(out) == ["llama", "qwen3", "gpt2", "Qwen/Qwen3-0.6B", str(garbage), str(nonsense)]
    for key in ("llama", "qwen3", "gpt2", "Qwen/Qwen3-0.6B"):
        validate(out[key], schema())
        assert instance_ok({"report": out[key]}), key
    assert out["llama"]["verdict"] == out["qwen3"]["verdict"] == "native-speed"
    assert out["Qwen/Qwen3-0.6B"]["model"]["source"] == "bundled"
    assert out["llama"]["model"]["source_note"].startswith("default LlamaForCausalLM config of transformers")
    assert out[str(garbage)] == {"error": f"analysis failed: {garbage / 'config.json'}: not valid JSON (Expecting value at line 1, column 1)"}
    assert out[str(nonsense)]["error"].startswith('analysis failed: FactsError: config.json: num_hidden_layers is "many" (a string), expected an integer')
    assert "6 of 6 targets" in run.stderr and "2 failed" in run.stderr

    atlas = (tmp_path / "atlas.md").read_text()
    summary, failures, rows = atlas.index("## Summary"), atlas.index("## Failures"), atlas.index("## Every target")
    assert summary < failures < rows
    assert "| native-speed | 3 |" in atlas[summary:failures] or "| native-speed | 4 |" in atlas[summary:failures]
    assert "| analysis failed | 2 |" in atlas[summary:failures] and "| **total** | **6** |" in atlas[summary:failures]
    assert f"| {garbage} | analysis | analysis failed: " in atlas[failures:rows]
    assert "| llama | LlamaForCausalLM | native-speed | 100 | glu, qkv, rms_norm |" in atlas[rows:]


def test_hanging_and_crashing_workers_do_not_stop_the_sweep(tmp_path):
    # two configs: identical ones would be analysed once (the crash would share the hang's fate)
    qwen = json.loads((BUNDLED_QWEN / "config.json").read_text())
    hang, crash = model_folder(tmp_path / "hangs"), model_folder(tmp_path / "crashes", json.dumps({**qwen, "hidden_act": "gelu"}))
    started = time.monotonic()
    run = run_sweep(
        str(hang), "type:llama", str(crash), "type:qwen3", "--format", "json", "--jobs", "2", "--timeout", "4",
        tmp_path=tmp_path, timeout=420, HFCHECK_TEST_HANG=str(hang), HFCHECK_TEST_CRASH=str(crash),
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out[str(hang)] == {"error": "analysis failed: timed out after 4 s (worker killed)", "config_hash": out[str(hang)]["config_hash"]}
    assert out[str(crash)]["error"].startswith("analysis failed: worker crashed (SIGABRT): Aborted")
    assert out["llama"]["verdict"] == out["qwen3"]["verdict"] == "native-speed"
    # a hang costs its time limit, not the sweep: 4 worker start-ups (2, then one after the kill
    # and one after the crash) and 2 analyses; generous, so that a busy machine does not fail it
    assert time.monotonic() - started < 300
    # neither a timeout nor a crash is cached (they may be the machine's fault): llama and qwen3 only
    assert len(cached_results(tmp_path)) == 2


def test_cache_makes_a_rerun_instant_and_no_cache_bypasses_it(tmp_path):
    refs = ["type:llama", "type:mistral", "Qwen/Qwen3-0.6B"]
    first = run_sweep(*refs, "--format", "json", "--jobs", "1", tmp_path=tmp_path)
    assert first.returncode == 0 and "3 analysed, 0 from cache" in first.stderr, first.stderr
    # the cached re-run, as the command runs it, in a fresh process: torch is not imported (the Hub
    # reference's source reader imports transformers' light dynamic_module_utils, not torch)
    second = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, "hfcheck.sweep", *refs, "--format", "json", "--jobs", "1"],
                            capture_output=True, text=True, env=env_for(tmp_path), timeout=240, cwd=tmp_path)
    assert "0 analysed, 3 from cache" in second.stderr, second.stderr
    assert "heavy imports: [" in second.stderr and "'torch'" not in second.stderr, second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)
    # in-process: a fully cached sweep starts no worker at all
    cached = sweep(parse_refs(refs[:2]), cache=ResultCache(tmp_path / "cache"))
    assert (cached.from_cache, cached.analysed, cached.workers_started) == (2, 0, 0)
    bypass = run_sweep(*refs, "--format", "json", "--no-cache", "--jobs", "1", tmp_path=tmp_path)
    assert "3 analysed, 0 from cache" in bypass.stderr, bypass.stderr


def test_model_types_come_from_the_type_index_without_transformers(tmp_path):
    listing = "import sys; from pathlib import Path; from hfcheck.sweep.cache import ResultCache; from hfcheck.sweep.run import atlas_targets\n" \
        "t = atlas_targets(ResultCache(Path(sys.argv[1])))\n" \
        "print(len(t), t[0].key, sorted(m for m in ('torch', 'transformers') if m in sys.modules))"

    def types() -> str:
        run = subprocess.run([sys.executable, "-c", listing, str(tmp_path / "cache")], capture_output=True, text=True, env=env_for(tmp_path), timeout=240)
        assert run.returncode == 0, run.stderr
        return run.stdout.split()

    every = atlas_types()
    assert {t.section for t in every} == {"causal-lm", "image-text-to-text", "pooling"}
    assert types()[:2] == [str(len(every)), every[0].key]  # the first run asks transformers and keeps the list
    assert types() == [str(len(every)), every[0].key, "[]"]
    # a type whose default config cannot be a target is known as such too: the re-run does not ask again
    refs = ["type:llama", "type:not_a_model_type"]
    first = run_sweep(*refs, "--format", "json", "--jobs", "1", tmp_path=tmp_path)
    second = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, "hfcheck.sweep", *refs, "--format", "json"],
                            capture_output=True, text=True, env=env_for(tmp_path), timeout=240, cwd=tmp_path)
    assert "heavy imports: []" in second.stderr and "0 analysed, 1 from cache, 1 failed" in second.stderr, second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert json.loads(first.stdout)["not_a_model_type"]["error"].startswith("analysis failed: 'not_a_model_type' is neither a causal-LM nor an image-text-to-text model type")


def test_ctrl_c_keeps_finished_results_and_writes_the_atlas(tmp_path):
    hang = model_folder(tmp_path / "hangs")
    cmd = sweep_cmd("type:llama", "type:qwen3", str(hang), "--format", "json", "--jobs", "2", "--timeout", "300", "--atlas", str(tmp_path / "atlas.md"))
    # its own session, so that whatever happens the whole tree can be killed below
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(tmp_path, HFCHECK_TEST_HANG=str(hang)), cwd=tmp_path,
                            start_new_session=True, preexec_fn=from_a_terminal)
    try:
        deadline = time.monotonic() + 300
        while len(cached_results(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(0.5)  # the hanging target has been handed to a worker by now
        proc.send_signal(signal.SIGINT)  # to the sweep alone: ending its workers is its job
        stdout, stderr = proc.communicate(timeout=60)
        left = ends_alone(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, stderr
    assert not left, left
    out = json.loads(stdout)
    assert list(out) == ["llama", "qwen3"] and all("verdict" in r for r in out.values())
    assert "interrupted" in stderr
    assert "Partial: the sweep was interrupted after 2 of 3 targets" in (tmp_path / "atlas.md").read_text()


def test_ctrl_c_during_worker_start_up_ends_the_sweep(tmp_path):
    """Ctrl-C of a terminal (SIGINT to the whole process group) while the workers import torch."""
    cmd = sweep_cmd("type:llama", "type:qwen3", "--format", "json", "--jobs", "2", "--no-cache")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(tmp_path), cwd=tmp_path, start_new_session=True,
                            preexec_fn=from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while len([c for c in children(proc.pid) if "spawn_main" in c[1]]) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - started
        left = ends_alone(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, stderr
    assert took < 30 and not left, (took, left)
    assert "Traceback" not in stderr, stderr  # the workers ignore it: Ctrl-C is the parent's


def test_ctrl_c_between_start_and_record_of_a_worker_loses_none(monkeypatch):
    """The window that once lost a worker: started, not yet recorded by the pool."""
    import multiprocessing
    from multiprocessing.context import SpawnProcess

    from hfcheck.sweep.worker import WorkerPool

    real_start = SpawnProcess.start

    def start_then_interrupt(self):
        real_start(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(SpawnProcess, "start", start_then_interrupt)
    pool = WorkerPool(1, 30)
    with pytest.raises(KeyboardInterrupt):
        pool.run([("llama", None, False)], lambda *_: None)
    monkeypatch.undo()
    pool.close(kill=True)
    assert pool.started_workers == 0 and not multiprocessing.active_children()


def test_usage_errors_exit_2(tmp_path):
    run = run_sweep("--from", str(tmp_path / "nope.txt"), tmp_path=tmp_path, timeout=60)
    assert run.returncode == 2 and "cannot be read" in run.stderr
    run = run_sweep("type:llama", "--jobs", "0", tmp_path=tmp_path, timeout=60)
    assert run.returncode == 2 and "--jobs" in run.stderr


# ------------------------------------------------------------------------------- atlas


def test_atlas_lists_instance_failures_with_their_reason(scan_type):
    ok = {"report": scan_type("qwen3")}
    no_instance = {"report": json.loads(json.dumps(ok["report"]))}
    no_instance["report"]["analysis"].update(instance=None, instance_error="KeyError: 'x'", graph=False)
    no_instance["transformers_builds"] = {"ok": False, "error": "KeyError: 'x'"}
    result = SweepResult(
        [Target("qwen3", model_type="qwen3"), Target("odd", model_type="odd"), Target("gone", model_type="gone")],
        {"qwen3": ok, "odd": no_instance, "gone": {"error": "timed out after 1 s (worker killed)"}},
    )
    text = render_atlas(result)
    assert text.index("## Summary") < text.index("## Failures") < text.index("## Every target")
    assert "Tiny instance built and graph walked: **1 of 3** (33.3%)" in text
    assert "| gone | analysis | analysis failed: timed out after 1 s (worker killed) | — |" in text
    assert "| odd | tiny instance / graph | no tiny instance: KeyError: 'x' | no: KeyError: 'x' |" in text
    assert "1 of the 2 failures are transformers' own" in text and "Over the other 2 targets: **1 of 2** (50.0%)" in text
    assert render_atlas(result) == text  # deterministic: nothing time-dependent


def test_hfcheck_sweep_subcommand(tmp_path):
    run = subprocess.run([sys.executable, "-m", "hfcheck", "sweep", "type:llama", "--format", "json"], capture_output=True, text=True, env=env_for(tmp_path), timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["llama"]["verdict"] == "native-speed"


def test_atlas_column_of_what_vllm_ran(tmp_path, scan_type):
    """The atlas written next to a runtime cross-check's rows (the newest vLLM's) gains the
    headline agreement and a *vLLM ran* column; rows of another version are ignored."""
    from hfcheck.sweep.atlas import write_atlas

    rows = [
        {"model_type": "qwen3", "status": "loaded", "verdict": "native-speed", "differences": [], "tokens_match": True},
        {"model_type": "gpt2", "status": "refused", "verdict": "blocked", "error": "ValueError: Following weights were not initialized"},
        {"model_type": "odd", "status": "loaded", "verdict": "blocked", "differences": [], "tokens_match": True},
    ]
    (tmp_path / "runtime-vllm-0.32.0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "runtime-vllm-0.9.1.jsonl").write_text(json.dumps({"model_type": "qwen3", "status": "refused", "verdict": "runs"}) + "\n")
    result = SweepResult(
        [Target("qwen3", model_type="qwen3"), Target("gpt2", model_type="gpt2"), Target("odd", model_type="odd")],
        {"qwen3": {"report": scan_type("qwen3")}, "gpt2": {"report": scan_type("gpt2")}, "odd": {"report": scan_type("llama")}},
    )
    text = write_atlas(result, tmp_path / "atlas.md").read_text()
    assert "took 3 of these types to real vLLM 0.32.0" in text and "agrees on **2 of 3** (66.7%)" in text
    assert "| vLLM ran (0.32.0) |" in text
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert lines["| qwen3"].endswith("| ✓ loaded, tokens = transformers |")
    assert lines["| gpt2"].endswith("| ✓ refused: ValueError: Following weights were not initialized |")
    assert lines["| odd"].endswith("| ✗ loaded, tokens = transformers |")


def test_atlas_sections_for_vision_language_and_pooling_types(tmp_path, scan_type):
    """Types of the image-text-to-text and pooling sections get their own section, counts and table
    (with what vLLM ran for them, from their own runtime rows); the summary stays the causal-LM one."""
    from hfcheck.analyzer.sources.model_types import parse_refs
    from hfcheck.sweep.atlas import write_atlas

    (pooling,) = parse_refs(["pooling:bert"])
    assert (pooling.key, pooling.model_type, pooling.section) == ("pooling:bert", "bert", "pooling")
    vlm = Target("llava", model_type="llava", section="image-text-to-text")
    (tmp_path / "runtime-pooling-vllm-0.32.0.jsonl").write_text(json.dumps(
        {"model_type": "pooling:bert", "status": "loaded", "predicted": {"transformers_backend": True}, "differences": [],
         "tokens_match": True, "cosine": 1.0}) + "\n")
    result = SweepResult(
        [Target("qwen3", model_type="qwen3"), vlm, pooling],
        {"qwen3": {"report": scan_type("qwen3")}, "llava": {"report": scan_type("llama")}, "pooling:bert": {"error": "timed out after 1 s"}},
    )
    text = write_atlas(result, tmp_path / "atlas.md").read_text()
    assert text.index("## Every target") < text.index("## Vision-language types") < text.index("## Pooling types")
    summary = text[text.index("## Summary"):text.index("## Failures")]
    assert "| **total** | **1** |" in summary  # the causal-LM section alone
    vlm_part = text[text.index("## Vision-language types"):text.index("## Pooling types")]
    assert "1 targets:" in vlm_part and "native-speed 1, runs 0, blocked 0, inconclusive 0, analysis failed 0" in vlm_part
    assert "| llava | LlamaForCausalLM | native-speed |" in vlm_part
    pool_part = text[text.index("## Pooling types"):]
    assert "analysis failed 1" in pool_part and "**1 of 1** agree" in pool_part
    assert "| pooling:bert | — | analysis failed |" in pool_part and pool_part.rstrip().endswith("✓ loaded, embedding = transformers |")
