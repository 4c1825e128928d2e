"""HFC815: remote code whose layers compute something other than softmax attention.

vLLM's transformers backend serves a decoder layer only through a module that calls the
attention interface (HFC201); long convolutions (Hyena's FFT filters), state-space mixers
(Mamba's selective scan, causal_conv1d) and linear attention (flash-linear-attention) have no
such module, so they are refused at load (no dispatching module) or, beside attention in the
same layer, run unmanaged without their state cache (HFC202). The config rarely says so
(``layer_types`` is a transformers 5 convention), the code always does: this family reads it
and names the construct at its line. ``hfcheck port`` refuses on the same findings before it
runs anything, since no rewrite keeps such a function inside what vLLM serves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex, FileIndex

# top-level package -> the layer kind its kernels compute
KERNEL_PACKAGES = {
    "mamba_ssm": "state-space (Mamba selective scan)",
    "causal_conv1d": "state-space (causal conv1d of a Mamba mixer)",
    "selective_scan_cuda": "state-space (Mamba selective scan)",
    "fla": "linear attention (flash-linear-attention)",
}
# a call whose dotted name ends so -> the layer kind
CALLS = {
    "fft.rfft": "long convolution (FFT filter)",
    "fft.irfft": "long convolution (FFT filter)",
    "fft.fft": "long convolution (FFT filter)",
    "fft.ifft": "long convolution (FFT filter)",
    "selective_scan_fn": "state-space (Mamba selective scan)",
    "mamba_inner_fn": "state-space (Mamba selective scan)",
    "mamba_chunk_scan_combined": "state-space (Mamba2 chunked scan)",
    "causal_conv1d_fn": "state-space (causal conv1d of a Mamba mixer)",
}
# transformers names that only recurrent/SSM code imports
TRANSFORMERS_NAMES = {"MambaCache": "state-space (MambaCache)", "HybridMambaAttentionDynamicCache": "state-space (hybrid Mamba cache)"}


@dataclass(frozen=True)
class Construct:
    """One place where the code computes a layer kind vLLM's transformers backend cannot serve."""

    kind: str
    file: str
    line: int
    code: str


def non_softmax_constructs(index: CodeIndex) -> list[Construct]:
    found: list[Construct] = []
    for file in index.files.values():
        if file.tree is None:
            continue
        found.extend(_in_file(file))
    return sorted(found, key=lambda c: (c.file, c.line))


def _in_file(file: FileIndex) -> Iterator[Construct]:
    lines = file.text.splitlines()

    def at(line: int) -> str:
        return lines[line - 1].strip()[:120] if 0 < line <= len(lines) else ""

    for imp in file.imports:
        if imp.level:
            continue
        top = imp.module.split(".")[0]
        if top in KERNEL_PACKAGES:
            yield Construct(KERNEL_PACKAGES[top], file.path, imp.line, at(imp.line))
        elif top == "transformers" and imp.name in TRANSFORMERS_NAMES:
            yield Construct(TRANSFORMERS_NAMES[imp.name], file.path, imp.line, at(imp.line))
    if file.tree is None:  # the caller reads only files that parsed
        return
    for node in ast.walk(file.tree):
        if isinstance(node, ast.Call):
            name = file.call_name(node) or ""
            for suffix, kind in CALLS.items():
                if name == suffix or name.endswith("." + suffix):
                    yield Construct(kind, file.path, node.lineno, at(node.lineno))
                    break


def check_layer_kinds(index: CodeIndex) -> Iterator[CodeFinding]:
    by_kind: dict[str, Construct] = {}
    for c in non_softmax_constructs(index):
        by_kind.setdefault(c.kind, c)
    for kind, c in by_kind.items():
        yield CodeFinding("HFC815", "fail", c.file, c.line, f"the code computes {kind} layers (`{c.code}`): vLLM's transformers backend serves softmax attention only",
                          "Serve it with a native vLLM implementation where one exists (`--model-impl auto`); no port keeps this function inside the transformers backend.")


class NonSoftmaxLayers(RemoteCodeRule):
    code = "HFC815"
    name = "remote-non-softmax-layers"
    impact = "blocker"
    what = "Remote code that computes long convolutions (FFT filters), state-space (Mamba) mixers or linear attention."
    why = (
        "vLLM's backend serves a decoder layer through the module that calls the attention interface and keeps a KV "
        "cache for it (HFC201). A Hyena FFT filter, a Mamba selective scan or a linear-attention kernel has no such "
        "module and carries its own state: the layer is refused at load, or runs beside attention without its state "
        "cache (HFC202). The config seldom says so; the code does."
    )
    example = "k_f = torch.fft.rfft(k, n=fft_size) / fft_size   # Hyena's long convolution"
    fix = "Use a native vLLM implementation of the architecture where one exists; otherwise it is not servable by the backend."
    vllm_source = ("model_executor/models/transformers/base.py::Base._create_attention_instances",)
    none = None


RULES = (NonSoftmaxLayers,)
