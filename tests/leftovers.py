"""Child processes a test leaves behind: found, killed (with everything they started), reported.

``no_leftover_processes`` is an autouse fixture for the modules that start processes (import
it into the module). After each test, every child process of the test process still running
is killed together with its descendants and reaped, and the test errors naming them, so one
test that leaks (a hung sweep, a worker nobody killed) cannot fail the tests after it. Before
each test it also clears what an earlier test of another module left, without blaming this one.

multiprocessing's resource tracker is not a leftover: one per process that spawned workers,
it lives as long as that process by design.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest


def _table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) for every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out[int(entry.name)] = (int(fields[1]), fields[0], cmd)
    return out


def is_resource_tracker(cmd: str) -> bool:
    return "multiprocessing.resource_tracker" in cmd


def children(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of the running (not zombie) children of ``pid`` (default: this
    process), the resource tracker left out."""
    me = pid or os.getpid()
    return [(p, cmd) for p, (ppid, state, cmd) in _table().items() if ppid == me and state != "Z" and not is_resource_tracker(cmd)]


def kill_tree(pids: list[int]) -> None:
    """SIGKILL each process and all its descendants; reap the ones that are this process's children."""
    table = _table()
    doomed: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in doomed:
            continue
        doomed.append(pid)
        todo += [p for p, (ppid, _, _) in table.items() if ppid == pid]
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leftover_processes():
    earlier = children()
    if earlier:
        kill_tree([pid for pid, _ in earlier])
    yield
    left = children()
    if left:
        kill_tree([pid for pid, _ in left])
        pytest.fail("left running (now killed): " + "; ".join(f"{pid} {cmd[:160]}" for pid, cmd in left), pytrace=False)
