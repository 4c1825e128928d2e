"""Quantization methods the release predicted for does not load on the transformers backend."""

from __future__ import annotations

from hfcheck.analyzer.findings.rule import Finding, Rule
from hfcheck.analyzer.terms import vocabulary as V
from hfcheck.analyzer.vllm.release import tables


class Quantization(Rule):
    code = "HFC701"
    name = "quantization"
    impact = "blocker"
    what = "The checkpoint's quantization method is one the release predicted for knows, and the transformers backend loads."
    why = (
        "`ModelConfig._verify_quantization` raises 'Unknown quantization method' for a method not in the release's "
        "`QuantizationMethods` (vLLM 0.34 removed `fp_quant` and added `w4afp8`, `lut_b_moe`, `mxfp4_hadamard32`), and "
        "refuses a deprecated one unless `--allow-deprecated-quantization`; the transformers backend then raises "
        "NotImplementedError for MXFP4 ('does not support MXFP4 quantization yet')."
    )
    vllm_source = ("config/model.py::ModelConfig._verify_quantization",
                   "model_executor/layers/quantization/__init__.py::QuantizationMethods",
                   "model_executor/models/transformers/base.py::Base.__init__")
    example = 'openai/gpt-oss-20b: "quantization_config": {"quant_method": "mxfp4"}'
    fix = "Use a bf16 or FP8 checkpoint of the model, a method the release knows, or a native vLLM implementation (`--model-impl auto`)."

    def check(self, analysis) -> list[Finding]:
        method = analysis.facts.quant_method
        if method is None:
            return [self.passed(f"not quantized ({analysis.facts.dtype})")]
        release = analysis.target.vllm
        known = tables(release)["quantization"]
        if method in V.MXFP4_METHODS:
            return [self.failed(f"{method} quantization is refused by the transformers backend")]
        if method not in known["methods"]:
            return [self.failed(f"vLLM {release} does not know the quantization method {method!r} ('Unknown quantization method')",
                                method=method)]
        if method in known["deprecated"]:
            return [self.warned(f"{method} quantization is deprecated in vLLM {release}: it loads only with --allow-deprecated-quantization",
                                "Serve with --allow-deprecated-quantization, or use a checkpoint in a current method.", method=method)]
        return [self.passed(f"{method} quantization (known to vLLM {release})")]
