"""The ``hfcheck`` command: parse arguments, run the analysis, render, set the exit code.

Exit codes (Ruff/Semgrep convention): 0 no failing check, 1 failing checks (or score
under --fail-under), 2 the tool could not run (bad reference, bad config, bad usage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from hfcheck.shared.command import EXIT_CLEAN, EXIT_ERROR, Parser, fail, interrupted


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hfcheck", description="Will vLLM's transformers backend load, fuse and shard this model? Answered on CPU, without weights.")
    from hfcheck import __version__

    parser.add_argument("--version", action="version", version=f"hfcheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    scan = sub.add_parser("scan", help="analyse one model (Hub id[@revision] or local folder)")
    scan.add_argument("ref", help="Hub id such as Qwen/Qwen3-4B (optionally @revision) or a local folder with config.json")
    scan.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text")
    scan.add_argument("--policy", metavar="FILE", help="policy file (TOML or YAML): which checks enforce, which are ignored, fail-under")
    scan.add_argument("--cross-check", action="store_true", help="also ask the installed vLLM's own code (0.33.x) and report agreement")
    scan.add_argument("--fail-under", type=int, default=None, metavar="N", help="exit 1 when the score is below N")
    scan.add_argument("--verbose", "-v", action="store_true", help="also list passing checks")
    scan.add_argument("--graph", metavar="FILE", help="write the module dependency graph (networkx) as GraphML")
    from hfcheck.analyzer.vllm.release import add_argument as add_vllm_argument

    add_vllm_argument(scan)
    scan.add_argument("--verify", action="store_true", help="also prove the fusions and parallel plans numerically on CPU")
    scan.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="build auto_map models in a sandboxed subprocess (time limit, no network, no writes outside a temp folder)",
    )
    explain = sub.add_parser("explain", help="print the documentation of a check code")
    explain.add_argument("code", nargs="?", help="e.g. HFC201")
    explain.add_argument("--all", action="store_true", help="every check, in order")
    sub.add_parser("schema", help="print the JSON Schema of `scan --format json`")
    from hfcheck.sweep.cli import add_parser as add_sweep_parser

    add_sweep_parser(sub)
    from hfcheck.verify.cli import add_parser as add_verify_parser

    add_verify_parser(sub)
    from hfcheck.tui.cli import add_parser as add_tui_parser

    add_tui_parser(sub)
    from hfcheck.porter.cli import add_parser as add_port_parser

    add_port_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from hfcheck.analyzer.vllm.release import UnsupportedRelease, choose

    try:
        choose(getattr(args, "vllm", None), getattr(args, "platform", None), getattr(args, "transformers", None))
    except UnsupportedRelease as exc:
        return fail(str(exc))
    if hasattr(args, "vllm"):  # a command that predicts: it runs with the transformers of its target
        code = _in_target_environment(argv)
        if code is not None:
            return code
    try:
        if args.command == "scan":
            return _scan(args)
        if args.command == "explain":
            return _explain(args)
        if args.command in ("port", "serve"):
            from hfcheck.porter.cli import run as run_port

            return run_port(args)
        if args.command == "tui":
            from hfcheck.tui.cli import run as run_tui

            return run_tui(args)
        if args.command == "verify":
            from hfcheck.verify.cli import run as run_verify

            return run_verify(args)
        if args.command == "sweep":
            from hfcheck.sweep.cli import run as run_sweep

            return run_sweep(args)
        if args.command == "schema":
            from hfcheck.analyzer.report import schema

            print(json.dumps(schema(), indent=2))
            return EXIT_CLEAN
    except KeyboardInterrupt:
        return interrupted()
    return EXIT_ERROR


def _in_target_environment(argv: list[str]) -> int | None:
    """Run the command again in the analysis environment of its target when this one imports
    another transformers release (None: this environment is the target's)."""
    from hfcheck.analyzer.vllm import target as T

    needed = T.environment_needed()
    if needed is None:
        return None
    _, how = T.wanted_transformers()
    import subprocess

    from hfcheck.analyzer.vllm.release import TRANSFORMERS_ENV, modelled_version
    from hfcheck.shared.environments import EnvError, ensure_analysis_env

    version = modelled_version()
    try:
        python = ensure_analysis_env(needed, log_fn=lambda message: sys.stderr.write(f"hfcheck: {message}\n"))
    except EnvError as exc:
        return fail(f"vLLM {version} runs transformers {needed} (its pin: transformers{T.pin_of(version)}), and its environment could not "
                     f"be built: {exc} (--transformers installed analyses with transformers {T.installed_transformers()} instead)")
    env = {**os.environ, TRANSFORMERS_ENV: needed, T.SOURCE_ENV: how if how == "chosen" else "environment"}
    try:
        return subprocess.run([str(python), "-m", "hfcheck", *argv], env=env, check=False).returncode
    except KeyboardInterrupt:
        return interrupted()


def _scan(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.facts.errors import FactsError
    from hfcheck.analyzer.report.policy import DEFAULT_POLICY, PolicyError, load_policy
    from hfcheck.analyzer.sources import SourceError, resolve

    try:
        policy = load_policy(args.policy) if args.policy else DEFAULT_POLICY
    except PolicyError as exc:
        return fail(str(exc))
    try:
        source = resolve(args.ref)
    except SourceError as exc:
        return fail(str(exc))
    from hfcheck.analyzer.scan import scan

    try:
        result = scan(source, trust_remote_code=args.trust_remote_code)
    except FactsError as exc:
        return fail(f"{args.ref}: {exc}")
    analysis, report = result.analysis, result.report
    if args.verify:
        from hfcheck.verify.cli import attach_proofs

        report = attach_proofs(report, analysis)
    if args.cross_check:
        from hfcheck.analyzer.analysis.crosscheck import cross_check, summary_line

        report["cross_check"] = cross_check(analysis, report)
        if not report["cross_check"]["available"]:
            sys.stderr.write(summary_line(report["cross_check"]) + "\n")
    if args.policy:
        report = policy.apply(report)
    if args.graph:
        if analysis.observations is None:
            return fail(f"no graph to write: {analysis.instance_error}")
        import networkx as nx

        try:
            nx.write_graphml(analysis.observations.graph, args.graph)
        except OSError as exc:
            return fail(f"cannot write {args.graph}: {exc.strerror}")
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "sarif":
        from hfcheck.analyzer.render.sarif import render_sarif

        print(json.dumps(render_sarif(report), indent=2))
    elif args.format == "github":
        from hfcheck.analyzer.render.github import render_github

        sys.stdout.write(render_github(report))
    else:
        from rich.console import Console

        from hfcheck.analyzer.render.text import render_text

        console = Console()
        render_text(report, console, verbose=args.verbose)
        if args.verify:
            from hfcheck.verify.cli import render_proofs

            render_proofs(report, console)
        if report.get("cross_check", {}).get("available"):
            from hfcheck.analyzer.analysis.crosscheck import render_cross_check_text

            render_cross_check_text(report["cross_check"], console)
    return policy.exit_code(report, args.fail_under)


def _explain(args: argparse.Namespace) -> int:
    from hfcheck.analyzer.rules.registry import BY_CODE, RULES

    if args.all or not args.code:
        print("\n\n".join(rule.documentation() for rule in RULES))
        return EXIT_CLEAN
    rule = BY_CODE.get(args.code.upper())
    if rule is None:
        return fail(f"unknown check code {args.code!r}; `hfcheck explain --all` lists them")
    print(rule.documentation())
    return EXIT_CLEAN
