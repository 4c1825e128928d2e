"""What every ``hfcheck`` command shares: the exit codes and the argument parser.

Exit codes (Ruff/Semgrep convention): 0 clean, 1 findings (failing checks, a refused port,
a score under --fail-under), 2 the tool could not run (bad reference, bad config, bad
usage), 130 interrupted. A usage error is one line on stderr and exit 2, never argparse's
usage dump.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class Parser(argparse.ArgumentParser):
    """``argparse`` with hfcheck's one-line usage errors (exit 2, argparse's own convention)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"hfcheck: error: {message}\n")
        raise SystemExit(EXIT_ERROR)


def fail(message: str) -> int:
    """A command that cannot run: its one line on stderr, and the exit code that says so."""
    sys.stderr.write(f"hfcheck: error: {message}\n")
    return EXIT_ERROR


def interrupted() -> int:
    """Ctrl-C: one line instead of a traceback, and the shell's own code for it."""
    sys.stderr.write("hfcheck: interrupted\n")
    return EXIT_INTERRUPTED


def module_main(command: str, add_parser: Callable[[Any], Any], run: Callable[[argparse.Namespace], int],
                argv: list[str] | None = None) -> int:
    """``python -m hfcheck.<command>``: the same command as ``hfcheck <command>``, with its parser,
    its one-line usage errors and its exit codes, without the ``hfcheck`` front end."""
    parser = Parser(prog="hfcheck")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_parser(sub)
    args = parser.parse_args([command, *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except KeyboardInterrupt:
        return interrupted()
