"""CPU stand-ins that let an original written for GPUs be built and run on a CPU, unchanged.

Loaded by path inside the reference child (standard library and torch only: hfcheck is not
installed there), and only when the original failed without them (``establish`` retries with
``gpu_shims``), so a model that runs as it is keeps exactly its own run.

Real remote code often cannot even be *constructed* on a machine without CUDA, though the
function it computes does not need one: ``import flash_attn`` at the top of the modeling
file (with ``use_flash_attn: false`` in its config), a flash-attention class whose
``__init__`` asserts the package, ``import triton`` for a quantization helper the float
checkpoint never calls, rotary tables moved with ``.cuda()`` in ``__init__``. The shims keep
the function and cannot hide a GPU path:

- every CUDA-only package the job names (``environments.GPU_ONLY``) that is not installed imports as a stub module; each
  name read from it is a class whose construction or call raises ``GpuOnlyPathReached``
  naming it, so a reference that *reaches* a GPU path fails (and says which), while one
  that only imports it runs;
- ``Tensor.cuda()`` and ``Module.cuda()`` leave the tensor or module where it is (on the CPU);
  each call site in the remote code is recorded.

``report()`` lists what was stubbed and where ``.cuda()`` was called: PORT.md shows it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUB_VERSION = "0.0.0"


class GpuOnlyPathReached(RuntimeError):
    """The reference run called into a CUDA-only package that was only stubbed."""


_STATE: dict = {"modules": [], "reached": [], "cuda_calls": []}


def _stub_class(qualname: str) -> type:
    def refuse(*_args, **_kwargs):
        _STATE["reached"].append(qualname)
        raise GpuOnlyPathReached(f"{qualname} is a CUDA-only callable (stubbed on this CPU machine by hfcheck); "
                                 "the original took a GPU path")

    class Meta(type):
        def __call__(cls, *args, **kwargs):
            refuse()

        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _stub_class(f"{qualname}.{name}")

    return Meta(qualname.rpartition(".")[2] or qualname, (), {"__module__": qualname.rpartition(".")[0], "__hfcheck_stub__": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name in ("__version__", "version"):
            return STUB_VERSION
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: its submodules import as stubs too
        return module

    def exec_module(self, module):
        _STATE["modules"].append(module.__name__)


def _importer(depth: int = 2) -> str:
    """The file whose code asked for the import: the nearest frame outside importlib."""
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") or "/importlib/" in name):
            return name
        frame = frame.f_back
    return ""


class _StubFinder(importlib.abc.MetaPathFinder):
    """Stubs a missing CUDA-only package only where the *remote code* imports it: torch and
    transformers probing for triton or flash_attn keep seeing that it is not installed."""

    def __init__(self, tops: set[str], package_dir: str):
        self.tops = tops
        self.package_dir = package_dir

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.tops:
            return None
        if fullname.split(".")[0] in sys.modules and isinstance(sys.modules[fullname.split(".")[0]], _StubModule):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)  # a submodule of a stub
        if not _importer().startswith(self.package_dir):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def install(torch, package_dir: str, packages: list[str]) -> None:
    """Stub the CUDA-only ``packages`` that are not installed, and make ``.cuda()`` a no-op
    (recording its call sites inside ``package_dir``)."""
    missing = set()
    for top in packages:
        try:
            if importlib.util.find_spec(top) is None:
                missing.add(top)
        except (ImportError, ValueError):
            missing.add(top)
    sys.meta_path.insert(0, _StubFinder(missing, package_dir))

    def where() -> str | None:
        frame: types.FrameType | None = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(package_dir):
                return f"{frame.f_code.co_filename[len(package_dir):].lstrip('/')}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def tensor_cuda(self, *_args, **_kwargs):
        site = where()
        if site and site not in _STATE["cuda_calls"]:
            _STATE["cuda_calls"].append(site)
        return self

    def module_cuda(self, *_args, **_kwargs):
        tensor_cuda(self)
        return self

    torch.Tensor.cuda = tensor_cuda
    torch.nn.Module.cuda = module_cuda


def report() -> dict:
    return {"stubbed": sorted(set(_STATE["modules"])), "reached": list(dict.fromkeys(_STATE["reached"])),
            "cuda_calls": list(_STATE["cuda_calls"])}
