"""Isolated child processes: ``process.run_child`` starts and reaps them, ``fence`` is what
the child raises around itself before untrusted code runs. One implementation of each, shared
by the remote-code sandbox, the port's reference run and the port's proof."""

from hfcheck.isolation.process import (
    ChildRun,
    child_env,
    die_with_parent,
    end_processes,
    kill_group,
    private_root,
    run_child,
    running,
    tail,
    wait_all,
)

__all__ = ["ChildRun", "child_env", "die_with_parent", "end_processes", "kill_group", "private_root", "run_child", "running", "tail", "wait_all"]
