"""``hfcheck tui``: the dashboard over many models.

Wired into ``hfcheck.cli`` by ``add_parser(subparsers)`` and ``run(args) -> exit code``; also
runnable alone as ``python -m hfcheck.tui``.

Exit codes: 0 the dashboard ran and was closed, 2 it could not start (no references, an
unreadable --from file, --author while the Hub cannot be reached): one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_CLEAN, EXIT_ERROR = 0, 2
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
    p.add_argument("--author", action="append", default=[], metavar="NAME", help="the Hub's text-generation models of NAME (needs the Hub; most downloaded first)")
    p.add_argument("--limit", type=int, default=DEFAULT_AUTHOR_LIMIT, metavar="N", help=f"at most N models per --author (default {DEFAULT_AUTHOR_LIMIT})")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the sweep's result cache")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: the CPUs available)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds allowed per model (default 60)")
    p.add_argument("--output-dir", default=".", metavar="DIR", help="where j / m write hfcheck-tui.json / hfcheck-tui.md (default: .)")
    return p


def _fail(message: str) -> int:
    sys.stderr.write(f"hfcheck: error: {message}\n")
    return EXIT_ERROR


def author_refs(author: str, limit: int) -> list[str]:
    """The Hub ids of ``author``'s text-generation models, most downloaded first; TargetError if impossible."""
    from huggingface_hub import constants, list_models
    from huggingface_hub.utils import logging as hf_logging

    from hfcheck.analyzer.sources._base import first_line
    from hfcheck.analyzer.sources.hub import is_unreachable, unreachable_why
    from hfcheck.analyzer.sweep.targets import TargetError

    def unreachable(why: str) -> TargetError:
        return TargetError(f"--author {author}: the Hub cannot be reached ({why}); listing a Hub author needs it (references, --from and --atlas work offline)")

    if constants.is_offline_mode():
        raise unreachable("HF_HUB_OFFLINE=1")
    sys.stderr.write(f"hfcheck tui: listing {author}'s models on the Hub...\n")
    hf_logging.set_verbosity_error()  # one message from us, not one per retry
    try:
        models = list(list_models(author=author, pipeline_tag="text-generation", sort="downloads", limit=limit))
    except Exception as exc:  # noqa: BLE001 - every failure is one line for the user
        if is_unreachable(exc):
            raise unreachable(unreachable_why(exc)) from None
        raise TargetError(f"--author {author}: cannot list the Hub's models: {type(exc).__name__}: {first_line(exc)}") from None
    if not models:
        raise TargetError(f"--author {author}: no text-generation models on the Hub")
    return [m.id for m in models]


def targets_from(args: argparse.Namespace):
    """(targets, scope label); TargetError (one line) when there is nothing to show or a source fails."""
    from hfcheck.analyzer.sweep.targets import (
        TargetError,
        causal_lm_types,
        parse_refs,
        read_ref_file,
    )

    entries = list(args.refs)
    for path in args.from_file:
        entries += read_ref_file(path)
    scope = []
    if args.refs or args.from_file:
        scope.append("references")
    for author in args.author:
        entries += author_refs(author, args.limit)
        scope.append(f"author {author}")
    targets = parse_refs(entries)
    if args.atlas:
        have = {t.key for t in targets}
        targets += [t for t in causal_lm_types() if t.key not in have]
        scope.append("atlas")
    if not targets:
        if args.from_file and not (args.refs or args.author or args.atlas):
            raise TargetError("--from file(s) list no references")
        raise TargetError("nothing to show: give references, --from FILE, --atlas or --author NAME")
    return targets, " + ".join(scope)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.sweep.targets import TargetError

    from hfcheck.analyzer.sweep.cli import pool_args_problem

    if problem := pool_args_problem(args):
        return _fail(problem)
    if args.limit < 1:
        return _fail("--limit must be at least 1")
    try:
        import textual  # noqa: F401
    except ImportError:
        return _fail("hfcheck tui needs Textual: pip install 'hfcheck[tui]' (or pip install textual)")
    try:
        targets, scope = targets_from(args)
    except TargetError as exc:
        return _fail(str(exc))
    from hfcheck.tui.app import Dashboard

    app = Dashboard(targets, jobs=args.jobs, timeout=args.timeout, use_cache=not args.no_cache, output_dir=args.output_dir, scope=scope)
    app.run()
    return EXIT_CLEAN if app.return_code in (None, 0) else int(app.return_code)


def main(argv: list[str] | None = None) -> int:
    """``python -m hfcheck.tui``: the same command without the ``hfcheck`` front end."""
    from hfcheck.cli import _Parser

    parser = _Parser(prog="hfcheck")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_parser(sub)
    args = parser.parse_args(["tui", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except KeyboardInterrupt:
        sys.stderr.write("hfcheck: interrupted\n")
        return 130
