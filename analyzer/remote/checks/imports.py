"""What the code imports, judged where it runs (the modelled vLLM release's environment):
HFC811 transformers APIs removed by v5, HFC812 packages that environment lacks and custom kernels,
HFC814 model code that moves tensors to CUDA itself."""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterator

from hfcheck.analyzer.remote import removed_apis
from hfcheck.analyzer.remote.ast_helpers import calls_to, where_in
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex, FileIndex
from hfcheck.analyzer.vllm.environment import serving_environment
from hfcheck.shared.packages import CUDA_ONLY

# --------------------------------------------------------------------------- HFC811: removed APIs


def check_removed_apis(index: CodeIndex) -> Iterator[CodeFinding]:
    """Judged against the transformers releases the modelled vLLM accepts (where the code runs),
    not the transformers hfcheck itself runs on."""
    env = serving_environment()
    where = env.transformers_label
    hits = 0
    for file in index.files.values():
        if file.tree is None:
            continue
        for imp in file.imports:
            if imp.level:
                continue
            api = removed_apis.match_import(imp.module, imp.name)
            if api is None:
                continue
            hits += 1
            present = env.transformers_still_has(api.gone_in)
            what = f"imports {imp.qualified}"
            gone = removed_apis.when_removed(api)
            if present == "all":
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: still in {where}, {gone}: a later vLLM will refuse the code",
                                  f"Stop using it before upgrading: {api.replacement}.")
            elif present == "some":
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: {gone}; only some of {where} still have it",
                                  f"Stop using it: {api.replacement}.")
            elif imp.in_try:
                yield CodeFinding("HFC811", "warn", file.path, imp.line, f"{what}: {gone}; the ImportError is caught here",
                                  f"Remove the fallback: {api.replacement}.")
            else:
                yield CodeFinding("HFC811", "fail", file.path, imp.line, f"{what}: {gone}; importing the code fails with {where}",
                                  f"{api.replacement[0].upper()}{api.replacement[1:]}.")
        for node in ast.walk(file.tree):
            if isinstance(node, ast.Attribute) and (api := removed_apis.match_attribute(node.attr)) is not None:
                hits += 1
                present = env.transformers_still_has(api.gone_in)
                state = {"all": f"still in {where}", "some": f"only some of {where} still have it"}.get(present, f"AttributeError with {where} when this path runs")
                yield CodeFinding("HFC811", "warn", file.path, node.lineno, f"uses .{node.attr} (a Cache method removed in transformers {api.gone_in}, last in {api.last_seen}): {state}",
                                  f"{api.replacement[0].upper()}{api.replacement[1:]}.")
    if not hits:
        yield CodeFinding("HFC811", "pass", None, None, f"no transformers API removed in v5 is used (judged for {where})")


# --------------------------------------------------------------------------- HFC812: packages


_KERNEL_LOADERS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline", "torch.ops.load_library", "ctypes.CDLL", "ctypes.cdll.LoadLibrary", "ctypes.PyDLL")


def unguarded_imports(file: FileIndex) -> dict[str, int]:
    """Top-level packages transformers' ``get_imports`` would require -> first line
    (same skip rules: try blocks and ``if is_*_available()`` bodies; relative imports ignored)."""
    out: dict[str, int] = {}
    for imp in file.imports:
        if imp.guarded or imp.level:
            continue
        top = imp.module.split(".")[0]
        if top:
            out.setdefault(top, imp.line)
    return out


def installed(top: str) -> bool:
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None  # top-level: nothing is imported
    except (ImportError, ValueError):
        return False


def check_packages(index: CodeIndex) -> Iterator[CodeFinding]:
    """Unguarded imports are judged in the serving environment (the modelled vLLM release's
    dependency closure), not in hfcheck's own venv: vLLM brings einops, not flash_attn."""
    env = serving_environment()
    hits = 0
    for file in index.files.values():
        if file.tree is None:
            continue
        for top, line in unguarded_imports(file).items():
            if env.provides(top):
                continue
            hits += 1
            if top in CUDA_ONLY:
                yield CodeFinding("HFC812", "fail", file.path, line, f"imports {top} unconditionally ({CUDA_ONLY[top]}), which is not in {env.label}: transformers' check_imports refuses to load the code ('requires the following packages that were not found')",
                                  f"Guard the import with `if is_*_available():` or try/except ImportError, or install {top} (a CUDA build) into vLLM's environment.")
            else:
                yield CodeFinding("HFC812", "fail", file.path, line, f"imports {top}, which is not in {env.label} (vLLM does not install it): transformers' check_imports refuses to load the code",
                                  f"pip install {top} into vLLM's environment on the serving machine, or guard the import.")
        for call, name in calls_to(file, file.tree, lambda n: n in _KERNEL_LOADERS or n.endswith(("cpp_extension.load", "cpp_extension.load_inline"))):
            hits += 1
            yield CodeFinding("HFC812", "warn", file.path, call.lineno, f"{name}(...) builds or loads a custom native kernel {where_in(file, call)}",
                              "Ship kernels as an installable package (or use the kernels hub) and guard their use; vLLM's backend expects plain PyTorch + the attention interface.")
    if not hits:
        yield CodeFinding("HFC812", "pass", None, None, f"every unconditional import is in {env.label}; no custom kernel")


# --------------------------------------------------------------------------- HFC814: .cuda()


def cuda_calls(file: FileIndex) -> list[ast.Call]:
    """``x.cuda(...)`` calls in a file (any receiver): the model code picks the device itself."""
    if file.tree is None:
        return []
    return [n for n in ast.walk(file.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cuda"]


def check_device_placement(index: CodeIndex) -> Iterator[CodeFinding]:
    for file in index.files.values():
        for call in cuda_calls(file):
            yield CodeFinding("HFC814", "warn", file.path, call.lineno,
                              f"{ast.unparse(call)[:80]} moves a tensor to CUDA {where_in(file, call)}: the model cannot be built where torch has no CUDA "
                              "(vLLM's CPU build, a CPU-only from_pretrained)",
                              "Drop the .cuda(): build tensors on the device of an existing parameter or buffer, or let the loader place the model.")


# --------------------------------------------------------------------------- the codes, documented


class RemovedTransformersAPI(RemoteCodeRule):
    code = "HFC811"
    name = "remote-removed-transformers-api"
    impact = "blocker"
    what = "Imports or uses of transformers APIs removed by v5: modeling_attn_mask_utils, utils.fx, LlamaFlashAttention2/LlamaSdpaAttention, HybridCache, MambaCache, is_torch_fx_available, DynamicCache.from_legacy_cache/to_legacy_cache/get_usable_length/seen_tokens."
    why = (
        "An import of a removed API fails when transformers loads the code (ImportError before any model exists). "
        "A removed Cache method fails only when that path runs (warn). Each finding names the release it vanished "
        "in and whether the transformers releases the modelled vLLM accepts (its pin, where the code runs) still have it."
    )
    example = "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask   # gone in 5.24"
    fix = "Port to the v5 APIs: masks from transformers.masking_utils (or none: the attention interface masks), Cache objects instead of tuples."
    none = None


class UnavailablePackages(RemoteCodeRule):
    code = "HFC812"
    name = "remote-unavailable-packages"
    impact = "blocker"
    what = (
        "Top-level imports transformers' `get_imports` would require (not in a try block, not under `if is_*_available()`) "
        "that the serving environment lacks; custom kernels built or loaded at run time."
    )
    why = (
        "Before executing remote code, transformers imports every package get_imports lists and refuses the model when "
        "one is missing ('This modeling file requires the following packages that were not found'). The code runs where "
        "vLLM runs, so imports are judged against the modelled vLLM release's dependency closure "
        "(analyzer/data/vllm/<release>/environment.json: einops is there; flash_attn, bitsandbytes, accelerate are not), "
        "not against the environment hfcheck itself runs in."
    )
    example = "from flash_attn import flash_attn_func   # at module level, unguarded"
    fix = "if is_flash_attn_2_available():\n    from flash_attn import flash_attn_func"
    none = None


class DevicePlacement(RemoteCodeRule):
    code = "HFC814"
    name = "remote-cuda-placement"
    impact = "blocker"
    what = "Model code that moves tensors to CUDA itself (`.cuda()`), typically rotary tables in `__init__`."
    why = (
        "A loader places the model: transformers by device_map, vLLM by building it under its device. A `.cuda()` in the "
        "code pins one device and raises 'Torch not compiled with CUDA enabled' wherever torch has no CUDA, so the model "
        "cannot be built on vLLM's CPU build or on a CPU machine at all."
    )
    example = "self.inv_freq = (1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))).cuda()"
    fix = "Drop the `.cuda()`; register the tensor as a buffer so that it follows the module, or create it on `x.device` in forward."
    platforms = ("cpu",)
    none = None


RULES = (RemovedTransformersAPI, UnavailablePackages, DevicePlacement,)
