"""A job for an isolated child: the parent writes ``ROOT/job.json``, runs the child under
``run_child`` and reads ``ROOT/result.json``; the child reads the job and writes its result
(large tensors go beside them as safetensors). The one way hfcheck hands work to a child that
runs hfcheck's code (the port's proofs in hfcheck's interpreter; the runtime batches and serve's
reference run in vLLM's environment, where hfcheck is installed); the reference child runs in a
transformers release without hfcheck and reads the same two files by hand. The remote-code
sandbox returns its observations as a pickle of allowed classes instead (``analyzer/analysis/sandbox.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hfcheck.isolation.process import ChildRun, run_child

JOB, RESULT = "job.json", "result.json"


def run_job(argv: Sequence[str], root: Path, job: dict[str, Any], *, timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None, max_rss_bytes: int | None = None) -> tuple[ChildRun, dict[str, Any] | None]:
    """Write ``job``, run ``argv`` (which finds the job under ``root``) and return the run and
    the child's result (None: it ended without one, killed or crashed)."""
    (root / JOB).write_text(json.dumps(job), encoding="utf-8")
    run = run_child(argv, root, timeout=timeout, env=env, cwd=cwd, max_rss_bytes=max_rss_bytes)
    try:
        result = json.loads((root / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = None
    return run, result if isinstance(result, dict) else None


def read_job(root: Path) -> dict[str, Any]:
    """The child's side: the job its parent wrote."""
    return json.loads((root / JOB).read_text(encoding="utf-8"))


def write_result(root: Path, result: dict[str, Any]) -> None:
    """The child's side: its result, for ``run_job`` to read."""
    (root / RESULT).write_text(json.dumps(result), encoding="utf-8")
