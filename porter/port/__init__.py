"""``hfcheck port``: rewrite a remote-code model into one vLLM's transformers backend serves,
prove the rewrite, and write a complete model folder.

- ``codemods``: one libcst codemod per fixable finding (HFC801-813, the tp/pp plans);
- ``weights``: the checkpoint converted tensor by tensor (renames, q/k/v split, expert stacking);
- ``equivalence``: original vs ported logits in a fenced subprocess (random and real weights);
- ``compat``: v4 stand-ins so the original can run as the proof's reference (child only);
- ``orchestrate``: ``port(src, out)`` -> ``PortResult``, PORT.md, port.diff, the re-scan.
"""

from __future__ import annotations

__all__ = ["PortError", "PortResult", "port"]


def __getattr__(name: str):
    if name in __all__:
        from hfcheck.porter.port import orchestrate

        return getattr(orchestrate, name)
    raise AttributeError(name)
