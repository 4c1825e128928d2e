"""Parent side of the reference run: stage the original code, start ``child.py`` with the
reference environment's Python through the one isolated-process runner, read what it wrote.

Nothing here imports the remote code; the tensors come back through safetensors (no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.isolation import child_env, fence, private_root
from hfcheck.isolation.jobs import run_job
from hfcheck.shared.environments import GPU_ONLY, ReferenceEnv

CHILD = Path(__file__).with_name("child.py")
PACKAGE = "hfcheck_ref_original"
DEFAULT_TIMEOUT_S = 300.0
MEMORY_BUDGET_BYTES = 2 * 1024**3  # a proof stays under 2 GB resident, whatever the model's size


@dataclass
class ReferenceRun:
    """What the original did in its own environment."""

    ok: bool
    error: str | None
    error_at: dict[str, Any] | None
    result: dict[str, Any]
    tensors: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    stderr_tail: str = ""

    @property
    def state(self) -> dict[str, Any]:
        return {k.removeprefix("state."): v for k, v in self.tensors.items() if k.startswith("state.")}

    @property
    def logits(self):
        """The reference logits: the original with the attention implementation its release
        picks by default (what its users get)."""
        return self.tensors.get("logits")

    def logits_for(self, impl: str):
        """The original run with one attention implementation (code of the attention-interface
        era has several; older code has one, and this is the default run's)."""
        value = self.tensors.get(f"logits.{impl}")
        return value if value is not None else self.tensors.get("logits")

    def hidden(self, i: int):
        return self.tensors.get(f"hidden.{i}")

    def modules(self) -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in self.result.get("modules", [])}


def stage_code(code_files: dict[str, str], folder: Path) -> Path:
    from hfcheck.analyzer.sources.code_files import unsafe_name_reason

    package = folder / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    for name, text in code_files.items():
        reason = unsafe_name_reason(name)
        if reason is not None:
            raise ValueError(f"{name}: {reason}")
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def model_key(auto_map: dict[str, Any]) -> str | None:
    for key in ("AutoModelForCausalLM", "AutoModel"):
        if isinstance(auto_map.get(key), str):
            return key
    return next((k for k, v in auto_map.items() if k.startswith("AutoModelFor") and isinstance(v, str)), None)


@dataclass(frozen=True)
class RemoteCode:
    """The original's code files and the ``auto_map`` naming its classes."""

    files: dict[str, str]
    auto_map: dict[str, Any]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder to load instead of random weights, with the modules whose index moved ((truncated, original) prefixes)."""

    dir: str
    moved: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One run of the original: its config, the token ids, how many layers, where its weights come from and what it does."""

    config: dict[str, Any]
    input_ids: list[list[int]]
    num_layers: int
    mode: str = "random"
    seed: int = 0
    checkpoint: Checkpoint | None = None
    meta_config: dict[str, Any] | None = None
    generate_tokens: int = 4
    import_only: bool = False
    threads: int = 1
    gpu_shims: bool = False

    def job(self, code: RemoteCode, key: str, timeout: float) -> dict[str, Any]:
        """What ``child.py`` reads."""
        checkpoint = self.checkpoint
        return {
            "fence": fence.load_fence_source(), "auto_map": code.auto_map, "model_key": key, "config": self.config, "mode": self.mode,
            "seed": self.seed, "input_ids": self.input_ids, "num_layers": self.num_layers, "generate_tokens": self.generate_tokens,
            "meta_config": self.meta_config, "import_only": self.import_only, "threads": self.threads, "cpu_seconds": timeout * 2,
            "checkpoint": {"dir": checkpoint.dir, "moved": list(checkpoint.moved)} if checkpoint else None,
            "gpu_shims": GPU_ONLY if self.gpu_shims else None,
        }


def run_reference(env: ReferenceEnv, code: RemoteCode, spec: RunSpec, *, timeout: float = DEFAULT_TIMEOUT_S) -> ReferenceRun:
    """Run the original (``code`` at ``spec.config``) in ``env``; see ``child.py``."""

    auto_map = code.auto_map
    key = model_key(auto_map)
    if key is None or not isinstance(auto_map.get("AutoConfig"), str):
        return ReferenceRun(False, "auto_map names no AutoConfig and AutoModel class", None, {})
    with private_root("hfcheck-reference-") as root:
        try:
            stage_code(code.files, root / "orig")
        except (ValueError, OSError) as exc:
            return ReferenceRun(False, f"cannot stage the remote code: {exc}", None, {})
        job = spec.job(code, key, timeout)
        run, result = run_job([str(env.python), "-I", str(CHILD), str(root)], root, job, timeout=timeout, env=child_env(root, spec.threads),
                              max_rss_bytes=MEMORY_BUDGET_BYTES)
        result = result or {}
        tensors = {}
        if (root / "tensors.safetensors").is_file():
            from safetensors.torch import load_file

            tensors = load_file(str(root / "tensors.safetensors"))
    error = result.get("error")
    if run.over_memory:
        error = f"the reference run passed the proof's memory budget of {MEMORY_BUDGET_BYTES / 2**30:g} GiB (killed)"
    elif run.timed_out:
        error = f"the reference run did not finish within {timeout:g} s (killed)"
    elif not result:
        error = f"the reference process exited with status {run.returncode} and no result"
    return ReferenceRun(not error, error, result.get("error_at"), result, tensors, run.seconds, run.peak_rss_bytes, run.stderr_tail)
