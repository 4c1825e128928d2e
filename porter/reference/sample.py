"""A small copy of a remote-code model folder with a random checkpoint in the original's own
tensor names, made by the original code in its own release: what tests and benchmarks port
when they need real checkpoint files without downloading weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hfcheck.analyzer.instance.shrink import MAX_TINY_HEADS, head_counts, shrink_config
from hfcheck.porter.reference.establish import establish, is_shape_failure


def write_sample(src: Path, dst: Path, *, head_dim: int = 32, layers: int = 2, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """``dst``: ``src``'s files, a shrunk ``config.json`` and ``model.safetensors`` (seeded
    random weights, as the original names and shapes them, stored in ``dtype``)."""
    import torch
    from safetensors.torch import save_file

    from hfcheck.analyzer.sources import resolve

    dst.mkdir(parents=True, exist_ok=False)
    for path in src.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".bin")):
            shutil.copy2(path, dst / path.name)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    heads = head_counts(config)[0]
    for max_heads in dict.fromkeys((MAX_TINY_HEADS, heads if isinstance(heads, int) else MAX_TINY_HEADS)):
        # every head where the code hard-codes a grouping of them (CodeGen2's 8 blocks), as establish() does
        small = shrink_config(config, layers=layers, head_dim=head_dim, max_heads=max_heads)
        (dst / "config.json").write_text(json.dumps(small, indent=2) + "\n", encoding="utf-8")
        reference = establish(resolve(str(dst)), seed=seed, head_dim=head_dim)
        if reference.run.ok or not is_shape_failure(reference.run):
            break
    if not reference.run.ok:
        raise RuntimeError(f"the original does not run: {reference.run.error}")
    params = {f"{m['name']}.{p}" if m["name"] else p for m in reference.run.result["modules"] for p in m["params"]}
    state = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in reference.run.state.items() if k in params}
    for _a, b in reference.run.result.get("tied") or []:
        state.pop(b, None)  # a tied head is not stored twice
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
