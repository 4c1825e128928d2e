"""``hfcheck sweep``: analyse many models at once; with no references, every causal-LM type.

Wired into ``hfcheck.cli`` by ``add_parser(subparsers)`` and ``run(args) -> exit code``; also
runnable alone as ``python -m hfcheck.analyzer.sweep``.

Exit codes: 0 the sweep ran (failed analyses are results: listed, never hidden), 2 it could
not run (bad usage, unreadable --from file, workers that cannot start), 130 interrupted
(Ctrl-C: workers are killed, finished results are printed and the atlas is written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_CLEAN, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        help="analyse many models; with no references, every causal-LM type of the installed transformers",
        description=(
            "Analyse many models, each in a worker process under a time limit, with results cached. "
            "With no references: every causal-LM model type of the installed transformers, from its "
            "default config, and write the atlas (reports/atlas-transformers-<version>.md)."
        ),
        epilog="A reference is a Hub id[@revision], a local folder, or type:<model_type> (a transformers default config).",
    )
    p.add_argument("refs", nargs="*", metavar="REF", help="Hub id[@revision], local folder, or type:<model_type>")
    p.add_argument("--from", dest="from_file", action="append", default=[], metavar="FILE", help="read references from FILE, one per line (# comments)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="json: {target: scan JSON | {\"error\": ...}}")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: the CPUs available)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds allowed per model (default 60)")
    p.add_argument("--atlas", default=None, metavar="PATH", help="write the atlas markdown here (default for a full sweep: reports/atlas-transformers-<version>.md)")
    p.add_argument("--no-atlas", action="store_true", help="do not write the atlas")
    return p


def _fail(message: str) -> int:
    sys.stderr.write(f"hfcheck: error: {message}\n")
    return EXIT_ERROR


def pool_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with --jobs / --timeout (shared by every command that runs the pool)."""
    if args.jobs is not None and args.jobs < 1:
        return "--jobs must be at least 1"
    if not args.timeout > 0:
        return "--timeout must be a positive number of seconds"
    return None


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.sweep.targets import TargetError, parse_refs, read_ref_file

    if problem := pool_args_problem(args):
        return _fail(problem)
    try:
        entries = list(args.refs)
        for path in args.from_file:
            entries += read_ref_file(path)
        targets = parse_refs(entries)
    except TargetError as exc:
        return _fail(str(exc))
    full = not entries
    if full and args.from_file:
        return _fail("--from file(s) list no references")
    from hfcheck.analyzer.sweep.cache import ResultCache
    from hfcheck.analyzer.sweep.run import causal_lm_targets, sweep

    cache = ResultCache(enabled=not args.no_cache)
    if full:
        targets = causal_lm_targets(cache)  # from the cache's type index when it has them: no transformers import

    from rich.console import Console

    from hfcheck.analyzer.sweep.worker import PoolError

    err = Console(stderr=True)
    progress, on_progress = _progress(err, len(targets))
    try:
        with progress:
            result = sweep(targets, jobs=args.jobs, timeout=args.timeout, cache=cache, on_progress=on_progress)
    except PoolError as exc:
        return _fail(str(exc))

    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _print_table(result)
    atlas_path = None
    if not args.no_atlas and (full or args.atlas):
        from hfcheck.analyzer.sweep.atlas import default_path, write_atlas
        from hfcheck.analyzer.sweep.cache import versions

        atlas_path = write_atlas(result, Path(args.atlas) if args.atlas else default_path(versions()["transformers"]))
    done = len(result.results)
    line = (
        f"hfcheck sweep: {done} of {len(targets)} targets in {result.seconds:.1f} s "
        f"({result.analysed} analysed, {result.from_cache} from cache, {len(result.failed)} failed)"
    )
    if atlas_path:
        line += f"; atlas: {atlas_path}"
    err.print(line, highlight=False, markup=False)
    if result.interrupted:
        err.print("hfcheck sweep: interrupted; finished results kept", style="yellow", highlight=False)
        return EXIT_INTERRUPTED
    return EXIT_CLEAN


def _progress(console, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[current]}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = progress.add_task("sweep", total=total, failed=0, current="")
    state = {"failed": 0}

    def on_progress(event: str, key: str, result) -> None:
        if event == "start":
            progress.update(task, current=key)
            return
        if result is not None and "report" not in result:
            state["failed"] += 1
        progress.update(task, advance=1, failed=state["failed"])

    return progress, on_progress


def _print_table(result) -> None:
    from rich.console import Console
    from rich.table import Table

    from hfcheck.analyzer.render.text import VERDICT_STYLE
    from hfcheck.analyzer.sweep.atlas import _fusions, _tp, coverage, summary_counts
    from hfcheck.analyzer.sweep.run import FAILED, failure_reason, instance_error

    table = Table(show_lines=False, expand=False)
    for name in ("target", "verdict", "score", "fusions", "TP", "note"):
        table.add_column(name, overflow="fold")
    for target, res in result.ordered():
        report = res.get("report")
        if report is None:
            table.add_row(target.key, f"[bold red]{FAILED}[/]", "", "", "", failure_reason(res).split(": ", 1)[1])
            continue
        note = instance_error(res) or ("; ".join(report.get("blockers") or []))
        style = VERDICT_STYLE.get(report["verdict"], "")
        table.add_row(target.key, f"[{style}]{report['verdict']}[/]" if style else report["verdict"], str(report["score"]), _fusions(report), _tp(report), note)
    console = Console()
    console.print(table)
    counts = summary_counts(result)
    ok, total = coverage(result)
    console.print(", ".join(f"{k}: {v}" for k, v in counts.items()) + f"; tiny instance + graph: {ok}/{total}", highlight=False)
