"""Every rule, in report order. A new rule is one class in its concern's file and one line here."""

from __future__ import annotations

from hfcheck.analyzer.findings.rule import Rule
from hfcheck.analyzer.rules.attention import (
    AttentionArguments,
    AttentionCoverage,
    EncoderModels,
    MLAHeadSize,
    UnmanagedStateSpace,
    ValueHeadSize,
)
from hfcheck.analyzer.rules.fusion import AttentionProjections, GatedMLP, RMSNormDetected
from hfcheck.analyzer.rules.loading import CheckpointLoads, LinearSubclassForward
from hfcheck.analyzer.rules.moe import (
    CPUBuildRouting,
    ExpertCount,
    ExpertParallel,
    ExpertsReplaceable,
    InternalRouting,
    MoEConfigFields,
    RoutingInputs,
)
from hfcheck.analyzer.rules.multimodal import MULTIMODAL_RULES
from hfcheck.analyzer.rules.parallel import (
    PipelineParallel,
    TensorParallelPlan,
    TensorParallelSizes,
)
from hfcheck.analyzer.rules.pooling import POOLING_RULES
from hfcheck.analyzer.rules.quantization import Quantization
from hfcheck.analyzer.rules.remote_code import REMOTE_CODE_RULES
from hfcheck.analyzer.rules.resolution import (
    BackendTransformersMinimum,
    ClassResolution,
    CompatibilityGate,
    InstanceBuilt,
    NativeImplementation,
    PerLayerAttributeReadGlobally,
)

RULES: tuple[type[Rule], ...] = (
    ClassResolution,
    CompatibilityGate,
    NativeImplementation,
    InstanceBuilt,
    BackendTransformersMinimum,
    PerLayerAttributeReadGlobally,
    CheckpointLoads,
    LinearSubclassForward,
    AttentionCoverage,
    UnmanagedStateSpace,
    AttentionArguments,
    EncoderModels,
    MLAHeadSize,
    ValueHeadSize,
    AttentionProjections,
    GatedMLP,
    RMSNormDetected,
    ExpertsReplaceable,
    InternalRouting,
    RoutingInputs,
    ExpertCount,
    CPUBuildRouting,
    MoEConfigFields,
    ExpertParallel,
    TensorParallelPlan,
    TensorParallelSizes,
    PipelineParallel,
    Quantization,
    *MULTIMODAL_RULES,
    *POOLING_RULES,
    *REMOTE_CODE_RULES,
)

BY_CODE: dict[str, type[Rule]] = {rule.code: rule for rule in RULES}
assert len(BY_CODE) == len(RULES), "rule codes must be unique"
