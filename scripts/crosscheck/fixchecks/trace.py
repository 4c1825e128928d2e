# Verify suggested fix for hfcheck trace_module: unwrap only the cache-rename deprecate_kwarg wrappers.
import sys, inspect, contextlib, warnings
from unittest import mock
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')); warnings.filterwarnings('ignore')
import torch
from transformers import AutoConfig, AutoModel
from common import cut_text_config
import hfcheck.analyzer.graph.tracer as T
from hfcheck.analyzer.instance import register_attention
register_attention()

def _cache_rename_only(fn):
    """Unwrap @deprecate_kwarg wrappers renaming past_key_values/cache_params -> cache (transformers >= 5.21); stop at any other wrapper."""
    while hasattr(fn, "__wrapped__"):
        nl = inspect.getclosurevars(fn).nonlocals
        if nl.get("new_name") == "cache" and nl.get("old_name") in ("past_key_values", "cache_params"):
            fn = fn.__wrapped__
        else:
            break
    return fn

orig_unwrap = inspect.unwrap
T.inspect = type(sys)("inspect_shim"); T.inspect.__dict__.update(inspect.__dict__); T.inspect.unwrap = _cache_rename_only
cfg = AutoConfig.for_model('mllama'); text = cfg.get_text_config(); cut_text_config(cfg); text._attn_implementation = 'hfcheck'
with torch.device('meta'): model = AutoModel.from_config(cfg)
m = model.get_submodule('vision_model.global_transformer.layers.0.self_attn')
t = T.trace_module(m); print('mllama vision attn:', t.complete, t.error, len(list(t.graph.nodes)) if t.graph else None)
cfg = AutoConfig.for_model('llama'); cut_text_config(cfg); cfg._attn_implementation = 'hfcheck'
with torch.device('meta'): model = AutoModel.from_config(cfg)
t = T.trace_module(model.layers[0].self_attn); print('llama attn:', t.complete, t.error, len(list(t.graph.nodes)))
