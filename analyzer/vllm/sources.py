"""A rule's citation of vLLM's source, resolved to the lines of the release predicted for.

Rules name what they model as ``"<path under vllm/>::<qualified name>"``
(``Rule.vllm_source``); the line is looked up in the release's tables (``sources`` in
``analyzer/data/vllm/<version>/tables.json``, every class, function, method and top-level name
of the files hfcheck models), so ``hfcheck explain`` and a report cite the release they are for,
and a release that moves or removes the code shows in its drill (``scripts/vllm_release_drill.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hfcheck.analyzer.vllm.release import modelled_version, tables


@dataclass(frozen=True)
class Citation:
    path: str  # under the vllm package, e.g. model_executor/models/transformers/base.py
    symbol: str  # qualified name, e.g. Base._get_attn_cls
    version: str
    line: int | None  # None: not in that release

    def __str__(self) -> str:
        where = f"vllm/{self.path}:{self.line}" if self.line else f"vllm/{self.path} (no {self.symbol} in vLLM {self.version})"
        return f"{where} {self.symbol}" if self.line else where


def cite(ref: str, version: str | None = None) -> Citation:
    """``path::Qualified.name`` -> its line in release ``version`` (default: the one predicted for)."""
    version = version or modelled_version()
    path, _, symbol = ref.partition("::")
    entry = (tables(version).get("sources") or {}).get(path) or {}
    return Citation(path, symbol, version, (entry.get("symbols") or {}).get(symbol))


def cite_all(refs: tuple[str, ...], version: str | None = None) -> list[str]:
    return [str(cite(ref, version)) for ref in refs]
