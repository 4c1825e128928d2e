"""Two logits tensors, the original's and a port's, compared the one way every proof of the
porter compares them: relative error against ``PORT_LOGITS`` and full argmax agreement."""

from __future__ import annotations

from typing import Any

from hfcheck.analyzer.terms.tolerances import PORT_LOGITS


def compare(ref, got) -> dict[str, Any]:
    import torch

    ref, got = ref.float(), got.float()
    if ref.shape != got.shape:
        return {"ok": False, "detail": f"shapes differ: {tuple(ref.shape)} vs {tuple(got.shape)}"}
    diff = (ref - got).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    rel = diff / scale
    argmax = float((ref.argmax(-1) == got.argmax(-1)).float().mean().item())
    ok = bool(torch.isfinite(ref).all() and torch.isfinite(got).all() and rel <= PORT_LOGITS and argmax == 1.0)
    return {"ok": ok, "max_abs_error": diff, "max_rel_error": rel, "argmax_agreement": argmax}
