"""The fence a child process raises around itself before untrusted model code runs.

Standard library only, on purpose: the same file is loaded by path (``load_fence``) into
Python environments that do not have hfcheck installed (the reference environments of
``hfcheck port``, with an old transformers), so every process that runs remote code is
fenced by this one implementation.

- the network is blocked twice: ``socket`` entry points are replaced by functions that
  raise, and an audit hook (``sys.addaudithook``, which Python code cannot remove) refuses
  every socket creation, connect and name lookup;
- once ``strict`` is set (after trusted imports such as torch and transformers), the hook also
  refuses process creation, signals to other processes, and file writes, renames or
  deletions outside the child's own folder;
- CPU time, core dumps and file sizes are limited with ``resource``.

This is defence in depth for an analysis tool, not a security boundary against a determined
attacker with native code (``ctypes``): run untrusted models in a container or VM for that.
"""

from __future__ import annotations

import _socket
import os
import socket
import sys

NET_EVENTS = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
              "socket.sendto", "socket.sendmsg", "socket.getnameinfo", "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect")
PROC_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "os.startfile",
               "ctypes.call_function")
PATH_EVENTS = {  # event -> indices of path arguments
    "os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
    "os.link": (0, 1), "os.symlink": (0, 1), "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.chown": (0,),
    "shutil.copymode": (1,), "shutil.copystat": (1,), "shutil.make_archive": (0,), "shutil.unpack_archive": (1,),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Fence:
    """Audit hook state: the folder writes are allowed in, and what was refused."""

    def __init__(self, root) -> None:
        self.root = os.path.realpath(os.fsdecode(root))
        self.strict = False
        self.blocked: list[str] = []
        self.pid = os.getpid()

    def inside(self, path) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == self.root or real.startswith(self.root + os.sep) or real == os.devnull

    def refuse(self, what: str):
        if len(self.blocked) < 100:
            self.blocked.append(what)
        raise PermissionError(f"hfcheck sandbox: {what} is not allowed")

    def hook(self, event: str, args: tuple) -> None:
        if event.startswith(NET_EVENTS):
            self.refuse(f"network: {event}{_short(args)}")
        if not self.strict:
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS)
            if writing and not self.inside(path):
                self.refuse(f"write outside the sandbox: {os.fsdecode(path) if isinstance(path, (str, bytes)) else path!r}")
        elif event in PATH_EVENTS:
            for i in PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not self.inside(args[i]):
                    self.refuse(f"{event} outside the sandbox: {args[i]!r}"[:300])
        elif event.startswith(PROC_EVENTS):
            self.refuse(f"process: {event}{_short(args)}")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            target = args[0] if args else None
            if target not in (self.pid, 0):
                self.refuse(f"{event} {target!r}")


def _short(args: tuple) -> str:
    return f" {repr(args)[:160]}"


def block_sockets(fence: Fence) -> None:
    def refused(*args, **kwargs):
        fence.refuse(f"network: socket{_short(args)}")

    class BlockedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            fence.refuse(f"network: socket.socket{_short(args)}")

    socket.socket = BlockedSocket  # type: ignore[misc]
    socket.SocketType = BlockedSocket
    _socket.socket = BlockedSocket  # type: ignore[misc]
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "socketpair", "fromfd"):
        if hasattr(socket, name):
            setattr(socket, name, refused)


def limit_resources(cpu_seconds: float, max_file_bytes: int = 512 * 1024 * 1024) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        limit = int(cpu_seconds) + 30
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_CPU, (limit, limit if hard == resource.RLIM_INFINITY else hard))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    except Exception:  # noqa: BLE001, S110 - limits are best effort (not every platform has them)
        pass


def install(root, cpu_seconds: float, max_file_bytes: int = 512 * 1024 * 1024) -> Fence:
    """Raise the fence in this process: limits, the audit hook, blocked sockets. Call
    ``fence.strict = True`` once the trusted imports are done."""
    sys.dont_write_bytecode = True
    limit_resources(cpu_seconds, max_file_bytes)
    fence = Fence(root)
    sys.addaudithook(fence.hook)
    block_sockets(fence)
    return fence


def load_fence_source() -> str:
    """This module's own path (a child in another environment loads it with ``runpy``-free
    ``importlib.util.spec_from_file_location``)."""
    return os.path.abspath(__file__)
