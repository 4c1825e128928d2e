"""Worker processes with a real ``torch.distributed`` gloo group, always cleaned up.

``launch(world, task)`` forks ``world`` workers (they inherit the tiny model and the
reference outputs; nothing is pickled), each joins a gloo group rendezvousing on a free
localhost port, runs ``task(rank, world)`` and sends back its result. The parent waits on
results and process sentinels together: a worker that fails, dies, or outlives the
timeout ends the launch, and every worker still alive is terminated, then killed, in a
``finally`` (so also on Ctrl-C). Workers ask the kernel to kill them if the parent dies.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from hfcheck.isolation.process import die_with_parent, end_processes


class LaunchError(RuntimeError):
    """The workers could not run the task (not a verdict on the claim)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, task: Callable[[int, int], Any], conn, timeout_s: float) -> None:
    die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork; tiny models need none
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else "lo0")
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        result = task(rank, world)
        conn.send(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=6)))
        except Exception:  # noqa: BLE001, S110 - the parent may be gone: nothing to report to
            pass
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - teardown is best effort
            pass
        conn.close()


def _stop(procs: list) -> None:
    end_processes(procs, grace_s=3, reap_s=2)  # SIGTERM, 3 s, then killed and reaped
    for p in procs:
        try:
            p.close()
        except ValueError:
            pass


def launch(world: int, task: Callable[[int, int], Any], timeout_s: float = 120.0, grace_s: float = 5.0) -> list[Any]:
    """``_launch_once``, retried once on a fresh port if another process took the first one."""
    try:
        return _launch_once(world, task, timeout_s, grace_s)
    except LaunchError as exc:
        if "address already in use" not in str(exc).lower():
            raise
    return _launch_once(world, task, timeout_s, grace_s)


def _launch_once(world: int, task: Callable[[int, int], Any], timeout_s: float, grace_s: float) -> list[Any]:
    """Run ``task(rank, world)`` in ``world`` forked gloo workers; their results in rank order.

    A result that is a dict with ``"abort": True`` (a rank whose forward failed) leaves the
    others ``grace_s`` to report (they may be blocked in a collective); missing results are
    ``None``. Raises ``LaunchError`` when a worker raises, dies without a result, or the
    launch outlives ``timeout_s``."""
    ctx = mp.get_context("fork")
    procs: list = []
    readers: dict = {}
    results: list[Any] = [None] * world
    done = [False] * world
    try:
        port = free_port()
        for rank in range(world):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, world, port, task, writer, timeout_s), name=f"hfcheck-verify-{rank}")
            p.start()
            writer.close()
            procs.append(p)
            readers[reader] = rank
        deadline = time.monotonic() + timeout_s
        aborted = False
        while not all(done):
            left = deadline - time.monotonic()
            if left <= 0:
                if aborted:
                    return results
                raise LaunchError(f"workers did not finish within {timeout_s:.0f} s")
            pending = [p.sentinel for r, p in enumerate(procs) if not done[r]]
            for obj in wait(list(readers) + pending, timeout=left):
                if obj not in readers:
                    continue  # a sentinel: its pipe is ready too (result or EOF) and is read below
                conn = cast(Connection, obj)  # one of readers' pipes
                rank = readers.pop(conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = ("error", f"exited (code {procs[rank].exitcode}) without a result", "")
                conn.close()
                if message[0] != "ok":
                    if aborted:
                        done[rank] = True
                        continue
                    raise LaunchError(f"rank {rank}: {message[1]}")
                results[rank], done[rank] = message[1], True
                if isinstance(message[1], dict) and message[1].get("abort") and not aborted:
                    aborted = True
                    deadline = min(deadline, time.monotonic() + grace_s)
            if not readers and not all(done):
                raise LaunchError("a worker exited without a result")
        return results
    finally:
        for reader in readers:
            reader.close()
        _stop(procs)
