"""The one way to scan: a reference (Hub id[@revision], local folder) or a resolved source ->
facts -> tiny instance -> graph -> rules -> report. ``hfcheck scan``, ``hfcheck verify``, the
sweep (and so the TUI), port and its re-scans, serve and the runtime batches all call ``scan``; the
stages stay importable for tests and benchmarks that time them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hfcheck.analyzer.analysis import Analysis, analyse
from hfcheck.analyzer.report import build_report
from hfcheck.analyzer.sources import ModelSource, resolve


@dataclass
class Scan:
    analysis: Analysis  # the raw facts and observations (verify's proofs and --graph read them)
    report: dict[str, Any]  # the stable JSON report (schema in analyzer/report/scan.schema.json)


def scan(ref: str | ModelSource, *, trust_remote_code: bool = False, sandbox_timeout: float = 120.0) -> Scan:
    """Resolve ``ref`` (a ``ModelSource`` is taken as resolved), analyse it and build its report.
    Raises ``SourceError`` for a reference that cannot be read and ``FactsError`` for a config
    that cannot describe a model; remote code runs only in the sandbox, only when trusted."""
    source = ref if isinstance(ref, ModelSource) else resolve(str(ref))
    analysis = analyse(source, trust_remote_code=trust_remote_code, sandbox_timeout=sandbox_timeout)
    return Scan(analysis, build_report(analysis))
