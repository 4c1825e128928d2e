"""Each port codemod on its own, as LibCST's ``CodemodTest`` states a codemod: this source in,
that source out (and, where it refuses, the warning it gives and the code left alone).

The codemods (``porter/rewrite/codemods``) run one after another on a whole port (the modeling file,
its configuration, the config.json); that multi-file port, with its weight renames and proofs, is
covered by tests/test_port.py. Here every codemod in ``CODEMODS`` is named by at least one test
that shows the one construct it rewrites, on a small model that is otherwise already compliant:
``modeling()`` builds ``modeling_x.py`` from the parts below (imports, the eager attention
function, MLP, attention, decoder layer, PreTrainedModel, base model, causal LM), and each test
swaps in the part its codemod changes. The compliant parts are a fixed point of every codemod, so
a test's ``after`` differs from its ``before`` only where the codemod works.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import pytest
from libcst.codemod import CodemodContext, CodemodTest

from hfcheck.analyzer.remote.checks.imports import installed
from hfcheck.porter.rewrite.codemods import (
    CODEMODS,
    ActivationModule,
    AttentionInterface,
    BackendFlag,
    BufferInit,
    ConfigAliases,
    DevicePlacement,
    DroppedConfigDefaults,
    ExpertsLayout,
    GenerationBase,
    HeadMask,
    InlineProjectionHelpers,
    KwargsPropagation,
    LayerIndex,
    LegacyRopeScaling,
    PackedQKV,
    ParallelPlans,
    PostInit,
    RemovedApis,
    RotaryPositions,
    SingleLayerList,
    TiedWeights,
    TupleCache,
)
from hfcheck.porter.rewrite.codemods.attention import EAGER as PORT_EAGER

MODELING_FILE = "modeling_x.py"
CONFIGURATION_FILE = "configuration_x.py"

CONFIG = {
    "architectures": ["TinyForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_x.TinyConfig",
        "AutoModel": "modeling_x.TinyModel",
        "AutoModelForCausalLM": "modeling_x.TinyForCausalLM",
    },
    "model_type": "tiny",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
}

CONFIGURATION = '''
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny"

    def __init__(self, vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, hidden_act="silu", rms_norm_eps=1e-6, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        super().__init__(**kwargs)
'''

# ---------------------------------------------------------------------- the compliant model, in parts

IMPORTS = '''
import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from .configuration_x import TinyConfig
'''

EAGER = '''
def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights
'''

MLP = '''
class TinyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''

ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
'''

LAYER = '''
class TinyDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = TinyAttention(config, layer_idx=layer_idx)
        self.mlp = TinyMLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), attention_mask=attention_mask, **kwargs)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
'''

PRETRAINED = '''
class TinyPreTrainedModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
'''

MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden_states = self.embed_tokens(input_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))
'''

CAUSAL_LM = '''
class TinyForCausalLM(TinyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        outputs = self.model(input_ids, attention_mask=attention_mask, **kwargs)
        return CausalLMOutputWithPast(logits=self.lm_head(outputs.last_hidden_state))
'''

PARTS = {"imports": IMPORTS, "eager": EAGER, "mlp": MLP, "attention": ATTENTION, "layer": LAYER,
         "pretrained": PRETRAINED, "model": MODEL, "causal_lm": CAUSAL_LM}


def modeling(**parts: str | None) -> str:
    """``modeling_x.py``: the compliant parts, with ``parts`` swapped in (None leaves one out)."""
    unknown = set(parts) - set(PARTS)
    assert not unknown, unknown
    chosen = {**PARTS, **parts}
    return join(*(chosen[name] for name in PARTS if chosen[name] is not None))


def join(*sources: str) -> str:
    """Top-level blocks, two blank lines apart."""
    return "\n\n".join(source.strip("\n") + "\n" for source in sources)


class PortCodemodTest(CodemodTest):
    """``TRANSFORM`` on one file of the tiny model (``modeling_x.py`` unless told), with the other
    file beside it and ``CONFIG`` as its config.json."""

    maxDiff = None

    def assertPorts(self, before: str, after: str, *, warnings: Sequence[str] | None = (), **kwargs) -> CodemodContext:
        """``before`` -> ``after`` (which must differ), with exactly ``warnings`` (None: not checked)."""
        assert before != after, "the source does not trigger the codemod"
        return self._run(before, after, warnings, **kwargs)

    def assertLeavesAlone(self, source: str, *, warnings: Sequence[str], **kwargs) -> CodemodContext:
        """The codemod changes nothing here, giving exactly ``warnings``."""
        return self._run(source, source, warnings, **kwargs)

    def _run(self, before: str, after: str, warnings: Sequence[str] | None, *, file: str = MODELING_FILE,
             config: dict | None = None, files: dict[str, str] | None = None, recorded: dict | None = None) -> CodemodContext:
        if files is None:
            files = {CONFIGURATION_FILE: CONFIGURATION} if file == MODELING_FILE else {MODELING_FILE: modeling()}
        ast.parse(after)  # what the codemod must produce is Python
        context = CodemodContext(filename=file)
        self.assertCodemod(before, after, config=CONFIG if config is None else config, files=files, recorded=recorded,
                           context_override=context, expected_warnings=warnings)
        return context


# ---------------------------------------------------------------------- AttentionInterface (HFC801/803)

IMPORTS_MATH = "import math\n" + IMPORTS

HAND_WRITTEN_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
'''

# the interface call replaces the span; config, scaling and is_causal are stored; the interface
# returns [batch, seq, heads, dim], so the transpose that followed goes
DISPATCHING_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.scaling = self.head_dim**-0.5
        self.is_causal = True

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
'''

SDPA_ONLY_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=attention_mask)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
'''

SDPA_ATTENTION = '''
class TinySdpaAttention(TinyAttention):
    def forward(self, hidden_states, attention_mask=None):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=attention_mask)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
'''

DISPATCHING_SDPA_ATTENTION = '''
class TinySdpaAttention(TinyAttention):
    def forward(self, hidden_states, attention_mask=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
'''


class AttentionInterfaceTest(PortCodemodTest):
    TRANSFORM = AttentionInterface

    def test_hand_written_softmax_becomes_one_interface_call(self):
        self.assertPorts(modeling(imports=IMPORTS_MATH, attention=HAND_WRITTEN_ATTENTION),
                         modeling(imports=IMPORTS_MATH, attention=DISPATCHING_ATTENTION))

    def test_direct_sdpa_call_and_the_eager_fallback_it_needs(self):
        """A file without ``eager_attention_forward`` gets the codemod's own (and the imports)."""
        before_imports = '''
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel

from .configuration_x import TinyConfig
'''
        after_imports = before_imports.replace(  # added after the last absolute import, as written
            "\nfrom .configuration_x", "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\nimport torch\n\nfrom .configuration_x")
        eager = PORT_EAGER.format(name="eager_attention_forward")
        self.assertPorts(modeling(imports=before_imports, eager=None, attention=SDPA_ONLY_ATTENTION),
                         modeling(imports=after_imports, eager=None, mlp=join(MLP, eager), attention=DISPATCHING_ATTENTION))

    def test_attention_class_table_builds_the_eager_class(self):
        """v4's ``{"eager": A, "sdpa": SdpaA}[config._attn_implementation]``: both classes now
        dispatch, and the layer builds the eager one directly (vLLM's "vllm" is no key)."""
        imports = "import math\n\nimport torch.nn.functional as F\n" + IMPORTS.replace("import torch\n", "")
        table = 'TINY_ATTENTION_CLASSES = {"eager": TinyAttention, "sdpa": TinySdpaAttention}\n'
        looked_up = LAYER.replace("TinyAttention(config, layer_idx=layer_idx)",
                                  "TINY_ATTENTION_CLASSES[config._attn_implementation](config, layer_idx=layer_idx)")
        self.assertPorts(
            modeling(imports=imports, attention=join(HAND_WRITTEN_ATTENTION, SDPA_ATTENTION, table), layer=looked_up),
            modeling(imports=imports, attention=join(DISPATCHING_ATTENTION, DISPATCHING_SDPA_ATTENTION, table), layer=LAYER))

    def test_refuses_an_additive_bias_the_interface_cannot_express(self):
        alibi = HAND_WRITTEN_ATTENTION.replace(
            "        if attention_mask is not None:\n",
            "        attn_weights = attn_weights + self.alibi[:, :q_len, :q_len]\n        if attention_mask is not None:\n")
        self.assertLeavesAlone(modeling(imports=IMPORTS_MATH, attention=alibi), warnings=[
            "HFC803 TinyAttention.forward: unrecognised step between QK^T and the value product: "
            "`attn_weights = attn_weights + self.alibi[:, :q_len, :q_len]`"])


# ---------------------------------------------------------------------- RemovedApis (HFC811/812)

V4_IMPORTS = '''
import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, HybridCache
from transformers.generation import GenerationMixin
from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import is_torch_fx_available

from .configuration_x import TinyConfig

if is_torch_fx_available():
    _prepare_4d_causal_attention_mask = torch.fx.wrap(_prepare_4d_causal_attention_mask)
'''

V5_IMPORTS = '''
import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from .configuration_x import TinyConfig
'''

V4_CACHE_MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and not isinstance(past_key_values, DynamicCache):
            past_key_values = DynamicCache.from_legacy_cache(past_key_values)
        past_length = past_key_values.get_usable_length(input_ids.shape[1], 0) if past_key_values is not None else 0
        batch_size, seq_length = input_ids.shape
        attention_mask = _prepare_4d_causal_attention_mask(attention_mask, (batch_size, seq_length), inputs_embeds, past_length)
        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)
        next_cache = past_key_values.to_legacy_cache() if use_cache else None
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), past_key_values=next_cache)
'''

V5_CACHE_MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and not isinstance(past_key_values, DynamicCache):
            past_key_values = DynamicCache(config=self.config)
        past_length = past_key_values.get_seq_length(0) if past_key_values is not None else 0
        batch_size, seq_length = input_ids.shape
        attention_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, past_key_values)
        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)
        next_cache = past_key_values if use_cache else None
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), past_key_values=next_cache)
'''


class RemovedApisTest(PortCodemodTest):
    TRANSFORM = RemovedApis

    def test_v4_mask_helper_fx_guard_and_legacy_cache_calls(self):
        """The 4-D mask helper -> ``create_causal_mask``, the fx blocks and the unused HybridCache
        go, and the tuple-cache methods v5 removed become their Cache equivalents."""
        self.assertPorts(modeling(imports=V4_IMPORTS, model=V4_CACHE_MODEL),
                         modeling(imports=V5_IMPORTS, model=V5_CACHE_MODEL))

    @pytest.mark.skipif(installed("flash_attn"), reason="flash_attn is installed here: its imports need no guard")
    def test_unguarded_flash_attn_imports_are_guarded_or_dropped(self):
        """HFC812: used -> under ``if is_flash_attn_2_available():``; unused -> deleted."""
        before_imports = "import torch\nfrom flash_attn import flash_attn_func\nfrom flash_attn.bert_padding import pad_input\n" + IMPORTS.replace(
            "import torch\n", "", 1)
        after_imports = ("import torch\nfrom transformers.utils import is_flash_attn_2_available\nif is_flash_attn_2_available():\n"
                         "    from flash_attn import flash_attn_func\n" + IMPORTS.replace("import torch\n", "", 1))
        flash = join("def flash_forward(q, k, v):\n    return flash_attn_func(q, k, v, causal=True)\n", EAGER)
        self.assertPorts(modeling(imports=before_imports, eager=flash), modeling(imports=after_imports, eager=flash))

    def test_refuses_a_removed_helper_without_successor(self):
        imports = IMPORTS.replace("from transformers.generation", "from transformers.cache_utils import MambaCache\nfrom transformers.generation")
        model = MODEL.replace("        self.post_init()\n", "        self.cache_class = MambaCache\n        self.post_init()\n")
        self.assertLeavesAlone(modeling(imports=imports, model=model), warnings=[
            "HFC811 imports: transformers.cache_utils.MambaCache: keep the recurrent state in your own cache class "
            "(vLLM serves no SSM layers through this backend anyway) (not rewritten automatically)"])


# ---------------------------------------------------------------------- HeadMask (HFC811)

HEAD_MASK_MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, head_mask=None, **kwargs):
        head_mask = self.get_head_mask(head_mask, self.config.num_hidden_layers)
        hidden_states = self.embed_tokens(input_ids)
        for decoder_layer, layer_head_mask in zip(self.layers, head_mask):
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, head_mask=layer_head_mask, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))
'''


class HeadMaskTest(PortCodemodTest):
    TRANSFORM = HeadMask

    def test_get_head_mask_becomes_a_list_of_nones(self):
        self.assertPorts(
            modeling(model=HEAD_MASK_MODEL),
            modeling(model=HEAD_MASK_MODEL.replace("self.get_head_mask(head_mask, self.config.num_hidden_layers)",
                                                   "[None] * (self.config.num_hidden_layers)")))


# ---------------------------------------------------------------------- DevicePlacement (HFC814)

class DevicePlacementTest(PortCodemodTest):
    TRANSFORM = DevicePlacement

    def test_cuda_call_in_init_is_dropped(self):
        """The buffer follows the module wherever the loader puts it."""
        before = MODEL.replace(
            "        self.post_init()\n",
            '        self.register_buffer("embed_scale", torch.tensor(config.hidden_size**0.5).cuda(), persistent=False)\n'
            "        self.post_init()\n")
        after = before.replace(".cuda()", "")
        self.assertPorts(modeling(model=before), modeling(model=after))


# ---------------------------------------------------------------------- ConfigAliases (v5)

class ConfigAliasesTest(PortCodemodTest):
    TRANSFORM = ConfigAliases

    def test_layer_count_under_another_name_gets_an_attribute_map(self):
        config = {("num_layers" if k == "num_hidden_layers" else k): v for k, v in CONFIG.items()}
        before = CONFIGURATION.replace("num_hidden_layers", "num_layers")
        after = before.replace('    model_type = "tiny"\n', '    model_type = "tiny"\n    attribute_map = {\'num_hidden_layers\': \'num_layers\'}\n')
        self.assertPorts(before, after, file=CONFIGURATION_FILE, config=config,
                         files={MODELING_FILE: modeling().replace("num_hidden_layers", "num_layers")})

    def test_an_existing_attribute_map_is_extended(self):
        config = {("n_layer" if k == "num_hidden_layers" else k): v for k, v in CONFIG.items()}
        before = CONFIGURATION.replace("num_hidden_layers", "n_layer").replace(
            '    model_type = "tiny"\n', '    model_type = "tiny"\n    attribute_map = {"hidden_size": "d_model"}\n')
        after = before.replace('attribute_map = {"hidden_size": "d_model"}',
                               "attribute_map = {'hidden_size': 'd_model', 'num_hidden_layers': 'n_layer'}")
        self.assertPorts(before, after, file=CONFIGURATION_FILE, config=config)


# ---------------------------------------------------------------------- DroppedConfigDefaults, LegacyRopeScaling (v5)

class DroppedConfigDefaultsTest(PortCodemodTest):
    TRANSFORM = DroppedConfigDefaults

    def test_reads_take_what_4x_gave(self):
        """``pad_token_id`` (not in config.json: 4.x's default, None) and ``use_cache`` (in
        config.json, which 5 drops while loading) become getattr reads; a generation config's
        ``max_length`` is not a config and stays."""
        before = MODEL.replace("        self.post_init()\n",
                               "        self.padding_idx = config.pad_token_id\n        self.cache = self.config.use_cache\n"
                               "        self.limit = generation_config.max_length\n        self.post_init()\n", 1)
        after = before.replace("config.pad_token_id", "getattr(config, 'pad_token_id', None)").replace(
            "self.config.use_cache", "getattr(self.config, 'use_cache', True)")
        self.assertPorts(modeling(model=before), modeling(model=after), config={**CONFIG, "use_cache": True})

    def test_what_the_config_sets_itself_is_left_alone(self):
        configuration = CONFIGURATION.replace("        super().__init__(**kwargs)\n", "        self.pad_token_id = 0\n        super().__init__(**kwargs)\n")
        model = MODEL.replace("        self.post_init()\n", "        self.padding_idx = config.pad_token_id\n        self.post_init()\n", 1)
        self.assertLeavesAlone(modeling(model=model), warnings=[], files={CONFIGURATION_FILE: configuration})


ROPE_HELPER = '''
def legacy_rope_scaling(config):
    """config.rope_scaling as transformers 4.x read it: None where config.json set none, else its
    own keys. transformers 5 gives {"rope_type": "default", "rope_theta": ...} there and adds
    those two keys to a scaled one (added by hfcheck port)."""
    scaling = getattr(config, "rope_scaling", None)
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        return None
    legacy = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if "type" in legacy:
        legacy.pop("rope_type", None)
    return legacy
'''


class LegacyRopeScalingTest(PortCodemodTest):
    TRANSFORM = LegacyRopeScaling

    def test_reads_of_the_config_go_through_the_4x_view(self):
        """The 4.x guard-then-index idiom reads ``legacy_rope_scaling(config)``, defined once above
        the first class; the module's own copy (``self.rope_scaling``, not a config) stays."""
        scaled = ("        self.rope_scaling = config.rope_scaling\n"
                  "        if self.rope_scaling is None:\n            self.rope_factor = 1.0\n"
                  "        else:\n            self.rope_factor = self.rope_scaling[\"factor\"]\n        self.post_init()\n")
        before = MODEL.replace("        self.post_init()\n", scaled, 1)
        after = before.replace("= config.rope_scaling", "= legacy_rope_scaling(config)")
        self.assertPorts(modeling(model=before), join(IMPORTS, EAGER, ROPE_HELPER, MLP, ATTENTION, LAYER, PRETRAINED, after, CAUSAL_LM))

    def test_a_config_class_reads_itself_through_it_and_keeps_its_store(self):
        before = CONFIGURATION.replace("        super().__init__(**kwargs)\n",
                                       "        self.rope_scaling = kwargs.pop(\"rope_scaling\", None)\n"
                                       "        if self.rope_scaling is not None and len(self.rope_scaling) != 2:\n"
                                       "            raise ValueError(\"type and factor\")\n        super().__init__(**kwargs)\n")
        after = before.replace("if self.rope_scaling is not None and len(self.rope_scaling)",
                               "if legacy_rope_scaling(self) is not None and len(legacy_rope_scaling(self))").replace(
            "\n\nclass TinyConfig", "\n\n" + ROPE_HELPER.strip("\n") + "\n\n\nclass TinyConfig")
        self.assertPorts(before, after, file=CONFIGURATION_FILE)


# ---------------------------------------------------------------------- TiedWeights (v5)

class TiedWeightsTest(PortCodemodTest):
    TRANSFORM = TiedWeights

    def test_parameters_shared_in_the_original_run_are_declared(self):
        """Which parameters are tied comes from the original's own run (``PortState.tied``),
        given to the codemod as what was ``recorded``."""
        after = CAUSAL_LM.replace("GenerationMixin):\n", "GenerationMixin):\n    _tied_weights_keys = {'lm_head.weight': 'model.embed_tokens.weight'}\n")
        self.assertPorts(modeling(), modeling(causal_lm=after), recorded={"tied": [["model.embed_tokens.weight", "lm_head.weight"]]})

    def test_without_a_recorded_run_nothing_is_declared(self):
        """A static port (no run of the original) leaves the parameters untied, as written."""
        self.assertLeavesAlone(modeling(), warnings=[])


# ---------------------------------------------------------------------- GenerationBase (HFC811)

class PostInitTest(PortCodemodTest):
    TRANSFORM = PostInit

    def test_model_classes_end_their_init_with_post_init(self):
        """4.x-era classes that never call post_init (ChatGLM2/3, TeleChat) get it last in
        ``__init__``; the pretrained base and classes that already call it are left alone."""
        model = MODEL.replace("        self.post_init()\n", "", 1)
        causal_lm = CAUSAL_LM.replace("        self.post_init()\n", "", 1)
        self.assertPorts(modeling(model=model, causal_lm=causal_lm), modeling())

    def test_classes_that_call_it_are_left_alone(self):
        self.assertLeavesAlone(modeling(), warnings=[])


class GenerationBaseTest(PortCodemodTest):
    TRANSFORM = GenerationBase

    def test_causal_lm_gets_generation_mixin(self):
        before_imports = IMPORTS.replace("from transformers.generation import GenerationMixin\n", "")
        after_imports = before_imports.replace("\nfrom .configuration_x", "from transformers.generation import GenerationMixin\n\nfrom .configuration_x")
        self.assertPorts(modeling(imports=before_imports, causal_lm=CAUSAL_LM.replace(", GenerationMixin)", ")")),
                         modeling(imports=after_imports))


# ---------------------------------------------------------------------- TupleCache (HFC811)

TUPLE_CACHE_MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
        past_length = past_key_values[0][0].shape[2] if past_key_values is not None else 0
        hidden_states = self.embed_tokens(input_ids)
        for i, decoder_layer in enumerate(self.layers):
            layer_past = past_key_values[i] if past_key_values is not None else None
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, layer_past=layer_past, past_length=past_length, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))
'''

TUPLE_CACHE_LM = '''
class TinyForCausalLM(TinyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
        outputs = self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
        return CausalLMOutputWithPast(logits=self.lm_head(outputs.last_hidden_state))

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, **kwargs):
        if past_key_values:
            input_ids = input_ids[:, -1:]
        return {"input_ids": input_ids, "past_key_values": past_key_values, "attention_mask": attention_mask}
'''

LEGACY_PAST = '''
def legacy_past_key_values(past):
    """transformers 5's generate hands the model an empty Cache object where 4.x passed None; this
    model keeps its KV cache as the tuples it returns (added by hfcheck port)."""
    if past is None or isinstance(past, (tuple, list)):
        return past
    if past.get_seq_length() == 0:
        return None
    raise ValueError("this model keeps its KV cache as tuples: pass back the past_key_values it returned")
'''


class TupleCacheTest(PortCodemodTest):
    TRANSFORM = TupleCache

    def test_forward_indexing_tuples_maps_the_empty_v5_cache_to_none(self):
        """The forward that indexes ``past_key_values[0][0]`` and the generation hook that tests it
        for truth both start with the shim, defined once above the first class."""
        shim = "        past_key_values = legacy_past_key_values(past_key_values)  # a transformers 5 Cache -> this code's tuples\n"
        model = TUPLE_CACHE_MODEL.replace("        past_length =", shim + "        past_length =")
        mask = ("        if attention_mask is None and input_ids is not None:  # as in 4.x: transformers 5's generate drops an all-ones mask\n"
                "            attention_mask = torch.ones_like(input_ids)\n")
        lm = TUPLE_CACHE_LM.replace("        if past_key_values:", shim + mask + "        if past_key_values:")
        self.assertPorts(modeling(model=TUPLE_CACHE_MODEL, causal_lm=TUPLE_CACHE_LM),
                         modeling(eager=join(EAGER, LEGACY_PAST), model=model, causal_lm=lm))


# ---------------------------------------------------------------------- RotaryPositions (HFC801)

# a 4.x-era attention sizing its rotary table by its own cache length (the rotary class and
# apply_rotary_pos_emb are the model's; they are not what this codemod reads)
ROTARY_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.rotary_emb = TinyRotaryEmbedding(self.head_dim)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        kv_seq_len = key_states.shape[-2]
        if past_key_value is not None:
            kv_seq_len += past_key_value[0].shape[-2]
        cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin, position_ids)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
'''


class RotaryPositionsTest(PortCodemodTest):
    TRANSFORM = RotaryPositions

    def test_rotary_table_also_covers_the_positions_passed(self):
        after = ROTARY_ATTENTION.replace(
            "self.rotary_emb(value_states, seq_len=kv_seq_len)",
            "self.rotary_emb(value_states, seq_len=max(kv_seq_len, int(position_ids.max()) + 1) if position_ids is not None else kv_seq_len)")
        self.assertPorts(modeling(attention=ROTARY_ATTENTION), modeling(attention=after))


# ---------------------------------------------------------------------- LayerIndex (HFC806)

NO_INDEX_ATTENTION = ATTENTION.replace("def __init__(self, config, layer_idx):", "def __init__(self, config):").replace(
    "        self.layer_idx = layer_idx\n", "")
NO_INDEX_LAYER = LAYER.replace("def __init__(self, config, layer_idx):", "def __init__(self, config):").replace(
    "TinyAttention(config, layer_idx=layer_idx)", "TinyAttention(config)")
INDEXED_ATTENTION = ATTENTION.replace("def __init__(self, config, layer_idx):", "def __init__(self, config, layer_idx=None):").replace(
    "        self.config = config\n        self.layer_idx = layer_idx\n", "        self.layer_idx = layer_idx\n        self.config = config\n")
INDEXED_LAYER = LAYER.replace("def __init__(self, config, layer_idx):", "def __init__(self, config, layer_idx=None):")


class LayerIndexTest(PortCodemodTest):
    TRANSFORM = LayerIndex

    def test_layer_idx_is_threaded_from_the_layer_list_to_the_attention(self):
        """attention stores it, the decoder layer passes it on, the base model's comprehension
        names its loop variable ``layer_idx``."""
        self.assertPorts(
            modeling(attention=NO_INDEX_ATTENTION, layer=NO_INDEX_LAYER,
                     model=MODEL.replace("TinyDecoderLayer(config, layer_idx) for layer_idx in", "TinyDecoderLayer(config) for _ in")),
            modeling(attention=INDEXED_ATTENTION, layer=INDEXED_LAYER,
                     model=MODEL.replace("TinyDecoderLayer(config, layer_idx) for", "TinyDecoderLayer(config, layer_idx=layer_idx) for")))

    @pytest.mark.xfail(strict=True, reason="LayerIndex threads layer_idx=None up through the base model's and the causal LM's "
                                           "__init__ instead of refusing a layer list built by a for loop of append()s")
    def test_refuses_layers_appended_in_a_loop(self):
        """The docstring's "a layer built any other way is refused": the decoder layer and its
        attention take the index, the base model (which has none to give) is left as it was."""
        appended = MODEL.replace(
            "        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])\n",
            "        self.layers = nn.ModuleList()\n"
            "        for i in range(config.num_hidden_layers):\n"
            "            self.layers.append(TinyDecoderLayer(config))\n")
        context = self.assertPorts(modeling(attention=NO_INDEX_ATTENTION, layer=NO_INDEX_LAYER, model=appended),
                                   modeling(attention=INDEXED_ATTENTION, layer=INDEXED_LAYER, model=appended),
                                   warnings=None)  # the wording of the refusal is the codemod's
        assert any(w.startswith("HFC806 TinyModel.__init__") for w in context.warnings), context.warnings


# ---------------------------------------------------------------------- KwargsPropagation (HFC804)

def _without_kwargs(part: str) -> str:
    return part.replace(", **kwargs", "")


class KwargsPropagationTest(PortCodemodTest):
    TRANSFORM = KwargsPropagation

    def test_kwargs_flow_from_the_causal_lm_down_to_the_attention_interface(self):
        self.assertPorts(
            modeling(attention=_without_kwargs(ATTENTION), layer=_without_kwargs(LAYER), model=_without_kwargs(MODEL),
                     causal_lm=_without_kwargs(CAUSAL_LM)),
            modeling())


# ---------------------------------------------------------------------- InlineProjectionHelpers (HFC301)

SHAPE_HELPER_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def _shape(self, tensor, bsz, seq_len):
        return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()
        query_states = self._shape(self.q_proj(hidden_states), bsz, q_len)
        key_states = self._shape(self.k_proj(hidden_states), bsz, q_len)
        value_states = self._shape(self.v_proj(hidden_states), bsz, q_len)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(bsz, q_len, -1).contiguous()
        return self.o_proj(attn_output)
'''


class InlineProjectionHelpersTest(PortCodemodTest):
    TRANSFORM = InlineProjectionHelpers

    def test_one_line_view_helper_around_the_projections_is_inlined(self):
        after = SHAPE_HELPER_ATTENTION
        for p in "qkv":
            after = after.replace(f"self._shape(self.{p}_proj(hidden_states), bsz, q_len)",
                                  f"self.{p}_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)")
        self.assertPorts(modeling(attention=SHAPE_HELPER_ATTENTION), modeling(attention=after))


# ---------------------------------------------------------------------- ActivationModule (HFC302)

class ActivationModuleTest(PortCodemodTest):
    TRANSFORM = ActivationModule

    def test_activation_function_call_becomes_an_act2fn_module(self):
        before_mlp = '''
class TinyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''
        after_mlp = '''
class TinyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN["silu"]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''
        before_imports = "import torch.nn.functional as F\n" + IMPORTS.replace("from transformers.activations import ACT2FN\n", "")
        after_imports = before_imports.replace("\nfrom .configuration_x", "from transformers.activations import ACT2FN\n\nfrom .configuration_x")
        self.assertPorts(modeling(imports=before_imports, mlp=before_mlp), modeling(imports=after_imports, mlp=after_mlp))


# ---------------------------------------------------------------------- BackendFlag (HFC805)

V4_PRETRAINED = '''
class TinyPreTrainedModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "model"
    _supports_flash_attn_2 = True
'''


class BackendFlagTest(PortCodemodTest):
    TRANSFORM = BackendFlag

    def test_flag_is_set_once_every_attention_dispatches(self):
        """And v4's ``_supports_flash_attn_2`` takes v5's name; sdpa is one more backend."""
        after = V4_PRETRAINED.replace("_supports_flash_attn_2 = True\n",
                                      "_supports_flash_attn = True\n    _supports_attention_backend = True\n    _supports_sdpa = True\n")
        self.assertPorts(modeling(pretrained=V4_PRETRAINED), modeling(pretrained=after))

    def test_not_set_while_an_attention_computes_attention_itself(self):
        """The flag would promise vLLM something false; only the v4 name is renamed."""
        source = modeling(imports=IMPORTS_MATH, attention=HAND_WRITTEN_ATTENTION, pretrained=V4_PRETRAINED)
        self.assertPorts(source, source.replace("_supports_flash_attn_2 = True", "_supports_flash_attn = True"), warnings=[
            "HFC805 TinyPreTrainedModel: not set: TinyAttention still compute attention outside the interface"])


# ---------------------------------------------------------------------- PackedQKV (HFC813)

PACKED_ATTENTION = '''
class TinyAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states, key_states, value_states = self.Wqkv(hidden_states).chunk(3, dim=-1)
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
'''


class PackedQKVTest(PortCodemodTest):
    TRANSFORM = PackedQKV

    def test_chunked_packed_projection_becomes_three_projections(self):
        after = PACKED_ATTENTION.replace(
            "        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)\n",
            "        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)\n"
            "        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)\n"
            "        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)\n").replace(
            "        query_states, key_states, value_states = self.Wqkv(hidden_states).chunk(3, dim=-1)\n",
            "        query_states = self.q_proj(hidden_states)\n"
            "        key_states = self.k_proj(hidden_states)\n"
            "        value_states = self.v_proj(hidden_states)\n")
        context = self.assertPorts(modeling(attention=PACKED_ATTENTION), modeling(attention=after))
        assert context.scratch["changes"][0].what == "split self.Wqkv into q_proj, k_proj, v_proj (config.hidden_size outputs each)"

    def test_packed_output_used_elsewhere_keeps_the_projection_and_splits_it(self):
        before = PACKED_ATTENTION.replace(
            "        query_states, key_states, value_states = self.Wqkv(hidden_states).chunk(3, dim=-1)\n",
            "        qkv = self.Wqkv(hidden_states)\n"
            "        self.last_qkv = qkv\n"
            "        query_states, key_states, value_states = qkv.chunk(3, dim=-1)\n")
        after = before.replace(
            "        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)\n",
            "        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)\n"
            "        self.q_size = config.hidden_size\n"
            "        self.kv_size = config.hidden_size\n").replace(
            "qkv.chunk(3, dim=-1)", "qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)")
        self.assertPorts(modeling(attention=before), modeling(attention=after))

    def test_refuses_chunks_along_another_dimension(self):
        self.assertLeavesAlone(modeling(attention=PACKED_ATTENTION.replace("chunk(3, dim=-1)", "chunk(3, dim=0)")), warnings=[
            "HFC813 TinyAttention.Wqkv: the chunks are taken along dim 0, not the output features"])


# ---------------------------------------------------------------------- ExpertsLayout (HFC808)

MOE_LAYER = LAYER.replace("TinyMLP(config)", "TinySparseMoeBlock(config)")

EXPERT_MLP = '''
class TinyExpertMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''

LOOPED_MOE = '''
class TinySparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.moe_experts = nn.ModuleList([TinyExpertMLP(config) for _ in range(config.num_experts)])

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        top_k_weights, top_k_index = torch.topk(self.gate(flat).softmax(dim=-1), self.top_k, dim=-1)
        out = torch.zeros_like(flat)
        for expert_idx, expert in enumerate(self.moe_experts):
            weight = (top_k_weights * (top_k_index == expert_idx)).sum(dim=-1, keepdim=True)
            out = out + expert(flat) * weight
        return out.view(batch, seq, hidden)
'''

FUSED_MOE = '''
class TinySparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = TinyExperts(config)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        top_k_weights, top_k_index = torch.topk(self.gate(flat).softmax(dim=-1), self.top_k, dim=-1)
        out = self.experts(flat, top_k_index, top_k_weights)
        return out.view(batch, seq, hidden)
'''

SWAPPED_EXPERTS = '''
class TinyExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * config.intermediate_size, config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, config.intermediate_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, routing_weights, selected_experts):
        out = torch.zeros_like(hidden_states)
        for expert_idx in range(self.num_experts):
            weight = (routing_weights * (selected_experts == expert_idx)).sum(dim=-1, keepdim=True)
            gate, up = (hidden_states @ self.gate_up_proj[expert_idx].t()).chunk(2, dim=-1)
            out = out + (self.act_fn(gate) * up) @ self.down_proj[expert_idx].t() * weight
        return out


class TinySparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = TinyExperts(config)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        routing_weights, selected_experts = torch.topk(self.gate(flat).softmax(dim=-1), self.top_k, dim=-1)
        return self.experts(flat, routing_weights, selected_experts).view(batch, seq, hidden)
'''


STACKED_EXPERTS = '''class TinyExperts(nn.Module):
    """The experts of TinySparseMoeBlock, stacked (hfcheck port): gate_up_proj [E, 2I, H], down_proj [E, H, I],
    called as experts(hidden_states, top_k_index, top_k_weights), the layout vLLM replaces with its
    fused MoE kernel."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * config.intermediate_size, config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, config.hidden_size, config.intermediate_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_idx = expert_idx[0]
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[token_idx]
            gate, up = torch.nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
            current_hidden_states = self.act_fn(gate) * up
            current_hidden_states = torch.nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
        return final_hidden_states
'''

class ExpertsLayoutTest(PortCodemodTest):
    TRANSFORM = ExpertsLayout

    def test_module_list_of_glu_experts_becomes_stacked_experts(self):
        """``moe_experts`` + its loop -> ``self.experts = TinyExperts(config)`` (the codemod's
        stacked class, gate_up_proj [E, 2I, H] / down_proj [E, H, I]) called with the routing."""
        self.assertPorts(modeling(mlp=join(EXPERT_MLP, LOOPED_MOE), layer=MOE_LAYER),
                         modeling(mlp=join(EXPERT_MLP, STACKED_EXPERTS, FUSED_MOE), layer=MOE_LAYER))

    def test_experts_taking_weights_before_indices_get_the_v5_signature(self):
        after = SWAPPED_EXPERTS.replace(
            "def forward(self, hidden_states, routing_weights, selected_experts):",
            "def forward(self, hidden_states, top_k_index, top_k_weights):").replace(
            "(routing_weights * (selected_experts == expert_idx))", "(top_k_weights * (top_k_index == expert_idx))").replace(
            "self.experts(flat, routing_weights, selected_experts)", "self.experts(flat, selected_experts, routing_weights)")
        self.assertPorts(modeling(mlp=SWAPPED_EXPERTS, layer=MOE_LAYER), modeling(mlp=after, layer=MOE_LAYER))

    def test_refuses_experts_with_a_bias(self):
        biased = EXPERT_MLP.replace("config.intermediate_size, bias=False)\n        self.up", "config.intermediate_size, bias=True)\n        self.up")
        self.assertLeavesAlone(modeling(mlp=join(biased, LOOPED_MOE), layer=MOE_LAYER), warnings=[
            "HFC808 TinySparseMoeBlock.moe_experts: TinyExpertMLP.gate_proj has a bias: vLLM's fused MoE for this backend has no expert bias"])


# ---------------------------------------------------------------------- SingleLayerList (HFC809/810)

TWO_LISTS_MODEL = '''
class TinyModel(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)])
        self.extra_layers = nn.ModuleList([TinyDecoderLayer(config, config.num_hidden_layers + i) for i in range(config.num_extra_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden_states = self.embed_tokens(input_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)
        for decoder_layer in self.extra_layers:
            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))
'''

TYPED_LAYER = LAYER.replace("        self.mlp = TinyMLP(config)\n", '        self.mlp = TinyMLP(config)\n        self.attention_type = "full"\n')

CHECKED_MODEL = MODEL.replace(
    "        for decoder_layer in self.layers:\n",
    "        for decoder_layer in self.layers:\n"
    '            if decoder_layer.attention_type != "full":\n'
    '                raise ValueError(f"{decoder_layer.attention_type} attention is not supported")\n')


class SingleLayerListTest(PortCodemodTest):
    TRANSFORM = SingleLayerList

    def test_second_list_of_the_same_layer_is_folded_into_the_first(self):
        """config.json then counts the extra layers in num_hidden_layers (a config edit)."""
        after = TWO_LISTS_MODEL.replace(
            "        self.extra_layers = nn.ModuleList([TinyDecoderLayer(config, config.num_hidden_layers + i) for i in range(config.num_extra_layers)])\n",
            "").replace(
            "        for decoder_layer in self.extra_layers:\n            hidden_states = decoder_layer(hidden_states, attention_mask=attention_mask, **kwargs)\n",
            "")
        self.assertPorts(modeling(model=TWO_LISTS_MODEL), modeling(model=after), config={**CONFIG, "num_extra_layers": 1})

    def test_refuses_a_second_list_of_another_module(self):
        mtp = MODEL.replace(
            "        self.norm =", "        self.mtp_heads = nn.ModuleList([TinyMLP(config) for _ in range(config.num_nextn_predict_layers)])\n"
            "        self.norm =").replace(
            "        return BaseModelOutputWithPast", "        for head in self.mtp_heads:\n            hidden_states = head(hidden_states)\n"
            "        return BaseModelOutputWithPast")
        self.assertLeavesAlone(modeling(model=mtp), config={**CONFIG, "num_nextn_predict_layers": 1}, warnings=[
            "HFC809 TinyModel: self.mtp_heads holds TinyMLP, not the decoder layer of self.layers: fold it by hand or declare base_model_pp_plan"])

    def test_read_of_a_constant_layer_attribute_is_folded_away(self):
        """HFC810: every layer sets ``attention_type = "full"``, so the guard can never fire."""
        self.assertPorts(modeling(layer=TYPED_LAYER, model=CHECKED_MODEL), modeling(layer=TYPED_LAYER))

    def test_refuses_a_layer_attribute_that_is_not_a_constant(self):
        self.assertLeavesAlone(modeling(model=CHECKED_MODEL), warnings=[
            "HFC810 TinyModel.forward: reads decoder_layer.attention_type, which is not a constant of the layer class: "
            "read it from the config (self.config.layer_types[i])"])


# ---------------------------------------------------------------------- BufferInit (v5)

ROTARY = '''
class TinyRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        dim = config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
'''

ROTARY_BY_DIM = ROTARY.replace("def __init__(self, config):", "def __init__(self, dim, base=10000):").replace(
    "        dim = config.hidden_size // config.num_attention_heads\n", "").replace("(10000 **", "(base **")

# the rebuilt rotary's buffers are copied into the loaded one (the blank line before the new
# method is written indented: whitespace-only lines compare as empty)
INIT_WEIGHTS = '''

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, (TinyRotaryEmbedding,)):  # non-persistent buffers computed in __init__ (hfcheck port)
            fresh = type(module)({args})
            with torch.no_grad():
                for name, buffer in fresh.named_buffers(recurse=False):
                    getattr(module, name).copy_(buffer)
'''


def _with_rotary(rotary: str, construction: str) -> dict[str, str]:
    return {"mlp": join(rotary, MLP),
            "model": MODEL.replace("        self.post_init()\n", f"        self.rotary_emb = {construction}\n        self.post_init()\n")}


class BufferInitTest(PortCodemodTest):
    TRANSFORM = BufferInit

    def test_rotary_built_from_the_config_is_rebuilt_after_loading(self):
        parts = _with_rotary(ROTARY, "TinyRotaryEmbedding(config)")
        self.assertPorts(modeling(**parts),
                         modeling(**parts, pretrained=PRETRAINED.rstrip("\n") + INIT_WEIGHTS.format(args="self.config")))

    def test_rotary_built_from_arguments_remembers_them(self):
        parts = _with_rotary(ROTARY_BY_DIM, "TinyRotaryEmbedding(config.hidden_size // config.num_attention_heads, 10000)")
        remembered = ROTARY_BY_DIM.replace(
            "    def __init__(self, dim, base=10000):\n",
            "    def __init__(self, dim, base=10000):\n"
            "        self._hfcheck_init_args = dict(dim=dim, base=base)  # to rebuild it after loading\n")
        self.assertPorts(modeling(**parts),
                         modeling(mlp=join(remembered, MLP), model=parts["model"],
                                  pretrained=PRETRAINED.rstrip("\n") + INIT_WEIGHTS.format(args="**module._hfcheck_init_args")))

    @pytest.mark.xfail(strict=True, reason="BufferInit takes any one argument whose source starts with 'config.' for the config: "
                                           "Cls(config.hidden_size // config.num_attention_heads) is rebuilt as "
                                           "type(module)(self.config.hidden_size // config.num_attention_heads), a NameError")
    def test_rotary_built_from_an_expression_of_the_config_remembers_its_arguments(self):
        parts = _with_rotary(ROTARY_BY_DIM, "TinyRotaryEmbedding(config.hidden_size // config.num_attention_heads)")
        remembered = ROTARY_BY_DIM.replace(
            "    def __init__(self, dim, base=10000):\n",
            "    def __init__(self, dim, base=10000):\n"
            "        self._hfcheck_init_args = dict(dim=dim, base=base)  # to rebuild it after loading\n")
        self.assertPorts(modeling(**parts),
                         modeling(mlp=join(remembered, MLP), model=parts["model"],
                                  pretrained=PRETRAINED.rstrip("\n") + INIT_WEIGHTS.format(args="**module._hfcheck_init_args")))


# ---------------------------------------------------------------------- ParallelPlans (HFC501/601)

class ParallelPlansTest(PortCodemodTest):
    TRANSFORM = ParallelPlans

    def test_tp_and_pp_plans_are_read_off_the_module_structure(self):
        """On the configuration file: q/k/v, gate/up colwise, o/down rowwise; embed -> layers -> norm."""
        after = CONFIGURATION.replace('    model_type = "tiny"\n', '''    model_type = "tiny"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
''')
        self.assertPorts(CONFIGURATION, after, file=CONFIGURATION_FILE)

    def test_existing_entries_are_kept_and_missing_ones_appended(self):
        declared = '''    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
    }
    base_model_pp_plan = {"embed_tokens": (["input_ids"], ["inputs_embeds"])}
'''
        before = CONFIGURATION.replace('    model_type = "tiny"\n', '    model_type = "tiny"\n' + declared)
        after = before.replace('        "layers.*.self_attn.o_proj": "rowwise",\n', '''        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
''')
        self.assertPorts(before, after, file=CONFIGURATION_FILE)


# ---------------------------------------------------------------------- every codemod has its test

def test_the_compliant_model_is_left_alone_by_every_codemod():
    """The parts the tests above do not swap are a fixed point, so each test shows one codemod."""
    import libcst as cst

    source = modeling()
    for codemod in CODEMODS:
        context = CodemodContext(filename=MODELING_FILE)
        out = codemod(context, config=CONFIG, files={CONFIGURATION_FILE: CONFIGURATION}).transform_module(cst.parse_module(source))
        assert out.code == source, codemod.__name__
        assert context.warnings == [], codemod.__name__


def test_every_codemod_has_a_codemod_test():
    tested = {cls.TRANSFORM for cls in globals().values()
              if isinstance(cls, type) and issubclass(cls, CodemodTest) and isinstance(getattr(cls, "TRANSFORM", None), type)}
    missing = sorted(c.__name__ for c in set(CODEMODS) - tested)
    assert not missing, f"codemods without a CodemodTest in tests/test_codemods.py: {missing}"


# ---------------------------------------------------------------------- statements named by line

SPANNED = '''class Attention(nn.Module):
    def forward(self, x):
        q = self.q(x)
        # the scores
        w = (q @
             q.transpose(-1, -2))
        o = w @ q
        return self.helper(o)

    def helper(self, o):
        if o is not None:
            o = o * 2
            o = o + 1
        return o
'''


def test_replace_spans_puts_new_statements_in_place_of_lines_keeping_the_comment_above():
    """Two spans of one class, in two methods and a nested block, in one pass over one tree."""
    import libcst as cst

    from hfcheck.porter.rewrite import cstutil as cu

    module = cst.parse_module(SPANNED)
    call = cu.LineSpan("forward", 5, 7, (cu.template("o = attend({q})\n", q="q"),))
    inner = cu.LineSpan("helper", 12, 13, (cu.template("o = o * 2 + 1\n"),))
    out, replaced = cu.replace_spans(module, "Attention", [call, inner])
    assert replaced == {call: 2, inner: 2}
    assert out.code == SPANNED.replace(
        "        w = (q @\n             q.transpose(-1, -2))\n        o = w @ q\n", "        o = attend(q)\n").replace(
        "            o = o * 2\n            o = o + 1\n", "            o = o * 2 + 1\n")


@pytest.mark.parametrize(("method", "start", "end"), [("forward", 6, 7), ("forward", 5, 5), ("helper", 11, 12), ("other", 3, 3)])
def test_replace_spans_leaves_a_span_that_is_not_whole_statements_of_one_block(method, start, end):
    """Line 6 is inside a statement, 5-5 ends inside one, 11-12 crosses into the `if` block, and
    there is no method `other`: the module comes back unchanged and the span is not replaced."""
    import libcst as cst

    from hfcheck.porter.rewrite import cstutil as cu

    module = cst.parse_module(SPANNED)
    span = cu.LineSpan(method, start, end, (cu.template("pass\n"),))
    out, replaced = cu.replace_spans(module, "Attention", [span])
    assert replaced == {}
    assert out.code == SPANNED



# ---------------------------------------------------------------------- a region in a helper of forward

HELPER_ATTENTION = '''import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.head_dim = 8
        self.q = nn.Linear(16, 16)

    def forward(self, hidden_states, attention_mask=None):
        # the helper computes the attention
        out = self._attend(hidden_states, attention_mask)
        return out

    def _attend(self, hidden_states, attention_mask):
        q = self.q(hidden_states)
        # the scores
        w = torch.matmul(q, q.transpose(2, 3)) * self.head_dim**-0.5
        w = w + attention_mask
        w = w.softmax(-1)
        out = torch.matmul(w, q)
        return out
'''
HELPER_ATTENTION_PORTED = '''class Attn(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.head_dim = 8
        self.q = nn.Linear(16, 16)
        self.is_causal = True

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        # the helper computes the attention
        query_states, key_states, value_states = self._attend(hidden_states, attention_mask)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, w = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0,
            scaling=self.head_dim**-0.5,
            **kwargs,
        )
        out = out.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return out

    def _attend(self, hidden_states, attention_mask):
        q = self.q(hidden_states)
        # the scores
        return q, q, q  # [batch, heads, seq, head_dim]: forward calls the attention
'''


def test_a_region_ending_a_helper_becomes_the_call_in_forward_and_the_helper_returns_q_k_v():
    """The reference run found the attention at the end of ``_attend``; vLLM reads forward's
    source, so forward makes the interface call (where it called the helper, keeping the comment
    above) and the helper returns q, k and v."""
    from hfcheck.porter.rewrite.dataflow.plan import CorePlan
    from hfcheck.porter.rewrite.state import PortState

    plan = CorePlan(cls="Attn", file="m.py", start_line=20, end_line=24, block_line=20, q="q", k="q", v="q", out="out", out_layout="bsD",
                    weights="w", mask="attention_mask", scaling="self.head_dim**-0.5", scaling_init=None, dropout=None,
                    what="softmax(QK^T)V", max_rel_error=1e-7, function="_attend", returns=True, caller_line=14,
                    caller_call="self._attend(hidden_states, attention_mask)")
    state = PortState({"m.py": HELPER_ATTENTION}, {})
    state.observed = [plan]
    AttentionInterface().apply(state)
    assert state.refusals == []
    ported = state.files["m.py"]
    assert ported[ported.index("class Attn"):] == HELPER_ATTENTION_PORTED
    assert "def eager_attention_forward(" in ported and "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS" in ported
