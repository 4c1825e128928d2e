"""Prove a rewrite: the ported remote code, in the current transformers, reproduces the
original as it ran in its own release (the reference run).

The reference run (``porter/reference``) already holds the original's seeded random weights,
its logits on the proof's token ids, and its greedy tokens with its own cache. Here the port's
weight rules convert those weights, and a fenced child (the remote-code fence, the one
isolated-process runner) loads the ported classes the way vLLM and ``from_pretrained`` do
(``auto_map``, ``trust_remote_code``), once per attention implementation (``eager`` and
``sdpa``), loads the converted weights *strictly* (a missing or extra tensor fails the proof),
and returns its logits and its greedy tokens. The parent compares: max |a - b| / max |a| must
stay under 1e-4 (float32) and the greedy token must agree at every position.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hfcheck.isolation import child_env, private_root
from hfcheck.isolation.fence import install
from hfcheck.isolation.jobs import read_job, run_job, write_result
from hfcheck.porter.reference.compare import compare
from hfcheck.porter.rewrite.state import apply_config_edits

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEFAULT_TIMEOUT_S = 300.0
IMPLEMENTATIONS = ("eager", "sdpa")


def prove_rewrite(reference, files: dict[str, str], auto_map: dict[str, Any], rules: list[dict], config_edits: list[dict], defaults: dict,
                  *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Checks of the ported ``files`` against ``reference`` (an ``establish.Reference``)."""
    from safetensors.torch import save_file

    from hfcheck.porter.output.weights import ConvertError, convert_state_dict

    run = reference.run
    ported_config = apply_config_edits(reference.tiny_config, config_edits, defaults)
    try:
        converted = convert_state_dict(run.state, rules, reference.tiny_config, defaults)
    except ConvertError as exc:
        return {"ok": False, "error": f"the weight rules do not apply: {exc}", "checks": []}
    with private_root("hfcheck-port-proof-") as root:
        ported = root / "ported"
        ported.mkdir()
        for name, text in files.items():
            (ported / name).parent.mkdir(parents=True, exist_ok=True)
            (ported / name).write_text(text, encoding="utf-8")
        (ported / "config.json").write_text(json.dumps(ported_config, indent=2), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in converted.items()}, str(root / "weights.safetensors"))
        key = "AutoModelForCausalLM" if "AutoModelForCausalLM" in auto_map else "AutoModel"
        job = {"ported_dir": str(ported), "class_ref": auto_map[key], "ids": reference.input_ids,
               "generate_tokens": len(run.result.get("generated") or run.result.get("greedy_no_cache") or [])}
        bootstrap = "from hfcheck.porter.rewrite.equivalence import child_main; child_main()"
        child, result = run_job([sys.executable, "-I", "-c", bootstrap, str(root)], root, job, timeout=timeout, env=child_env(root, 1))
        if result is None:
            result = {"error": f"the proof process exited with status {child.returncode} and no result"}
        outputs = {}
        if (root / "outputs.safetensors").is_file():
            from safetensors.torch import load_file

            outputs = load_file(str(root / "outputs.safetensors"))
    if child.timed_out:
        result["error"] = f"the proof did not finish within {timeout:g} s (killed)"
    checks = []
    for impl in IMPLEMENTATIONS:
        if f"logits.{impl}" in outputs:
            checks.append({"name": f"random weights, {impl}", **compare(run.logits_for(impl), outputs[f"logits.{impl}"])})
        elif impl in result.get("failed", {}):
            checks.append({"name": f"random weights, {impl}", "ok": False, "detail": result["failed"][impl]})
        elif impl in result.get("unsupported", {}):
            checks.append({"name": f"random weights, {impl}", "ok": True, "skipped": True,
                           "detail": f"not run: the ported class has no {impl} path (the original had none either)"})
    checks.extend(_generate_checks(run.result, result))
    out = {"checks": checks, "seconds": child.seconds, "peak_rss_bytes": child.peak_rss_bytes, "blocked": result.get("blocked", [])}
    if result.get("error"):
        out["error"] = result["error"]
        out["stderr_tail"] = child.stderr_tail[-2000:]
    out["ok"] = not out.get("error") and bool(checks) and all(c["ok"] for c in checks)
    return out


def _generate_checks(original: dict[str, Any], ported: dict[str, Any]) -> list[dict[str, Any]]:
    """The ported model's greedy generate (with its KV cache) against the original's.

    Some originals' own cache is incomplete (a layer list run without the cache, as in models
    that keep extra layers apart): their cached generate then differs from their uncached greedy
    decode. The port is held to the function (the uncached decode) and may also match the
    original's cached tokens; the check says which, and why both are accepted.
    """
    cached, uncached = original.get("generated"), original.get("greedy_no_cache")
    if cached and uncached and len(cached) < len(uncached) and uncached[:len(cached)] == cached:
        cached = None  # stopped early at an end-of-sequence id: a stop, not a cache defect; held to the full decode
    expected = cached or uncached
    if not expected:
        return []
    name = f"greedy generate, {len(expected)} tokens with the KV cache"
    if "generated" not in ported:
        error = ported.get("generate_error")
        return [{"name": name, "ok": False, "detail": error}] if error else []
    got = ported["generated"]
    if cached and uncached and cached != uncached:
        ok = got in (cached, uncached)
        detail = (f"the original's own cached generate {cached} differs from its uncached greedy decode {uncached} "
                  f"(its KV cache is incomplete); ported {got}")
        return [{"name": name, "ok": ok, "detail": detail}]
    return [{"name": name, "ok": got == expected, "detail": "" if got == expected else f"original {expected}, ported {got}"}]


def child_main() -> None:  # pragma: no cover - runs in the child process (covered through prove_rewrite)

    root = Path(sys.argv[-1]).resolve()
    fence = install(root, DEFAULT_TIMEOUT_S * 2)
    job = read_job(root)
    result: dict[str, Any] = {"error": None, "failed": {}}
    outputs: dict[str, Any] = {}
    stage = "starting"
    try:
        import copy

        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoConfig
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        weights = load_file(str(root / "weights.safetensors"))
        fence.strict = True  # from here on, the ported (remote) code runs
        stage = "loading the ported classes"
        ported_dir = job["ported_dir"]
        ref = job["class_ref"].partition("--")[2] if "--" in job["class_ref"] else job["class_ref"]
        cfg = AutoConfig.from_pretrained(ported_dir, trust_remote_code=True, local_files_only=True)
        cls = cast("type[PreTrainedModel]", get_class_from_dynamic_module(ref, ported_dir, local_files_only=True))
        ids = torch.tensor(job["ids"], dtype=torch.long)
        model = None
        for impl in IMPLEMENTATIONS:
            stage = f"building the ported model ({impl})"
            try:
                model = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.float32).float().eval()
            except ValueError as exc:
                if impl == "eager" or "does not support" not in str(exc):
                    raise
                result.setdefault("unsupported", {})[impl] = str(exc).splitlines()[0][:200]
                continue
            keys = set(model.state_dict())
            missing, unexpected = sorted(keys - set(weights))[:5], sorted(set(weights) - keys)[:5]
            if missing or unexpected:
                result["failed"][impl] = f"converted weights do not fit the ported model: missing {missing}, unexpected {unexpected}"
                continue
            model.load_state_dict(weights, strict=True)
            stage = f"running the ported model ({impl})"
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=False)
            outputs[f"logits.{impl}"] = (out.logits if hasattr(out, "logits") else out[0]).float().contiguous()
            result[f"seconds_{impl}"] = round(time.perf_counter() - t0, 3)
        if job.get("generate_tokens") and model is not None and not result["failed"]:
            if "sdpa" in result.get("unsupported", {}):
                model = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32).float().eval()
                model.load_state_dict(weights, strict=True)
            stage = "generating with the ported model's cache"
            if getattr(model, "generation_config", None) is not None:  # eos_token_id=None alone means "the config's": no EOS stop
                model.generation_config.eos_token_id = None
            try:
                with torch.no_grad():
                    gen = model.generate(ids[:1], max_new_tokens=int(job["generate_tokens"]), do_sample=False, num_beams=1, pad_token_id=0,
                                         eos_token_id=None, use_cache=True)
                result["generated"] = [int(t) for t in gen[0, ids.shape[1]:].tolist()]
            except Exception as exc:  # noqa: BLE001 - a failed generate is a failed check
                result["generate_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        fence.strict = False
        if outputs:
            save_file(outputs, str(root / "outputs.safetensors"))
    except BaseException as exc:  # noqa: BLE001 - whatever the model code raises is a result
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        result["error"] = f"{stage}: {type(exc).__name__}: {first}".rstrip(": ")
    result["blocked"] = list(fence.blocked)
    fence.strict = False
    write_result(root, result)
    os._exit(0)
