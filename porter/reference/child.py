"""The reference run: the original remote code, executed in its own transformers release.

Runs as ``<reference env python> -I child.py ROOT`` (standard library, torch and that
environment's transformers only: hfcheck is not installed there). Before any remote code is
imported it loads hfcheck's fence by path (``job["fence"]``) and raises it: no network, no
processes, no writes outside ROOT.

It reads ``ROOT/job.json`` and writes ``ROOT/result.json`` (observations) and
``ROOT/tensors.safetensors``:

- builds the original model from the staged package (``ROOT/orig/<package>``) with the job's
  config at float32, fills every parameter with seeded random values (or, in ``checkpoint``
  mode, with the real tensors of a checkpoint, truncated to the first layers and vocabulary
  rows the job names), and saves that state dict;
- records the module tree (classes, parameter and buffer shapes, scalar attributes such as
  ``eps``, small buffers such as ``inv_freq``), the order in which modules are called, and the
  source lines of the remote code that the forward pass executed;
- runs a forward pass on the job's token ids (logits and each decoder layer's output), and a
  short greedy ``generate`` with the original's own cache;
- optionally builds the full-size model on the meta device to report the real shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from typing import Any

PACKAGE = "hfcheck_ref_original"


def _load_by_path(name: str, module_name: str):
    """A helper module next to this file (hfcheck is not installed in the reference env)."""
    spec = importlib.util.spec_from_file_location(module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), name))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_fence(path: str):
    spec = importlib.util.spec_from_file_location("hfcheck_fence", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the fence from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _remote_frame(exc: BaseException, package_dir: str) -> dict | None:
    """The innermost frame of the traceback that is in the remote code: file and line."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith(package_dir):
            found = {"file": os.path.relpath(frame.filename, package_dir), "line": frame.lineno, "code": (frame.line or "")[:200]}
    return found


def _scalars(module) -> dict:
    out = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, bool) or (isinstance(value, (int, float, str)) and not isinstance(value, bool)):
            if isinstance(value, str) and len(value) > 80:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            out[key] = value
        elif isinstance(value, (tuple, list)) and len(value) <= 8 and all(isinstance(v, (int, float)) for v in value):
            out[key] = list(value)
    return out


def describe_modules(model, torch) -> list[dict]:
    entries = []
    for name, module in model.named_modules():
        params = {n: list(p.shape) for n, p in module.named_parameters(recurse=False)}
        buffers = {}
        small = {}
        persistent = set(getattr(module, "_buffers", {})) - set(getattr(module, "_non_persistent_buffers_set", set()))
        for n, b in module.named_buffers(recurse=False):
            if b is None:
                continue
            buffers[n] = list(b.shape)
            if b.dim() == 1 and b.numel() <= 4096 and b.is_floating_point() and b.device.type != "meta":
                small[n] = [float(v) for v in b.detach().float().tolist()]
        for attr, value in vars(module).items():  # a rotary table kept as a plain attribute (not a buffer)
            if attr == "inv_freq" and isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() <= 4096 and value.is_floating_point():
                small.setdefault(attr, [float(v) for v in value.detach().float().tolist()])
        entry = {"name": name, "class": type(module).__name__, "module": type(module).__module__.replace(PACKAGE + ".", ""),
                 "params": params, "buffers": buffers, "persistent": sorted(n for n in buffers if n in persistent),
                 "small_buffers": small, "scalars": _scalars(module), "children": [n for n, _ in module.named_children()]}
        linear = _linear_shape(module, torch)
        if linear:
            entry["linear"] = linear
        if isinstance(module, torch.nn.Embedding):
            entry["embedding"] = {"num": module.num_embeddings, "dim": module.embedding_dim}
        entries.append(entry)
    return entries


def _linear_shape(module, torch) -> dict | None:
    """``in``/``out``/``bias`` of a linear projection: ``nn.Linear``, or GPT-2's ``Conv1D``
    (weight stored ``[in, out]``, so ``transposed``: a retarget's plan transposes it)."""
    if isinstance(module, torch.nn.Linear):
        return {"in": module.in_features, "out": module.out_features, "bias": module.bias is not None}
    weight = getattr(module, "weight", None)
    if (type(module).__name__ == "Conv1D" and isinstance(getattr(module, "nf", None), int) and isinstance(weight, torch.Tensor)
            and weight.dim() == 2 and weight.shape[1] == module.nf):
        return {"in": int(weight.shape[0]), "out": int(module.nf), "bias": getattr(module, "bias", None) is not None, "transposed": True}
    return None


def _random_state(model, seed: int, torch) -> dict:
    """Seeded random values for every floating-point parameter; a parameter shared by two
    names (tied embeddings) gets one value under both."""
    gen = torch.Generator().manual_seed(seed)
    scales = {f"{m}.{n}" if m else n for m, module in model.named_modules() if not isinstance(module, torch.nn.Linear)
              for n, p in module.named_parameters(recurse=False) if p.dim() == 1 and n in ("weight", "scale", "g", "gamma")}
    by_id: dict = {}
    values: dict = {}
    for key, param in model.named_parameters(remove_duplicate=False):
        if id(param) in by_id:
            values[key] = by_id[id(param)].clone()  # same value, its own storage (safetensors refuses shared memory)
            continue
        if not param.is_floating_point():
            continue
        noise = torch.randn(tuple(param.shape), generator=gen, dtype=torch.float32)
        if key in scales:  # a norm's scale: around 1
            value = 1.0 + 0.1 * noise
        elif param.dim() == 1:
            value = 0.02 * noise
        else:
            value = noise / math.sqrt(max(1, param.shape[-1]))
        by_id[id(param)] = values[key] = value
    return {key: (values[key] if key in values else tensor.clone()) for key, tensor in model.state_dict().items()}


def _checkpoint_reader(folder: str, torch):
    """key -> a function returning that tensor (sliced to a shape): safetensors with
    ``safe_open``, PyTorch pickles with ``weights_only=True`` and ``mmap``."""
    names = sorted(os.listdir(folder))
    index = {}
    if any(n.endswith(".safetensors") for n in names):
        from safetensors import safe_open

        for name in names:
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(folder, name), framework="pt") as f:
                    for key in f.keys():
                        index[key] = ("st", os.path.join(folder, name))
    else:
        for name in names:
            if name.endswith(".bin") and name != "training_args.bin":
                for key in torch.load(os.path.join(folder, name), map_location="cpu", weights_only=True, mmap=True):
                    index[key] = ("pt", os.path.join(folder, name))
    loaded: dict[str, Any] = {}

    def get(key, shape):
        kind, path = index[key]
        if kind == "st":
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                real = f.get_slice(key)
                full = list(real.get_shape())
                if full == list(shape):
                    return f.get_tensor(key)
                if len(full) == len(shape) and all(a >= b for a, b in zip(full, shape)):
                    return real[tuple(slice(0, n) for n in shape)]
                raise ValueError(f"checkpoint tensor {key} has shape {full}, the model wants {list(shape)}")
        if path not in loaded:
            loaded.clear()
            loaded[path] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        value = loaded[path][key]
        if list(value.shape) == list(shape):
            return value
        if value.dim() == len(shape) and all(a >= b for a, b in zip(value.shape, shape)):
            return value[tuple(slice(0, n) for n in shape)]
        raise ValueError(f"checkpoint tensor {key} has shape {list(value.shape)}, the model wants {list(shape)}")

    return index, get


def checkpoint_state(model, folder: str, torch, moved=()) -> tuple[dict, list]:
    """The real tensors of the checkpoint in ``folder`` for every key of ``model``'s state
    dict, sliced to the truncated model's shapes (first rows: the first vocabulary entries;
    only the first layers exist in the truncated model); a tied parameter absent from the
    checkpoint gets its partner's tensor. ``moved``: (model prefix, checkpoint prefix) pairs
    for modules whose index follows the layers (MixFormer's head in the same nn.Sequential).
    Returns (state, keys the checkpoint lacks)."""
    index, get = _checkpoint_reader(folder, torch)
    state = {}
    missing = []
    for key, tensor in model.state_dict().items():
        name = next((theirs + key[len(ours):] for ours, theirs in moved if key.startswith(ours)), key)
        if name not in index:
            missing.append(key)
            continue
        value = get(name, tensor.shape)
        state[key] = value.to(torch.float32) if value.is_floating_point() else value
    for a, b in _tied_pairs(model):
        for have, want in ((a, b), (b, a)):
            if have in state and want in missing:
                state[want] = state[have]
                missing.remove(want)
    return state, missing


def _decoder_layers(model, torch, num_layers: int):
    """(path, the layer modules, index of the first): the shallowest ``ModuleList`` of
    ``num_layers`` modules of one class; else a run of ``num_layers`` modules of one class inside
    an ``nn.Sequential`` (MixFormer keeps embedding, blocks and head in one, the blocks from 1)."""
    if num_layers <= 0:
        return None
    best = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            classes = {type(m).__name__ for m in module}
            if len(classes) == 1 and (best is None or name.count(".") < best[0].count(".")):
                best = (name, list(module), 0)
    if best is not None:
        return best
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential):
            children = list(module)
            for start in range(len(children) - num_layers + 1):
                run = children[start:start + num_layers]
                if len({type(m) for m in run}) == 1 and len(list(run[0].children())) > 1 and all(
                        type(m) is not type(run[0]) for m in children[:start] + children[start + num_layers:]):
                    if best is None or name.count(".") < best[0].count("."):
                        best = (name, run, start)
                    break
    return best


def _repeated_block(model, num_layers: int):
    """The first of the ``num_layers`` instances of one class, when the layers are not a
    ModuleList of their own (MixFormer keeps them in an nn.Sequential between the embedding
    and the head)."""
    if num_layers <= 0:
        return None
    seen: dict[type, list] = {}
    for name, module in model.named_modules():
        seen.setdefault(type(module), []).append((name, module))
    blocks = [found for found in seen.values() if len(found) == num_layers and len(list(found[0][1].children())) > 1]
    if not blocks:
        return None
    return min(blocks, key=lambda found: found[0][0].count("."))[0][1]


def _output(out):
    for name in ("logits",):
        value = getattr(out, name, None)
        if value is not None:
            return value
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _tracer(package_dir: str, lines: dict, on_line=None):
    def local(frame, event, arg):
        if event == "line":
            lines.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
            if on_line is not None:
                on_line(frame)
        return local

    def global_(frame, event, arg):
        if frame.f_code.co_filename.startswith(package_dir):
            lines.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
            return local
        return None

    return global_


@dataclasses.dataclass
class _Run:
    """What the steps of one reference run share: the job, the fence and what they observed."""

    root: str
    job: dict
    fence: Any  # the fence module, loaded by path (hfcheck is not installed here)
    result: dict
    tensors: dict = dataclasses.field(default_factory=dict)
    stage: str = "importing torch and transformers"  # the step under way: an error names it
    shims: Any = None  # gpu_shims, loaded by path when asked for
    t_start: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def package_dir(self) -> str:
        """Where the staged remote package lives: its frames and lines are reported relative to it."""
        return os.path.join(self.root, "orig", PACKAGE)


@dataclasses.dataclass
class _Watch:
    """What observes the forward pass: the decoder layers' outputs, the module calls, the hooks."""

    layers: tuple | None = None
    hidden: dict = dataclasses.field(default_factory=dict)
    calls: list = dataclasses.field(default_factory=list)
    hooks: list = dataclasses.field(default_factory=list)
    recorder: Any = None  # record.DataflowRecorder, loaded by path
    mode: Any = dataclasses.field(default_factory=contextlib.nullcontext)


def _read_job(root: str) -> dict:
    """The parent's job (hfcheck.isolation.jobs names the same file; it cannot be imported here)."""
    with open(os.path.join(root, "job.json"), encoding="utf-8") as f:
        return json.load(f)


def _raise_fence(root: str, job: dict):
    """hfcheck's fence, loaded by path and raised before any remote code is imported."""
    fence_mod = _load_fence(job["fence"])
    return fence_mod.install(root, job.get("cpu_seconds", 600))


def _import_torch(run: _Run):
    """torch and transformers seeded and threaded as the job says; the staged package on the path."""
    import torch
    import transformers

    torch.manual_seed(run.job.get("seed", 0))
    torch.set_num_threads(max(1, int(run.job.get("threads", 1))))
    run.result["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    sys.path.insert(0, os.path.join(run.root, "orig"))
    if run.job.get("gpu_shims"):  # an original that only constructs on a GPU machine (gpu_shims.py)
        run.shims = _load_by_path("gpu_shims.py", "hfcheck_gpu_shims")
        run.shims.install(torch, run.package_dir, run.job["gpu_shims"])
    return torch


def _local_ref(ref: str) -> tuple[str, str]:
    """(module, class) of an auto_map entry, without the ``repo--`` prefix of code kept elsewhere."""
    body = ref.partition("--")[2] if "--" in ref else ref
    module, _, cls = body.rpartition(".")
    return module, cls


def _import_remote(run: _Run):
    """The original's config and model classes, imported from the staged package."""
    auto_map = run.job["auto_map"]
    run.stage = "importing the remote code"
    cfg_mod, cfg_name = _local_ref(auto_map["AutoConfig"])
    cfg_cls = getattr(importlib.import_module(f"{PACKAGE}.{cfg_mod}"), cfg_name)
    mod_name, cls_name = _local_ref(auto_map[run.job["model_key"]])
    model_cls = getattr(importlib.import_module(f"{PACKAGE}.{mod_name}"), cls_name)
    run.result["classes"] = {"config": f"{cfg_mod}.{cfg_name}", "model": f"{mod_name}.{cls_name}"}
    return cfg_cls, model_cls


def _report_full_size(run: _Run, torch, cfg_cls, model_cls) -> None:
    """The full-size model's real shapes and ties, built on the meta device; a failure is reported."""
    run.stage = "building the full-size model on the meta device"
    try:
        meta_cfg = cfg_cls.from_dict(dict(run.job["meta_config"]))
        with empty_weights(torch):
            meta = model_cls(meta_cfg)
        run.result["meta_params"] = {n: list(p.shape) for n, p in meta.named_parameters()}
        run.result["meta_tied"] = _tied_pairs(meta)
        del meta
    except Exception as exc:  # noqa: BLE001 - reported, the proof goes on without it
        run.result["meta_error"] = _first_line(exc)


def _job_config(job: dict, cfg_cls):
    """The original's config from the job's values, with the attention implementation it names."""
    cfg = cfg_cls.from_dict(dict(job["config"]))
    for attr in ("_attn_implementation", "attn_implementation"):
        if job.get("attn_implementation") and hasattr(cfg, attr):
            try:
                setattr(cfg, attr, job["attn_implementation"])
            except Exception:  # noqa: BLE001, S110 - read-only on some releases
                pass
    return cfg


def _build_model(run: _Run, torch, cfg_cls, model_cls):
    """(config, model): float32, or with meta parameters that a checkpoint will assign."""
    run.stage = "building the original model"
    cfg = _job_config(run.job, cfg_cls)
    if run.job["mode"] == "checkpoint":
        with empty_weights(torch, params_only=True):
            model = model_cls(cfg)
        model = model.eval()
    else:
        model = model_cls(cfg).float().eval()
    return cfg, model


def _record_module_tree(run: _Run, torch, cfg, model) -> None:
    """The config as the original left it, its module tree and its tied parameters."""
    run.result["config_after"] = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool, type(None), list, dict))}
    run.result["modules"] = describe_modules(model, torch)
    run.result["tied"] = _tied_pairs(model)


def _load_checkpoint(run: _Run, torch, model) -> None:
    """The checkpoint's real tensors, truncated to the model; every parameter must be there."""
    run.stage = "loading the checkpoint tensors"
    state, missing = checkpoint_state(model, run.job["checkpoint"]["dir"], torch, [tuple(m) for m in run.job["checkpoint"].get("moved") or []])
    params = {n for n, _ in model.named_parameters()}
    absent = [k for k in missing if k in params]
    if absent:
        raise ValueError(f"the checkpoint lacks {len(absent)} parameter(s) of the model, e.g. {absent[:3]}")
    model.load_state_dict(state, strict=False, assign=True)
    model.float()
    run.result["checkpoint_missing"] = missing


def _fill_random(run: _Run, torch, model) -> None:
    """Seeded random weights, also saved as ``state.*`` tensors for the port to load."""
    run.stage = "filling random weights"
    state = _random_state(model, int(run.job.get("seed", 0)), torch)
    model.load_state_dict(state, strict=True)
    for key, value in state.items():
        run.tensors[f"state.{key}"] = value.contiguous()


def _watch_layers(run: _Run, torch, model, watch: _Watch) -> None:
    """Find the decoder layers and keep each one's output, for the layer-by-layer comparison."""
    watch.layers = layers = _decoder_layers(model, torch, int(run.job.get("num_layers", 0)))
    if layers is None:
        return
    run.result["layers_path"] = layers[0]
    if layers[2]:
        run.result["layers_offset"] = layers[2]
    hidden = watch.hidden
    for i, layer in enumerate(layers[1]):
        def keep(_m, _inp, out, i=i):
            value = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(value, torch.Tensor):
                hidden[i] = value.detach().clone()
        watch.hooks.append(layer.register_forward_hook(keep))


def _watch_calls(torch, model, watch: _Watch) -> None:
    """Record the order in which modules are called, with their input shapes."""
    names = {id(m): n for n, m in model.named_modules()}
    calls = watch.calls

    def record(module, inputs):
        shapes = [list(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
        calls.append({"name": names.get(id(module), "?"), "inputs": shapes})

    watch.hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(record))


def _watch_dataflow(run: _Run, torch, model, watch: _Watch) -> None:
    """Record the first decoder layer's dataflow (record.py); without it the port uses patterns."""
    first_layer = watch.layers[1][0] if watch.layers is not None else _repeated_block(model, int(run.job.get("num_layers", 0)))
    if first_layer is not None and run.job.get("dataflow", True):
        try:
            watch.recorder = _load_by_path("record.py", "hfcheck_ref_record").DataflowRecorder(torch, run.package_dir)
            watch.mode, more = watch.recorder.attach(model, first_layer)
            watch.hooks.extend(more)
        except Exception as exc:  # noqa: BLE001 - the run goes on without a dataflow (the port falls back to patterns)
            watch.recorder, watch.mode = None, contextlib.nullcontext()
            run.result["dataflow_error"] = _first_line(exc)


def _watch_forward(run: _Run, torch, model) -> _Watch:
    """Everything that observes the forward pass, attached before it runs."""
    watch = _Watch()
    _watch_layers(run, torch, model, watch)
    _watch_calls(torch, model, watch)
    _watch_dataflow(run, torch, model, watch)
    return watch


def _traced_forward(run: _Run, torch, model, ids, watch: _Watch):
    """(output, executed lines) of the forward pass under the line tracer; the hooks come off after."""
    run.stage = "running the original forward pass"
    lines: dict = {}
    tracer = _tracer(run.package_dir, lines, watch.recorder.on_line if watch.recorder is not None else None)
    t0 = time.perf_counter()
    sys.settrace(tracer)
    try:
        with torch.no_grad(), watch.mode:
            try:
                out = model(input_ids=ids, use_cache=False)
            except TypeError:
                out = model(input_ids=ids)
    finally:
        sys.settrace(None)
        for h in watch.hooks:
            h.remove()
    run.result["stages"]["forward_s"] = round(time.perf_counter() - t0, 3)
    return out, lines


def _record_forward(run: _Run, out, watch: _Watch, lines: dict) -> None:
    """The forward's observations: dataflow, logits, layer outputs, module calls, executed lines."""
    if watch.recorder is not None:
        run.result["dataflow"], values = watch.recorder.result()
        run.tensors.update(values)
    logits = _output(out)
    run.tensors["logits"] = logits.detach().float().contiguous()
    for i, value in watch.hidden.items():
        run.tensors[f"hidden.{i}"] = value.float().contiguous()
    run.result["calls"] = watch.calls[:5000]
    run.result["executed_lines"] = {os.path.relpath(f, run.package_dir): sorted(v) for f, v in lines.items()}


def _has_attention_interface(model) -> bool:
    """Code of the attention-interface era, which can run with more than one implementation."""
    return hasattr(model.config, "_attn_implementation") and getattr(model, "_supports_sdpa", None) is not None


def _run_each_attention(run: _Run, torch, model, ids) -> None:
    """The reference logits for each attention implementation the code has, then its default back."""
    run.stage = "running the original with each attention implementation"
    run.result["attn_default"] = model.config._attn_implementation
    for impl in ("eager", "sdpa"):
        try:
            if hasattr(model, "set_attn_implementation"):
                model.set_attn_implementation(impl)
            else:
                model.config._attn_implementation = impl
            with torch.no_grad():
                run.tensors[f"logits.{impl}"] = _output(model(input_ids=ids, use_cache=False)).detach().float().contiguous()
        except Exception as exc:  # noqa: BLE001 - an implementation the code does not have
            run.result.setdefault("attn_unavailable", {})[impl] = _first_line(exc)
    model.config._attn_implementation = run.result["attn_default"]


def _greedy_without_cache(run: _Run, torch, model, ids) -> None:
    """Greedy tokens from full forward passes, no cache: what the cached generate should give."""
    run.stage = "greedy decoding without a cache"
    seq = ids[:1]
    with torch.no_grad():
        for _ in range(int(run.job["generate_tokens"])):
            try:
                step = _output(model(input_ids=seq, use_cache=False))
            except TypeError:
                step = _output(model(input_ids=seq))
            seq = torch.cat([seq, step[:, -1:].argmax(-1)], dim=1)
    run.result["greedy_no_cache"] = [int(t) for t in seq[0, ids.shape[1]:].tolist()]


def _clear_eos(model) -> None:
    """No EOS in the generation config: 4.x reads eos_token_id=None as "the config's", greedy has none."""
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.eos_token_id = None
        if hasattr(generation, "forced_eos_token_id"):
            generation.forced_eos_token_id = None


def _generate_with_cache(run: _Run, torch, model, ids) -> None:
    """A short greedy generate with the original's own cache; a failure is reported, not fatal."""
    run.stage = "generating with the original's cache"
    _clear_eos(model)
    try:
        with torch.no_grad():
            gen = model.generate(ids[:1], max_new_tokens=int(run.job["generate_tokens"]), do_sample=False, num_beams=1,
                                 pad_token_id=0, eos_token_id=None, use_cache=True)
        run.result["generated"] = [int(t) for t in gen[0, ids.shape[1]:].tolist()]
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        run.result["generate_error"] = _first_line(exc)
        where = _remote_frame(exc, run.package_dir)
        if where:
            run.result["generate_error_at"] = where


def _record_error(run: _Run, exc: BaseException) -> None:
    """What the remote code raised, as the result: the step, the remote line and the traceback."""
    run.result["error"] = f"{run.stage}: {_first_line(exc)}"
    where = _remote_frame(exc, run.package_dir)
    if where:
        run.result["error_at"] = where
    run.result["traceback"] = traceback.format_exc()[-3000:]


def _finish(run: _Run) -> None:
    """The run's time and the GPU shims' report; the fence lowered for the child's own writes."""
    run.result["seconds"] = round(time.perf_counter() - run.t_start, 3)
    if run.shims is not None:
        run.result["gpu_shims"] = run.shims.report()
    run.fence.strict = False


def _save_tensors(run: _Run) -> None:
    """The observed tensors as safetensors; a failure to save is the error if there is none yet."""
    if not run.tensors:
        return
    try:
        from safetensors.torch import save_file

        save_file(run.tensors, os.path.join(run.root, "tensors.safetensors"))
    except Exception as exc:  # noqa: BLE001
        run.result["error"] = run.result["error"] or f"saving the tensors: {_first_line(exc)}"


def _write_result(run: _Run) -> None:
    """The observations for the parent (hfcheck.isolation.jobs names the same file)."""
    with open(os.path.join(run.root, "result.json"), "w", encoding="utf-8") as f:
        json.dump(run.result, f, default=str)


def main() -> None:
    """The reference run, step by step; whatever fails is recorded, and result.json is always written."""
    root = os.path.realpath(sys.argv[-1])
    job = _read_job(root)
    fence = _raise_fence(root, job)
    run = _Run(root, job, fence, {"error": None, "stages": {}, "blocked": fence.blocked})
    try:
        torch = _import_torch(run)
        fence.strict = True  # from here on, remote code runs
        cfg_cls, model_cls = _import_remote(run)
        if job.get("import_only"):
            raise SystemExit(0)
        if job.get("meta_config"):
            _report_full_size(run, torch, cfg_cls, model_cls)
        cfg, model = _build_model(run, torch, cfg_cls, model_cls)
        _record_module_tree(run, torch, cfg, model)
        if job["mode"] == "checkpoint":
            _load_checkpoint(run, torch, model)
        else:
            _fill_random(run, torch, model)
        ids = torch.tensor(job["input_ids"], dtype=torch.long)
        watch = _watch_forward(run, torch, model)
        out, lines = _traced_forward(run, torch, model, ids, watch)
        _record_forward(run, out, watch, lines)
        if _has_attention_interface(model):
            _run_each_attention(run, torch, model, ids)
        if job.get("generate_tokens"):
            _greedy_without_cache(run, torch, model, ids)
            _generate_with_cache(run, torch, model, ids)
        run.stage = "done"
    except SystemExit:
        pass
    except BaseException as exc:  # noqa: BLE001 - whatever the remote code raises is a result
        _record_error(run, exc)
    _finish(run)
    _save_tensors(run)
    _write_result(run)
    sys.stdout.flush()
    os._exit(0)


class empty_weights:
    """Build on the meta device even where the code creates its parameters on a device of its
    own choosing (MPT's ``init_device``): every parameter registered is moved to meta at once,
    so at most one real tensor exists at a time (accelerate's ``init_empty_weights`` idea).
    ``params_only`` keeps buffers real (rotary tables), for a model whose parameters are then
    assigned from a checkpoint."""

    def __init__(self, torch, params_only: bool = False):
        self.torch = torch
        self.params_only = params_only

    def __enter__(self):
        torch = self.torch
        self.device = torch.device("meta") if not self.params_only else None
        if self.device is not None:
            self.device.__enter__()
        self.original = torch.nn.Module.register_parameter

        def register(module, name, param):
            self.original(module, name, param)
            if param is not None and param.device.type != "meta":
                kwargs = dict(param.__dict__)
                kwargs["requires_grad"] = param.requires_grad
                module._parameters[name] = type(param)(module._parameters[name].to("meta"), **kwargs)

        torch.nn.Module.register_parameter = register
        return self

    def __exit__(self, *exc):
        self.torch.nn.Module.register_parameter = self.original
        if self.device is not None:
            self.device.__exit__(*exc)
        return False


def _tied_pairs(model) -> list[list[str]]:
    seen: dict[int, str] = {}
    pairs = []
    for name, param in model.named_parameters(remove_duplicate=False):
        key = id(param)
        if key in seen:
            pairs.append([seen[key], name])
        else:
            seen[key] = name
    return pairs


if __name__ == "__main__":
    main()
