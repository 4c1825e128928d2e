"""``hfcheck verify REF`` and ``attach_proofs`` (for ``hfcheck scan --verify``).

Exit codes follow ``scan``: 0 every claim proven (or not applicable), 1 a proof failed or
could not run, 2 hfcheck could not run (bad reference, unreadable config).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from hfcheck.shared.command import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify", help="prove scan's fusions and parallel plans numerically on a tiny CPU instance")
    parser.add_argument("ref", help="Hub id such as Qwen/Qwen3-4B (optionally @revision) or a local folder with config.json")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--tp-sizes", default="2,4", metavar="N[,N]", help="tensor-parallel sizes to prove (default 2,4)")
    parser.add_argument("--no-parallel", action="store_true", help="prove the fusions only (no worker processes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds a group of workers may run")
    parser.set_defaults(handler=run)
    from hfcheck.analyzer.vllm.release import add_argument as add_vllm_argument

    add_vllm_argument(parser)
    return parser


def _tp_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--tp-sizes {text!r} is not a comma-separated list of integers") from None
    if not sizes or any(s < 2 for s in sizes):
        raise ValueError("--tp-sizes takes sizes >= 2")
    return sizes


def attach_proofs(report: dict[str, Any], analysis, proofs: list | None = None, **options) -> dict[str, Any]:
    """Add ``proofs`` to a scan report (running them unless given) and let failures count: the
    verdict and score are judged again from the checks and the proofs (``analyzer/report/verdict.py``:
    a failed proof counts as a failing check of its impact, so ``native-speed`` becomes ``runs``).
    ``options`` go to ``verify_analysis`` (``tp_sizes``, ``parallel``, ``seed``, ``timeout_s``)."""
    if proofs is None:
        from hfcheck.verify.runner import verify_analysis

        options.setdefault("blocked", report.get("verdict") == "blocked")
        proofs = verify_analysis(analysis, **options)
    from hfcheck.analyzer.report.verdict import judge

    records = [p if isinstance(p, dict) else p.to_dict() for p in proofs]
    report["proofs"] = records
    report["verdict"], report["score"] = judge(report["checks"], records)
    return report


def render_proofs(report: dict[str, Any], console=None) -> None:
    """The proofs section of a text report (``rich``)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    marks = {"proven": ("✓", "green"), "failed": ("✗", "red"), "not_applicable": ("·", "dim"), "error": ("?", "magenta")}
    table = Table(title="Proofs (tiny instance, float32, CPU)", title_justify="left", expand=True)
    table.add_column("", width=1)
    table.add_column("claim", ratio=4)
    table.add_column("rel. error", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    table.add_column("detail", ratio=3, style="dim")
    for p in report.get("proofs", []):
        mark, style = marks.get(p["status"], ("?", "magenta"))
        err = "" if p.get("max_rel_error") is None else f"{p['max_rel_error']:.1e}"
        detail = p.get("detail") or ("" if p["status"] == "proven" else p["status"])
        table.add_row(Text(mark, style=style), Text(p["claim"]), err, f"{p['seconds']:.2f}", Text(detail))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hfcheck.analyzer.facts.errors import FactsError
    from hfcheck.analyzer.sources import SourceError, resolve

    try:
        sizes = _tp_sizes(args.tp_sizes)
        source = resolve(args.ref)
    except (SourceError, ValueError) as exc:
        sys.stderr.write(f"hfcheck: error: {exc}\n")
        return EXIT_ERROR
    from hfcheck.analyzer.scan import scan

    try:
        result = scan(source)
    except FactsError as exc:
        sys.stderr.write(f"hfcheck: error: {args.ref}: {exc}\n")
        return EXIT_ERROR
    analysis, report = result.analysis, result.report
    report = attach_proofs(report, analysis, tp_sizes=sizes, parallel=not args.no_parallel, seed=args.seed, timeout_s=args.timeout)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        from rich.console import Console
        from rich.text import Text

        from hfcheck.analyzer.report.verdict import VERDICT_STYLE

        console = Console()
        model = report["model"]
        head = Text()
        head.append(report["verdict"].upper(), style=VERDICT_STYLE.get(report["verdict"], "bold"))
        head.append(f"  score {report['score']}/100   {model['ref']}  ({model['model_type']})")
        console.print(head)
        render_proofs(report, console)
        from hfcheck.verify.runner import summary

        counts = summary(report["proofs"])
        console.print(", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items() if n), markup=False)
    bad = any(p["status"] in ("failed", "error") for p in report["proofs"])
    return EXIT_FINDINGS if bad else EXIT_CLEAN
