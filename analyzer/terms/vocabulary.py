"""The one place that names what hfcheck shares with vLLM and transformers.

A vLLM or transformers release that renames a fusion, a layer kind or a TP style is an
edit here. Values are those of vLLM 0.32.0-0.34.0 and transformers 5.19-5.24; what differs
between releases is read from each release's tables (``vllm.release.tables``).
"""

from __future__ import annotations

FUSIONS: tuple[str, ...] = ("mla", "glu", "qkv", "packed_qkv", "merged_column", "rms_norm")
"""Fusion names in vLLM's priority order; at most one of the first five per instance."""

ACT_AND_MUL_KERNELS = frozenset({"gelu", "gelu_pytorch_tanh", "silu", "swish", "geglu", "swigluoai"})
"""Activations vLLM has a fused ``...AndMul`` kernel for (``_ACTIVATION_AND_MUL_REGISTRY``)."""

SOFTMAX_LAYER_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "window_attention"})

TP_STYLES_SHARDED = frozenset({"colwise", "rowwise", "colwise_gather_output", "rowwise_split_input"})
"""Linear styles vLLM shards; any other style on a Linear silently becomes replicated."""

MXFP4_METHODS = frozenset({"mxfp4", "gpt_oss_mxfp4"})
"""Quantization methods the transformers backend refuses (``Base.__init__``, 0.32 to 0.34 alike)."""

DECODER_FORWARD_ARGUMENTS = ("input_ids", "inputs_embeds", "position_ids")
"""The parameters the base model's ``forward`` must name: ``Base.__init__`` decorates that class
for torch.compile with ``DynamicArgDims(input_ids=1, inputs_embeds=1, position_ids=-1)`` and
``support_torch_compile`` raises "Argument X not found in the forward method" for one its
signature lacks (``**kwargs`` does not count), with or without --enforce-eager (0.32 to 0.34 alike)."""

EXPERT_COUNT_FIELDS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
TOP_K_FIELDS = ("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "experts_per_token", "top_k")
MOE_INTERMEDIATE_FIELDS = ("moe_intermediate_size", "intermediate_size")
SHARED_EXPERT_FIELDS = ("n_shared_experts", "num_shared_experts", "shared_expert_count")

HEAD_FIELDS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_head_kv", "kv_heads", "num_kv")
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model", "model_dim", "dim")
HEAD_DIM_FIELDS = ("head_dim", "kv_channels", "attention_head_dim", "d_kv")
INTERMEDIATE_FIELDS = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "d_ff", "inner_hidden_size")
VOCAB_FIELDS = ("vocab_size", "padded_vocab_size")
"""How configs (remote ones included) spell the same quantity; the first one set wins."""

TRANSFORMERS_BACKEND_ATTENTION_ARGS = ("num_heads", "scale", "head_size", "num_kv_heads", "logits_soft_cap", "per_layer_sliding_window", "sinks")
"""What vLLM's transformers backend gives each ``Attention`` it creates (``base.py``,
``_create_attention_instances``, 0.32 and 0.33): no ``alibi_slopes``, and the attention
interface ignores the additive mask a model builds, so ALiBi (and any other additive
position bias) cannot be kept; vLLM's own Falcon, Bloom and MPT-era classes pass slopes."""

TP_SIZES = (1, 2, 4, 8)
