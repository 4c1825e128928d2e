"""transformers v4 stand-ins, for running the *original* model as the reference of a proof.

The original code imports APIs the installed transformers removed (that is why it is being
ported), so the proof's reference run puts back just enough of them, with their v4 semantics,
inside the sandboxed child only: ``transformers.modeling_attn_mask_utils``'s causal-mask
helpers, ``HybridCache``/``MambaCache`` names, ``is_torch_fx_available``, the tuple-cache
methods of ``DynamicCache``, ``LlamaFlashAttention2``/``LlamaSdpaAttention``, and stub modules
for CUDA-only packages that are imported but not installed (calling into them raises).
Nothing here is ever imported into the hfcheck process itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types


def _min(dtype):
    import torch

    return torch.finfo(dtype).min


def _prepare_4d_causal_attention_mask(attention_mask, input_shape, inputs_embeds, past_key_values_length, sliding_window=None):
    """v4's helper: a [bsz, 1, q, kv] additive float mask (0 / dtype min), None for one token."""
    import torch

    bsz, q_len = input_shape[0], input_shape[-1]
    kv_len = q_len + past_key_values_length
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    low = _min(dtype)
    if attention_mask is not None and attention_mask.dim() == 4:
        inverted = 1.0 - attention_mask.to(dtype)
        return inverted.masked_fill(inverted.to(torch.bool), low)
    causal = None
    if q_len > 1 or sliding_window is not None:
        i = torch.arange(q_len, device=device)[:, None] + past_key_values_length
        j = torch.arange(kv_len, device=device)[None, :]
        blocked = j > i
        if sliding_window is not None:
            blocked = blocked | (j <= i - sliding_window)
        causal = torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill(blocked, low)[None, None].expand(bsz, 1, q_len, kv_len)
    if attention_mask is not None:
        expanded = 1.0 - attention_mask[:, None, None, :].expand(bsz, 1, q_len, kv_len).to(dtype)
        expanded = expanded.masked_fill(expanded.to(torch.bool), low)
        causal = expanded if causal is None else causal.masked_fill(expanded.to(torch.bool), low)
    return causal


def _prepare_4d_attention_mask(mask, dtype, tgt_len=None):
    import torch

    bsz, src_len = mask.shape
    tgt_len = tgt_len if tgt_len is not None else src_len
    expanded = 1.0 - mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
    return expanded.masked_fill(expanded.to(torch.bool), _min(dtype))


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise ImportError(f"{self.__name__}.{name} is not installed (a stub in hfcheck's reference run)")

        return missing


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, tops: set[str]):
        self.tops = tops

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.tops:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(stub_packages: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Put the removed v4 APIs back (where missing); return what was installed."""
    import transformers

    done: list[str] = []
    try:
        importlib.import_module("transformers.modeling_attn_mask_utils")
    except ImportError:
        mod = types.ModuleType("transformers.modeling_attn_mask_utils")
        mod._prepare_4d_causal_attention_mask = _prepare_4d_causal_attention_mask
        mod._prepare_4d_causal_attention_mask_for_sdpa = _prepare_4d_causal_attention_mask
        mod._prepare_4d_attention_mask = _prepare_4d_attention_mask
        sys.modules[mod.__name__] = mod
        transformers.modeling_attn_mask_utils = mod
        done.append("transformers.modeling_attn_mask_utils")
    cache_utils = importlib.import_module("transformers.cache_utils")
    dynamic = cache_utils.DynamicCache
    for name in ("HybridCache", "MambaCache", "SlidingWindowCache"):
        if not hasattr(cache_utils, name):
            setattr(cache_utils, name, type(name, (dynamic,), {}))
            done.append(f"transformers.cache_utils.{name}")
    if not hasattr(dynamic, "from_legacy_cache"):
        def from_legacy_cache(cls, past_key_values=None):
            cache = cls()
            for i, (k, v) in enumerate(past_key_values or ()):
                cache.update(k, v, i)
            return cache

        dynamic.from_legacy_cache = classmethod(from_legacy_cache)
        done.append("DynamicCache.from_legacy_cache")
    if not hasattr(dynamic, "to_legacy_cache"):
        dynamic.to_legacy_cache = lambda self: tuple((layer.keys, layer.values) for layer in self.layers)
        done.append("DynamicCache.to_legacy_cache")
    if not hasattr(dynamic, "get_usable_length"):
        dynamic.get_usable_length = lambda self, new_seq_length, layer_idx=0: self.get_seq_length(layer_idx)
        done.append("DynamicCache.get_usable_length")
    if not hasattr(dynamic, "seen_tokens"):
        dynamic.seen_tokens = property(lambda self: self.get_seq_length())
        done.append("DynamicCache.seen_tokens")
    utils = importlib.import_module("transformers.utils")
    if not hasattr(utils, "is_torch_fx_available"):
        utils.is_torch_fx_available = lambda: False
        importlib.import_module("transformers.utils.import_utils").is_torch_fx_available = utils.is_torch_fx_available
        done.append("transformers.utils.is_torch_fx_available")
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    for name in ("LlamaFlashAttention2", "LlamaSdpaAttention"):
        if not hasattr(llama, name):
            setattr(llama, name, llama.LlamaAttention)
            done.append(name)
    tops = {p for p in stub_packages if importlib.util.find_spec(p) is None} if stub_packages else set()
    if tops:
        sys.meta_path.insert(0, _StubFinder(tops))
        done.extend(f"stub {t}" for t in sorted(tops))
    return done
