"""scripts/compare_outputs.py, the before/after check of a no-behaviour-change step: what is
measured anew (times, memory, source lines in messages) is left out, anything else is a difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_outputs.py"


def compare(tmp_path: Path, before, after) -> subprocess.CompletedProcess:
    (tmp_path / "before.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(after))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "before.json"), str(tmp_path / "after.json")],
                          capture_output=True, text=True, check=False)


def test_times_memory_and_line_numbers_are_not_differences(tmp_path):
    scan = {"qwen3": {"verdict": "native-speed", "timings_s": {"graph": 0.1}, "blockers": ["failed (at facts/__init__.py:245)"]}}
    rows = [{"model": "m", "run": "port", "status": "ported", "seconds": 7.0, "peak_rss_mib": 700},
            {"model": "m", "run": "back", "status": "ported", "seconds": 3.0, "peak_rss_mib": 500}]
    moved = {"qwen3": {"verdict": "native-speed", "timings_s": {"graph": 0.3}, "blockers": ["failed (at facts/__init__.py:216)"]}}
    assert compare(tmp_path, scan, moved).returncode == 0
    assert compare(tmp_path, rows, [dict(rows[1], seconds=9.9), dict(rows[0], peak_rss_mib=1)]).returncode == 0


def test_a_changed_value_is_named_with_its_path(tmp_path):
    run = compare(tmp_path, {"qwen3": {"verdict": "native-speed", "score": 100}}, {"qwen3": {"verdict": "runs", "score": 100}})
    assert run.returncode == 1
    assert "/qwen3/verdict: 'native-speed' -> 'runs'" in run.stdout and "1 difference(s)" in run.stdout
    rows = [{"model": "m", "run": "port", "max_rel_error": 1e-6}]
    assert compare(tmp_path, rows, [{"model": "m", "run": "port", "max_rel_error": 2e-6}]).returncode == 1
    assert compare(tmp_path, {"a": 1}, {"a": 1, "b": 2}).stdout.startswith("/b: only after")


def test_an_unreadable_file_is_one_line_and_status_2(tmp_path):
    (tmp_path / "after.json").write_text("{}")
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing.json"), str(tmp_path / "after.json")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
