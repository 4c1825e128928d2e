"""``--trust-remote-code`` only: build the remote model in a separate, fenced Python process.

The parent (hfcheck) never imports the remote code. It copies ``config.json`` and the code
files into a fresh temporary folder and starts ``sys.executable -I`` there with a time
limit, a new process group, no stdin, and an environment reduced to what Python needs
(no proxies, no tokens, ``HF_HUB_OFFLINE=1``, the HF caches inside the temporary folder).

The child, *before* any remote code is imported:
- blocks the network: ``socket.socket`` / ``socket.create_connection`` / ``getaddrinfo`` are
  replaced by functions that raise, and an audit hook (``sys.addaudithook``, which Python
  code cannot remove) refuses every socket creation, connect and name lookup;
- after importing torch, transformers and hfcheck (trusted), arms the rest of the hook:
  no process creation, no signals to other processes, no file writes, renames or deletions
  outside the temporary folder;
- then loads the config and model classes with ``trust_remote_code=True`` from the folder,
  builds the structural instance on the meta device (``instance.build_structural``) and
  runs ``analysis.observe.observe`` on it, exactly as for a native model.

It writes a pickle of plain data (facts, observations, a parameter-shape skeleton of the
module tree, the class flags vLLM's gate reads, and what it blocked) into the folder. The
parent reads it with an unpickler that only accepts hfcheck's own result classes, networkx
graphs and builtin containers, so a hostile child cannot smuggle code back; it kills the
whole process group when the time limit passes.

This is defence in depth for a scanner, not a security boundary against a determined
attacker with native code (ctypes); run untrusted models in a container or VM for that.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.facts import ModelFacts
from hfcheck.isolation import private_root, run_child
from hfcheck.isolation.fence import install as install_fence

DEFAULT_TIMEOUT_S = 120.0
MAX_RESULT_BYTES = 64 * 1024 * 1024
MAX_SKELETON_ENTRIES = 200_000
RESULT_NAME = "result.pkl"


# --------------------------------------------------------------------------- parent side


@dataclass
class SandboxResult:
    ok: bool
    error: str | None
    timed_out: bool
    seconds: float
    blocked: list[str] = field(default_factory=list)
    """Operations the child refused (network, processes, writes outside its folder)."""
    facts: Any = None  # ModelFacts read from the remote config object
    observations: Any = None  # analysis.observe.Observations
    instance: Any = None  # instance.TinyInstance whose model is a meta-device skeleton
    class_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """auto_map key -> {"class", "supports_attention_backend", "source_gate"} (vLLM's gate)."""
    stderr_tail: str = ""

    @property
    def gate_passes(self) -> bool | None:
        """vLLM's ``is_backend_compatible() or _can_set_attn_implementation()`` on the class it
        resolves (the AutoModel entry), None when no class was loaded."""
        entry = self.class_facts.get("AutoModel") or next(iter(self.class_facts.values()), None)
        if entry is None:
            return None
        return bool(entry.get("supports_attention_backend") or entry.get("source_gate"))


def _write_model(source, folder: Path) -> None:
    from hfcheck.analyzer.sources.code_files import unsafe_name_reason

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(source.config), encoding="utf-8")
    for name, text in source.code_files.items():
        reason = unsafe_name_reason(name)
        if reason is not None or not name.endswith(".py"):
            raise ValueError(f"{name}: {reason or 'not a .py file'}")
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def run_sandboxed(source, timeout: float = DEFAULT_TIMEOUT_S) -> SandboxResult:
    """Build and observe the remote model of ``source`` in a fenced child process."""
    with private_root("hfcheck-sandbox-") as root:
        try:
            _write_model(source, root / "model")
        except (ValueError, OSError) as exc:
            return SandboxResult(False, f"cannot stage the remote code: {exc}", False, 0.0)
        bootstrap = "from hfcheck.analyzer.analysis.sandbox import child_main; child_main()"
        run = run_child([sys.executable, "-I", "-c", bootstrap, str(root)], root, timeout=timeout)
        payload = _read_result(root / RESULT_NAME)
        if run.timed_out:
            blocked = list(payload.get("blocked", [])) if isinstance(payload, dict) else []
            return SandboxResult(False, f"the remote code did not finish within {timeout:g} s (killed)", True, run.seconds, blocked,
                                 stderr_tail=run.stderr_tail)
        if not isinstance(payload, dict):
            reason = payload if isinstance(payload, str) else f"the sandboxed process exited with status {run.returncode} and no result"
            return SandboxResult(False, reason, False, run.seconds, stderr_tail=run.stderr_tail)
        return _result_from(payload, run.seconds, run.stderr_tail)


class _ResultUnpickler(pickle.Unpickler):
    """Accept hfcheck's result dataclasses, networkx graph classes and builtin containers only."""

    ALLOWED = {
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "list"), ("builtins", "dict"),
        ("builtins", "tuple"), ("builtins", "str"), ("builtins", "int"), ("builtins", "float"),
        ("builtins", "bool"), ("builtins", "bytes"), ("builtins", "complex"),
        ("collections", "OrderedDict"), ("collections", "defaultdict"),
        ("hfcheck.analyzer.analysis.observe", "Observations"), ("hfcheck.analyzer.analysis.observe", "ModuleObservation"),
        ("hfcheck.analyzer.fusions.moe", "MoEBlock"), ("hfcheck.analyzer.fusions.base", "Match"), ("hfcheck.analyzer.facts", "ModelFacts"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module.startswith("networkx.classes.") and re.fullmatch(r"[A-Za-z_]\w*", name):
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        raise pickle.UnpicklingError(f"refused {module}.{name} in the sandbox result")


def _read_result(path: Path) -> dict | str | None:
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size > MAX_RESULT_BYTES:
        return f"the sandbox result is too large ({size} bytes)"
    try:
        payload = _ResultUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure refuses the result
        return f"the sandbox result was refused ({type(exc).__name__}: {str(exc)[:200]})"
    return payload if isinstance(payload, dict) else "the sandbox result is not a dict"


def _result_from(payload: dict, seconds: float, tail: str) -> SandboxResult:
    from hfcheck.analyzer.analysis.observe import Observations

    blocked = [str(b)[:300] for b in payload.get("blocked", [])[:100]] if isinstance(payload.get("blocked"), list) else []
    class_facts = {}
    if isinstance(payload.get("class_facts"), dict):
        for key, value in payload["class_facts"].items():
            if isinstance(key, str) and isinstance(value, dict):
                class_facts[key] = {
                    "class": str(value.get("class", "")),
                    "supports_attention_backend": value.get("supports_attention_backend") is True,
                    "source_gate": value.get("source_gate") is True,
                }
    error = payload.get("error")
    result = SandboxResult(error is None, str(error) if error is not None else None, False, seconds, blocked, class_facts=class_facts, stderr_tail=tail)
    facts = payload.get("facts")
    result.facts = facts if isinstance(facts, ModelFacts) else None
    obs = payload.get("observations")
    if isinstance(obs, Observations):
        result.observations = obs
        try:
            result.instance = _instance_from(payload)
        except (ValueError, TypeError, RuntimeError) as exc:
            result.ok = False
            result.error = f"the sandbox skeleton is malformed: {exc}"
            result.observations = None
    elif result.ok:
        result.ok = False
        result.error = "the sandbox returned no observations"
    return result


# --------------------------------------------------------------------------- skeleton


def describe(model) -> list[tuple]:
    """The module tree as plain data: (path, class name, kind, info) with parameter shapes."""
    from torch import nn

    entries: list[tuple] = []
    for path, module in model.named_modules(remove_duplicate=False):
        cls = type(module).__name__
        if isinstance(module, nn.Linear):
            entries.append((path, cls, "linear", {"in": module.in_features, "out": module.out_features, "bias": module.bias is not None, "dtype": str(module.weight.dtype)}))
        elif isinstance(module, nn.Embedding):
            entries.append((path, cls, "embedding", {"num": module.num_embeddings, "dim": module.embedding_dim, "dtype": str(module.weight.dtype)}))
        elif isinstance(module, nn.ModuleList):
            entries.append((path, cls, "modulelist", {}))
        elif isinstance(module, nn.ModuleDict):
            entries.append((path, cls, "moduledict", {}))
        else:
            entries.append((path, cls, "module", {}))
            for name, param in module.named_parameters(recurse=False):
                entries.append((f"{path}.{name}" if path else name, "Parameter", "param", {"shape": tuple(int(s) for s in param.shape), "dtype": str(param.dtype)}))
    return entries


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def rebuild(entries: object) -> Any:
    """A meta-device nn.Module tree with the same paths, class names, Linear sizes and
    parameter shapes (enough for hfcheck's size, plan and memory checks)."""
    import torch
    from torch import nn

    if not isinstance(entries, list) or not entries or len(entries) > MAX_SKELETON_ENTRIES:
        raise ValueError("empty or oversized module list")
    classes: dict[str, type] = {}

    def dtype_of(info: dict) -> torch.dtype:
        name = str(info.get("dtype", "torch.float32")).replace("torch.", "")
        value = getattr(torch, name, None)
        return value if isinstance(value, torch.dtype) else torch.float32

    def positive(value) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > 2**40:
            raise ValueError(f"bad size {value!r}")
        return value

    def skeleton_class(name: str) -> type:
        if not _IDENT.fullmatch(name):
            name = "RemoteModule"
        if name not in classes:
            classes[name] = type(name, (nn.Module,), {"__module__": "hfcheck.remote_skeleton", "__doc__": "structure of a sandboxed remote module"})
        return classes[name]

    modules: dict[str, nn.Module] = {}
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 4 and isinstance(entry[0], str) and isinstance(entry[1], str) and isinstance(entry[2], str) and isinstance(entry[3], dict)):
            raise ValueError("malformed entry")
        path, cls, kind, info = entry
        parent_path, _, name = path.rpartition(".")
        if path and not re.fullmatch(r"[\w]+", name):
            raise ValueError(f"bad name {name!r}")
        if kind == "param":
            owner = modules.get(parent_path)
            if owner is None:
                raise ValueError(f"parameter {path} before its module")
            shape = tuple(positive(s) for s in info.get("shape", ()))
            owner.register_parameter(name, nn.Parameter(torch.empty(shape, device="meta", dtype=dtype_of(info)), requires_grad=False))
            continue
        module: nn.Module
        if kind == "linear":
            module = nn.Linear(positive(info.get("in")), positive(info.get("out")), bias=bool(info.get("bias")), device="meta", dtype=dtype_of(info))
        elif kind == "embedding":
            module = nn.Embedding(positive(info.get("num")), positive(info.get("dim")), device="meta", dtype=dtype_of(info))
        elif kind == "modulelist":
            module = nn.ModuleList()
        elif kind == "moduledict":
            module = nn.ModuleDict()
        elif kind == "module":
            module = skeleton_class(cls)()
        else:
            raise ValueError(f"unknown kind {kind!r}")
        if path in modules:
            continue  # a shared module seen again
        if path:
            parent = modules.get(parent_path)
            if parent is None:
                raise ValueError(f"module {path} before its parent")
            parent.add_module(name, module)
        modules[path] = module
    if "" not in modules:
        raise ValueError("no root module")
    return modules[""]


def _instance_from(payload: dict):
    from transformers import PretrainedConfig

    from hfcheck.analyzer.instance import TinyInstance

    model = rebuild(payload.get("skeleton"))
    raw_config = payload.get("config")
    config_dict = raw_config if isinstance(raw_config, dict) else {}
    config_dict = {k: v for k, v in config_dict.items() if isinstance(k, str) and k not in ("auto_map", "text_config")}
    try:
        config = PretrainedConfig(**config_dict)
    except Exception:  # noqa: BLE001 - a config PretrainedConfig refuses: an empty one
        config = PretrainedConfig()
    kept = payload.get("kept_layers")
    kinds = payload.get("layer_types")
    instance = TinyInstance(
        model,
        config,
        kept if isinstance(kept, int) and not isinstance(kept, bool) else 0,
        [str(k) for k in kinds] if isinstance(kinds, list) else [],
        "structural (remote code, sandboxed)",
    )
    problem = payload.get("vllm_build_problem")
    if isinstance(problem, str) and hasattr(instance, "vllm_build_problem"):
        instance.vllm_build_problem = problem[:500]
    return instance


# --------------------------------------------------------------------------- child side


def child_main() -> None:  # pragma: no cover - runs in the child process (covered by tests through run_sandboxed)
    root = Path(sys.argv[-1]).resolve()
    fence = install_fence(root, DEFAULT_TIMEOUT_S * 5)
    out = root / RESULT_NAME
    payload: dict[str, Any] = {"error": None, "blocked": fence.blocked}
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from transformers import AutoConfig, AutoModel
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        from hfcheck.analyzer.analysis.observe import observe
        from hfcheck.analyzer.facts import collect_facts
        from hfcheck.analyzer.fusions.context import fusion_context
        from hfcheck.analyzer.instance import build_structural
        from hfcheck.analyzer.rules.resolution import source_gate

        fence.strict = True  # from here on, remote code may run
        model_dir = str(root / "model")
        config = json.loads((root / "model" / "config.json").read_text(encoding="utf-8"))
        stage = "loading the remote config class"
        cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=True, local_files_only=True)
        stage = "loading the remote model classes"
        auto_map = config.get("auto_map") or {}
        classes = {}
        for key, ref in auto_map.items():
            if isinstance(key, str) and key.startswith("AutoModel") and isinstance(ref, str):
                classes[key] = get_class_from_dynamic_module(ref, model_dir, local_files_only=True)
        model_cls = classes.get("AutoModel") or next((c for k, c in classes.items() if k.startswith("AutoModelFor")), None)
        if model_cls is None:
            raise RuntimeError("auto_map names no AutoModel class")
        payload["class_facts"] = {
            key: {"class": cls.__name__, "supports_attention_backend": bool(getattr(cls, "_supports_attention_backend", False) is True), "source_gate": bool(source_gate(cls))}
            for key, cls in classes.items()
        }
        model_type = getattr(type(cfg), "model_type", None) or config.get("model_type")
        AutoConfig.register(model_type, type(cfg), exist_ok=True)
        AutoModel.register(type(cfg), model_cls, exist_ok=True)
        stage = "reading facts from the remote config"
        facts, cfg_obj = collect_facts(config)
        if cfg_obj is None:
            cfg_obj = cfg
        stage = "building the structural instance"
        instance = build_structural(facts, cfg_obj)
        stage = "observing the instance"
        observations = observe(instance.model, fusion_context(facts))
        payload.update(
            facts=facts,
            observations=observations,
            skeleton=describe(instance.model),
            config=json.loads(json.dumps(instance.config.to_dict(), default=str)),
            kept_layers=instance.kept_layers,
            layer_types=list(instance.layer_types),
            vllm_build_problem=getattr(instance, "vllm_build_problem", None),
        )
    except BaseException as exc:  # noqa: BLE001 - everything the remote code raises is a result
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        payload["error"] = f"{locals().get('stage', 'starting')}: {type(exc).__name__}: {first}".rstrip(": ")
    fence.strict = False
    data = pickle.dumps(payload, protocol=4)
    with open(out, "wb") as f:
        f.write(data)
    os._exit(0)  # skip interpreter teardown (remote atexit handlers, finalizers)
