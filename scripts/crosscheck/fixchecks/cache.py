# Verify: on transformers >= 5.21 the forward argument `past_key_values` is renamed `cache`; vLLM 0.33 (tf 5.20)
# traces with past_key_values=None, so hfcheck's trace_module should make `cache` concrete None too.
import sys, warnings, inspect, contextlib
from unittest import mock
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')); warnings.filterwarnings('ignore')
from common import build_cut_model
import hfcheck.analyzer.graph.tracer as T
from hfcheck.analyzer.fusions import detect
from hfcheck.analyzer.instance import register_attention
register_attention()
orig = T.trace_module
def trace_module(module):
    params = T.forward_parameters(type(module))
    if "cache" not in params or "past_key_values" in params:
        return orig(module)
    tracer = T.LeafTracer()
    tracer.kwargs_name = next((p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    forward = type(module).forward
    unwrapped = inspect.unwrap(forward)
    patch = mock.patch.object(type(module), "forward", unwrapped) if unwrapped is not forward else contextlib.nullcontext()
    try:
        with T._opaque_attention_interfaces(), patch:
            return T.Trace(tracer.trace(module, concrete_args={"cache": None}), complete=True)
    except Exception as exc:
        return T.Trace(getattr(tracer, "graph", None), complete=False, error=str(exc)[:200])
for fix in (False, True):
    detect.clear_cache()
    detect.trace_module = trace_module if fix else orig
    _, _, model, _ = build_cut_model('whisper', 'hfcheck')
    m = model.get_submodule('decoder.layers.0.encoder_attn')
    cf = detect.class_fusions(m)
    print(f"fix={fix} whisper encoder_attn candidates={[p.name for p, _ in cf.candidates]} trace_error={cf.trace.error}")
