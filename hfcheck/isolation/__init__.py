"""Isolated child processes: ``process.run_child`` starts and reaps them, ``fence`` is what
the child raises around itself before untrusted code runs, ``jobs`` hands a child its work and
reads its result back, ``stop_group`` ends a server. One implementation of each, shared by the
remote-code sandbox, the port's reference run and proofs, the runtime batches and serve."""

from hfcheck.isolation.process import (
    ChildRun,
    child_env,
    die_with_parent,
    end_processes,
    kill_group,
    private_root,
    run_child,
    running,
    stop_group,
    tail,
    wait_all,
)

__all__ = ["ChildRun", "child_env", "die_with_parent", "end_processes", "kill_group", "private_root", "run_child", "running", "stop_group", "tail", "wait_all"]
