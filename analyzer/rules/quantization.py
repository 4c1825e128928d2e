"""Quantization methods the transformers backend refuses."""

from __future__ import annotations

from hfcheck.analyzer import vocabulary as V
from hfcheck.analyzer.rules.base import Finding, Rule


class Quantization(Rule):
    code = "HFC701"
    name = "quantization"
    impact = "blocker"
    what = "The checkpoint's quantization method is one the transformers backend loads."
    why = "vLLM's transformers backend raises NotImplementedError for MXFP4 ('does not support MXFP4 quantization yet')."
    example = 'openai/gpt-oss-20b: "quantization_config": {"quant_method": "mxfp4"}'
    fix = "Use a bf16 or FP8 checkpoint of the model, or a native vLLM implementation (`--model-impl auto`)."

    def check(self, analysis) -> list[Finding]:
        method = analysis.facts.quant_method
        if method is None:
            return [self.passed(f"not quantized ({analysis.facts.dtype})")]
        if method in V.MXFP4_METHODS:
            return [self.failed(f"{method} quantization is refused by the transformers backend")]
        return [self.passed(f"{method} quantization")]
