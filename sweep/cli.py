"""``hfcheck sweep``: analyse many models at once; with no references, every causal-LM type.

Wired into ``hfcheck.cli`` by ``add_parser(subparsers)`` and ``run(args) -> exit code``; also
runnable alone as ``python -m hfcheck.sweep``.

Models can also come from the Hub (``--hub-search``, ``--author``, ``hub:QUERY`` entries: see
``hub``), and the workers can run on a Ray cluster (``--ray [ADDRESS]``: see ``ray_pool``).

Exit codes: 0 the sweep ran (failed analyses are results: listed, never hidden), 2 it could
not run (bad usage, unreadable --from file, a Hub query that fails, workers that cannot start,
a Ray cluster that cannot be reached), 130 interrupted
(Ctrl-C: workers are killed, finished results are printed and the atlas is written).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import cast

from hfcheck.shared.command import EXIT_CLEAN, EXIT_INTERRUPTED, fail


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        help="analyse many models; with no references, every causal-LM, image-text-to-text and encoder (pooling) type of the installed transformers",
        description=(
            "Analyse many models, each in a worker process under a time limit, with results cached. "
            "With no references: every causal-LM model type of the installed transformers, every "
            "image-text-to-text type outside it, and every encoder (masked-LM) type as the embedding model "
            "vLLM's pooling runner serves, each from its default config, and write the atlas "
            "(reports/atlas-vllm-<release>-transformers-<release>.md, one section each)."
        ),
        epilog="A reference is a Hub id[@revision], a local folder, type:<model_type> (a transformers default config) "
               "or pooling:<model_type> (an encoder type's base model, as a pooling model).",
    )
    p.add_argument("refs", nargs="*", metavar="REF", help="Hub id[@revision], local folder, type:<model_type> or pooling:<model_type>")
    p.add_argument("--from", dest="from_file", action="append", default=[], metavar="FILE", help="read references from FILE, one per line (# comments; a 'hub:QUERY' line lists the Hub's models); --from hub:QUERY is one query")
    p.add_argument("--format", choices=("text", "json"), default="text", help="json: {target: scan JSON | {\"error\": ...}}")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: the CPUs available)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds allowed per model (default 60)")
    p.add_argument("--atlas", default=None, metavar="PATH", help="write the atlas markdown here (default for a full sweep: reports/atlas-vllm-<release>-transformers-<release>.md)")
    p.add_argument("--no-atlas", action="store_true", help="do not write the atlas")
    add_hub_arguments(p, DEFAULT_HUB_LIMIT)
    add_ray_argument(p)
    from hfcheck.analyzer.vllm.release import add_argument as add_vllm_argument

    add_vllm_argument(p)
    return p


DEFAULT_HUB_LIMIT = 1000
RAY_ADDRESS = re.compile(r"^(auto|local|(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+)$")


def add_hub_arguments(p: argparse.ArgumentParser, default_limit: int) -> None:
    """--hub-search / --author and the defaults of every Hub query (shared with ``hfcheck tui``)."""
    hub = p.add_argument_group(
        "models listed by the Hub",
        "A query is words (the search text) and key=value filters: author, pipeline_tag, library, filter (a tag), "
        "sort, limit (or 'all'); e.g. --hub-search 'qwen3 library=transformers limit=200'. --from hub:QUERY, or a "
        "'hub:QUERY' line of a --from file, is one too. Identical configs are analysed once.",
    )
    hub.add_argument("--hub-search", action="append", default=[], metavar="QUERY", help="the Hub's models matching QUERY (needs the Hub)")
    hub.add_argument("--author", action="append", default=[], metavar="NAME", help="the Hub's models of NAME (needs the Hub; most downloaded first)")
    hub.add_argument("--pipeline-tag", default="text-generation", metavar="TAG", help="default pipeline tag of a query (default text-generation; 'any' for none)")
    hub.add_argument("--library", default=None, metavar="NAME", help="default library of a query, e.g. transformers (default: any)")
    hub.add_argument("--sort", default="downloads", metavar="KEY", help="default order of a query: downloads (default), likes, trending_score, created_at, last_modified, none")
    hub.add_argument("--limit", default=default_limit, metavar="N", help=f"default number of models per query (default {default_limit}; 'all' for every match)")


def add_ray_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="run the workers on a Ray cluster (host:port, ray://host:port or auto; alone: $RAY_ADDRESS or a local Ray instance). "
             "Needs hfcheck[ray] here and the same hfcheck on every node",
    )


def ray_address(args: argparse.Namespace) -> str | None:
    """The --ray address (``""``: Ray's default), or None without --ray. ``--ray REF`` with a REF
    that is no address (``--ray Qwen/Qwen3-4B``) is the reference, not the address."""
    address = getattr(args, "ray", None)
    if address and not RAY_ADDRESS.match(address):
        args.refs = [address, *args.refs]
        args.ray = address = ""
    return address


def hub_defaults(args: argparse.Namespace):
    """The defaults of the command's Hub queries; TargetError when one is malformed."""
    from hfcheck.sweep.hub import ANY, HubQuery, limit_value, sort_value

    tag = args.pipeline_tag
    return HubQuery(
        pipeline_tag=None if tag is None or tag.strip().lower() in ANY else tag.strip(),
        library=args.library or None,
        sort=sort_value(args.sort),
        limit=limit_value(args.limit),
    )


def hub_entries(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(``hub:QUERY`` entries of --hub-search and --author, their scope labels)."""
    entries, scope = [], []
    for query in args.hub_search:
        entries.append(f"hub:{query}")
        scope.append(f"search {query}")
    for author in args.author:
        entries.append(f"hub:author={shlex.quote(author)}")
        scope.append(f"author {author}")
    return entries, scope


def pool_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with --jobs / --timeout (shared by every command that runs the pool)."""
    if args.jobs is not None and args.jobs < 1:
        return "--jobs must be at least 1"
    if not args.timeout > 0:
        return "--timeout must be a positive number of seconds"
    return None


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.sources.model_types import TargetError, parse_refs, read_ref_file

    if problem := pool_args_problem(args):
        return fail(problem)
    address = ray_address(args)
    try:
        entries = list(args.refs)
        for path in args.from_file:
            entries += [path] if path.startswith("hub:") else read_ref_file(path)
        listed, _ = hub_entries(args)
        entries += listed
        if any(e.startswith("hub:") for e in entries):
            from hfcheck.sweep.hub import expand

            entries = expand(entries, hub_defaults(args), offline_hint="listing the Hub needs it (references, --from files and type: targets work offline)",
                             announce_as="hfcheck sweep")
        targets = parse_refs(entries)
    except TargetError as exc:
        return fail(str(exc))
    full = not entries
    if full and args.from_file:
        return fail("--from file(s) list no references")
    from hfcheck.sweep.cache import ResultCache
    from hfcheck.sweep.run import atlas_targets, sweep

    cache = ResultCache(enabled=not args.no_cache)
    if full:
        targets = atlas_targets(cache)  # from the cache's type index when it has them: no transformers import

    from rich.console import Console

    from hfcheck.sweep.worker import PoolError

    err = Console(stderr=True)
    progress, on_progress = _progress(err, len(targets))
    try:
        with progress:
            result = sweep(targets, jobs=args.jobs, timeout=args.timeout, cache=cache, on_progress=on_progress, ray=address)
    except PoolError as exc:
        return fail(str(exc))

    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _print_table(result)
    atlas_path = None
    if not args.no_atlas and (full or args.atlas):
        from hfcheck.sweep.atlas import default_path, write_atlas
        from hfcheck.sweep.cache import versions

        atlas_path = write_atlas(result, Path(args.atlas) if args.atlas else default_path(versions()["transformers"]))
    done = len(result.results)
    line = (
        f"hfcheck sweep: {done} of {len(targets)} targets in {result.seconds:.1f} s "
        f"({result.analysed} analysed, {result.from_cache} from cache, {len(result.failed)} failed"
        + (f", {result.deduplicated} answered by an identical config; {result.distinct_configs} distinct configs" if result.deduplicated else "")
        + (f"; on Ray ({result.workers_started} actors)" if address is not None and result.workers_started else "")
        + ")"
    )
    if atlas_path:
        line += f"; atlas: {atlas_path}"
    err.print(line, highlight=False, markup=False, soft_wrap=True)  # one line, whatever its length
    if result.interrupted:
        err.print("hfcheck sweep: interrupted; finished results kept", style="yellow", highlight=False)
        return EXIT_INTERRUPTED
    return EXIT_CLEAN


def _progress(console, total: int):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

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

    from hfcheck.analyzer.report.cells import fusions_cell, tp_cell
    from hfcheck.analyzer.report.verdict import VERDICT_STYLE
    from hfcheck.sweep.atlas import coverage, summary_counts
    from hfcheck.sweep.run import FAILED, failure_reason, instance_error

    table = Table(show_lines=False, expand=False)
    for name in ("target", "verdict", "score", "fusions", "TP", "note"):
        table.add_column(name, overflow="fold")
    for target, res in result.ordered():
        report = res.get("report")
        if report is None:
            table.add_row(target.key, f"[bold red]{FAILED}[/]", "", "", "", cast(str, failure_reason(res)).split(": ", 1)[1])  # no report: a failure
            continue
        note = instance_error(res) or ("; ".join(report.get("blockers") or []))
        style = VERDICT_STYLE.get(report["verdict"], "")
        table.add_row(target.key, f"[{style}]{report['verdict']}[/]" if style else report["verdict"], str(report["score"]), fusions_cell(report), tp_cell(report), note)
    console = Console()
    console.print(table)
    counts = summary_counts(result)
    ok, total = coverage(result)
    console.print(", ".join(f"{k}: {v}" for k, v in counts.items()) + f"; tiny instance + graph: {ok}/{total}", highlight=False)
