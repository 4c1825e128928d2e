"""Establish the original's behaviour: pick its transformers release, build (or reuse) that
environment, and run the original there at the shrunk size with seeded random weights.

The release is the one config.json declares (``transformers_version``), or the one the user
names; when the code does not even import there (or the config declares none), the newest of
a few well-known 4.x releases below it that imports the code is used, and the result says so.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from hfcheck.analyzer.instance.shrink import MAX_TINY_HEADS, first, head_counts, shrink_config
from hfcheck.analyzer.remote import CodeIndex
from hfcheck.porter.reference.run import ReferenceRun, RemoteCode, RunSpec, run_reference
from hfcheck.shared.environments import (
    NOT_INSTALLABLE,
    EnvError,
    EnvSpec,
    ReferenceEnv,
    ensure_env,
    own_transformers,
    pip_requirement,
    release_of,
)

# Releases tried, newest first, when the declared one cannot import the code or none is declared.
FALLBACK_RELEASES = ("4.51.3", "4.46.3", "4.42.4", "4.37.2", "4.33.3", "4.30.2", "4.28.1")
SEQUENCE_LENGTH = 12


class ReferenceError(Exception):
    """The original cannot be run in any reference environment (one line)."""


@dataclass
class Reference:
    env: ReferenceEnv
    version_reason: str
    packages: tuple[str, ...]
    not_installed: list[str]  # imports that cannot be installed on a CPU machine (guarded in the code)
    tiny_config: dict[str, Any]
    input_ids: list[list[int]]
    run: ReferenceRun
    tried: list[str] = field(default_factory=list)
    gpu_shims: bool = False  # the original only constructs with gpu_shims.py's CPU stand-ins (every later run of it too)
    switched_off: list[str] = field(default_factory=list)  # config flags that select a GPU-only kernel, set false for the CPU run
    one_sequence: str | None = None  # why the inputs are one sequence: the original's failure on two

    @property
    def num_layers(self) -> int:
        value = first(self.tiny_config, "layers")
        return int(value) if isinstance(value, int) else 0


def _reachable(code_files: dict[str, str], auto_map: dict[str, Any]):
    """The code files the auto_map classes import (relative imports, transitively)."""

    index = CodeIndex(dict(code_files))
    stems = {PurePosixPath(name).stem: name for name in index.files}
    todo = []
    for ref in auto_map.values():
        if isinstance(ref, str):
            body = ref.partition("--")[2] if "--" in ref else ref
            todo.append(body.rpartition(".")[0])
    seen: set[str] = set()
    while todo:
        stem = todo.pop()
        name = stems.get(stem.rpartition(".")[2] if "." in stem else stem)
        if name is None or name in seen:
            continue
        seen.add(name)
        file = index.files[name]
        for imp in file.imports if file.tree is not None else []:
            if imp.level:
                todo.append(imp.module or (imp.name or ""))
    return [index.files[n] for n in sorted(seen)]


def required_packages(code_files: dict[str, str], auto_map: dict[str, Any]) -> tuple[tuple[str, ...], list[str]]:
    """(PyPI requirements for the third-party imports of the code the model loads, imports
    that cannot be installed here). Guarded imports (try / is_*_available) are not required."""
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    reqs: set[str] = set()
    missing: set[str] = set()
    for file in _reachable(code_files, auto_map):
        for imp in file.imports:
            if imp.level or imp.in_try:
                continue
            top = imp.module.split(".")[0]
            if not top or top in stdlib or top in ("torch", "transformers", "numpy"):
                continue
            req = pip_requirement(top)
            if req is None:
                if not imp.guarded:
                    missing.add(top)
            elif not imp.guarded:
                reqs.add(req)
    return tuple(sorted(reqs)), sorted(missing)


def candidate_releases(config: dict[str, Any], override: str | None) -> list[tuple[str, str]]:
    if override:
        release = release_of(override)
        if release is None:
            raise ReferenceError(f"--reference-transformers {override!r} is not a transformers release (4.x or later)")
        return [(release, "named with --reference-transformers")]

    declared = config.get("transformers_version")
    release = release_of(declared) if isinstance(declared, str) else None
    out = []
    if release:
        out.append((release, f"declared in config.json (transformers_version {declared})"))
    else:
        out.append((own_transformers(), "config.json declares no transformers_version; hfcheck's own release runs it"))
    for fallback in FALLBACK_RELEASES:  # newest first: "the newest release its code still runs with"
        if fallback != release:
            why = "config.json declares no transformers_version" if release is None else f"the code does not run with {release}"
            out.append((fallback, f"{why}; {fallback} is the newest tried release it runs with"))
    return out


@dataclass
class _Original:
    """The original and what it runs with now: the retries below change its shrunk config, ids, environment and packages."""

    source: Any
    config: dict[str, Any]
    auto_map: dict[str, Any]
    packages: tuple[str, ...]
    tiny: dict[str, Any]
    ids: list[list[int]]
    seed: int
    timeout: float
    log: Callable[[str], None] | None
    release: str = ""
    env: ReferenceEnv | None = None

    def run(self, shims: bool = False) -> ReferenceRun:
        """One run of the original in the current environment, shrunk config and ids."""
        spec = RunSpec(self.tiny, self.ids, int(first(self.tiny, "layers") or 0), seed=self.seed, meta_config=self.config, gpu_shims=shims)
        assert self.env is not None  # set before the first run: the environment of self.release
        return run_reference(self.env, RemoteCode(self.source.code_files, self.auto_map), spec, timeout=self.timeout)

    def with_optional(self, run: ReferenceRun, shims: bool = False) -> ReferenceRun:
        """A package the code imports optionally (in a try) but then requires (TeleChat:
        `assert rearrange is not None, 'Please install einops first'`): installed, and run again."""
        while not run.ok and (wanted := optional_package_wanted(run, self.packages)) is not None:
            if self.log:
                self.log(f"the original asks for {wanted} ({(run.error or '?').splitlines()[0][:160]}); again with it installed")
            try:
                self.env = ensure_env(EnvSpec(self.release, tuple(sorted({*self.packages, wanted}))), self.log)
            except EnvError:
                return run
            self.packages = self.env.spec.packages
            run = self.run(shims)
        return run


def establish(source, *, override: str | None = None, seed: int = 0, head_dim: int = 16, timeout: float = 300.0,
              log: Callable[[str], None] | None = None) -> Reference:
    """Run the original of ``source`` in its reference environment (see the module doc)."""
    config = dict(source.config)
    auto_map = config.get("auto_map") or {}
    packages, not_installed = required_packages(source.code_files, auto_map)
    tiny = shrink_config(config, head_dim=head_dim)
    original = _Original(source, config, auto_map, packages, tiny, _input_ids(tiny, seed), seed, timeout, log)
    tried: list[str] = []
    candidates = candidate_releases(config, override)
    for n, (release, why) in enumerate(candidates):
        original.release = release
        try:
            original.env = ensure_env(EnvSpec(release, original.packages), log)
        except EnvError as exc:
            if n == 0:
                raise  # the declared (or named) release cannot be installed: the user's to fix
            tried.append(f"transformers {release}: {exc}")
            continue
        if log:
            log(f"running the original in transformers {release} ({original.env.path.name})")
        run = _at_real_head_dim(original, original.run(), head_dim)
        run = _with_real_heads(original, run, head_dim)
        run = _ending_in_searched_tokens(original, run)
        shims = False
        switched: list[str] = []
        needs = _needs_a_gpu(run)
        if needs:
            run, switched = _with_gpu_shims(original, needs)
            shims = True
        run = original.with_optional(run, shims)
        run, one_sequence = _one_sequence(original, run, shims)
        _refuse_uninstallable(run)
        if not run.ok and n + 1 < len(candidates) and not override and (_is_import_failure(run) or _undeclared(config) or n > 0):
            tried.append(f"transformers {release}: {run.error}")
            continue
        return Reference(original.env, why, original.packages, not_installed, original.tiny, original.ids, run, tried, shims, switched,
                         one_sequence)
    raise ReferenceError("the original code imports with none of the releases tried: " + "; ".join(tried))


def _input_ids(tiny: dict[str, Any], seed: int) -> list[list[int]]:
    """Two seeded random sequences in the shrunk vocabulary: the inputs every later comparison reuses."""
    vocab = first(tiny, "vocab") or 256
    rng = random.Random(seed + 1)
    return [[rng.randrange(int(vocab)) for _ in range(SEQUENCE_LENGTH)] for _ in range(2)]


def _at_real_head_dim(original: _Original, run: ReferenceRun, head_dim: int) -> ReferenceRun:
    """Code that hard-codes the head size (Falcon-40B's `view(..., 64)`): again with only everything else shrunk."""
    real_head_dim = _real_head_dim(original.config)
    if not run.ok and is_shape_failure(run) and real_head_dim and real_head_dim != head_dim:
        if original.log:
            original.log(f"the original fails at head dim {head_dim} ({run.error}); again at its real head dim {real_head_dim}")
        original.tiny = shrink_config(original.config, head_dim=real_head_dim)
        run = original.run()
    return run


def _with_real_heads(original: _Original, run: ReferenceRun, head_dim: int) -> ReferenceRun:
    """Code that hard-codes a head grouping (CodeGen2's `mp_num = 8` blocks of heads): again with every head, each small."""
    real_heads = head_counts(original.config)[0]
    if not run.ok and is_shape_failure(run) and isinstance(real_heads, int) and MAX_TINY_HEADS < real_heads <= 64:
        if original.log:
            original.log(f"the original fails with {first(original.tiny, 'heads')} heads ({run.error}); "
                         f"again with its real {real_heads} heads of {head_dim}")
        original.tiny = shrink_config(original.config, head_dim=head_dim, max_heads=real_heads)
        run = original.run()
    return run


def _ending_in_searched_tokens(original: _Original, run: ReferenceRun) -> ReferenceRun:
    """Code that looks its special tokens up in the input (ChatGLM-6B finds BOS and [gMASK] with `seq.index(...)`): again with ids ending in them."""
    searched: list[int] = []
    while not run.ok and len(searched) < 4 and (token := searched_token(run, original.tiny, searched)) is not None:
        # the ids end with them, in the order its tokenizer writes
        searched.insert(0, token)
        original.ids = [seq[:len(seq) - len(searched)] + searched for seq in original.ids]
        if original.log:
            original.log(f"the original looks for token {token} in the input ({run.error}); again with ids ending in {searched}")
        run = original.run()
    return run


def _one_sequence(original: _Original, run: ReferenceRun, shims: bool) -> tuple[ReferenceRun, str | None]:
    """Code that handles a batch of two only with an attention mask, which the proof passes to
    neither side (CodeShell builds a batch-1 causal mask and checks it against the batch): again
    on the first sequence alone, the way vLLM hands a model its tokens. (run, the failure on two)."""
    error = run.error or ""
    if run.ok or len(original.ids) < 2 or not error.startswith("running the original forward pass") or not any(w in error for w in ("size", "shape")):
        return run, None
    failure = error.splitlines()[0]
    if original.log:
        original.log(f"the original fails on two sequences without a mask ({failure}); again on one")
    ids = original.ids
    original.ids = ids[:1]
    single = original.run(shims)
    if not single.ok:
        original.ids = ids
        return run, None
    return single, failure


def _with_gpu_shims(original: _Original, needs: str) -> tuple[ReferenceRun, list[str]]:
    """Code written for GPUs: (the run, config flags switched off) with CPU stand-ins that keep its function (gpu_shims.py)."""
    if original.log:
        original.log(f"the original needs {needs} to construct; again with CPU stand-ins for CUDA-only packages and .cuda()")
    shimmed = original.with_optional(original.run(shims=True), shims=True)
    switched: list[str] = []
    flags = [k for k in FLASH_FLAGS if original.tiny.get(k) is True]
    if not shimmed.ok and flags:
        # the config selects a flash-attention kernel the code then asserts CUDA and fp16 for
        # (TeleChat's `flash_attn: true`); flash attention is exact softmax attention, so the
        # code's own eager path computes the same function
        if original.log:
            original.log(f"the original's flash path needs a GPU ({(shimmed.error or '?').splitlines()[0][:160]}); again with {', '.join(flags)} false")
        original.tiny = {**original.tiny, **dict.fromkeys(flags, False)}
        shimmed = original.with_optional(original.run(shims=True), shims=True)
        switched = flags
    _refuse_cuda_kernel(shimmed)
    return shimmed, switched


def _refuse_cuda_kernel(shimmed: ReferenceRun) -> None:
    """A CUDA-only kernel the shimmed run still reached on the CPU path: nothing can be proven here, so say where."""
    reached = (shimmed.result.get("gpu_shims") or {}).get("reached") or []
    if reached:
        where = shimmed.error_at
        at = f" ({where['file']}:{where['line']}: `{where['code']}`)" if where else ""
        raise ReferenceError(f"the original calls {reached[0]}{at}, a CUDA-only kernel, on the path a CPU takes: it really needs a GPU, "
                             "so nothing can be proven against it here")


def _refuse_uninstallable(run: ReferenceRun) -> None:
    """An unguarded import of a CUDA-only package fails in every release: stop rather than fall back."""
    missing = _missing_uninstallable(run)
    if missing:
        where = run.error_at
        at = f" ({where['file']}:{where['line']})" if where else ""
        raise ReferenceError(f"the original imports {missing} unguarded{at}, a package that cannot be installed on a CPU machine "
                             "(CUDA kernels): it runs in no reference environment here, so nothing can be proven against it")


def _undeclared(config: dict[str, Any]) -> bool:
    """Whether config.json names no transformers release: then any failure is worth an older release."""
    return not release_of(str(config.get("transformers_version") or ""))


FLASH_FLAGS = ("flash_attn", "use_flash_attn", "use_flash_attention", "use_flash_attention_2", "flash_attention")
"""Config switches remote code reads to take a flash-attention kernel instead of its own attention."""

ASKED_PACKAGE = re.compile(r"No module named '([\w.]+)'|[Pp]lease install (?:the )?`?([A-Za-z][\w.-]*)`?|pip install `?([A-Za-z][\w.-]*)")


def optional_package_wanted(run: ReferenceRun, packages: tuple[str, ...]) -> str | None:
    """The PyPI package an original's failure asks for, when it installs on a CPU machine and is
    not installed yet (None: anything else, or a CUDA-only package, which gpu_shims stands in for)."""
    match = ASKED_PACKAGE.search(run.error or "")
    if not match:
        return None
    name = next(g for g in match.groups() if g).split(".")[0]
    req = pip_requirement(name.replace("-", "_"))
    if req is None or req in packages or name.replace("-", "_") in ("torch", "transformers", "numpy"):
        return None
    return req


SEARCHED_TOKEN = re.compile(r"ValueError: (\d+) is not in list")


def searched_token(run: ReferenceRun, tiny: dict[str, Any], already: list[int]) -> int | None:
    """The special token id the original looked for in the input and did not find (``list.index``'s
    ``ValueError: N is not in list``), when N is one of the config's ``*_token_id`` values and
    inside the shrunk vocabulary; None otherwise (the failure is something else)."""
    match = SEARCHED_TOKEN.search(run.error or "")
    if not match:
        return None
    token = int(match.group(1))
    named = {v for k, v in tiny.items() if k.endswith("token_id") and isinstance(v, int) and not isinstance(v, bool)}
    vocab = first(tiny, "vocab")
    if token not in named or token in already or not (isinstance(vocab, int) and 0 <= token < vocab):
        return None
    return token


def _real_head_dim(config: dict[str, Any]) -> int | None:
    explicit = first(config, "head_dim")
    heads, _ = head_counts(config)
    hidden = first(config, "hidden")
    if isinstance(explicit, int):
        return explicit
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def is_shape_failure(run: ReferenceRun) -> bool:
    text = run.error or ""
    return "RuntimeError" in text and any(w in text for w in ("shape", "size", "dimension"))


def _missing_uninstallable(run: ReferenceRun) -> str | None:
    m = re.search(r"No module named '([\w.]+)'", run.error or "")
    top = m.group(1).split(".")[0] if m else None
    return top if top in NOT_INSTALLABLE and top not in ("torch", "transformers") else None


def _needs_a_gpu(run: ReferenceRun) -> str | None:
    """What stopped an original that constructs only on a GPU machine: an unguarded import of a
    CUDA-only package, or a ``.cuda()`` / CUDA assertion on a torch built without CUDA."""
    if run.ok:
        return None
    missing = _missing_uninstallable(run)
    if missing:
        return f"{missing} (a CUDA-only package)"
    text = run.error or ""
    if "not compiled with CUDA" in text or "Found no NVIDIA driver" in text or "CUDA driver" in text:
        return "CUDA (`.cuda()` or a CUDA device)"
    if "flash_attn" in text or "flash-attn" in text or "flash attention" in text.lower():
        return "flash-attn (asserted by the code)"
    return None


def _is_import_failure(run: ReferenceRun) -> bool:
    error = run.error or ""
    return error.startswith("importing the remote code") and ("ImportError" in error or "ModuleNotFoundError" in error or "AttributeError" in error)
