"""Background scans for the dashboard: the sweep's machinery, driven from one thread.

``Scanner.submit(targets)`` queues a batch; one background thread takes batches in order and
runs each with the sweep's own ``run_batch`` (the one way targets are run): targets are
prepared (Hub look-ups overlap in a thread pool), the sweep's result cache answers what it
knows, and the rest goes to the sweep's ``WorkerPool`` (child processes, a time limit per
model, a crash or hang is that model's error), or with ``ray`` the sweep's ``RayPool`` (the
same workers as Ray actors of a cluster: ``hfcheck tui --ray``), which this thread cancels the
same way. The pool is kept between batches, so a re-scan does not pay for starting workers.

``cancel()`` drops queued batches, kills the running workers and makes the thread stop at
once; every target it drops is reported ``cancelled``. Nothing here blocks the caller, and
nothing raises into it: every failure becomes an event about the targets it concerns.

Events go to ``post(event)`` from the background thread (Textual's ``post_message`` is
thread-safe); each carries the ``generation`` of the request, so a caller can ignore
events of a request it has since replaced.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hfcheck.analyzer.sources.model_types import Target
from hfcheck.sweep.worker import PoolError, Stopped, WorkerPool


@dataclass(frozen=True)
class TargetEvent:
    """Something that happened to one target of one submission (``generation``: events of a
    submission the user has since replaced are dropped by the app)."""

    key: str
    generation: int


@dataclass(frozen=True)
class Started(TargetEvent):
    pass


@dataclass(frozen=True)
class Finished(TargetEvent):
    result: dict[str, Any]
    cached: bool = False


@dataclass(frozen=True)
class Cancelled(TargetEvent):
    pass


@dataclass(frozen=True)
class Idle:
    """The thread has nothing left to do (every submitted target was reported)."""


Event = Started | Finished | Cancelled | Idle


@dataclass
class _Batch:
    targets: list[Target]
    generation: int
    force: bool = False  # skip the cache read (a re-scan); the result is still written
    open: set[str] = field(default_factory=set)


def ensure_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, with a real stderr.

    The first spawned worker starts it otherwise, handing it ``sys.stderr.fileno()``; inside
    a running Textual app that is Textual's capture object, whose fileno is -1, and the spawn
    fails ("bad value(s) in fds_to_keep"). So the scanner starts it before the app runs.
    """
    from multiprocessing import resource_tracker

    saved = sys.stderr
    try:
        if saved is None or saved.fileno() < 0:
            sys.stderr = sys.__stderr__
    except (AttributeError, OSError, ValueError):
        sys.stderr = sys.__stderr__
    try:
        resource_tracker.ensure_running()
    except Exception:  # noqa: BLE001, S110 - the first spawn will say what is wrong, as that batch's error
        pass
    finally:
        sys.stderr = saved


class Scanner:
    def __init__(self, post: Callable[[Event], None], *, jobs: int | None = None, timeout: float = 60.0, use_cache: bool = True, cache=None,
                 ray: str | None = None) -> None:
        self._post = post
        self.jobs = jobs
        self.ray = ray  # a Ray address ("" for Ray's default): the workers run on that cluster
        self.timeout = timeout
        self.use_cache = use_cache
        self._cache = cache
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._lock = threading.Lock()
        self._generation = 0
        self._cancelled_below = 0  # batches with a generation under this are cancelled
        self._pool: Any = None  # the sweep's WorkerPool, or RayPool with ``ray``
        self._thread: threading.Thread | None = None
        self._closed = False
        self.busy = False
        ensure_resource_tracker()

    # -- caller side (the UI thread)
    def submit(self, targets: list[Target], *, force: bool = False) -> int:
        """Queue a batch; returns its generation (every event about it carries it)."""
        with self._lock:
            if self._closed:
                return -1
            self._generation += 1
            batch = _Batch(list(targets), self._generation, force, {t.key for t in targets})
            self.busy = True
            self._queue.put(batch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hfcheck-tui-scanner", daemon=True)
                self._thread.start()
            return batch.generation

    def cancel(self) -> None:
        """Stop everything submitted so far; the dropped targets are reported ``Cancelled``."""
        with self._lock:
            self._cancelled_below = self._generation + 1
            pool = self._pool
        if pool is not None:
            pool.interrupt()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel, stop the thread and the workers (the app calls this when it exits)."""
        with self._lock:
            self._closed = True
        self.cancel()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the background thread
    def _is_cancelled(self, batch: _Batch) -> bool:
        return batch.generation < self._cancelled_below

    def _emit(self, event: Event) -> None:
        try:
            self._post(event)
        except Exception:  # noqa: BLE001, S110 - a receiver that has gone away
            pass

    def _loop(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            try:
                self._run(batch)
            except BaseException as exc:  # noqa: BLE001 - never die silently: the rest is each target's error
                self._fail_open(batch, f"scan failed: {type(exc).__name__}: {exc}")
            if self._is_cancelled(batch):
                for key in sorted(batch.open):
                    self._emit(Cancelled(key, batch.generation))
                batch.open.clear()
            with self._lock:
                if self._queue.empty():
                    self.busy = False
                    idle = True
                else:
                    idle = False
            if idle:
                self._emit(Idle())
        self._close_pool(kill=True)

    def _fail_open(self, batch: _Batch, message: str) -> None:
        if self._is_cancelled(batch):
            return
        for key in sorted(batch.open):
            self._emit(Finished(key, batch.generation, {"error": message}))
        batch.open.clear()

    def _close_pool(self, kill: bool) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(kill=kill)

    def _get_pool(self):
        from hfcheck.sweep.run import default_jobs

        with self._lock:
            if self._pool is None:
                if self.ray is not None:
                    from hfcheck.sweep.ray_pool import RayPool

                    self._pool = RayPool(self.ray, self.jobs, self.timeout)
                else:
                    self._pool = WorkerPool(self.jobs or default_jobs(), self.timeout)
            return self._pool

    def _run(self, batch: _Batch) -> None:
        from hfcheck.sweep.cache import ResultCache
        from hfcheck.sweep.run import run_batch

        if self._is_cancelled(batch):
            return
        if self._cache is None:
            self._cache = ResultCache(enabled=self.use_cache)

        def on_progress(event: str, key: str, result: dict[str, Any] | None) -> None:
            if self._is_cancelled(batch):
                return
            if event == "start":
                self._emit(Started(key, batch.generation))
            elif key in batch.open:
                assert result is not None  # every event but "start" carries its result
                batch.open.discard(key)
                self._emit(Finished(key, batch.generation, result, cached=event == "cached"))

        try:
            pool = self._get_pool()
        except PoolError as exc:  # --ray without Ray installed
            self._fail_open(batch, str(exc))
            return
        pool.cancelled = lambda: self._is_cancelled(batch)
        try:
            run_batch(batch.targets, pool, self._cache, on_progress=on_progress, force=batch.force, stop=lambda: self._is_cancelled(batch))
        except Stopped:  # the batch was cancelled: the pool loop unwound (run_batch raises it too)
            self._close_pool(kill=True)
        except PoolError as exc:
            self._close_pool(kill=True)
            self._fail_open(batch, str(exc))
        except BaseException:
            self._close_pool(kill=True)
            raise
        finally:
            pool.cancelled = lambda: False
        if self._is_cancelled(batch):
            self._close_pool(kill=True)
        elif batch.open:  # the pool answered for every task it was given; anything else is a bug, shown
            self._fail_open(batch, "scan failed: the worker pool returned no result")
