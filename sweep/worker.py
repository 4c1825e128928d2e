"""Run analyses in child processes, one at a time per child, each under a time limit.

A child ("worker") is started with the ``spawn`` method (no inherited state, no fork of a
process that has threads), imports the analysis stack once, warms it up on one analysis,
says it is ready, then serves one task after another over its pipe. The parent gives a
worker one task at a time and knows its deadline, so:

- an exception becomes ``analysis failed: <Type>: <message> (at file:line)``, and the worker
  goes on;
- a worker past its deadline is killed: ``analysis failed: timed out after N s``;
- a worker that dies (segfault, abort, out of memory) is recorded with its signal and the
  ``Fatal Python error`` line faulthandler wrote: ``analysis failed: worker crashed (SIGSEGV) ...``;

and in the two last cases a fresh worker takes its place. Workers ignore SIGINT: Ctrl-C is
the parent's to handle, which kills them and keeps what has been done. A worker is recorded
before it starts, so a Ctrl-C during start-up misses none; workers are killed by the kernel
when the parent dies (Linux), and ended through ``isolation.process.end_processes``.

Test hooks (read by the worker, never set by hfcheck): ``HFCHECK_TEST_HANG`` and
``HFCHECK_TEST_CRASH`` hold comma-separated result keys; a worker given such a key sleeps
forever, or calls ``os.abort()``, before analysing it.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from hfcheck.isolation.process import die_with_parent, end_processes, kill_group, wait_all

HANG_ENV = "HFCHECK_TEST_HANG"
CRASH_ENV = "HFCHECK_TEST_CRASH"
START_FAILURES_ALLOWED = 3

Task = tuple[str, Any, bool]  # (result key, ModelSource, probe plain transformers on failure)
Result = dict[str, Any]  # {"report": {...}} | {"error": "...", "cacheable": bool}


class Stopped(Exception):
    """``run_batch``'s ``stop()`` became true: the batch was abandoned (the caller cancelled it)."""


class PoolError(Exception):
    """Workers cannot run at all (e.g. every one dies while importing)."""


# ------------------------------------------------------------------------------ child side


def _hooked(key: str, env: str) -> bool:
    return key in {k.strip() for k in os.environ.get(env, "").split(",") if k.strip()}


def _error_text(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0] + (" " + lines[1] if lines and lines[0].endswith(":") and len(lines) > 1 else "") if lines else ""
    text = f"{type(exc).__name__}: {head[:300]}" if head else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        path = last.filename.replace("\\", "/")
        for marker in ("/site-packages/", "/analyzer/"):
            if marker in path:
                path = ("hfcheck/analyzer/" if marker == "/analyzer/" else "") + path.split(marker, 1)[1]
                break
        text += f" (at {path}:{last.lineno})"
    return text


def _child(conn, log_path: str, parent_pid: int | None = None) -> None:  # pragma: no cover - runs in the child process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a Ctrl-C held back since the spawn (see _spawn)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    die_with_parent(parent_pid)  # a parent killed outright (SIGKILL, a crash) takes its workers with it
    # stdout/stderr (transformers' warnings, faulthandler's crash report) go to a log the
    # parent reads when the worker dies; the sweep's own terminal output stays clean.
    log = open(log_path, "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)

    faulthandler.enable(file=log)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    warnings.simplefilter("ignore")
    from hfcheck.analyzer.scan import scan

    try:  # warm up (lazy imports, first trace) so a task's time limit measures the task alone
        from hfcheck.analyzer.sources.model_types import type_source

        scan(type_source("llama"))
    except Exception:  # noqa: BLE001, S110 - a warm-up that fails only costs the first task some time
        pass
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        key, source, probe = task
        log.seek(0)
        log.truncate()
        if _hooked(key, HANG_ENV):
            while True:
                time.sleep(3600)
        if _hooked(key, CRASH_ENV):
            os.abort()
        try:
            result: dict[str, Any] = {"report": scan(source).report}
        except BaseException as exc:  # noqa: BLE001 - any failure of one model is its result
            result = {"error": _error_text(exc), "cacheable": not isinstance(exc, MemoryError)}
        if probe:
            _probe_transformers(result, source)
        conn.send(("done", key, result))


def _probe_transformers(result: Result, source) -> None:  # pragma: no cover - runs in the child
    """When hfcheck could not build or walk a default config, record whether plain transformers can."""
    from hfcheck.analyzer.sources.model_types import plain_build_error

    if instance_ok(result):
        return
    try:
        error = plain_build_error(source.config)
    except Exception as exc:  # noqa: BLE001
        error = _error_text(exc)
    result["transformers_builds"] = {"ok": error is None, "error": error}


# ----------------------------------------------------------------------------- parent side


@dataclass
class _Worker:
    process: Any
    conn: Any
    log: Path
    started: float
    state: str = "starting"  # starting -> idle <-> busy
    key: str | None = None
    deadline: float = 0.0
    task_started: float = 0.0
    done: int = field(default=0)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _crash_detail(log: Path) -> str:
    """The faulthandler headline and the innermost frame it printed, if any."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")[-20000:]
    except OSError:
        return ""
    fatal = re.findall(r"^Fatal Python error: (.+)$", text, re.MULTILINE)
    if not fatal:
        return ""
    after = text[text.rfind("Fatal Python error") :]
    frame = re.search(r'^\s+File "([^"]+)", line (\d+) in (\S+)', after, re.MULTILINE)
    where = ""
    if frame:
        path = frame.group(1).replace("\\", "/").split("/site-packages/")[-1]
        where = f" in {frame.group(3)} ({path}:{frame.group(2)})"
    return f": {fatal[-1].strip()}{where}"


class WorkerPool:
    """``run(tasks, on_result)``: at most ``jobs`` workers, ``timeout`` seconds per task.

    ``cancelled`` (a callable, false by default) is asked before a worker starts and around each
    wait; once true, ``run`` raises ``Stopped``. ``interrupt()`` (any thread) kills the workers,
    which wakes the wait at once. The dashboard cancels a batch that way; ``RayPool`` has both too.
    """

    def __init__(self, jobs: int, timeout: float, start_timeout: float = 300.0, context: str = "spawn") -> None:
        self.jobs = max(1, int(jobs))
        self.timeout = float(timeout)
        self.start_timeout = max(float(start_timeout), self.timeout)
        self.ctx = multiprocessing.get_context(context)
        self.workers: list[_Worker] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="hfcheck-sweep-"))
        self._spawned = 0
        self._start_failures = 0
        self.started_workers = 0
        self.cancelled: Callable[[], bool] = lambda: False

    def _check_cancelled(self) -> None:
        if self.cancelled():
            raise Stopped

    def interrupt(self) -> None:
        """Kill every started worker (the pool loop then sees them end and checks ``cancelled``)."""
        for w in list(self.workers):
            if w.process.pid is None:  # not started yet: the check before a start stops it
                continue
            try:
                kill_group(w.process)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass

    # -- lifecycle
    def _spawn(self) -> _Worker:
        self._check_cancelled()
        parent, child = self.ctx.Pipe(duplex=True)
        self._spawned += 1
        log = self.logdir / f"worker-{self._spawned}.log"
        # typeshed's BaseContext lacks Process, which every context get_context returns has
        process = self.ctx.Process(target=_child, args=(child, str(log), os.getpid()), name=f"hfcheck-sweep-{self._spawned}", daemon=True)  # type: ignore[attr-defined]
        # Recorded before it starts: a Ctrl-C at any point of the start leaves no worker that
        # close() does not know about (one it missed would be joined, without a time limit, by
        # multiprocessing's exit handler).
        worker = _Worker(process, parent, log, time.monotonic())
        self.workers.append(worker)
        # The child starts with SIGINT blocked (the mask is inherited through fork and exec) and
        # ignores it from its first line on: a terminal's Ctrl-C, sent to the whole process
        # group, never interrupts a worker's start-up (no traceback, no half-started worker).
        masked = hasattr(signal, "pthread_sigmask")
        if masked and self.ctx.get_start_method() != "fork":
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()  # now: starting it, start() would unblock SIGINT again
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
        try:
            process.start()
        except BaseException:
            if process.pid is None:  # it never started
                self._discard(worker)
            raise
        finally:
            if previous is not None:  # masked
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            child.close()
        self.started_workers += 1
        return worker

    def _discard(self, worker: _Worker) -> None:
        """Kill the worker (when it still runs), reap it, forget it."""
        end_processes([worker.process], reap_s=10)
        try:
            worker.conn.close()
        except OSError:
            pass
        if worker in self.workers:
            self.workers.remove(worker)

    def close(self, kill: bool = False) -> None:
        """Stop every worker: idle ones are asked to exit (up to 5 s) unless ``kill``; whatever
        still runs is killed and reaped. A Ctrl-C while closing kills the rest, then goes on."""
        try:
            self._close(kill)
        except KeyboardInterrupt:
            self._close(kill=True)
            raise

    def _close(self, kill: bool) -> None:
        workers = list(self.workers)
        if not kill:
            idle = [w for w in workers if w.state == "idle"]
            for w in idle:
                try:
                    w.conn.send(None)
                except (OSError, ValueError):
                    pass
            wait_all([w.process for w in idle], 5)
        end_processes([w.process for w in workers], reap_s=10)
        for w in workers:
            self._discard(w)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None)

    # -- the loop
    def run(self, tasks: Iterable[Task], on_result: Callable[[str, Result], None], on_start: Callable[[str], None] | None = None) -> None:
        """Analyse every task; ``on_result(key, result)`` is called once per task, in completion order."""
        source_iter = iter(tasks)
        exhausted = False
        pending: deque[Task] = deque()
        while True:
            free = sum(w.state in ("idle", "starting") for w in self.workers) + (self.jobs - len(self.workers))
            while not exhausted and len(pending) < free:
                try:
                    pending.append(next(source_iter))
                except StopIteration:
                    exhausted = True
            waiting = sum(w.state in ("idle", "starting") for w in self.workers)
            while len(pending) > waiting and len(self.workers) < self.jobs:
                self._spawn()
                waiting += 1
            for w in self.workers:
                if w.state == "idle" and pending:
                    task = pending.popleft()
                    key = task[0]
                    try:
                        w.conn.send(task)
                    except (OSError, ValueError):  # broken pipe: the worker just died
                        pending.appendleft(task)
                        w.state = "dead"
                        continue
                    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable source
                        on_result(key, {"error": f"cannot send to a worker: {type(exc).__name__}: {exc}", "cacheable": False})
                        continue
                    w.state, w.key = "busy", key
                    w.task_started = time.monotonic()
                    w.deadline = w.task_started + self.timeout
                    if on_start:
                        on_start(key)
            for w in [w for w in self.workers if w.state == "dead"]:
                self._discard(w)
            if not self.workers and not pending and exhausted:
                return
            if not any(w.state == "busy" for w in self.workers) and not pending and exhausted:
                return
            self._check_cancelled()
            self._wait_and_handle(on_result, pending)
            self._check_cancelled()

    def _wait_and_handle(self, on_result, pending: deque) -> None:
        now = time.monotonic()
        deadlines = [w.deadline if w.state == "busy" else w.started + self.start_timeout for w in self.workers if w.state in ("busy", "starting")]
        timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
        handles = {}
        for w in self.workers:
            handles[w.conn] = w
            handles[w.process.sentinel] = w
        ready = wait(list(handles), timeout=min(timeout, 5.0))
        seen: set[int] = set()
        for handle in ready:
            w = handles[handle]
            if id(w) in seen:
                continue
            seen.add(id(w))
            self._service(w, on_result)
        now = time.monotonic()
        for w in list(self.workers):
            if w.state == "busy" and now >= w.deadline:
                self._discard(w)
                on_result(w.key, {"error": f"timed out after {self.timeout:g} s (worker killed)", "cacheable": False})
            elif w.state == "starting" and now >= w.started + self.start_timeout:
                self._discard(w)
                self._start_failed(w, f"did not start within {self.start_timeout:g} s")

    def _service(self, w: _Worker, on_result) -> None:
        eof = False
        while True:
            try:
                if not w.conn.poll():
                    break
                message = w.conn.recv()
            except (EOFError, OSError):
                eof = True
                break
            if message[0] == "ready":
                w.state = "idle"
                self._start_failures = 0
            elif message[0] == "done":
                w.state, key, w.key = "idle", w.key, None
                w.done += 1
                on_result(key, message[2])
        if not eof and w.process.is_alive():
            return
        wait_all([w.process], 5)
        code = w.process.exitcode
        state, key = w.state, w.key
        self._discard(w)
        if state == "busy":
            on_result(key, {"error": f"worker crashed ({_signal_name(code)}){_crash_detail(w.log)}", "cacheable": False})
        elif state == "starting":
            self._start_failed(w, f"died while starting ({_signal_name(code)})")

    def _start_failed(self, w: _Worker, why: str) -> None:
        self._start_failures += 1
        if self._start_failures >= START_FAILURES_ALLOWED:
            try:
                tail = w.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
            except OSError:
                tail = []
            raise PoolError(f"sweep workers cannot start: {why}" + (": " + " | ".join(tail) if tail else ""))


def instance_ok(result: Result) -> bool:
    """Whether the tiny instance was built and the graph walked (the coverage criterion)."""
    report = result.get("report")
    if not report:
        return False
    state = report.get("analysis") or {}
    return bool(state.get("instance")) and bool(state.get("graph"))
