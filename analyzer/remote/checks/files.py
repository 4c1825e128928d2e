"""HFC800: every file ``auto_map`` names was obtained and parses (read with ``ast`` only)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex

# --------------------------------------------------------------------------- HFC800: files parsed


def check_parsed(index: CodeIndex, config: dict, missing: Iterable[str]) -> Iterator[CodeFinding]:
    missing = list(missing)
    for file in index.files.values():
        if file.tree is None:
            yield CodeFinding("HFC800", "fail", file.path, file.error_line, f"{file.path} does not parse ({file.error}); transformers cannot import it either",
                              "Fix the syntax error; the file must be valid Python for the Python version vLLM runs on.")
    for line in missing:
        yield CodeFinding("HFC800", "inconclusive", None, None, f"remote code not available: {line}")
    if not index.files and not missing:
        yield CodeFinding("HFC800", "inconclusive", None, None, "config.json has auto_map but no code file could be read")
    parsed = [f for f in index.files.values() if f.tree is not None]
    if parsed and not missing and len(parsed) == len(index.files):
        yield CodeFinding("HFC800", "pass", None, None, f"read {len(parsed)} remote-code file(s) with ast only (nothing imported or executed): {', '.join(index.files)}")


# --------------------------------------------------------------------------- the codes, documented


class RemoteCodeRead(RemoteCodeRule):
    code = "HFC800"
    name = "remote-code-read"
    impact = "blocker"
    what = "Every file auto_map names (and its relative imports) was obtained and parses as Python; it is read with `ast` only."
    why = (
        "hfcheck never imports remote code unless asked, so every other remote-code check reads the syntax "
        "tree. A file that does not parse fails in transformers too; a file that could not be fetched "
        "(offline, refused path) leaves the remote-code checks without it."
    )
    example = 'auto_map: {"AutoModel": "modeling_x.XModel"} but modeling_x.py is not in the HF cache (HF_HUB_OFFLINE=1)'
    fix = "Make every file auto_map names available (and valid Python); scan online or after `huggingface-cli download`."
    none = None


RULES = (RemoteCodeRead,)
