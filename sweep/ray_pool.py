"""The sweep's worker pool on a Ray cluster: ``RayPool`` runs the same tasks as ``WorkerPool``.

Each of ``jobs`` Ray actors (one CPU each, spread over the nodes) holds a ``WorkerPool`` of one
worker on its node, the sweep's own: the same child process, started the same way, the same
warm-up, the same time limit per model, the same error texts for an exception, a timeout or a
crash, on whichever node it runs. The actor only relays a task and its result; it never runs
an analysis itself, so a model that hangs or kills its worker costs that model's row, the
actor lives on and its pool starts a fresh worker. The driver (this process) keeps what only it
can: the targets, the result cache (results are keyed exactly as a local sweep keys them, so
either reuses the other's), the progress display, the atlas and the JSON.

Before the first task an actor reports its node's transformers, hfcheck and vLLM versions and
the hash of hfcheck's analyzer source; a node that differs from this machine stops the sweep
(``PoolError``): its results would be cached under this machine's keys.

The driver also watches each task: an actor lost with its node (or killed by the system)
records ``worker crashed (Ray actor died: ...)`` for the model it held, and one that has not
answered ``timeout + start_timeout + 60`` s after its task was handed out is killed (its own
pool's time limit should always have answered first).

Test hook (never set by hfcheck): ``HFCHECK_TEST_KILL_ACTOR`` holds result keys whose actor
aborts when handed them, as ``worker.HANG_ENV`` and ``worker.CRASH_ENV`` do for the worker.

Ray is imported only when a ``RayPool`` is made (``hfcheck sweep --ray``); it is the optional
extra ``hfcheck[ray]``. Environment variables the worker reads that a cluster node would not
have (the test hooks ``HFCHECK_TEST_*``, ``TRANSFORMERS_VERBOSITY``) go with the job's runtime
environment; the Hub token never does (workers read nothing from the Hub: the driver resolved
every config before handing it out).

A local Ray instance the sweep starts (``--ray`` alone, nothing running) leaves nothing in the
user's home: Ray turns token authentication on for a new local instance and would write the token
it generates to ``~/.ray/auth_token``, where it stays and puts every later Ray client on the
machine in token mode (a cluster started without authentication then refuses them). The sweep
gives that instance a token of its own in its environment instead (``RAY_AUTH_TOKEN``: this
process, the instance and its workers hold it, nothing else): the same protection, no file.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hfcheck.sweep.worker import START_FAILURES_ALLOWED, PoolError, Result, Stopped, Task

KILL_ACTOR_ENV = "HFCHECK_TEST_KILL_ACTOR"  # test hook, as worker.HANG_ENV: keys whose actor aborts
FORWARDED_ENV_PREFIXES = ("HFCHECK_TEST_",)
FORWARDED_ENV = ("TRANSFORMERS_VERBOSITY", "HFCHECK_VLLM")
DRIVER_SLACK_S = 60.0
POLL_S = 0.5  # how often the loop looks at cancel(), at most


def environment() -> dict[str, Any]:
    """What decides a result's key besides the model (``cache.key_parts`` less the config)."""
    from hfcheck.sweep.cache import analyzer_code_hash, versions

    return {**versions(), "analyzer": analyzer_code_hash()}


class NodeWorker:
    """A Ray actor's body: one ``WorkerPool`` worker on this node, one task at a time."""

    def __init__(self, timeout: float, start_timeout: float) -> None:
        from hfcheck.sweep.worker import WorkerPool

        self.pool = WorkerPool(1, timeout, start_timeout)

    def ready(self) -> dict[str, Any]:
        return {"environment": environment(), "host": socket.gethostname(), "pid": os.getpid()}

    def analyse(self, task: Task) -> Result:
        from hfcheck.sweep.worker import _hooked

        if _hooked(task[0], KILL_ACTOR_ENV):
            os.abort()  # the test hook: this Ray worker process itself dies, with the model it holds
        out: list[Result] = []
        try:
            self.pool.run([task], lambda _key, result: out.append(result))
        except PoolError as exc:
            return {"pool_error": str(exc)}
        return out[0] if out else {"error": "the node's worker returned no result", "cacheable": False}

    def close(self) -> None:
        self.pool.close()


@dataclass
class _Actor:
    handle: Any
    ref: Any  # the pending call: ready() while starting, analyse() while busy
    started: float
    state: str = "starting"  # starting -> idle <-> busy
    key: str | None = None
    deadline: float = 0.0
    host: str = "?"


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "ray::")):
            return line[:300]
    return type(exc).__name__


def _answers(address: str, timeout: float = 5.0) -> None:
    """PoolError at once when nothing listens at a ``host:port`` address (Ray itself would retry
    for minutes); other forms (``auto``, Ray's default) are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise PoolError(f"cannot connect to the Ray cluster at {address}: nothing answers there ({exc.strerror or type(exc).__name__})") from None


def _token_for_a_new_local_instance(address: str) -> None:
    """Where ``ray.init`` will start a new local instance, a token of its own in the environment,
    so that Ray writes none to ``~/.ray/auth_token`` (see the module's docstring). A cluster the
    sweep connects to, and any authentication the user set up (``RAY_AUTH_*``, a token file),
    are left as they are."""
    try:  # Ray's own answers to "where is the token file" and "is a local instance running"
        from ray._private.authentication.authentication_token_setup import _get_default_token_path
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # a Ray without token authentication (or that moved them): nothing to do
        return
    if any(os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")) or _get_default_token_path().exists():
        return
    try:
        # ray annotates addr as str, but documents and handles None (read from the environment)
        if canonicalize_bootstrap_address(address or None) is not None:  # type: ignore[arg-type]
            return  # a running cluster: its own authentication applies
    except Exception:  # noqa: BLE001 - Ray's own connection error follows from ray.init with its message
        return
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_urlsafe(32)


class RayPool:
    """``run(tasks, on_result, on_start)`` and ``close(kill)`` as ``WorkerPool`` has them.

    ``address``: a Ray address (``host:port``, ``ray://host:port``, ``auto``), or ``""`` for
    Ray's own default (``$RAY_ADDRESS``, else a running local instance, else a new one). Ray is
    connected to on the first task, so a sweep the cache answers never touches the cluster.
    ``cancelled`` and ``interrupt()`` serve the dashboard, as ``WorkerPool``'s do.
    """

    def __init__(self, address: str, jobs: int | None, timeout: float, start_timeout: float = 300.0) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise PoolError("--ray needs Ray: pip install 'hfcheck[ray]'") from None
        self.address = address
        self.jobs_wanted = jobs
        self.jobs = jobs or 0  # known once connected
        self.timeout = float(timeout)
        self.start_timeout = max(float(start_timeout), self.timeout)
        self.actors: list[_Actor] = []
        self.started_workers = 0
        self.cancelled: Callable[[], bool] = lambda: False
        self._interrupted = False
        self._connected = False
        self._start_failures = 0
        self._environment: dict[str, Any] | None = None
        self._actor_class: Any = None

    # -- connection
    def _connect(self) -> None:
        if self._connected:
            return
        import ray

        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) or k in FORWARDED_ENV}
        _answers(self.address)
        _token_for_a_new_local_instance(self.address)
        try:
            ray.init(
                address=self.address or None,
                runtime_env={"env_vars": env} if env else None,
                logging_level=logging.ERROR,
                log_to_driver=False,
                include_dashboard=False,
                configure_logging=True,
            )
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
            where = f"at {self.address}" if self.address else "(Ray's default address)"
            raise PoolError(f"cannot connect to the Ray cluster {where}: {type(exc).__name__}: {_first_line(exc)}") from None
        self._connected = True
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self.jobs = max(1, min(self.jobs_wanted or cpus, cpus) if cpus else (self.jobs_wanted or 1))
        self._environment = environment()
        self._actor_class = ray.remote(NodeWorker).options(num_cpus=1, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD")

    def _spawn(self) -> _Actor:
        handle = self._actor_class.remote(self.timeout, self.start_timeout)
        actor = _Actor(handle, handle.ready.remote(), time.monotonic())
        self.actors.append(actor)
        self.started_workers += 1
        return actor

    def _discard(self, actor: _Actor) -> None:
        import ray

        try:
            ray.kill(actor.handle, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - already gone with its node
            pass
        if actor in self.actors:
            self.actors.remove(actor)

    def close(self, kill: bool = False) -> None:
        """Stop every actor (idle ones close their worker first, up to 5 s, unless ``kill``) and
        disconnect from the cluster (a local instance Ray started for this sweep stops with it)."""
        if not self._connected:
            return
        import ray

        try:
            if not kill:
                idle = [a for a in self.actors if a.state == "idle"]
                closing = [a.handle.close.remote() for a in idle]
                if closing:
                    ray.wait(closing, num_returns=len(closing), timeout=5)
            for actor in list(self.actors):
                self._discard(actor)
        finally:
            self.actors.clear()
            ray.shutdown()
            self._connected = False

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None)

    def interrupt(self) -> None:
        """Any thread: make ``run`` stop at its next look (at most ``POLL_S`` later)."""
        self._interrupted = True

    def _check(self) -> None:
        if self._interrupted or self.cancelled():
            self._interrupted = False
            raise Stopped

    # -- the loop
    def run(self, tasks: Iterable[Task], on_result: Callable[[str, Result], None], on_start: Callable[[str], None] | None = None) -> None:
        """Analyse every task; ``on_result(key, result)`` once per task, in completion order."""
        source_iter = iter(tasks)
        exhausted = False
        pending: deque[Task] = deque()
        while True:
            self._check()
            free = sum(a.state in ("idle", "starting") for a in self.actors) + (self.jobs - len(self.actors) if self._connected else 1)
            while not exhausted and len(pending) < max(1, free):
                try:
                    pending.append(next(source_iter))
                except StopIteration:
                    exhausted = True
            if pending and not self._connected:
                self._connect()
                continue
            waiting = sum(a.state in ("idle", "starting") for a in self.actors)
            while len(pending) > waiting and len(self.actors) < self.jobs:
                self._spawn()
                waiting += 1
            for actor in self.actors:
                if actor.state == "idle" and pending:
                    task = pending.popleft()
                    try:
                        actor.ref = actor.handle.analyse.remote(task)
                    except Exception as exc:  # noqa: BLE001 - e.g. a source that cannot be serialised
                        on_result(task[0], {"error": f"cannot send to a worker: {type(exc).__name__}: {_first_line(exc)}", "cacheable": False})
                        continue
                    actor.state, actor.key = "busy", task[0]
                    actor.deadline = time.monotonic() + self.timeout + self.start_timeout + DRIVER_SLACK_S
                    if on_start:
                        on_start(task[0])
            if not pending and exhausted and not any(a.state == "busy" for a in self.actors):
                return
            self._wait_and_handle(on_result)

    def _wait_and_handle(self, on_result: Callable[[str, Result], None]) -> None:
        import ray

        watched = {a.ref: a for a in self.actors if a.state in ("starting", "busy")}
        if not watched:
            return
        now = time.monotonic()
        deadlines = [a.deadline if a.state == "busy" else a.started + self.start_timeout for a in watched.values()]
        ready, _ = ray.wait(list(watched), num_returns=1, timeout=max(0.0, min(min(deadlines) - now, POLL_S)))
        for ref in ready:
            self._service(watched[ref], ref, on_result)
        now = time.monotonic()
        for actor in list(self.actors):
            if actor.state == "busy" and now >= actor.deadline:
                self._discard(actor)
                assert actor.key is not None  # a busy actor holds its task's key
                on_result(actor.key, {"error": f"timed out after {self.timeout:g} s (worker killed)", "cacheable": False})
            elif actor.state == "starting" and now >= actor.started + self.start_timeout:
                self._discard(actor)
                self._start_failed(f"a Ray actor did not start within {self.start_timeout:g} s")

    def _lost(self, actor: _Actor, on_result: Callable[[str, Result], None], when_busy: str, when_starting: str) -> None:
        """An actor gone: its model's row (not cached: the machine's fault), or a failed start."""
        state, key = actor.state, actor.key
        self._discard(actor)
        if state == "busy":
            assert key is not None  # a busy actor holds its task's key
            on_result(key, {"error": when_busy, "cacheable": False})
        else:
            self._start_failed(when_starting)

    def _service(self, actor: _Actor, ref: Any, on_result: Callable[[str, Result], None]) -> None:
        import ray

        try:
            answer = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError) as exc:
            self._lost(actor, on_result, f"worker crashed (Ray actor died on {actor.host}: {_first_line(exc)})",
                       f"a Ray actor died while starting: {_first_line(exc)}")
            return
        except ray.exceptions.RayTaskError as exc:  # a bug in the relay itself
            self._lost(actor, on_result, f"the Ray task failed: {_first_line(exc)}", f"a Ray actor failed while starting: {_first_line(exc)}")
            return
        if actor.state == "starting":
            actor.host = answer.get("host", "?")
            theirs = answer.get("environment")
            if theirs != self._environment:
                diff = ", ".join(f"{k} {theirs.get(k)!r} (here {v!r})" for k, v in (self._environment or {}).items() if (theirs or {}).get(k) != v)
                raise PoolError(f"the Ray node {actor.host} runs another hfcheck environment: {diff}; "
                                "its results would be cached under this machine's keys: install the same versions there")
            actor.state = "idle"
            self._start_failures = 0
            return
        key, actor.state, actor.key = actor.key, "idle", None
        if "pool_error" in answer:
            raise PoolError(f"on the Ray node {actor.host}: {answer['pool_error']}")
        assert key is not None  # an answer comes from a busy actor, which holds its task's key
        on_result(key, answer)

    def _start_failed(self, why: str) -> None:
        self._start_failures += 1
        if self._start_failures >= START_FAILURES_ALLOWED:
            raise PoolError(f"sweep workers cannot start on the Ray cluster: {why}")
