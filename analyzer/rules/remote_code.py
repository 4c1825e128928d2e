"""Remote code (``auto_map``): static compliance and safety checks, HFC800-HFC830.

Every rule reads the static analysis of ``analysis.source.code_files`` (``analyzer/remote``:
``ast`` only, nothing imported or executed, computed once and cached) and turns the findings
of its own code into ``Finding`` s with ``details = {"file": ..., "line": ...}``. Models
without remote code get no finding from these rules. HFC830 reports the sandboxed build,
which runs only with ``--trust-remote-code``.
"""

from __future__ import annotations

from typing import ClassVar

from hfcheck.analyzer.remote import static_findings
from hfcheck.analyzer.rules.base import Finding, Rule


class _RemoteCodeRule(Rule):
    """A rule whose findings come from the static analysis, filtered by ``code``."""

    none: ClassVar[str] = "nothing to report"
    """Pass message when the code was read and this check found nothing (None: no finding)."""
    observed_by: ClassVar[str | None] = None
    """The rule that decides the same question on the built model. When the sandbox built it
    (--trust-remote-code), this rule's failures and warnings become notes, so that one
    problem is not scored twice; without the sandbox they stand."""

    def check(self, analysis) -> list[Finding]:
        findings = static_findings(analysis.source)
        if findings is None:
            return []
        mine = [f for f in findings if f.code == self.code]
        if not mine:
            readable = any(f.code == "HFC800" and f.status == "pass" for f in findings)
            return [self.passed(self.none)] if readable and self.none else []
        sandbox = getattr(analysis, "sandbox", None)
        observed = bool(self.observed_by and sandbox is not None and getattr(sandbox, "ok", False) and getattr(analysis, "observations", None) is not None)
        # vLLM resolves `getattr(transformers, architecture)` before auto_map: when that class
        # exists, the model's own modeling code is not what vLLM runs.
        unused = getattr(analysis, "class_origin", None) == "transformers" and self.impact != "info"
        out = []
        for f in mine:
            details = {"file": f.file, "line": f.line}
            if unused and f.status in ("fail", "warn", "inconclusive"):
                cls = analysis.transformers_class.__name__
                out.append(self.noted(f"{f.message} (not what vLLM runs: it uses transformers' own {cls})", **details, static_status=f.status))
            elif observed and f.status in ("fail", "warn"):
                out.append(self.noted(f"{f.message} (static reading; {self.observed_by} decides on the built model)", **details, static_status=f.status))
            elif f.status == "fail":
                out.append(self.failed(f.message, f.remediation, **details))
            elif f.status == "warn":
                out.append(self.warned(f.message, f.remediation, **details))
            elif f.status == "info":
                out.append(self.noted(f.message, **details))
            elif f.status == "inconclusive":
                out.append(self.inconclusive(f.message, **details))
            else:
                out.append(self.passed(f.message, **details))
        return out


class RemoteCodeRead(_RemoteCodeRule):
    code = "HFC800"
    name = "remote-code-read"
    impact = "blocker"
    what = "Every file auto_map names (and its relative imports) was obtained and parses as Python; it is read with `ast` only."
    why = (
        "hfcheck never imports remote code unless asked, so every other remote-code check reads the syntax "
        "tree. A file that does not parse fails in transformers too; a file that could not be fetched "
        "(offline, refused path) leaves the remote-code checks without it."
    )
    example = 'auto_map: {"AutoModel": "modeling_x.XModel"} but modeling_x.py is not in the HF cache (HF_HUB_OFFLINE=1)'
    fix = "Make every file auto_map names available (and valid Python); scan online or after `huggingface-cli download`."
    none = None


class AttentionInterfaceDispatch(_RemoteCodeRule):
    code = "HFC801"
    name = "remote-attention-interface"
    impact = "blocker"
    what = "Each attention module the decoder layers build dispatches through `ALL_ATTENTION_FUNCTIONS` (`[impl]` or `.get_interface(...)`) and calls it exactly once."
    why = (
        "vLLM serves attention only through the transformers attention interface: a layer whose attention "
        "does not dispatch through it fails at load ('Layer i does not dispatch through the Transformers "
        "attention interface'). vLLM reads the dispatch from the forward's source, so two calls are refused too."
    )
    example = "attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)   # no ALL_ATTENTION_FUNCTIONS"
    fix = (
        "attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward); "
        "attn_output, attn_weights = attention_interface(self, q, k, v, attention_mask, scaling=self.scaling, **kwargs)"
    )
    none = None
    observed_by = "HFC201"


class AttentionScalingResolvable(_RemoteCodeRule):
    code = "HFC802"
    name = "remote-attention-scaling"
    impact = "blocker"
    what = "The `scaling=` (and `s_aux=`) passed to the attention interface is a number literal or a `self.<attr>` the module sets."
    why = "vLLM resolves these from the forward's source on the built module; an expression raises 'Cannot resolve attention scaling expression' at load."
    example = "attention_interface(self, q, k, v, mask, scaling=1 / math.sqrt(self.head_dim))"
    fix = "In __init__: `self.scaling = self.head_dim ** -0.5`; in forward: `scaling=self.scaling`."
    none = None
    observed_by = "HFC203"


class HandWrittenAttention(_RemoteCodeRule):
    code = "HFC803"
    name = "remote-hand-written-attention"
    impact = "blocker"
    what = "softmax(Q K^T) V written with matmuls, or direct calls to F.scaled_dot_product_attention / flash_attn / xformers, outside the interface's eager fallback."
    why = (
        "Attention computed by hand bypasses vLLM's paged attention and KV cache: the layer is refused when it is "
        "the only path (fail), and dead code under vLLM when the module also dispatches through the interface (warn)."
    )
    example = "attn_output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # in *SdpaAttention.forward"
    fix = "Keep one attention module that dispatches through ALL_ATTENTION_FUNCTIONS; the hand-written version may only be the `eager` fallback function."
    none = None


class KwargsPropagation(_RemoteCodeRule):
    code = "HFC804"
    name = "remote-kwargs-propagation"
    impact = "blocker"
    what = "`**kwargs` flow model.forward -> decoder layer -> attention module -> attention interface call."
    why = (
        "vLLM passes its attention state (which vLLM attention layer serves each module) as keyword arguments "
        "through the base model's forward; a hop that drops **kwargs makes vLLM's attention function miss it "
        "at the first forward. `_supports_attention_backend` promises exactly this."
    )
    example = "def forward(self, hidden_states, attention_mask=None):   # no **kwargs\n    hidden_states = self.self_attn(hidden_states, attention_mask)"
    fix = "Accept `**kwargs` in every forward on the path and pass them on: `self.self_attn(..., **kwargs)`, `attention_interface(..., **kwargs)`."
    none = None


class AttentionBackendFlag(_RemoteCodeRule):
    code = "HFC805"
    name = "remote-attention-backend-flag"
    impact = "blocker"
    what = "The PreTrainedModel subclass sets `_supports_attention_backend = True`, or its module passes transformers' source test."
    why = (
        "vLLM checks `is_backend_compatible()` (the flag) or `_can_set_attn_implementation()` (a module defining "
        "`class *Attention*(nn.Module)` must contain `ALL_ATTENTION_FUNCTIONS.get_interface(`). Neither: "
        "'The Transformers implementation of X is not compatible with vLLM'. Passing only the source test is a warning."
    )
    example = "class MyPreTrainedModel(PreTrainedModel):\n    _supports_sdpa = True   # no _supports_attention_backend"
    fix = "class MyPreTrainedModel(PreTrainedModel):\n    _supports_attention_backend = True"
    none = None
    observed_by = "HFC102"


class AttentionLayerIndex(_RemoteCodeRule):
    code = "HFC806"
    name = "remote-attention-layer-idx"
    impact = "blocker"
    what = "Each attention module stores the index of its decoder layer in `self.layer_idx`."
    why = "vLLM maps each dispatching module to its attention layer and KV-cache slot by the int `layer_idx`; without it the layer counts as not dispatching."
    example = "class MyAttention(nn.Module):\n    def __init__(self, config):   # no layer_idx"
    fix = "def __init__(self, config, layer_idx):\n    self.layer_idx = layer_idx   # and build it as MyAttention(config, layer_idx)"
    none = None
    observed_by = "HFC201"


class AttentionIsCausal(_RemoteCodeRule):
    code = "HFC807"
    name = "remote-attention-is-causal"
    impact = "info"
    what = "Whether attention modules declare `is_causal` (True: decoder; False: encoder-only)."
    why = "vLLM serves a text model with any `is_causal = False` module as encoder-only (pooling, no generation); an undeclared value is read as causal."
    example = "self.is_causal = False   # a bidirectional encoder"
    fix = "Set `self.is_causal = True` in decoder attention modules (False only for encoders)."
    none = None


class ExpertsLayout(_RemoteCodeRule):
    code = "HFC808"
    name = "remote-moe-experts-layout"
    impact = "speed"
    what = "MoE experts live in a child named `experts` that is an nn.ModuleList or holds only 3-D parameters, with forward(hidden_states, top_k_index, top_k_weights)."
    why = (
        "vLLM replaces exactly that child with its FusedMoE kernel and calls it as experts(x, ids, weights). "
        "Experts under another name, with 2-D parameters (biases, Linear layers) or another argument order stay "
        "plain PyTorch: correct but much slower, and no expert parallelism."
    )
    example = "self.moe_experts = nn.ModuleList([Expert(config) for _ in range(config.num_experts)])"
    fix = "self.experts = MyExperts(config)   # gate_up_proj [E, 2I, H], down_proj [E, H, I]; forward(hidden_states, top_k_index, top_k_weights)"
    none = "no mixture-of-experts block in the code"
    observed_by = "HFC401"


class PipelineModuleLists(_RemoteCodeRule):
    code = "HFC809"
    name = "remote-pp-module-lists"
    impact = "parallel"
    what = "The base model keeps its decoder layers in exactly one nn.ModuleList (or declares a pp plan)."
    why = "Without a pp plan vLLM splits the base model for pipeline parallelism along its single ModuleList; two refuse PP ('multiple ModuleLists ... not supported yet')."
    example = "self.layers = nn.ModuleList(...); self.mtp_layers = nn.ModuleList(...)"
    fix = "Keep all decoder layers in one ModuleList, or declare `base_model_pp_plan` on the config class."
    none = None
    observed_by = "HFC601"


class ForwardReadsSubmoduleAttributes(_RemoteCodeRule):
    code = "HFC810"
    name = "remote-forward-reads-submodules"
    impact = "parallel"
    what = "The base model's forward does not read attributes of its decoder layers or custom submodules (transformers rule TRF011)."
    why = "Under pipeline parallelism layers on other ranks are nn.Identity placeholders; reading `layer.attention_type` there raises AttributeError."
    example = "for layer in self.layers:\n    mask = masks[layer.attention_type]"
    fix = "Read per-layer facts from the config: `self.config.layer_types[i]`."
    none = None


class RemovedTransformersAPI(_RemoteCodeRule):
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


class UnavailablePackages(_RemoteCodeRule):
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
        "(analyzer/data/vllm_environment.json: einops is there; flash_attn, bitsandbytes, accelerate are not), "
        "not against the environment hfcheck itself runs in."
    )
    example = "from flash_attn import flash_attn_func   # at module level, unguarded"
    fix = "if is_flash_attn_2_available():\n    from flash_attn import flash_attn_func"
    none = None


class PackedQKVUnreadable(_RemoteCodeRule):
    code = "HFC813"
    name = "remote-packed-qkv"
    impact = "speed"
    what = "A single q/k/v projection (Wqkv, qkv_proj, query_key_value, c_attn, W_pack) is split with `.split((q, kv, kv))`, the only form vLLM shards."
    why = "vLLM turns such a projection into QKVParallelLinear only through that split; `.chunk(3)`, `.view(..., 3, ...)` or indexing leave one replicated GEMM (no TP sharding of attention, no fusion)."
    example = "q, k, v = self.Wqkv(x).chunk(3, dim=-1)"
    fix = "q, k, v = self.Wqkv(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)   # int sizes; or separate q/k/v projections"
    none = "no packed q/k/v projection"
    observed_by = "HFC301"


class DynamicCodeExecution(_RemoteCodeRule):
    code = "HFC820"
    name = "remote-dynamic-code"
    impact = "info"
    what = "exec / eval / compile, __import__, importlib.import_module of a computed name, getattr on builtins."
    why = "Code that builds code can do anything and hides what it does from review and from static analysis. At import time (fail) it runs as soon as transformers loads the model."
    example = 'use_triton = eval(os.environ.get("use_triton", "False"))'
    fix = "Parse values explicitly (int(), float(), json.loads, a dict of allowed names); import modules by name."
    none = None


class ProcessExecution(_RemoteCodeRule):
    code = "HFC821"
    name = "remote-process-execution"
    impact = "info"
    what = "subprocess, os.system, os.popen, os.exec*/spawn*/fork, pty.spawn."
    why = "Modeling code has no reason to start processes; doing so at import time (fail) runs commands on every machine that loads the model."
    example = 'os.system("pip install flash-attn")'
    fix = "Remove it; declare dependencies in the model card instead of installing them from code."
    none = None


class NetworkAccess(_RemoteCodeRule):
    code = "HFC822"
    name = "remote-network-access"
    impact = "info"
    what = "Imports and calls of socket, requests, urllib.request, http.client, httpx, aiohttp, websockets, ftplib, smtplib, paramiko; run-time Hub downloads."
    why = "Network access from modeling code can exfiltrate data or fetch code that was never reviewed; at import time (fail) it happens on every load, and offline deployments break."
    example = "requests.post(url, data=open(os.path.expanduser('~/.cache/huggingface/token')).read())"
    fix = "Ship every file the model needs in its repo; never open connections from modeling code."
    none = None


class UnsafeDeserialization(_RemoteCodeRule):
    code = "HFC823"
    name = "remote-unsafe-deserialization"
    impact = "info"
    what = "pickle / dill / joblib / marshal loads, numpy.load(allow_pickle=True), torch.load without weights_only=True."
    why = "Unpickling executes arbitrary code embedded in the file; a repo can ship a tensor file that runs a payload when the model loads it."
    example = "state = torch.load(path)   # weights_only defaults to True only on torch >= 2.6"
    fix = "Use safetensors, or torch.load(path, weights_only=True)."
    none = None


class FileWrites(_RemoteCodeRule):
    code = "HFC824"
    name = "remote-file-writes"
    impact = "info"
    what = "open(..., 'w'/'a'/'x'/'+') and os/shutil/pathlib writes, moves and deletions to fixed or computed paths (not a cache, temp or caller-given directory)."
    why = "Modeling code should write only under the HF cache or where the caller asks (save_pretrained); writes elsewhere can plant files or destroy data, at import time (fail) on every load."
    example = 'open(os.path.expanduser("~/.bashrc"), "a").write(...)'
    fix = "Write only under a directory the caller passes in, or the HF cache."
    none = None


class ImportTimeSideEffects(_RemoteCodeRule):
    code = "HFC825"
    name = "remote-import-time-side-effects"
    impact = "info"
    what = "Module-level statements that act when the file is merely imported: calls (other than logging/warnings/registration), loops, `with` blocks, assignments into other modules (os.environ, torch flags)."
    why = "transformers imports the module to get one class; anything it does at import happens in every process that loads the model (vLLM workers included), before any check."
    example = 'os.environ["CUDA_VISIBLE_DEVICES"] = "0"\ntorch.backends.cuda.matmul.allow_tf32 = True'
    fix = "Move the work into the model's __init__/forward, or drop it."
    none = None


class SandboxedBuild(Rule):
    code = "HFC830"
    name = "remote-sandboxed-build"
    impact = "blocker"
    what = "With --trust-remote-code: the remote classes were built on the meta device in a time-limited, network-less subprocess, and what the code tried there."
    why = (
        "Building the model from its own classes lets hfcheck run the same graph analysis as for native models. "
        "A build that fails there (missing package, broken code) fails in vLLM too; operations the sandbox refused "
        "(network, processes, writes outside its folder) are what the code does on load."
    )
    example = "hfcheck scan ./my-model --trust-remote-code"
    fix = "Fix the error the build reports; remove network, process and file-system access from the modeling code."

    def check(self, analysis) -> list[Finding]:
        result = getattr(analysis, "sandbox", None)
        if result is None:
            return []
        out: list[Finding] = []
        if result.timed_out:
            out.append(self.inconclusive(f"the sandboxed build was stopped: {result.error}"))
        elif not result.ok:
            out.append(self.failed(f"the remote code does not build: {result.error}", "Fix the error; vLLM loads the same classes."))
        else:
            out.append(self.passed(f"built the remote classes in the sandbox ({result.seconds:.1f} s, meta device, no network)"))
        if result.blocked:
            out.append(
                Finding(self.code, "fail", f"the sandbox refused {len(result.blocked)} operation(s) the code attempted: {'; '.join(result.blocked[:3])}",
                        "Remove network, process and file-system access from the modeling code.", "info", {"blocked": list(result.blocked)})
            )
        return out


REMOTE_CODE_RULES: tuple[type[Rule], ...] = (
    RemoteCodeRead,
    AttentionInterfaceDispatch,
    AttentionScalingResolvable,
    HandWrittenAttention,
    KwargsPropagation,
    AttentionBackendFlag,
    AttentionLayerIndex,
    AttentionIsCausal,
    ExpertsLayout,
    PipelineModuleLists,
    ForwardReadsSubmoduleAttributes,
    RemovedTransformersAPI,
    UnavailablePackages,
    PackedQKVUnreadable,
    DynamicCodeExecution,
    ProcessExecution,
    NetworkAccess,
    UnsafeDeserialization,
    FileWrites,
    ImportTimeSideEffects,
    SandboxedBuild,
)
"""In report order; registry.RULES should append these (``+ REMOTE_CODE_RULES``)."""
