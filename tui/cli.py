"""``hfcheck tui``: the dashboard over many models.

Wired into ``hfcheck.cli`` by ``add_parser(subparsers)`` and ``run(args) -> exit code``; also
runnable alone as ``python -m hfcheck.tui``.

Exit codes: 0 the dashboard ran and was closed, 2 it could not start (no references, an
unreadable --from file, --author or --hub-search while the Hub cannot be reached, --ray without
Ray): one line on stderr. ``--ray [ADDRESS]`` runs the scans on a Ray cluster (the sweep's
``RayPool``); the dashboard shows them as it shows local ones.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from hfcheck.shared.command import EXIT_CLEAN, fail, module_main
from hfcheck.sweep.cli import add_hub_arguments, add_ray_argument

DEFAULT_AUTHOR_LIMIT = 100


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tui",
        help="interactive dashboard over many models (Textual)",
        description=(
            "A terminal dashboard over many models: every model is analysed in a background worker "
            "process (the sweep's pool and cache), results fill the table live; sort, filter, inspect "
            "one model, re-scan, export the view to JSON or Markdown."
        ),
        epilog=(
            "A reference is a Hub id[@revision], a local folder, or type:<model_type>. Keys: / filter, "
            "v verdict, s sort, S reverse, r re-scan, c cancel, j JSON, m Markdown, q quit, ctrl+p commands."
        ),
    )
    p.add_argument("refs", nargs="*", metavar="REF", help="Hub id[@revision], local folder, or type:<model_type>")
    p.add_argument("--from", dest="from_file", action="append", default=[], metavar="FILE", help="read references from FILE, one per line (# comments)")
    p.add_argument("--atlas", action="store_true", help="every causal-LM model type of the installed transformers (its default config)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the sweep's result cache")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: the CPUs available)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds allowed per model (default 60)")
    p.add_argument("--output-dir", default=".", metavar="DIR", help="where j / m write hfcheck-tui.json / hfcheck-tui.md (default: .)")
    add_hub_arguments(p, DEFAULT_AUTHOR_LIMIT)
    add_ray_argument(p)
    from hfcheck.analyzer.vllm.release import add_argument as add_vllm_argument

    add_vllm_argument(p)
    return p


OFFLINE_HINT = "(references, --from and --atlas work offline)"


def author_refs(author: str, limit: int | None, defaults=None) -> list[str]:
    """The Hub ids of ``author``'s models (text-generation, most downloaded first, unless
    ``defaults`` say otherwise); TargetError if impossible."""
    from hfcheck.sweep.hub import HubQuery, list_refs

    query = replace(defaults or HubQuery(), author=author, limit=limit)
    return list_refs(query, label=f"--author {author}", offline_hint=f"listing a Hub author needs it {OFFLINE_HINT}",
                     announce=f"hfcheck tui: listing {author}'s models on the Hub...")


def targets_from(args: argparse.Namespace):
    """(targets, scope label); TargetError (one line) when there is nothing to show or a source fails."""
    from hfcheck.analyzer.sources.model_types import (
        TargetError,
        atlas_types,
        parse_refs,
        read_ref_file,
    )
    from hfcheck.sweep.cli import hub_defaults
    from hfcheck.sweep.hub import expand

    entries = list(args.refs)
    for path in args.from_file:
        entries += [path] if path.startswith("hub:") else read_ref_file(path)
    scope = []
    if args.refs or args.from_file:
        scope.append("references")
    defaults = hub_defaults(args) if (args.author or args.hub_search or any(e.startswith("hub:") for e in entries)) else None
    if defaults is not None:
        entries = expand(entries, defaults, offline_hint=f"listing the Hub needs it {OFFLINE_HINT}", announce_as="hfcheck tui")
    for query in args.hub_search:
        assert defaults is not None  # a Hub search sets them above
        entries += expand([f"hub:{query}"], defaults, offline_hint=f"a Hub search needs it {OFFLINE_HINT}", announce_as="hfcheck tui")
        scope.append(f"search {query}")
    for author in args.author:
        assert defaults is not None  # an author sets them above
        entries += author_refs(author, defaults.limit, defaults)
        scope.append(f"author {author}")
    targets = parse_refs(entries)
    if args.atlas:
        have = {t.key for t in targets}
        targets += [t for t in atlas_types() if t.key not in have]
        scope.append("atlas")
    if not targets:
        if args.from_file and not (args.refs or args.author or args.atlas):
            raise TargetError("--from file(s) list no references")
        raise TargetError("nothing to show: give references, --from FILE, --atlas or --author NAME")
    return targets, " + ".join(scope)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.sources.model_types import TargetError
    from hfcheck.sweep.cli import pool_args_problem, ray_address

    if problem := pool_args_problem(args):
        return fail(problem)
    address = ray_address(args)
    try:
        import textual  # noqa: F401
    except ImportError:
        return fail("hfcheck tui needs Textual: pip install 'hfcheck[tui]' (or pip install textual)")
    try:
        targets, scope = targets_from(args)
    except TargetError as exc:
        return fail(str(exc))
    from hfcheck.tui.app import Dashboard

    if address is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            return fail("--ray needs Ray: pip install 'hfcheck[ray]'")
        scope += f" · on Ray ({address or 'default address'})"
    app = Dashboard(targets, jobs=args.jobs, timeout=args.timeout, use_cache=not args.no_cache, output_dir=args.output_dir, scope=scope, ray=address)
    app.run()
    return EXIT_CLEAN if app.return_code in (None, 0) else int(app.return_code)


def main(argv: list[str] | None = None) -> int:
    """``python -m hfcheck.tui``: the same command without the ``hfcheck`` front end."""
    return module_main("tui", add_parser, run, argv)
