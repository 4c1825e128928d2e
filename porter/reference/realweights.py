"""The proof on real weights, within 2 GB whatever the model's size.

When the source folder holds a checkpoint, the original runs in its reference environment on
its real tensors and the output model runs on the converted checkpoint written to ``--out``,
both truncated the same way so that no process holds more than the budget:

- the first ``k`` decoder layers (``k`` = 2, or fewer when one layer of float32 weights is
  larger than the budget allows; a single layer that does not fit is reported, not run);
- the first ``rows`` vocabulary entries (embedding and head rows: each logit depends on its
  own head row only, so the truncated logits are the real ones for those tokens).

Each side builds its model with parameters on the meta device and assigns the checkpoint's
tensors (sliced with ``safe_open`` / ``mmap``), so a 20B model costs what two of its layers
cost. The output side is the native class (retarget) or the ported remote code (rewrite,
fenced) loaded from ``--out``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hfcheck.analyzer.instance.shrink import (
    first,
    moved_after_layers,
    set_int_fields,
    truncation,
    within_rows,
)
from hfcheck.isolation import child_env, private_root
from hfcheck.isolation.fence import install
from hfcheck.isolation.jobs import read_job, run_job, write_result
from hfcheck.porter.reference.compare import compare
from hfcheck.porter.reference.run import (
    MEMORY_BUDGET_BYTES,
    Checkpoint,
    RemoteCode,
    RunSpec,
    run_reference,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SEQUENCE = 12


def prove_real_weights(reference, source, out_dir: Path, *, native_config: dict[str, Any] | None = None, class_ref: str | None = None,
                       timeout: float = 600.0) -> dict[str, Any]:
    """One check dict: the truncated original (real tensors, its own release) against the output."""
    run = reference.run
    meta = run.result.get("meta_params") or {}
    layers_path = run.result.get("layers_path") or ""
    full_layers = first(source.config, "layers")
    vocab = first(source.config, "vocab")
    hidden = first(source.config, "hidden")
    name = "real weights (first layers and vocabulary rows of the checkpoint)"
    if not (meta and layers_path and isinstance(full_layers, int) and isinstance(vocab, int) and isinstance(hidden, int)):
        return {"name": name, "ok": False, "skipped": True, "detail": "not run: the full-size shapes of the original are unknown (no meta build)"}
    offset = int(run.result.get("layers_offset") or 0)
    keep, rows, layer_bytes = truncation(meta, layers_path, full_layers, vocab, hidden, offset)
    if keep == 0:
        return {"name": name, "ok": False, "skipped": True,
                "detail": f"not run: one decoder layer is {layer_bytes / 2**30:.1f} GiB in float32, over the proof's budget"}
    truncate = keep < full_layers  # all layers fit: both configs keep their own layer fields
    name = f"real weights ({keep} of {full_layers} layers, first {rows} vocabulary rows)" if truncate else f"real weights (all {full_layers} layers, first {rows} vocabulary rows)"
    original_cfg = within_rows(set_int_fields(set_int_fields(source.config, "layers", keep) if truncate else source.config, "vocab", rows), rows)
    original_cfg = {**original_cfg, **dict.fromkeys(reference.switched_off, False)}  # as the reference ran it (a GPU-only kernel's flag off)
    ids = [[(7 * i + 3 * j + 1) % rows for j in range(SEQUENCE)] for i in range(1 if reference.one_sequence else 2)]
    checkpoint = Checkpoint(str(source.location), tuple(moved_after_layers(meta, layers_path, offset, full_layers, keep)))
    spec = RunSpec(original_cfg, ids, keep, mode="checkpoint", checkpoint=checkpoint, generate_tokens=0, gpu_shims=reference.gpu_shims)
    ref = run_reference(reference.env, RemoteCode(source.code_files, source.config.get("auto_map") or {}), spec, timeout=timeout)
    if not ref.ok:
        return {"name": name, "ok": False, "detail": f"the original on its checkpoint: {ref.error}", "peak_rss_bytes": ref.peak_rss_bytes}
    job: dict[str, Any] = {"out_dir": str(out_dir), "ids": ids, "keep": keep, "rows": rows}
    if native_config is not None:
        cfg = within_rows(dict(native_config), rows)
        cfg["vocab_size"] = rows
        if truncate:
            cfg["num_hidden_layers"] = keep
        job["native_config"] = cfg
    else:
        job["class_ref"] = class_ref
        job["attn"] = ref.result.get("attn_default")  # the same implementation as the original's run
        ported = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
        job["config"] = within_rows(set_int_fields(set_int_fields(ported, "layers", keep) if truncate else ported, "vocab", rows), rows)
    with private_root("hfcheck-real-weights-") as root:
        bootstrap = "from hfcheck.porter.reference.realweights import child_main; child_main()"
        child, result = run_job([sys.executable, "-I", "-c", bootstrap, str(root)], root, job, timeout=timeout, env=child_env(root, 1),
                                max_rss_bytes=MEMORY_BUDGET_BYTES)
        if result is None:
            result = {"error": "the output model's process ended without a result"
                      + (" (over the memory budget)" if child.over_memory else f" (status {child.returncode})")}
        got = None
        if (root / "logits.safetensors").is_file():
            from safetensors.torch import load_file

            got = load_file(str(root / "logits.safetensors"))["logits"]
    peak = max(ref.peak_rss_bytes, child.peak_rss_bytes)
    if result.get("error") or got is None:
        return {"name": name, "ok": False, "detail": f"the output model on the converted checkpoint: {result.get('error')}", "peak_rss_bytes": peak}
    return {"name": name, **compare(ref.logits, got), "peak_rss_bytes": peak}


def child_main() -> None:  # pragma: no cover - runs in the child process (covered through prove_real_weights)

    root = Path(sys.argv[-1]).resolve()
    fence = install(root, 1200)
    job = read_job(root)
    result: dict[str, Any] = {"error": None}
    stage = "starting"
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoConfig, AutoModelForCausalLM

        from hfcheck.porter.reference.child import checkpoint_state, empty_weights

        stage = "building the output model"
        if "native_config" in job:
            cfg_dict = dict(job["native_config"])
            cfg = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "architectures"})
            with empty_weights(torch, params_only=True):
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        else:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            ref = job["class_ref"].partition("--")[2] if "--" in job["class_ref"] else job["class_ref"]
            staged = root / "model"
            staged.mkdir()
            for f in Path(job["out_dir"]).glob("*.py"):
                (staged / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
            (staged / "config.json").write_text(json.dumps(job["config"]), encoding="utf-8")
            fence.strict = True
            cfg = AutoConfig.from_pretrained(str(staged), trust_remote_code=True, local_files_only=True)
            cls = cast("type[PreTrainedModel]", get_class_from_dynamic_module(ref, str(staged), local_files_only=True))
            with empty_weights(torch, params_only=True):
                if job.get("attn"):
                    model = cls._from_config(cfg, attn_implementation=job["attn"], dtype=torch.float32)
                else:
                    model = cls._from_config(cfg, dtype=torch.float32)
        stage = "loading the converted checkpoint"
        state, missing = checkpoint_state(model, job["out_dir"], torch)
        params = {n for n, _ in model.named_parameters()}
        absent = [k for k in missing if k in params]
        if absent:
            raise ValueError(f"the converted checkpoint lacks {absent[:3]}")
        model.load_state_dict(state, strict=False, assign=True)
        model = model.float().eval()
        stage = "running the output model"
        with torch.no_grad():
            out = model(input_ids=torch.tensor(job["ids"], dtype=torch.long), use_cache=False)
        fence.strict = False
        save_file({"logits": (out.logits if hasattr(out, "logits") else out[0]).float().contiguous()}, str(root / "logits.safetensors"))
    except BaseException as exc:  # noqa: BLE001 - reported as the check's result
        first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        result["error"] = f"{stage}: {type(exc).__name__}: {first_line}".rstrip(": ")
    fence.strict = False
    write_result(root, result)
    os._exit(0)
