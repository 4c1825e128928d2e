"""One sweep: targets -> (cache | worker pool) -> results, in the targets' order.

``run_batch()`` runs one batch of targets on a worker pool: the sweep (``sweep()``, the CLI)
and the dashboard's scanner both run targets through it. A target that cannot even be prepared
(a reference that does not resolve, a default config that does not build) is a failure
recorded here; everything else goes to the pool, unless the cache has its result, or another
target of the batch (or of an earlier sweep) has the same config hash (``cache.config_hash``):
then that one analysis answers both, with the model's own name (``restamp``).

The pool is the sweep's ``WorkerPool`` (processes on this machine) or, with ``ray``, a
``ray_pool.RayPool`` (the same worker, in Ray actors on a cluster); ``run_batch`` cannot tell.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hfcheck.analyzer.sources.model_types import (
    DefaultConfigError,
    Target,
    TargetError,
    atlas_types,
    prepare,
)
from hfcheck.sweep.cache import (
    ResultCache,
    TypeIndex,
    config_hash,
    content_key,
    key_parts,
    result_key,
)
from hfcheck.sweep.ray_pool import RayPool
from hfcheck.sweep.worker import Result, Stopped, Task, WorkerPool, instance_ok

FAILED = "analysis failed"

Progress = Callable[[str, str, Result | None], None]
"""on_progress(event, key, result): event is "start", "done" or "cached"."""


def failure_reason(result: Result) -> str | None:
    """``analysis failed: <reason>`` for a result without a report, else None."""
    if "report" in result:
        return None
    return f"{FAILED}: {result.get('error') or 'unknown error'}"


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
    deduplicated: int = 0  # answered by the analysis of another target with the same config hash
    workers_started: int = 0
    interrupted: bool = False
    seconds: float = 0.0

    def ordered(self) -> list[tuple[Target, Result]]:
        return [(t, self.results[t.key]) for t in self.targets if t.key in self.results]

    def to_json(self) -> dict[str, Any]:
        """``{key: scan report | {"error": "analysis failed: ..."}}`` in the targets' order, each
        with the model's ``config_hash`` when its config was read."""
        out: dict[str, Any] = {}
        for target, result in self.ordered():
            value = result["report"] if "report" in result else {"error": failure_reason(result)}
            if result.get("config_hash"):
                value = {**value, "config_hash": result["config_hash"]}
            out[target.key] = value
        return out

    @property
    def distinct_configs(self) -> int:
        """How many different config hashes the finished targets have (those without one count once each)."""
        hashes = [r.get("config_hash") or f"-{k}" for k, r in self.results.items()]
        return len(set(hashes))

    @property
    def failed(self) -> list[tuple[Target, str]]:
        return [(t, reason) for t, r in self.ordered() if (reason := failure_reason(r)) is not None]


def _prepare(target: Target) -> tuple[Any, Result | None]:
    """(source, None) or (None, the failure result)."""
    try:
        return prepare(target), None
    except DefaultConfigError as exc:
        return None, {"error": str(exc), "cacheable": False, "transformers_builds": {"ok": False, "error": str(exc)}, "lasting": True}
    except TargetError as exc:
        return None, {"error": str(exc), "cacheable": False, "lasting": True}
    except Exception as exc:  # noqa: BLE001 - a bug in preparing one target is that target's failure
        return None, {"error": f"cannot prepare: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}", "cacheable": False}


@dataclass
class BatchCounts:
    from_cache: int = 0
    analysed: int = 0  # results that came back from the pool (timeouts and crashes included)
    deduplicated: int = 0  # answered by the pool's result for another target with the same config hash


def serve_ref(source) -> str:
    """The reference a report's serve command names (``report.serve_command``'s choice)."""
    return source.repo_id or source.location or source.ref


def restamp(result: Result, source, origin_ref: str) -> Result:
    """``result`` (of a model with the same config hash) as the analysis of ``source`` reads: the
    report's model reference, source kind, note, revision and serve command are this model's.
    Nothing else of a report depends on where the config came from (``cache.config_hash``)."""
    out = dict(result)
    report = out.get("report")
    if isinstance(report, dict):
        report = dict(report)
        report["model"] = {**(report.get("model") or {}), "ref": source.ref, "source": source.kind, "source_note": source.note, "revision": source.revision}
        command, head = report.get("serve_command"), f"vllm serve {origin_ref}"
        if isinstance(command, str) and (command == head or command.startswith(head + " ")):
            report["serve_command"] = f"vllm serve {serve_ref(source)}{command[len(head):]}"
        out["report"] = report
    out["config_hash"] = config_hash(source)
    return out


@dataclass
class _SameConfig:
    """The targets of a batch that share one config hash: the first is analysed, the rest wait."""

    origin_ref: str  # serve_ref of the analysed one
    result: Result | None = None
    followers: list[tuple[str, Any]] = field(default_factory=list)  # (target key, source)


def atlas_targets(cache: ResultCache | None = None) -> list[Target]:
    """Every model type of the atlas's sections (``targets.atlas_types``: causal-LM,
    image-text-to-text, pooling), from the cache's ``TypeIndex`` when it knows them (no
    transformers import)."""
    index = TypeIndex(cache or ResultCache())
    known = index.types()
    if known is not None:
        return [Target(key=key, model_type=model_type, section=section) for key, model_type, section in known]
    targets = atlas_types()
    index.set_types([[t.key, t.model_type, t.section] for t in targets if t.model_type is not None])  # all types
    index.save()
    return targets


def run_batch(
    targets: list[Target],
    pool: WorkerPool,
    cache: ResultCache,
    *,
    on_progress: Progress,
    counts: BatchCounts | None = None,
    force: bool = False,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Run one batch of targets on ``pool``: the one way the sweep and the dashboard run them.

    Each target is answered, in the targets' order as far as the cache and preparation go, by
    ``on_progress("cached" | "done", key, result)``, and each task the pool starts by
    ``on_progress("start", key, None)``. A model type whose result key the cache's ``TypeIndex``
    knows is looked up without preparing it (no transformers import); references are resolved
    in a thread pool (Hub look-ups overlap); a target that cannot be prepared is a "done" failure;
    the rest goes to the pool and its result to the cache. ``force`` skips reading the cache
    (a re-scan; results are still written). ``stop()`` is asked before each target and each
    pool result: once true, ``Stopped`` is raised and later results are dropped, not cached.
    KeyboardInterrupt and pool errors propagate; the caller closes the pool.
    """
    batch = _Batch(cache, TypeIndex(cache), on_progress, counts if counts is not None else BatchCounts(), force, stop or (lambda: False))
    work = batch.tasks(targets)
    try:
        pool.run(work, batch.on_result, on_start=lambda key: on_progress("start", key, None))
    finally:
        work.close()  # now, not when collected: the resolver threads stop with the batch
        batch.index.save()


@dataclass
class _Batch:
    """One batch's state: ``tasks`` records each task's cache keys and config group, ``on_result`` reads them back."""

    cache: ResultCache
    index: TypeIndex
    on_progress: Progress
    counts: BatchCounts
    force: bool
    stopped: Callable[[], bool]
    cache_keys: dict[str, tuple[str, dict, str, str]] = field(default_factory=dict)  # target key -> (result key, key parts, content key, config hash)
    same: dict[str, _SameConfig] = field(default_factory=dict)  # content key -> the batch's targets with that config

    def tasks(self, targets: list[Target]) -> Generator[Task, None, None]:
        """The pool's tasks, made lazily so ``stop()`` and the cache are asked just in time while references resolve ahead."""
        refs = [t for t in targets if not t.is_type]
        io = ThreadPoolExecutor(max_workers=min(8, len(refs) or 1), thread_name_prefix="hfcheck-resolve")
        try:
            futures = {t.key: io.submit(_prepare, t) for t in refs}
            for target in targets:
                if self.stopped():
                    raise Stopped
                task = self._task(target, futures)
                if task is not None:
                    yield task
        finally:
            io.shutdown(wait=False, cancel_futures=True)

    def _task(self, target: Target, futures: dict[str, Future]) -> Task | None:
        """``target``'s pool task, or None when it is answered without the pool (its progress event already sent)."""
        if self._answered_by_index(target):
            return None
        source, failure = futures[target.key].result() if not target.is_type else _prepare(target)
        if failure is not None:
            self._unprepared(target, failure)
            return None
        try:
            key = result_key(source)
        except Exception as exc:  # noqa: BLE001 - an unhashable source is that model's error
            self.on_progress("done", target.key, {"error": f"cannot key the result: {type(exc).__name__}: {exc}"})
            return None
        if target.is_type:
            self.index.remember(target.key, key=key)
        chash = config_hash(source)
        if self._answered_by_cache(target, key, chash):
            return None
        ckey = content_key(chash)
        if self._joins_batch_config(target, source, ckey) or self._answered_by_earlier_config(target, source, ckey):
            return None
        self.same[ckey] = _SameConfig(serve_ref(source))
        self.cache_keys[target.key] = (key, key_parts(source), ckey, chash)
        return target.key, source, target.is_type

    def _answered_by_index(self, target: Target) -> bool:
        """A model type the ``TypeIndex`` knows is answered without preparing it (no transformers import)."""
        known = self.index.entry(target.key) if target.is_type and not self.force else None
        if known is None:
            return False
        if "failure" in known:
            self.on_progress("done", target.key, dict(known["failure"]))
            return True
        hit = self.cache.get(known["key"])
        if hit is None:
            return False
        self.counts.from_cache += 1
        self.on_progress("cached", target.key, hit)
        return True

    def _unprepared(self, target: Target, failure: Result) -> None:
        """An unpreparable target is a "done" failure; a model type's lasting one is remembered for later sweeps."""
        failure.pop("cacheable", None)
        if failure.pop("lasting", False) and target.is_type:
            self.index.remember(target.key, failure=failure)
        self.on_progress("done", target.key, failure)

    def _answered_by_cache(self, target: Target, key: str, chash: str) -> bool:
        """The cache's result for this source, stamped with its config hash (never with ``force``)."""
        if self.force:
            return False
        hit = self.cache.get(key)
        if hit is None:
            return False
        self.counts.from_cache += 1
        hit.setdefault("config_hash", chash)
        self.on_progress("cached", target.key, hit)
        return True

    def _joins_batch_config(self, target: Target, source: Any, ckey: str) -> bool:
        """A config this batch already analyses: one analysis answers both (now, or when it comes back)."""
        group = self.same.get(ckey)
        if group is None:
            return False
        if group.result is None:
            group.followers.append((target.key, source))
        else:
            self._follow(target.key, source, group)
        return True

    def _answered_by_earlier_config(self, target: Target, source: Any, ckey: str) -> bool:
        """A config analysed in an earlier sweep under another name answers this target (never with ``force``)."""
        earlier = self.cache.same_config(ckey) if not self.force else None
        if earlier is None:
            return False
        self.same[ckey] = _SameConfig(earlier[1], earlier[0])
        self.counts.from_cache += 1
        self.on_progress("cached", target.key, restamp(earlier[0], source, earlier[1]))
        return True

    def _follow(self, key: str, source: Any, group: _SameConfig) -> None:
        """Answer a target with its config group's result, restamped as its own model's."""
        self.counts.deduplicated += 1
        assert group.result is not None  # followed only once the group has its result
        self.on_progress("done", key, restamp(group.result, source, group.origin_ref))

    def on_result(self, key: str, res: Result) -> None:
        """The pool's callback: cache the result, report it, then answer the targets waiting on its config."""
        cacheable = res.pop("cacheable", True)
        if self.stopped():
            return  # a worker killed by the caller's stop is not this model's failure
        self.counts.analysed += 1
        group = self._store(key, res, cacheable)
        self.on_progress("done", key, res)
        if group is not None:  # a timeout or crash too: the same config would meet the same fate
            self._release_followers(group, res)

    def _store(self, key: str, res: Result, cacheable: bool) -> _SameConfig | None:
        """Stamp a pool result with its config hash and cache it; returns its config group (None: not one of ``tasks``'s)."""
        if key not in self.cache_keys:
            return None
        result_key_, parts, ckey, chash = self.cache_keys[key]
        res["config_hash"] = chash
        group = self.same.get(ckey)
        if cacheable:
            self.cache.put(result_key_, res, parts)
            self.cache.put_same_config(ckey, result_key_, group.origin_ref if group else "")
        return group

    def _release_followers(self, group: _SameConfig, res: Result) -> None:
        """Answer the targets that waited on this config; later ones follow at once (``_joins_batch_config``)."""
        group.result = res
        followers, group.followers = group.followers, []
        for other, source in followers:
            self._follow(other, source, group)


def sweep(
    targets: list[Target],
    *,
    jobs: int | None = None,
    timeout: float = 60.0,
    use_cache: bool = True,
    cache: ResultCache | None = None,
    on_progress: Progress | None = None,
    ray: str | None = None,
) -> SweepResult:
    """Analyse every target; Ctrl-C (KeyboardInterrupt) returns the partial result, ``interrupted=True``.

    ``ray``: run the workers as Ray actors of the cluster at that address (``""``: Ray's own
    default, ``$RAY_ADDRESS`` or a local instance); ``jobs`` then defaults to the cluster's CPUs.
    Without it, Ray is not imported."""
    started = time.perf_counter()
    cache = cache or ResultCache(enabled=use_cache)
    result = SweepResult(list(targets))
    counts = BatchCounts()
    notify = on_progress or (lambda *_: None)

    def progress(event: str, key: str, res: Result | None) -> None:
        if res is not None:
            result.results[key] = res
        notify(event, key, res)

    quiet: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if ray is not None:

        pool: Any = RayPool(ray, jobs, timeout)
        # Ray prints the cluster's error messages (a worker that died...) on stdout, where the
        # sweep writes its JSON: while connected, stdout is stderr (the sweep's rows say it all)
        quiet = contextlib.redirect_stdout(sys.stderr)
    else:
        pool = WorkerPool(jobs or default_jobs(), timeout)
    with quiet:
        _run(result, pool, cache, progress, counts, started)
    return result


def _run(result: SweepResult, pool: Any, cache: ResultCache, progress: Progress, counts: BatchCounts, started: float) -> None:
    try:
        run_batch(result.targets, pool, cache, on_progress=progress, counts=counts)
    except KeyboardInterrupt:
        result.interrupted = True
        pool.close(kill=True)
    except BaseException:
        pool.close(kill=True)
        raise
    else:
        pool.close()
    finally:
        result.from_cache, result.analysed, result.deduplicated = counts.from_cache, counts.analysed, counts.deduplicated
        result.workers_started = pool.started_workers
        result.seconds = time.perf_counter() - started
