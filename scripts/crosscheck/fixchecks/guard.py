# Verify the suggested fix for hfcheck's QKV/MergedColumn input-stability check on guarded projections
# (Gemma 4 `v_proj(x) if self.v_proj is not None else key_states`): fold existence guards as vLLM's
# bypass_existence_guard does before the alias analysis, and let _fresh take only the live branch.
import ast, copy, sys, warnings
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')); warnings.filterwarnings('ignore')
from common import build_cut_model
import hfcheck.analyzer.graph.forward_source as src
from hfcheck.analyzer.fusions import detect
from hfcheck.analyzer.instance import register_attention
register_attention()
fix = '--fix' in sys.argv
if fix:
    _orig_forward_def, _orig_single_call, _orig_fresh = src.forward_def, src.single_call, src._fresh
    src.forward_def = lambda cls: copy.deepcopy(_orig_forward_def(cls))       # never mutate the cached AST
    def single_call(funcdef, name, *, guards_allowed=True):
        call = _orig_single_call(funcdef, name, guards_allowed=guards_allowed)
        parents = src._parents(funcdef)
        for ref in [n for n in ast.walk(funcdef) if src._self_attr(n, name) and n is not call.func]:
            parent = parents.get(id(ref))
            if isinstance(parent, ast.Compare) and isinstance(parent.ops[0], (ast.Is, ast.IsNot)):
                new, old = ast.Constant(isinstance(parent.ops[0], ast.IsNot)), parent
            else:
                new, old = ast.Constant(True), ref
            for p in ast.walk(funcdef):
                for field, value in ast.iter_fields(p):
                    if value is old: setattr(p, field, new)
                    elif isinstance(value, list): value[:] = [new if v is old else v for v in value]
        return call
    src.single_call = single_call
    def _fresh(node, module):
        if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Constant):
            return _orig_fresh(node.body if node.test.value else node.orelse, module)
        return _orig_fresh(node, module)
    src._fresh = _fresh
for mt in ('gemma4_text', 'gemma4_unified_text', 'llama', 'qwen3', 'deepseek_v3'):
    _, _, model, _ = build_cut_model(mt, 'hfcheck')
    attn = next(m for p, m in model.named_modules() if p.endswith('layers.0.self_attn'))
    cf = detect.class_fusions(attn)
    print(f"fix={fix} {mt:20s} {type(attn).__name__:26s} candidates={[p.name for p, _ in cf.candidates]} refused={cf.refused}")
