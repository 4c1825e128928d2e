"""HFC811 (transformers APIs removed in v5) and HFC812 (unguarded CUDA-only imports).

- ``transformers.modeling_attn_mask_utils._prepare_4d_causal_attention_mask[_for_sdpa]`` ->
  ``transformers.masking_utils.create_causal_mask(self.config, inputs_embeds, mask, cache)``
  (positional: the same call works on 5.20, vLLM's pin, and on 5.24, where the cache argument
  was renamed), which builds the mask each attention backend expects (or none);
- ``is_torch_fx_available``: its ``if`` blocks (``torch.fx.wrap`` registrations) are deleted;
- ``HybridCache`` (unused: the import goes; used: ``DynamicCache``), ``LlamaFlashAttention2`` /
  ``LlamaSdpaAttention`` -> ``LlamaAttention``, ``transformers.utils.fx`` imports (when unused);
- ``DynamicCache.from_legacy_cache(x)`` -> ``DynamicCache(config=self.config)``,
  ``cache.to_legacy_cache()`` -> ``cache``, ``cache.get_usable_length(n, i)`` ->
  ``cache.get_seq_length(i)``, ``cache.seen_tokens`` -> ``cache.get_seq_length()``, and
  GenerationMixin's ``self._extract_past_from_model_output(outputs, ...)`` (gone in 5, called
  by 4.x code overriding ``_update_model_kwargs_for_generation``) -> ``outputs.past_key_values``
  (``("past_key_values", outputs.past_key_values)`` where 4.4x's ``(cache_name, cache)`` is unpacked);
- an unconditional import of a CUDA-only package that is not installed (flash_attn, xformers, ...)
  is deleted when nothing uses what it binds, else guarded (``if is_flash_attn_2_available():``,
  or ``try/except ImportError``), which transformers' ``check_imports`` skips.
Any other removed import (the releases' own table, ``data/transformers_removed.json``) is
dropped when nothing uses it, re-imported from the top level where transformers 5 still
exports the name there (``transformers.tokenization_utils.PreTrainedTokenizer`` ->
``transformers.PreTrainedTokenizer``), else refused naming it.
``MambaCache`` and other unknown helpers are refused: a model that needs them has recurrent
layers vLLM does not serve through this backend.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from hfcheck.analyzer.remote import removed_apis
from hfcheck.analyzer.remote.checks.imports import installed
from hfcheck.analyzer.vllm.environment import serving_environment
from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, parse, save
from hfcheck.shared.packages import CUDA_ONLY

MASK_HELPERS = {"_prepare_4d_causal_attention_mask", "_prepare_4d_causal_attention_mask_for_sdpa"}
CACHE_PARAMS = ("past_key_values", "cache", "past_key_value", "layer_past")
WHY_IMPORT = "the import fails on transformers >= 5.24 before any model exists (ImportError when transformers loads the code)"
IMPORT_CAUSAL_MASK = cst.parse_statement("from transformers.masking_utils import create_causal_mask\n")
IMPORT_LLAMA_ATTENTION = cst.parse_statement("from transformers.models.llama.modeling_llama import LlamaAttention\n")


PRUNING_HOOKS = ("prune_heads", "_prune_heads")
"""4.x's head-pruning hooks (``PreTrainedModel.prune_heads`` -> ``_prune_heads`` -> each attention's
``prune_heads``); transformers 5 removed head pruning and its helpers."""


def _removed_without_replacement(module: cst.Module) -> set[str]:
    """The local names of the module's removed transformers imports that have no rewrite here
    (no special case below and not exported from the top level any more)."""
    found: set[str] = set()
    for s in module.body:
        small = cu.simple(s)
        if not isinstance(small, cst.ImportFrom) or small.relative or isinstance(small.names, cst.ImportStar):
            continue
        mod = cu.dotted(small.module) or ""
        for alias in small.names:
            name = cu.dotted(alias.name) or ""
            api = removed_apis.match_import(mod, name)
            if api is None or name in MASK_HELPERS or any(k in api.label for k in ("is_torch_fx_available", "HybridCache", "FlashAttention2", "SdpaAttention")):
                continue
            if not _at_top_level(name):
                found.add(cst.ensure_type(alias.asname.name, cst.Name).value if alias.asname is not None else name)
    return found


def _at_top_level(name: str) -> bool:
    """Does the installed (trusted) transformers still export ``name`` at its top level?"""
    import transformers

    try:
        return getattr(transformers, name, None) is not None
    except Exception:  # noqa: BLE001 - a lazy name whose module no longer imports: not there
        return False


class RemovedApis(Codemod):
    name = "removed-apis"
    codes = ("HFC811", "HFC812")

    def apply(self, state) -> None:
        index = state.index()
        for file in list(state.files):
            if index.files[file].tree is None:
                continue
            module = parse(state, file)
            module = self._dead_users(state, file, module)
            module = self._imports(state, index, file, module)
            module = self._cache_methods(state, file, module)
            module = self._unguarded(state, file, module)
            save(state, file, module)

    # ------------------------------------------------------------------ removed imports

    def _imports(self, state, index, file: str, module: cst.Module) -> cst.Module:
        body = list(module.body)
        new_body: list[cst.BaseStatement] = []
        mask_locals: set[str] = set()
        fx_flags: set[str] = set()
        renames: dict[str, str] = {}
        need_dynamic = False
        for s in body:
            small = cu.simple(s)
            if not isinstance(small, cst.ImportFrom) or small.relative or isinstance(small.names, cst.ImportStar):
                new_body.append(s)
                continue
            mod = cu.dotted(small.module) or ""
            keep: list[cst.ImportAlias] = []
            replacement: list[cst.BaseStatement] = []
            for alias in small.names:
                name = cu.dotted(alias.name) or ""
                local = cst.ensure_type(alias.asname.name, cst.Name).value if alias.asname is not None else name
                api = removed_apis.match_import(mod, name)
                if api is None:
                    keep.append(alias)
                    continue
                label = api.label
                if label == "transformers.modeling_attn_mask_utils" and name in MASK_HELPERS and self._mask_calls_ok(module, local):
                    mask_locals.add(local)
                    if not any("create_causal_mask" in cu.code(r) for r in replacement):
                        replacement.append(IMPORT_CAUSAL_MASK)
                    state.change("HFC811", file, "imports", f"{mod}.{name} -> transformers.masking_utils.create_causal_mask", WHY_IMPORT)
                elif label.endswith("is_torch_fx_available"):
                    fx_flags.add(local)
                    state.change("HFC811", file, "imports", f"dropped {name} (and the `if {local}():` blocks it guarded)", WHY_IMPORT)
                elif label.endswith("HybridCache"):
                    if cu.count_name(module, local) > 0:
                        renames[local] = "DynamicCache"
                        need_dynamic = True
                        state.change("HFC811", file, "imports", "HybridCache -> DynamicCache (sliding layers come from config.layer_types in v5)", WHY_IMPORT)
                    else:
                        state.change("HFC811", file, "imports", "dropped the unused HybridCache import", WHY_IMPORT)
                elif "FlashAttention2" in label or "SdpaAttention" in label:
                    renames[local] = "LlamaAttention"
                    replacement.append(IMPORT_LLAMA_ATTENTION)
                    state.change("HFC811", file, "imports", f"{name} -> LlamaAttention (dispatches through the attention interface)", WHY_IMPORT)
                elif cu.count_name(module, local) == 0:
                    state.change("HFC811", file, "imports", f"dropped the unused import of {mod}.{name}", WHY_IMPORT)
                elif name and _at_top_level(name):
                    moved = cst.ImportAlias(cst.Name(name), asname=cst.AsName(cst.Name(local)) if local != name else None)
                    replacement.append(cst.SimpleStatementLine([cst.ImportFrom(module=cst.Name("transformers"), names=[moved])]))
                    state.change("HFC811", file, "imports", f"{mod}.{name} -> transformers.{name} (it moved: the top level still exports it)", WHY_IMPORT)
                else:
                    keep.append(alias)
                    state.refuse("HFC811", file, "imports", f"{mod}.{name}: {api.replacement} (not rewritten automatically)")
            if len(keep) == len(small.names):
                new_body.append(s)
                continue
            if keep:
                keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                lpar = small.lpar if len(keep) > 1 else None
                new_small = small.with_changes(names=keep, lpar=lpar, rpar=small.rpar if lpar else None)
                new_body.append(s.with_changes(body=[new_small]))
                new_body.extend(replacement)
            elif replacement:
                new_body.append(cu.carry_leading(s, replacement[0]))
                new_body.extend(replacement[1:])
        module = module.with_changes(body=new_body)
        if mask_locals:
            module = self._mask_calls(module, mask_locals)
        if fx_flags:
            module = _drop_flag_blocks(module, fx_flags)
        if renames:
            module = cu.replace_nodes(module, lambda n: cst.Name(renames[n.value]) if isinstance(n, cst.Name) and n.value in renames else None)
        if need_dynamic:
            module = cu.ensure_import(module, "from transformers.cache_utils import DynamicCache\n", "DynamicCache")
        return module

    def _dead_users(self, state, file: str, module: cst.Module) -> cst.Module:
        """Code that exists only for what transformers 5 removed goes with it, so the import it
        needed goes as unused: a top-level class built on a removed base that nothing in the
        package names (an ONNX export config on ``transformers.onnx``), and the head-pruning hooks (``prune_heads``,
        ``_prune_heads``: 5 has no head pruning, nothing calls them) that use a removed helper."""
        removed = _removed_without_replacement(module)
        if not removed:
            return module
        texts = "\n".join(state.files.values())
        named = set(str(v) for v in (state.config.get("auto_map") or {}).values())
        body: list[cst.BaseStatement] = []
        for s in module.body:
            uses = set().union(*(cu.names_in(b) for b in s.bases)) & removed if isinstance(s, cst.ClassDef) else set()
            if isinstance(s, cst.ClassDef) and uses and len(re.findall(rf"\b{re.escape(s.name.value)}\b", texts)) == 1 \
                    and not any(v.endswith("." + s.name.value) for v in named):
                state.change("HFC811", file, s.name.value, f"removed {s.name.value}: built on {', '.join(sorted(uses))}, which transformers 5 "
                             "removed, and nothing in the model names it", WHY_IMPORT)
                continue
            if isinstance(s, cst.ClassDef):
                hooks = [f for f in cu.body_of(s) if isinstance(f, cst.FunctionDef) and f.name.value in PRUNING_HOOKS]
                if any(cu.names_in(f) & removed for f in hooks):
                    s = s.with_changes(body=s.body.with_changes(body=[f for f in cu.body_of(s) if f not in hooks]))
                    state.change("HFC811", file, f"{s.name.value}.{'/'.join(f.name.value for f in hooks)}",
                                 "removed the head-pruning hook: transformers 5 has no head pruning (nothing calls it) and "
                                 f"{', '.join(sorted(set().union(*(cu.names_in(f) & removed for f in hooks))))} is gone", WHY_IMPORT)
            body.append(s)
        return module.with_changes(body=body)

    def _mask_calls_ok(self, module: cst.Module, local: str) -> bool:
        calls = cu.find_calls(module, lambda c: m.matches(c.func, m.Name(local)))
        return all(len([a for a in c.args if a.keyword is None]) == 4 and all(a.keyword is None or a.keyword.value == "past_key_values_length" for a in c.args) for c in calls)

    def _mask_calls(self, module: cst.Module, locals_: set[str]) -> cst.Module:
        class T(cst.CSTTransformer):
            def __init__(self):
                self.params: list[list[str]] = []

            def visit_FunctionDef(self, node):
                self.params.append(cu.param_names(node))

            def leave_FunctionDef(self, original, updated):
                self.params.pop()
                return updated

            def leave_Call(self, original, updated):
                if isinstance(updated.func, cst.Name) and updated.func.value in locals_:
                    args = [a.value for a in updated.args]
                    params = self.params[-1] if self.params else []
                    cache = next((p for p in CACHE_PARAMS if p in params), "None")
                    return cu.template_expr("create_causal_mask(self.config, {embeds}, {mask}, {cache})", embeds=args[2], mask=args[0], cache=cache)
                if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "wrap" and any(
                        isinstance(a.value, cst.Name) and a.value.value in locals_ for a in updated.args):
                    return updated  # inside an fx block that goes with is_torch_fx_available
                return updated

        return module.visit(T())

    # ------------------------------------------------------------------ Cache methods

    def _cache_methods(self, state, file: str, module: cst.Module) -> cst.Module:
        done: list[str] = []

        class T(cst.CSTTransformer):
            def leave_Call(self, original, updated):
                func = updated.func
                if not isinstance(func, cst.Attribute):
                    return updated
                attr = func.attr.value
                if attr == "from_legacy_cache" and cu.dotted(func.value) == "DynamicCache":
                    done.append("DynamicCache.from_legacy_cache(x) -> DynamicCache(config=self.config)")
                    return cst.parse_expression("DynamicCache(config=self.config)")
                if attr == "to_legacy_cache" and not updated.args:
                    done.append("cache.to_legacy_cache() -> the cache itself")
                    return func.value
                if attr == "_extract_past_from_model_output" and cu.dotted(func.value) == "self" and updated.args:
                    done.append("self._extract_past_from_model_output(outputs, ...) -> outputs.past_key_values (what it returned for a decoder)")
                    return cst.Attribute(updated.args[0].value, cst.Name("past_key_values"))
                if attr == "get_usable_length":
                    layer = updated.args[1].value if len(updated.args) > 1 else None
                    done.append("cache.get_usable_length(n, i) -> cache.get_seq_length(i)")
                    return cst.Call(cst.Attribute(func.value, cst.Name("get_seq_length")), args=[cst.Arg(layer)] if layer is not None else [])
                return updated

            def leave_Assign(self, original, updated):
                # 4.42-4.4x returned (cache_name, cache): `cache_name, cache = self._extract_past_from_model_output(outputs)`
                value = original.value
                if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "_extract_past_from_model_output"
                        and len(original.targets) == 1 and isinstance(original.targets[0].target, cst.Tuple)
                        and len(original.targets[0].target.elements) == 2):
                    return updated.with_changes(value=cu.template_expr('("past_key_values", {cache})', cache=updated.value))
                return updated

            def leave_Attribute(self, original, updated):
                if updated.attr.value == "seen_tokens":
                    done.append("cache.seen_tokens -> cache.get_seq_length()")
                    return cst.Call(cst.Attribute(updated.value, cst.Name("get_seq_length")))
                return updated

        module = module.visit(T())
        for what in dict.fromkeys(done):
            state.change("HFC811", file, "Cache calls", what, "v5 has no tuple caches: these methods raise AttributeError when the path runs")
        return module

    # ------------------------------------------------------------------ HFC812

    def _unguarded(self, state, file: str, module: cst.Module) -> cst.Module:
        body = list(module.body)
        out: list[cst.BaseStatement] = []
        need_flag = False
        for s in body:
            small = cu.simple(s)
            top = None
            if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                top = (cu.dotted(small.module) or "").split(".")[0]
            elif isinstance(small, cst.Import):
                top = (cu.dotted(small.names[0].name) or "").split(".")[0]
            if top is None or top not in CUDA_ONLY or installed(top):
                out.append(s)
                continue
            bound = []
            assert isinstance(small, (cst.Import, cst.ImportFrom))  # `top` is set only for imports
            names = small.names if not isinstance(small.names, cst.ImportStar) else []
            for alias in names:
                bound.append(cst.ensure_type(alias.asname.name, cst.Name).value if alias.asname is not None
                             else (cu.dotted(alias.name) or "").split(".")[0])
            rest = module.with_changes(body=[x for x in body if x is not s])
            if bound and all(cu.count_name(rest, b) == 0 for b in bound):
                state.change("HFC812", file, "imports", f"dropped the unused unconditional import `{cu.code(small).strip()}` ({CUDA_ONLY[top]})",
                             "transformers refuses to load code whose unconditional imports are not installed; flash-attention exists only on CUDA machines")
                continue
            plain = s.with_changes(leading_lines=[])
            guard: cst.If | cst.Try
            if top.startswith("flash_attn"):
                need_flag = True
                guard = cst.If(test=cst.parse_expression("is_flash_attn_2_available()"), body=cst.IndentedBlock(body=[plain]))
                how = "if is_flash_attn_2_available():"
            else:
                guard = cst.Try(body=cst.IndentedBlock(body=[plain]),
                                handlers=[cst.ExceptHandler(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]), type=cst.Name("ImportError"))])
                how = "try/except ImportError"
            out.append(guard.with_changes(leading_lines=s.leading_lines))
            state.change("HFC812", file, "imports", f"guarded `{cu.code(small).strip()}` with {how}",
                         "transformers' check_imports skips guarded imports; unguarded, the code loads only where the CUDA package is installed")
        module = module.with_changes(body=out)
        if need_flag:
            module = cu.ensure_import(module, "from transformers.utils import is_flash_attn_2_available\n", "is_flash_attn_2_available")
        return self._lazy_imports(state, file, module)

    def _lazy_imports(self, state, file: str, module: cst.Module) -> cst.Module:
        """An unguarded import inside a function (Qwen's ``chat_stream`` importing
        transformers_stream_generator) of a package vLLM's environment lacks: check_imports reads
        it all the same and refuses the whole file. Guarded, the file loads; the function raises
        the same ImportError, with the package to install, only when it is called."""

        env = serving_environment()
        done: list[str] = []

        class Guard(cst.CSTTransformer):
            def __init__(self) -> None:
                self.depth = 0
                self.in_try = 0

            def visit_FunctionDef(self, node) -> None:
                self.depth += 1

            def leave_FunctionDef(self, original, updated):
                self.depth -= 1
                return updated

            def visit_Try(self, node) -> None:
                self.in_try += 1

            def leave_Try(self, original, updated):
                self.in_try -= 1
                return updated

            def leave_SimpleStatementLine(self, original, updated):
                if not self.depth or self.in_try or len(updated.body) != 1:
                    return updated
                small = updated.body[0]
                top = None
                if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                    top = (cu.dotted(small.module) or "").split(".")[0]
                elif isinstance(small, cst.Import):
                    top = (cu.dotted(small.names[0].name) or "").split(".")[0]
                if not top or env.provides(top):
                    return updated
                done.append(f"`{cu.code(small).strip()}`")
                plain = updated.with_changes(leading_lines=[])
                raise_ = cu.template("raise ImportError({message}) from exc\n", message=cst.SimpleString(f'"this method needs the {top} package: pip install {top}"'))
                return cst.Try(body=cst.IndentedBlock(body=[plain]),
                               handlers=[cst.ExceptHandler(body=cst.IndentedBlock(body=[raise_]), type=cst.Name("ImportError"),
                                                           name=cst.AsName(name=cst.Name("exc")))],
                               leading_lines=updated.leading_lines)

        module = module.visit(Guard())
        for what in done:
            state.change("HFC812", file, "imports", f"guarded the import inside a function {what} with try/except ImportError (re-raised when called)",
                         "transformers' check_imports reads imports inside functions too and refuses to load the file when the package is missing")
        return module


def _drop_flag_blocks(module: cst.Module, flags: set[str]) -> cst.Module:
    """Delete ``if is_torch_fx_available(): ...`` (keeping an ``else`` body); other calls -> False."""

    def is_flag(test) -> bool:
        return m.matches(test, m.Call(func=m.Name(m.MatchIfTrue(lambda name: name in flags))))

    class T(cst.CSTTransformer):
        def leave_If(self, original, updated):
            if not is_flag(original.test):
                return updated
            if updated.orelse is None:
                return cst.RemovalSentinel.REMOVE
            if isinstance(updated.orelse, cst.Else):
                return cst.FlattenSentinel(list(updated.orelse.body.body))
            return updated

        def leave_Call(self, original, updated):
            return cst.Name("False") if is_flag(updated) else updated

    return module.visit(T())


class HeadMask(Codemod):
    """``self.get_head_mask(head_mask, n)`` (``PreTrainedModel.get_head_mask``, gone in v5) ->
    ``[None] * n``: what v4 returned for the ``head_mask=None`` every caller (generate, vLLM)
    passes. A model that is given a real head mask needs a hand-written change (noted)."""

    name = "head-mask"
    codes = ("HFC811",)

    def apply(self, state) -> None:
        class Rewrite(cst.CSTTransformer):
            def __init__(self) -> None:
                self.count = 0

            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
                func = updated.func
                if m.matches(func, cu.self_attr("get_head_mask")) and len(updated.args) >= 2:
                    self.count += 1
                    n = cu.code(updated.args[1].value)
                    return cst.parse_expression(f"[None] * ({n})")
                return updated

        for file in list(state.files):
            if "get_head_mask" not in state.files[file]:
                continue
            rewrite = Rewrite()
            module = parse(state, file).visit(rewrite)
            if rewrite.count:
                save(state, file, module)
                state.change("HFC811", file, "get_head_mask", f"{rewrite.count} call(s) of self.get_head_mask(head_mask, n) -> [None] * n",
                             "PreTrainedModel.get_head_mask is gone in transformers 5; with head_mask=None (generate, vLLM) it returned n Nones")
