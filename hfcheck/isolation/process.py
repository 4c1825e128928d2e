"""Run one isolated child process: its own process group, a time limit, a reduced
environment, a private folder, and nothing left behind.

Every place hfcheck runs code it does not trust, or code of another Python environment
(the remote-code sandbox, the port's reference run in an old transformers, the port's proof),
starts it through ``run_child``. The parent waits with ``os.wait4`` so the child's peak RSS
comes back with its exit status (the port publishes it), kills the whole process group on a
timeout, on Ctrl-C and on the way out, and returns a ``ChildRun`` instead of raising.

The worker pools (the sweep's ``WorkerPool``, the proofs' gloo launcher) keep their
``multiprocessing`` children but end them with the same code: ``end_processes`` (SIGTERM with a
grace period if asked, then ``kill_group``, then reap), ``wait_all`` and ``die_with_parent``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEEP_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "SYSTEMROOT", "TZ", "HFCHECK_VLLM")
SUBFOLDERS = ("home", "tmp", "hf_home", "modules", "work")


@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    seconds: float
    peak_rss_bytes: int
    stderr_tail: str
    over_memory: bool = False
    """killed because its resident memory passed ``max_rss_bytes``"""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@contextlib.contextmanager
def private_root(prefix: str) -> Iterator[Path]:
    """A fresh folder (home, tmp, HF caches, work) that is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    try:
        for sub in SUBFOLDERS:
            (root / sub).mkdir()
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child_env(root: Path, threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a child needs and nothing more: no proxies, no tokens, the Hub offline, every
    cache inside ``root``."""
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.update(
        HOME=str(root / "home"),
        TMPDIR=str(root / "tmp"),
        HF_HOME=str(root / "hf_home"),
        HF_MODULES_CACHE=str(root / "modules"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        PYTHONWARNINGS="ignore",
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS=str(max(1, threads)),
        NO_PROXY="*",
    )
    env.update(extra or {})
    return env


def kill_group(proc: subprocess.Popen | Any) -> None:
    """SIGKILL the process group ``proc`` leads (its session, for a ``run_child`` child), else
    ``proc`` alone (a ``multiprocessing.Process`` in its parent's group leads none)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> bool:
    """End a long-running child that leads its own process group (a server started with
    ``start_new_session``): SIGTERM the group so it can shut down cleanly, SIGKILL after ``grace``;
    True when the group is gone. ``run_child``'s jobs are killed outright; a server is asked first."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(proc.pid):
        time.sleep(0.1)
    if group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_alive(proc.pid):
            time.sleep(0.1)
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return not group_alive(proc.pid) and proc.poll() is not None


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id owned by someone else
        return False
    return True


def running(proc: subprocess.Popen | Any) -> bool:
    """Whether ``proc`` (a ``subprocess.Popen`` or a ``multiprocessing.Process``) has not ended."""
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is None
    return proc.is_alive()


def wait_all(procs: Iterable[subprocess.Popen | Any], timeout: float) -> list:
    """Wait (and reap) every process, ``timeout`` seconds for all of them together; returns
    those still running after that."""
    deadline = time.monotonic() + max(0.0, timeout)
    left = []
    for proc in procs:
        if proc.pid is None:  # a multiprocessing.Process that never started
            continue
        remaining = max(0.0, deadline - time.monotonic())
        if isinstance(proc, subprocess.Popen):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(remaining)
        else:
            proc.join(remaining)
        if running(proc):
            left.append(proc)
    return left


def end_processes(procs: Iterable[subprocess.Popen | Any], *, grace_s: float = 0.0, reap_s: float = 10.0) -> list:
    """End and reap child processes (``subprocess.Popen`` or ``multiprocessing.Process``).

    With ``grace_s``, the running ones are first asked to stop (SIGTERM) and given that long,
    all together; whatever still runs then is killed with ``kill_group``; then every one is
    reaped, at most ``reap_s`` seconds all together. Returns those still running (normally none).
    """
    procs = list(procs)
    if grace_s > 0:
        for proc in procs:
            if running(proc):
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        wait_all(procs, grace_s)
    for proc in procs:
        if running(proc):
            kill_group(proc)
    return wait_all(procs, reap_s)


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a child: ask the kernel to SIGKILL this process when its parent (the thread that
    started it) ends (Linux; elsewhere nothing). With ``parent_pid``, a parent already gone
    ends the child now."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _OverMemory(Exception):
    pass


def _reap(proc: subprocess.Popen, deadline: float, max_rss: int | None = None) -> tuple[int | None, int]:
    """Wait for ``proc`` until ``deadline`` with ``wait4``: (exit status or None, peak RSS).
    Raises _OverMemory when ``max_rss`` is given and the child's resident memory passes it."""
    delay = 0.005
    while True:
        if max_rss and _rss(proc.pid) > max_rss:
            raise _OverMemory
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            return (proc.returncode if proc.returncode is not None else -1), 0
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return code, int(usage.ru_maxrss) * 1024
        if time.monotonic() >= deadline:
            return None, 0
        time.sleep(delay)
        delay = min(0.1, delay * 2)


def run_child(argv: Sequence[str], root: Path, *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None,
              stdout_path: Path | None = None, max_rss_bytes: int | None = None) -> ChildRun:
    """Run ``argv`` in its own session under ``root`` and wait at most ``timeout`` seconds
    (and, with ``max_rss_bytes``, while its resident memory stays under that). The process
    group is killed whatever happens (timeout, memory, Ctrl-C, normal exit), so nothing the
    child started outlives the call."""
    start = time.monotonic()
    stderr_path = root / "stderr.txt"
    with open(stderr_path, "ab") as stderr, open(stdout_path or os.devnull, "ab") as stdout:
        proc = subprocess.Popen(list(argv), cwd=cwd or (root / "work"), env=env if env is not None else child_env(root),
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True, close_fds=True)
        code: int | None = None
        rss = 0
        over = False
        try:
            code, rss = _reap(proc, start + timeout, max_rss_bytes)
        except _OverMemory:
            over = True
        finally:
            kill_group(proc)  # also ends anything the child left behind in its group
            if code is None:
                with contextlib.suppress(ChildProcessError):
                    _, _, usage = os.wait4(proc.pid, 0)
                    rss = int(usage.ru_maxrss) * 1024
    return ChildRun(code, code is None and not over, round(time.monotonic() - start, 2), rss, tail(stderr_path), over)
