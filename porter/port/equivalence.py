"""Prove a port: the original and the ported model give the same logits.

Both models are user code, so they run in a separate, fenced Python process (the same fence
as ``analyzer/remote/sandbox.py``: no network, no process creation, no writes outside a
temporary folder, a time limit, its own process group); hfcheck never imports either. The
child:

1. imports the original package from a staged copy, with ``compat.install`` putting back the
   v4 APIs it needs (the reason it is being ported), and builds it at float32 with the
   original's own attention (``eager``);
2. loads the ported classes the way vLLM and ``from_pretrained`` do (``auto_map``,
   ``trust_remote_code``), once per attention implementation (``eager`` and ``sdpa``);
3. fills the original with seeded random weights, converts its state dict with the port's
   weight rules (``weights.convert_state_dict``) and loads the result *strictly* into each
   ported model, so a missing or extra tensor fails the proof;
4. compares the logits on random token ids: max |a - b| / max |a| must stay under 1e-4
   (float32), and the greedy next tokens must agree;
5. when the source folder has safetensors: loads the original from the source folder and the
   ported model from the output folder (converted weights) with ``from_pretrained``, and
   compares again.
The result comes back as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOLERANCE = 1e-4
ORIGINAL_PACKAGE = "hfcheck_port_original"
DEFAULT_TIMEOUT_S = 300.0


def tiny_config(config: dict[str, Any], max_layers: int = 2) -> dict[str, Any]:
    """The proof's instance: the real widths with at most ``max_layers`` decoder layers."""
    out = dict(config)
    n = out.get("num_hidden_layers")
    if isinstance(n, int) and n > max_layers:
        out["num_hidden_layers"] = max_layers
        for key in ("layer_types", "mlp_only_layers"):
            if isinstance(out.get(key), list) and len(out[key]) == n:
                out[key] = out[key][:max_layers]
    return out


def run_equivalence(source, out_dir: Path | None, files: dict[str, str], rules: list[dict], config_edits: list[dict], defaults: dict,
                    *, real_weights: bool = False, stub_packages: tuple[str, ...] = (), seed: int = 0,
                    timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Run the proof for ``source`` (original) against the ported ``files`` (and ``out_dir``)."""
    from hfcheck.analyzer.remote.sandbox import _child_env, _kill_group, _tail
    from hfcheck.porter.port.state import apply_config_edits

    start = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="hfcheck-port-proof-")).resolve()
    try:
        for sub in ("home", "tmp", "hf_home", "modules", "work"):
            (root / sub).mkdir()
        orig_pkg = root / "orig" / ORIGINAL_PACKAGE
        orig_pkg.mkdir(parents=True)
        (orig_pkg / "__init__.py").write_text("")
        for name, text in source.code_files.items():
            (orig_pkg / name).parent.mkdir(parents=True, exist_ok=True)
            (orig_pkg / name).write_text(text, encoding="utf-8")
        tiny = tiny_config(source.config)
        ported_tiny = apply_config_edits(tiny, config_edits, defaults)
        ported = root / "ported"
        ported.mkdir()
        for name, text in files.items():
            (ported / name).parent.mkdir(parents=True, exist_ok=True)
            (ported / name).write_text(text, encoding="utf-8")
        (ported / "config.json").write_text(json.dumps(ported_tiny, indent=2))
        job = {
            "orig_config": tiny, "ported_dir": str(ported), "rules": rules, "defaults": defaults, "seed": seed,
            "stub_packages": list(stub_packages), "auto_map": source.config.get("auto_map") or {},
            "real": bool(real_weights and out_dir is not None and source.location),
            "src_dir": source.location, "out_dir": str(out_dir) if out_dir is not None else None,
        }
        (root / "job.json").write_text(json.dumps(job))
        env = _child_env(root)
        env["OMP_NUM_THREADS"] = str(max(1, min(8, os.cpu_count() or 1)))
        stderr_path = root / "stderr.txt"
        bootstrap = "from hfcheck.porter.port.equivalence import child_main; child_main()"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, "-I", "-c", bootstrap, str(root)], cwd=root / "work", env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True, close_fds=True)
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except KeyboardInterrupt:
                _kill_group(proc)
                proc.wait()
                raise
            finally:
                _kill_group(proc)
                proc.wait()
        seconds = time.monotonic() - start
        try:
            result = json.loads((root / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = {"error": f"the proof process exited with status {proc.returncode} and no result", "checks": []}
        if timed_out:
            result["error"] = f"the proof did not finish within {timeout:g} s (killed)"
        result["seconds"] = round(seconds, 2)
        if result.get("error"):
            result["stderr_tail"] = _tail(stderr_path, 2000)
        result["ok"] = not result.get("error") and bool(result.get("checks")) and all(c["ok"] for c in result["checks"])
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------- child


def _output(out) -> Any:
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return out[0] if isinstance(out, (tuple, list)) else out


def _compare(name: str, ref, got, seconds: float) -> dict[str, Any]:
    import torch

    ref, got = ref.float(), got.float()
    if ref.shape != got.shape:
        return {"name": name, "ok": False, "detail": f"shapes differ: {tuple(ref.shape)} vs {tuple(got.shape)}", "seconds": round(seconds, 2)}
    diff = (ref - got).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    rel = diff / scale
    same_argmax = float((ref.argmax(-1) == got.argmax(-1)).float().mean().item())
    ok = bool(torch.isfinite(ref).all() and rel <= TOLERANCE and same_argmax == 1.0)
    return {"name": name, "ok": ok, "max_abs_error": diff, "max_rel_error": rel, "argmax_agreement": same_argmax, "seconds": round(seconds, 2)}


def _random_weights(model, seed: int) -> dict:
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters(remove_duplicate=False))
    state = model.state_dict()
    out = {}
    for key, tensor in state.items():
        if key in params and tensor.is_floating_point():
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
            if tensor.dim() == 1 and "norm" in key.lower():
                value = 1.0 + 0.1 * noise
            elif tensor.dim() == 1:
                value = 0.02 * noise
            else:
                value = noise / math.sqrt(max(1, tensor.shape[-1]))
            out[key] = value.to(tensor.dtype)
        else:
            out[key] = tensor
    return out


def _init_buffers(model, config) -> None:
    """vLLM's ``init_buffers``: rebuild each model-code module that owns non-persistent buffers
    from the config and copy them (the original's reference for the real-weights check)."""
    import torch

    for module in model.modules():
        if not getattr(module, "_non_persistent_buffers_set", None) or not type(module).__module__.startswith(ORIGINAL_PACKAGE):
            continue
        try:
            fresh = type(module)(config)
        except Exception:  # noqa: BLE001 - not buildable from the config alone
            continue
        with torch.no_grad():
            for name, buffer in fresh.named_buffers(recurse=False):
                current = getattr(module, name, None)
                if isinstance(current, torch.Tensor) and current.shape == buffer.shape:
                    current.copy_(buffer)


def child_main() -> None:  # pragma: no cover - runs in the child process (covered through run_equivalence)
    from hfcheck.analyzer.remote.sandbox import DEFAULT_TIMEOUT_S as SANDBOX_TIMEOUT
    from hfcheck.analyzer.remote.sandbox import _block_sockets, _Fence, _limit_resources

    root = Path(sys.argv[-1]).resolve()
    sys.dont_write_bytecode = True
    _limit_resources(SANDBOX_TIMEOUT * 10)
    fence = _Fence(root)
    sys.addaudithook(fence.hook)
    _block_sockets(fence)
    job = json.loads((root / "job.json").read_text(encoding="utf-8"))
    result: dict[str, Any] = {"error": None, "checks": [], "shims": []}
    stage = "starting"
    try:
        import copy
        import importlib

        import torch
        import transformers  # noqa: F401
        from transformers import AutoConfig
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        from hfcheck.porter.port import compat
        from hfcheck.porter.port.weights import convert_state_dict

        torch.manual_seed(job["seed"])
        result["shims"] = compat.install(job["stub_packages"])
        fence.strict = True  # from here on, model code runs
        auto_map = job["auto_map"]
        key = "AutoModelForCausalLM" if "AutoModelForCausalLM" in auto_map else "AutoModel"

        def local(ref: str) -> tuple[str, str]:
            body = ref.partition("--")[2] if "--" in ref else ref
            module, _, cls = body.rpartition(".")
            return module, cls

        stage = "importing the original code"
        sys.path.insert(0, str(root / "orig"))
        mod_name, cls_name = local(auto_map[key])
        orig_cls = getattr(importlib.import_module(f"{ORIGINAL_PACKAGE}.{mod_name}"), cls_name)
        cfg_mod, cfg_name = local(auto_map["AutoConfig"])
        orig_cfg_cls = getattr(importlib.import_module(f"{ORIGINAL_PACKAGE}.{cfg_mod}"), cfg_name)
        stage = "building the original model"
        orig_cfg = orig_cfg_cls.from_dict({k: v for k, v in job["orig_config"].items() if k != "auto_map"})

        def build_original(impl):
            try:
                return orig_cls._from_config(copy.deepcopy(orig_cfg), attn_implementation=impl, dtype=torch.float32).float().eval()
            except (TypeError, ValueError, KeyError, ImportError):
                return None

        orig = build_original("eager") or orig_cls(orig_cfg).float().eval()
        weights = _random_weights(orig, job["seed"])
        orig.load_state_dict(weights)
        stage = "converting the random weights"
        ported_weights = convert_state_dict(weights, job["rules"], job["orig_config"], job["defaults"])
        stage = "loading the ported classes"
        ported_dir = job["ported_dir"]
        ported_cfg = AutoConfig.from_pretrained(ported_dir, trust_remote_code=True, local_files_only=True)
        ported_cls = get_class_from_dynamic_module(auto_map[key].rpartition("--")[2] if "--" in auto_map[key] else auto_map[key], ported_dir, local_files_only=True)
        vocab = int(job["orig_config"].get("vocab_size") or 32)
        gen = torch.Generator().manual_seed(job["seed"] + 1)
        ids = torch.randint(0, vocab, (2, 12), generator=gen)
        with torch.no_grad():
            for impl in ("eager", "sdpa"):
                # the same attention backend on both sides (the original's own sdpa path when it has one)
                stage = f"running the original model ({impl})"
                reference = orig if impl == "eager" else build_original(impl)
                label = f"random weights, {impl}"
                if reference is None:
                    reference, label = orig, f"random weights, {impl} (original: eager)"
                else:
                    reference.load_state_dict(weights)
                t0 = time.perf_counter()
                ref = _output(reference(input_ids=ids))
                ref_s = time.perf_counter() - t0
                stage = f"building the ported model ({impl})"
                model = ported_cls._from_config(copy.deepcopy(ported_cfg), attn_implementation=impl, dtype=torch.float32).float().eval()
                try:
                    model.load_state_dict(ported_weights, strict=True)
                except RuntimeError as exc:
                    keys = set(model.state_dict())
                    missing = sorted(keys - set(ported_weights))[:5]
                    unexpected = sorted(set(ported_weights) - keys)[:5]
                    result["checks"].append({"name": label, "ok": False,
                                             "detail": f"converted weights do not fit the ported model: missing {missing}, unexpected {unexpected}" if missing or unexpected else str(exc).splitlines()[0]})
                    continue
                stage = f"running the ported model ({impl})"
                t0 = time.perf_counter()
                got = _output(model(input_ids=ids))
                result["checks"].append(_compare(label, ref, got, ref_s + time.perf_counter() - t0))
                del model
            if job["real"]:
                from transformers import AutoModel, AutoModelForCausalLM

                auto = AutoModelForCausalLM if key == "AutoModelForCausalLM" else AutoModel
                cfg = orig_cfg_cls.from_pretrained(job["src_dir"])
                vocab = int(getattr(cfg, "vocab_size", vocab))
                ids = torch.randint(0, vocab, (2, 12), generator=gen)
                for impl in ("eager", "sdpa"):
                    stage = f"loading the original checkpoint ({impl})"
                    t0 = time.perf_counter()
                    try:
                        orig = orig_cls.from_pretrained(job["src_dir"], config=copy.deepcopy(cfg), dtype=torch.float32, attn_implementation=impl).eval()
                        label = f"real weights (converted checkpoint), {impl}"
                    except (TypeError, ValueError, KeyError, ImportError):
                        if impl != "eager":
                            continue
                        orig = orig_cls.from_pretrained(job["src_dir"], config=copy.deepcopy(cfg), dtype=torch.float32).eval()
                        label = "real weights (converted checkpoint)"
                    _init_buffers(orig, orig.config)  # as vLLM does; from_pretrained leaves custom buffers uninitialised in v5
                    ref = _output(orig(input_ids=ids))
                    del orig
                    stage = f"loading the converted checkpoint ({impl})"
                    model = auto.from_pretrained(job["out_dir"], trust_remote_code=True, dtype=torch.float32, local_files_only=True,
                                                 attn_implementation=impl).eval()
                    got = _output(model(input_ids=ids))
                    del model
                    result["checks"].append(_compare(label, ref, got, time.perf_counter() - t0))
    except BaseException as exc:  # noqa: BLE001 - whatever the model code raises is a result
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        result["error"] = f"{stage}: {type(exc).__name__}: {first}".rstrip(": ")
    result["blocked"] = list(fence.blocked)
    fence.strict = False
    (root / "result.json").write_text(json.dumps(result))
    os._exit(0)
