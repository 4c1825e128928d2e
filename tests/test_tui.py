"""``hfcheck tui``: the Textual dashboard, driven for real.

- Pilot tests (``app.run_test``) run the real app over real scans in real worker processes:
  hfcheck's bundled configs (offline, empty HF cache) and tiny model folders written from
  transformers model types, plus a folder whose config.json is garbage and a Hub id that
  does not exist; a worker that crashes and one that hangs (the sweep's test hooks).
- SVG snapshots of two screens, from a result cache filled by the sweep's own ``sweep()``
  (so they are deterministic, and show that the dashboard reuses the sweep cache).
  ``HFCHECK_UPDATE_SNAPSHOTS=1`` rewrites them (tests/snapshots/tui/transformers-<version>/*.svg:
  what hfcheck finds follows transformers' modeling code, so each version CI runs has its own).
- One end-to-end run in a real terminal: tmux, send-keys, capture-pane.
"""

from __future__ import annotations

import asyncio
import io
import json
import multiprocessing
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("textual", reason="the [tui] extra (textual) is not installed")

from conftest import write_model
from rich.console import Console

from hfcheck.analyzer.sources.model_types import Target, parse_refs
from hfcheck.tui import rows as R

BUNDLED_REFS = ["Qwen/Qwen3-4B", "Qwen/Qwen3-Next-80B-A3B-Instruct", "openai/gpt-oss-20b"]
SIZE = (120, 40)
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "tui"  # + transformers-<version>/: the analysis follows its modeling code
UPDATE_SNAPSHOTS = os.environ.get("HFCHECK_UPDATE_SNAPSHOTS") == "1"
# relu: vLLM has no fused act-and-mul kernel for it, so the MLP only merges (a real speed loss: `runs`);
# its 4 heads refusing TP 8 is no loss, native vLLM refuses TP 8 too
TINY = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "hidden_act": "relu"}


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def _no_child_left():
    """Worker processes spawned in this process start multiprocessing's resource tracker, a child
    that outlives them; stop it after each test, so tests that count this process's children
    (tests/test_verify.py) are not disturbed when they share an xdist worker with these."""
    yield
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_fd", None) is not None and hasattr(tracker, "_stop"):
        tracker._stop()


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """The Hub unreachable, an empty HF cache, a private result cache: in this process and its workers."""
    root = tmp_path_factory.mktemp("tui")
    mp = pytest.MonkeyPatch()
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(root / "hf"),
        "HF_HUB_CACHE": str(root / "hf" / "hub"),
        "HFCHECK_CACHE_DIR": str(root / "cache"),
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for name, value in env.items():
        mp.setenv(name, value)
    import huggingface_hub.constants as hub_constants  # read at import: patch what it already read

    mp.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    mp.setattr(hub_constants, "HF_HOME", env["HF_HOME"])
    mp.setattr(hub_constants, "HF_HUB_CACHE", env["HF_HUB_CACHE"])
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def models(offline):
    """Tiny model folders (config.json of real transformers model types) and one garbage folder."""
    root = offline / "models"
    write_model(root / "tiny-llama", "llama", **TINY)
    write_model(root / "tiny-mamba", "mamba", hidden_size=128, intermediate_size=256, num_hidden_layers=2, vocab_size=1000)
    garbage = root / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    return root


@pytest.fixture(scope="module")
def warm_cache(offline):
    """A result cache that ``hfcheck sweep``'s own sweep() filled with the bundled models."""
    from hfcheck.sweep.cache import ResultCache
    from hfcheck.sweep.run import sweep

    path = offline / "warm-cache"
    result = sweep(parse_refs(BUNDLED_REFS), jobs=2, timeout=120, cache=ResultCache(path))
    assert [k for k, r in result.results.items() if "report" not in r] == []
    return path


# ------------------------------------------------------------------------------- helpers


def run(coro):
    return asyncio.run(coro)


async def wait_for(pilot, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; counts: {pilot.app.counts()}")
        await pilot.pause(0.1)
    await settle(pilot)


async def settle(pilot) -> None:
    """Let the batched table refresh run (every FLUSH_S while rows changed, later on a loaded machine)."""
    await pilot.pause(0.1)
    deadline = time.monotonic() + 10
    while pilot.app.refresh_pending and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.pause(0.05)


def table(app):
    from textual.widgets import DataTable

    return app.query_one(DataTable)


def shown(app) -> list[str]:
    return [row.key.value for row in table(app).ordered_rows]


def cell_texts(app, key: str) -> dict[str, str]:
    return {c: str(v) for c, v in zip(R.COLUMN_IDS, table(app).get_row(key))}


def detail_text(app, width: int = 116) -> str:
    from textual.widgets import Static

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(app.query_one("#detail", Static).content)
    return console.export_text()


def status_text(app) -> str:
    from textual.widgets import Static

    return str(app.query_one("#status", Static).content)


async def select(pilot, key: str) -> None:
    app = pilot.app
    table(app).move_cursor(row=shown(app).index(key), animate=False)
    await settle(pilot)
    assert app.selected == key


def hfcheck_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("hfcheck-sweep-")]


def dashboard(targets, **kwargs):
    from hfcheck.tui.app import Dashboard

    kwargs.setdefault("jobs", 2)
    kwargs.setdefault("timeout", 120)
    return Dashboard(parse_refs(targets) if targets and isinstance(targets[0], str) else targets, **kwargs)


# ---------------------------------------------------------------------- the live dashboard


def test_live_scans_sort_filter_detail_export_rescan(offline, models, tmp_path, monkeypatch):
    from jsonschema import validate

    from hfcheck.analyzer.report import schema

    monkeypatch.setenv("HFCHECK_CACHE_DIR", str(tmp_path / "cold-cache"))  # every model really analysed
    monkeypatch.chdir(models)
    fixed = tmp_path / "fixed"
    shutil.copytree(models / "garbage", fixed)
    refs = [*BUNDLED_REFS, "./tiny-llama", "./tiny-mamba", str(fixed), "nobody/nothing"]
    out = tmp_path / "out"
    app = dashboard(refs, output_dir=out)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            # scans run in the background: the UI answers while every worker is still starting
            assert app.counts()["done"] < len(refs)
            await pilot.press("v")
            assert app.verdict_filter == "native-speed"
            await pilot.press("v", "v", "v", "v", "v", "v")
            assert app.verdict_filter is None
            await wait_for(pilot, lambda: app.counts()["done"] == len(refs), 180, "every scan")
            assert "7/7 scanned" in status_text(app) and "2 errors" in status_text(app) and "0 from cache" in status_text(app)
            assert app.query_one("ProgressBar").percentage == 1.0

            verdicts = {k: cell_texts(app, k)["verdict"] for k in shown(app)}
            assert verdicts == {
                "Qwen/Qwen3-4B": "native-speed",
                "Qwen/Qwen3-Next-80B-A3B-Instruct": "blocked",
                "openai/gpt-oss-20b": "blocked",
                "./tiny-llama": "runs",
                "./tiny-mamba": "blocked",
                str(fixed): "error",
                "nobody/nothing": "error",
            }
            qwen = cell_texts(app, "Qwen/Qwen3-4B")
            assert (qwen["score"], qwen["fusions"], qwen["moe"], qwen["tp"], qwen["pp"], qwen["blockers"], qwen["source"]) == ("100", "glu qkv rms_norm", "—", "8", "yes", "0", "bundled")
            nxt = cell_texts(app, "Qwen/Qwen3-Next-80B-A3B-Instruct")
            assert (nxt["moe"], nxt["blockers"]) == ("fused+EP", "1") and nxt["note"].startswith("36 of 48")  # cut to the table's width
            assert cell_texts(app, "openai/gpt-oss-20b")["moe"] == "not fused"
            assert cell_texts(app, "./tiny-llama")["source"] == "local"
            # one bad model: its error in its row, the rest unaffected
            assert cell_texts(app, "nobody/nothing")["note"].startswith("cannot rea")  # cut to the table's width
            assert app.entries["nobody/nothing"].error.startswith("nobody/nothing: cannot reach the Hub (HF_HUB_OFFLINE=1)")
            assert "not valid JSON" in app.entries[str(fixed)].error

            # the detail pane
            await select(pilot, "Qwen/Qwen3-Next-80B-A3B-Instruct")
            text = detail_text(app)
            for part in ("BLOCKED", "score 20/100", "HFC201", "Only softmax attention", "Fusions per module", "Qwen3NextAttention",
                         "Parallelism (TP / PP / EP)", "Layer map  48 layers, 36 blocking", "linear_attention ×36, full_attention ×12",
                         "MoE Qwen3NextSparseMoeBlock: experts replaced by FusedMoE",
                         "Run it (vLLM's native implementation): vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --tensor-parallel-size 4"):
                assert part in text, part
            assert "No vllm serve command" not in text and "--model-impl transformers) cannot serve it" in " ".join(text.split())
            assert " 0 " + "█" * 3 + "░" in text  # layers 0-2 block, layer 3 is served
            await select(pilot, "Qwen/Qwen3-4B")
            assert "Run it: vllm serve Qwen/Qwen3-4B --model-impl transformers" in detail_text(app)
            await select(pilot, "nobody/nothing")
            assert "analysis failed: nobody/nothing: cannot reach the Hub" in detail_text(app)

            # sort: s cycles the columns, S reverses, a click on a header sorts by it
            await pilot.press("s")
            assert app.sort_column == "model" and shown(app)[0] == "./tiny-llama"
            await pilot.press("s", "s")
            assert app.sort_column == "score"
            assert shown(app)[:2] == ["Qwen/Qwen3-4B", "./tiny-llama"] and shown(app)[-2:] == [str(fixed), "nobody/nothing"]
            await pilot.press("S")
            assert shown(app)[0] in ("Qwen/Qwen3-Next-80B-A3B-Instruct", "openai/gpt-oss-20b", "./tiny-mamba")
            assert shown(app)[-2:] == [str(fixed), "nobody/nothing"]  # no score: last either way
            columns = list(table(app).columns.values())
            x = sum(c.get_render_width(table(app)) for c in columns[: R.COLUMN_IDS.index("blockers")]) + 1
            await pilot.click(table(app), offset=(x, 0))
            await settle(pilot)
            assert (app.sort_column, app.sort_reverse) == ("blockers", False)
            assert shown(app)[0] in ("Qwen/Qwen3-4B", "./tiny-llama")
            await pilot.click(table(app), offset=(x, 0))
            await settle(pilot)
            assert app.sort_reverse

            # filter by verdict, then by text
            await pilot.press("v")
            assert shown(app) == ["Qwen/Qwen3-4B"] and "showing 1" in status_text(app)
            await pilot.press("v", "v", "v")
            assert app.verdict_filter == "blocked"
            assert set(shown(app)) == {"Qwen/Qwen3-Next-80B-A3B-Instruct", "openai/gpt-oss-20b", "./tiny-mamba"}
            await pilot.press("/")
            await pilot.press(*"qwen")
            assert shown(app) == ["Qwen/Qwen3-Next-80B-A3B-Instruct"]
            await pilot.press("enter")  # back to the table
            assert app.focused is table(app)

            # export the view: JSON in the sweep's shape (valid scan reports), and Markdown
            await pilot.press("j", "m")
            data = json.loads((out / "hfcheck-tui.json").read_text())
            assert list(data) == ["Qwen/Qwen3-Next-80B-A3B-Instruct"]
            validate(data["Qwen/Qwen3-Next-80B-A3B-Instruct"], schema())
            md = (out / "hfcheck-tui.md").read_text()
            assert "verdict: blocked, text: 'qwen'" in md and "| Qwen/Qwen3-Next-80B-A3B-Instruct | blocked | 20 |" in md

            # the command palette: clear the filters, then export everything
            await pilot.press("ctrl+p")
            await pilot.press(*"Clear filters")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert app.verdict_filter is None and len(shown(app)) == len(refs)
            await pilot.press("ctrl+p")
            await pilot.press(*"Export view to JSON")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await pilot.pause(0.2)
            data = json.loads((out / "hfcheck-tui.json").read_text())
            assert len(data) == len(refs) and data["nobody/nothing"]["error"].startswith("analysis failed: nobody/nothing: cannot reach the Hub")

            # re-scan one row: the broken folder is fixed, r analyses it again (same worker pool)
            write_model(fixed, "llama", **TINY)
            await pilot.press("s")
            await select(pilot, str(fixed))
            first = app.entries[str(fixed)].generation
            await pilot.press("r")
            assert app.entries[str(fixed)].generation > first  # a new request (the warm pool may already have answered)
            await wait_for(pilot, lambda: app.entries[str(fixed)].state == R.DONE, 120, "the re-scan")
            assert cell_texts(app, str(fixed))["verdict"] == "runs"
            # and a re-scan of a cached-or-not row bypasses the cache
            await select(pilot, "Qwen/Qwen3-4B")
            await pilot.press("r")
            await wait_for(pilot, lambda: app.entries["Qwen/Qwen3-4B"].state == R.DONE, 120, "the re-scan")
            assert app.entries["Qwen/Qwen3-4B"].cached is False and cell_texts(app, "Qwen/Qwen3-4B")["verdict"] == "native-speed"

    run(scenario())
    assert not app.scanner._thread.is_alive()  # closed with the app: thread and workers gone
    assert hfcheck_children() == []


def test_crash_and_hang_are_rows_and_cancel_stops_the_workers(offline, models, tmp_path, monkeypatch):
    monkeypatch.setenv("HFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    crash, hang = tmp_path / "crashes", tmp_path / "hangs"
    write_model(crash, "llama", **{**TINY, "rms_norm_eps": 1e-5})  # configs of their own: identical ones are analysed once
    write_model(hang, "llama", **{**TINY, "rms_norm_eps": 2e-5})
    monkeypatch.setenv("HFCHECK_TEST_CRASH", str(crash))
    monkeypatch.setenv("HFCHECK_TEST_HANG", str(hang))
    refs = [str(models / "tiny-llama"), str(crash), str(hang)]
    app = dashboard(refs)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.entries[str(hang)].state == R.SCANNING and app.counts()["done"] == 2, 120, "the hang to start")
            assert cell_texts(app, str(models / "tiny-llama"))["verdict"] == "runs", app.entries[str(models / "tiny-llama")].result
            assert cell_texts(app, str(crash))["verdict"] == "error"
            assert app.entries[str(crash)].error.startswith("worker crashed (SIGABRT)")
            assert hfcheck_children()  # the hanging worker
            started = time.monotonic()
            await pilot.press("c")
            await settle(pilot)
            assert app.entries[str(hang)].state == R.CANCELLED and cell_texts(app, str(hang))["verdict"] == "cancelled"
            await wait_for(pilot, lambda: not app.scanner.busy, 15, "the scanner to stop")
            assert time.monotonic() - started < 10
            deadline = time.monotonic() + 10
            while hfcheck_children() and time.monotonic() < deadline:
                await pilot.pause(0.1)
            assert hfcheck_children() == []
            await pilot.press("v", "v")  # still alive and answering
            assert app.verdict_filter == "runs" and shown(app) == [str(models / "tiny-llama")]

            # a result the dashboard cannot read (say, a damaged cache entry) is that row's problem only
            from hfcheck.tui.app import ScanEvent
            from hfcheck.tui.scanner import Finished

            entry = app.entries[str(hang)]
            app.post_message(ScanEvent(Finished(entry.key, entry.generation, {"report": {"verdict": None, "modules": [None]}})))
            await settle(pilot)
            await pilot.press(*"vvvvv")
            assert app.verdict_filter is None
            for _ in R.SORTS:
                await pilot.press("s")
            await select(pilot, str(hang))
            assert cell_texts(app, str(hang))["note"].startswith("cannot display")
            assert detail_text(app).startswith(f"cannot display {hang}")

    run(scenario())


# ------------------------------------------------------------------------ SVG snapshots


def normalise_svg(svg: str) -> str:
    return re.sub(r"terminal-\d+", "terminal", svg)


def assert_snapshot(svg: str, name: str, tmp_path: Path) -> None:
    import transformers

    path = SNAPSHOTS / f"transformers-{transformers.__version__}" / name
    got = normalise_svg(svg)
    if UPDATE_SNAPSHOTS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    if not path.exists():
        pytest.skip(f"no snapshot for transformers {transformers.__version__} ({path}): HFCHECK_UPDATE_SNAPSHOTS=1 writes one to review")
    if got != path.read_text(encoding="utf-8"):
        actual = tmp_path / name
        actual.write_text(got, encoding="utf-8")
        pytest.fail(f"the screen differs from {path} (this run: {actual}); if the change is intended, rerun with HFCHECK_UPDATE_SNAPSHOTS=1")


def _snapshot_app(models, warm_cache, monkeypatch):
    monkeypatch.setenv("HFCHECK_CACHE_DIR", str(warm_cache))
    monkeypatch.chdir(models)
    return dashboard([*BUNDLED_REFS, "./garbage"])


def test_snapshot_overview(offline, models, warm_cache, tmp_path, monkeypatch):
    app = _snapshot_app(models, warm_cache, monkeypatch)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.counts()["done"] == 4, 60, "the cached results")
            assert "4/4 scanned · 1 error · 3 from cache" in status_text(app)  # the sweep's cache, reused
            assert "result from the sweep cache" in detail_text(app)
            await wait_for(pilot, lambda: len(app.query("FooterKey")) > 0, 30, "the footer's keys (drawn late on a loaded machine)")
            assert_snapshot(app.export_screenshot(), "overview.svg", tmp_path)

    run(scenario())


def test_snapshot_blocked_model_detail(offline, models, warm_cache, tmp_path, monkeypatch):
    app = _snapshot_app(models, warm_cache, monkeypatch)

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.counts()["done"] == 4, 60, "the cached results")
            await pilot.press("down")
            app.query_one("#detail-pane").scroll_end(animate=False)
            await pilot.pause(0.2)
            await wait_for(pilot, lambda: len(app.query("FooterKey")) > 0, 30, "the footer's keys (drawn late on a loaded machine)")
            assert_snapshot(app.export_screenshot(), "blocked-detail.svg", tmp_path)

    run(scenario())


# ------------------------------------------------------------------ the command line


def _cli_has_tui() -> bool:
    from hfcheck.cli import build_parser

    try:
        build_parser().parse_args(["tui", "--help"])
    except SystemExit as exc:
        return exc.code == 0
    return False


def tui_cmd() -> list[str]:
    """``python -m hfcheck tui`` once hfcheck.cli wires it, else the package's own entry point."""
    return [sys.executable, "-m", "hfcheck", "tui"] if _cli_has_tui() else [sys.executable, "-m", "hfcheck.tui"]


def test_author_offline_is_one_clear_error(offline, tmp_path):
    proc = subprocess.run([*tui_cmd(), "--author", "Qwen"], capture_output=True, text=True, env=dict(os.environ), timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        (
            "hfcheck: error: --author Qwen: the Hub cannot be reached (HF_HUB_OFFLINE=1); listing a Hub author needs it "
            "(references, --from and --atlas work offline)"
        )
    ]
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to show: give references, --from FILE, --atlas or --author NAME"),
        (["--from", "missing.txt"], "--from missing.txt: cannot be read"),
        (["Qwen/Qwen3-4B", "--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_cli_usage_errors(offline, tmp_path, args, message):
    proc = subprocess.run([*tui_cmd(), *args], capture_output=True, text=True, env=dict(os.environ), timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_targets_from_every_source(offline, tmp_path):
    import argparse

    from hfcheck.tui.cli import add_parser, targets_from

    listing = tmp_path / "models.txt"
    listing.write_text("# a catalogue\nQwen/Qwen3-4B\ntype:llama\n")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tui", "Qwen/Qwen3-4B", "./x", "--from", str(listing), "--atlas"])
    targets, scope = targets_from(args)
    keys = [t.key for t in targets]
    assert keys[:3] == ["Qwen/Qwen3-4B", "./x", "llama"] and keys.count("llama") == 1 and len(keys) > 150
    assert scope == "references + atlas"


# --------------------------------------------------------------------- the data of the rows


def _entry(key: str, index: int, verdict: str | None, score: int = 0, error: str | None = None) -> R.Entry:
    entry = R.Entry(Target(key=key, ref=key), index)
    if verdict is None and error is None:
        return entry
    entry.state = R.DONE
    if error is not None:
        entry.result = {"error": error}
        return entry
    entry.result = {"report": {"verdict": verdict, "score": score, "blockers": ["x | y"] if verdict == "blocked" else [], "model": {"source": "local"},
                               "modules": [], "moe": [], "parallel": {"tp": {"sizes": {"1": True, "2": score > 50}}, "pp": {"supported": True}}, "checks": []}}
    return entry


def test_rows_sort_filter_and_markdown():
    entries = [_entry("b", 0, "runs", 80), _entry("a", 1, "blocked", 20), _entry("c", 2, None), _entry("d", 3, None, error="d: boom")]
    assert [e.key for e in R.view(entries, sort="score")] == ["b", "a", "c", "d"]
    assert [e.key for e in R.view(entries, sort="score", reverse=True)] == ["a", "b", "c", "d"]
    assert [e.key for e in R.view(entries, sort="model")] == ["a", "b", "c", "d"]
    assert [e.key for e in R.view(entries, sort="verdict")] == ["b", "a", "d", "c"]
    assert [e.key for e in R.view(entries, verdict=R.PENDING)] == ["c"]
    assert [e.key for e in R.view(entries, verdict=R.ERROR)] == ["d"]
    assert [e.key for e in R.view(entries, text="BOOM")] == ["d"]
    assert R.cells(entries[0])["tp"] == "2" and R.cells(entries[1])["tp"] == "1"
    assert R.note_of(entries[3]) == "boom"  # the model column already names it
    assert list(R.to_json(entries)) == ["b", "a", "d"]  # finished rows only
    md = R.markdown(entries)
    assert "| a | blocked | 20 |" in md and "x \\| y" in md
    assert R.middle_cut("Qwen/Qwen3-Next-80B-A3B-Instruct") == "Qwen/Qwen3-N…-A3B-Instruct"


# ------------------------------------------------------------------- a real terminal (tmux)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_end_to_end_in_tmux(offline, models, warm_cache, tmp_path):
    socket = str(tmp_path / "tmux.sock")  # a private tmux server, its socket in the test's folder
    exit_file = tmp_path / "exit-code"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": os.environ["HF_HOME"], "HF_HUB_CACHE": os.environ["HF_HUB_CACHE"], "HFCHECK_CACHE_DIR": str(warm_cache),
           "TERM": "xterm-256color", "COLORTERM": "truecolor", "PATH": os.environ.get("PATH", ""),
           "COLUMNS": "150", "LINES": "45"}  # the pane's size (a shell under a detached tmux may export 80x24)
    command = [*tui_cmd(), *BUNDLED_REFS, "./tiny-llama", "./garbage", "--output-dir", str(tmp_path)]
    shell = f"cd {shlex.quote(str(models))} && env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-S", socket, "-f", "/dev/null", *args], capture_output=True, text=True, check=True, timeout=30).stdout

    def screen_until(predicate, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = tmux("capture-pane", "-p", "-t", "tui")
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the terminal shows:\n{screen}")
            time.sleep(0.3)

    tmux("new-session", "-d", "-s", "tui", "-x", "150", "-y", "45", shell)
    try:
        # a capture can catch a frame half written: wait for the rows as well as the status line
        screen = screen_until(lambda s: "5/5 scanned" in s and "queued" not in s and "analysing" not in s and "JSON" in s, 150, "every row")
        assert "1 error" in screen and "3 from cache" in screen
        rows = {line.split()[0]: line for line in screen.splitlines() if line.split() and line.split()[0] in (*BUNDLED_REFS, "./tiny-llama", "./garbage")}
        assert "native-speed" in rows["Qwen/Qwen3-4B"] and " 100 " in rows["Qwen/Qwen3-4B"]
        assert "blocked" in rows["openai/gpt-oss-20b"] and "mxfp4" in rows["openai/gpt-oss-20b"]
        assert "runs" in rows["./tiny-llama"] and "local" in rows["./tiny-llama"]
        assert "error" in rows["./garbage"] and "not valid JSON" in rows["./garbage"]
        assert "NATIVE-SPEED" in screen and "vllm serve Qwen/Qwen3-4B --model-impl transformers" in screen  # the detail pane
        tmux("send-keys", "-t", "tui", "v")
        screen_until(lambda s: "verdict: native-speed" in s and "openai/gpt-oss-20b" not in s and "./garbage" not in s and "Qwen/Qwen3-4B" in s,
                     20, "the verdict filter to hide the other rows")
        tmux("send-keys", "-t", "tui", "j")
        deadline = time.monotonic() + 20
        while not (tmp_path / "hfcheck-tui.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(json.loads((tmp_path / "hfcheck-tui.json").read_text())) == ["Qwen/Qwen3-4B"]
        tmux("send-keys", "-t", "tui", "q")
        deadline = time.monotonic() + 30
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert exit_file.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, timeout=30, check=False)
