"""One sweep: targets -> (cache | worker pool) -> results, in the targets' order.

``sweep()`` is the API (the CLI and the TUI call it). A target that cannot even be prepared
(a reference that does not resolve, a default config that does not build) is a failure
recorded here; everything else goes to the pool, unless the cache has its result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hfcheck.analyzer.sweep.cache import ResultCache, key_parts, result_key
from hfcheck.analyzer.sweep.targets import DefaultConfigError, Target, TargetError, prepare
from hfcheck.analyzer.sweep.worker import Result, WorkerPool

FAILED = "analysis failed"

Progress = Callable[[str, str, Result | None], None]
"""on_progress(event, key, result): event is "start", "done" or "cached"."""


def failure_reason(result: Result) -> str | None:
    """``analysis failed: <reason>`` for a result without a report, else None."""
    if "report" in result:
        return None
    return f"{FAILED}: {result.get('error') or 'unknown error'}"


def instance_ok(result: Result) -> bool:
    """Whether the tiny instance was built and the graph walked (the coverage criterion)."""
    report = result.get("report")
    if not report:
        return False
    state = report.get("analysis") or {}
    return bool(state.get("instance")) and bool(state.get("graph"))


def instance_error(result: Result) -> str | None:
    """Why the tiny instance or the graph failed (None when both worked or no report)."""
    report = result.get("report")
    if not report or instance_ok(result):
        return None
    state = report.get("analysis") or {}
    if state.get("instance_error"):
        return f"no tiny instance: {state['instance_error']}"
    return "the instance was built but the graph walk produced no observations"


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


@dataclass
class SweepResult:
    targets: list[Target]
    results: dict[str, Result] = field(default_factory=dict)  # only finished targets
    from_cache: int = 0
    analysed: int = 0
    workers_started: int = 0
    interrupted: bool = False
    seconds: float = 0.0

    def ordered(self) -> list[tuple[Target, Result]]:
        return [(t, self.results[t.key]) for t in self.targets if t.key in self.results]

    def to_json(self) -> dict[str, Any]:
        """``{key: scan report | {"error": "analysis failed: ..."}}`` in the targets' order."""
        out: dict[str, Any] = {}
        for target, result in self.ordered():
            out[target.key] = result["report"] if "report" in result else {"error": failure_reason(result)}
        return out

    @property
    def failed(self) -> list[tuple[Target, str]]:
        return [(t, failure_reason(r)) for t, r in self.ordered() if "report" not in r]


def _prepare(target: Target) -> tuple[Any, Result | None]:
    """(source, None) or (None, the failure result)."""
    try:
        return prepare(target), None
    except DefaultConfigError as exc:
        return None, {"error": str(exc), "cacheable": False, "transformers_builds": {"ok": False, "error": str(exc)}}
    except TargetError as exc:
        return None, {"error": str(exc), "cacheable": False}
    except Exception as exc:  # noqa: BLE001 - a bug in preparing one target is that target's failure
        return None, {"error": f"cannot prepare: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", "cacheable": False}


def sweep(
    targets: list[Target],
    *,
    jobs: int | None = None,
    timeout: float = 60.0,
    use_cache: bool = True,
    cache: ResultCache | None = None,
    on_progress: Progress | None = None,
) -> SweepResult:
    """Analyse every target; Ctrl-C (KeyboardInterrupt) returns the partial result, ``interrupted=True``."""
    started = time.perf_counter()
    cache = cache or ResultCache(enabled=use_cache)
    result = SweepResult(list(targets))
    cache_keys: dict[str, tuple[str, dict]] = {}
    notify = on_progress or (lambda *_: None)

    def record(key: str, res: Result, event: str) -> None:
        result.results[key] = res
        notify(event, key, res)

    def tasks():
        refs = [t for t in targets if not t.is_type]
        with ThreadPoolExecutor(max_workers=min(8, len(refs) or 1)) as io:  # Hub look-ups overlap
            futures = {t.key: io.submit(_prepare, t) for t in refs}
            for target in targets:
                source, failure = futures[target.key].result() if not target.is_type else _prepare(target)
                if failure is not None:
                    failure.pop("cacheable", None)
                    record(target.key, failure, "done")
                    continue
                key = result_key(source)
                hit = cache.get(key)
                if hit is not None:
                    result.from_cache += 1
                    record(target.key, hit, "cached")
                    continue
                cache_keys[target.key] = (key, key_parts(source))
                yield target.key, source, target.is_type

    def on_result(key: str, res: Result) -> None:
        result.analysed += 1
        cacheable = res.pop("cacheable", True)
        if key in cache_keys and cacheable:
            cache.put(cache_keys[key][0], res, cache_keys[key][1])
        record(key, res, "done")

    pool = WorkerPool(jobs or default_jobs(), timeout)
    try:
        pool.run(tasks(), on_result, on_start=lambda key: notify("start", key, None))
    except KeyboardInterrupt:
        result.interrupted = True
        pool.close(kill=True)
    except BaseException:
        pool.close(kill=True)
        raise
    else:
        pool.close()
    finally:
        result.workers_started = pool.started_workers
        result.seconds = time.perf_counter() - started
    return result
