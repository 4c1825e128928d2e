"""Will vLLM's weight loader find a home for every tensor of the checkpoint?"""

from __future__ import annotations

from hfcheck.analyzer.findings.rule import Finding, ObservedRule, Rule


def _some(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


class CheckpointLoads(Rule):
    code = "HFC105"
    name = "checkpoint-names-load"
    impact = "blocker"
    what = (
        "Every parameter of the causal-LM class is either in its base model or in `lm_head`, and no base-model "
        "parameter matches one of the base model's `_keys_to_ignore_on_load_unexpected` patterns."
    )
    why = (
        "vLLM's transformers backend builds the base model with AutoModel plus its own ParallelLMHead, and maps "
        "every checkpoint name onto that pair. A head kept under another name (BERT's `cls.predictions`, "
        "ELECTRA's `generator_predictions`) has no module: 'There is no module or parameter named cls'. The "
        "ignore patterns are applied with re.search and drop any name containing them, so a real weight can be "
        "discarded: 'Following weights were not initialized from checkpoint'."
    )
    example = (
        "class BertLMHeadModel(BertPreTrainedModel):\n"
        "    def __init__(self, config):\n"
        "        self.bert = BertModel(config)\n"
        "        self.cls = BertOnlyMLMHead(config)   # transform + decoder: not lm_head\n"
        "_keys_to_ignore_on_load_unexpected = [\"attn.bias\"]  # also drops h.0.attn.c_attn.bias"
    )
    fix = (
        "Keep the output projection as `lm_head` directly on the causal-LM class (fold any head transform into "
        "the base model's forward), and anchor ignore patterns (r\"\\.attn\\.bias$\") so they match only the "
        "buffers they mean."
    )
    vllm_source = (
        "model_executor/models/transformers/base.py::Base._create_hf_to_vllm_mapper",
        "model_executor/models/utils.py::AutoWeightsLoader._load_module",
        "model_executor/model_loader/default_loader.py::DefaultModelLoader.track_weights_loading",
    )

    def check(self, analysis) -> list[Finding]:
        names = analysis.checkpoint
        if names is None:
            return []
        findings = []
        if names.outside:
            findings.append(self.failed(
                f"{names.architecture} keeps parameters outside its base model and lm_head, which vLLM's loader has no "
                f"module for: {_some(names.outside)}",
                outside=names.outside,
            ))
        if names.dropped:
            findings.append(self.failed(
                f"vLLM drops base-model weights matching the model's _keys_to_ignore_on_load_unexpected (re.search): "
                f"{_some(names.dropped)}; loading fails with 'weights were not initialized'",
                dropped=names.dropped,
            ))
        if not findings:
            findings.append(self.passed(f"every {names.architecture} parameter maps onto the base model or lm_head"))
        return findings


class LinearSubclassForward(ObservedRule):
    code = "HFC106"
    name = "linear-subclass-forward"
    impact = "blocker"
    what = "No nn.Linear subclass that vLLM replaces has a forward doing more than `x @ W.T + b`."
    why = (
        "vLLM's transformers backend replaces every nn.Linear child, subclasses included, by its own linear "
        "layer (ReplicatedLinear or a tensor-parallel one), which only multiplies: a subclass's own forward is "
        "dropped. A router that returns (logits, weights, experts) then returns one tensor and the block fails "
        "('too many values to unpack (expected 3)', measured on PhiMoE with vLLM 0.32); a forward that scales "
        "or post-processes gives other numbers without any error. Routers of MoE blocks that vLLM takes over "
        "run as written and are not judged."
    )
    example = (
        "class PhimoeTopKRouter(nn.Linear):\n"
        "    def forward(self, hidden_states):\n"
        "        router_logits = super().forward(hidden_states)\n"
        "        ...\n"
        "        return router_logits, routing_weights, selected_experts   # vLLM's linear returns one tensor"
    )
    fix = (
        "Make such a module an nn.Module that holds an nn.Linear child (or a weight Parameter) and does its extra "
        "work in its own forward: vLLM then replaces only the plain linear."
    )
    vllm_source = (
        "model_executor/models/transformers/base.py::Base.recursive_replace",
        "model_executor/models/transformers/utils.py::replace_linear_class",
    )
    without_instance = None  # HFC104 and HFC201 already say why there is no instance

    def check_observed(self, analysis, obs) -> list[Finding]:
        lost = obs.linear_forwards_lost
        if not lost:
            return [self.passed("every nn.Linear vLLM replaces computes only x @ W.T + b")]
        by_class: dict[str, tuple[str, str]] = {}
        for path, cls, why in lost:
            by_class.setdefault(cls, (path, why))
        return [
            self.failed(f"{cls} ({path}) subclasses nn.Linear with its own forward, which vLLM's replacement linear drops: {why}",
                        module=cls)
            for cls, (path, why) in by_class.items()
        ]
