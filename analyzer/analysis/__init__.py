"""Gather everything the rules read, in the data flow's order, once.

source -> facts -> tiny instance -> observations. A stage that cannot run (remote code
not executed, a class that does not build) leaves a recorded reason; later rules turn
that into "inconclusive" rather than crashing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hfcheck.analyzer.analysis.observe import Observations, observe
from hfcheck.analyzer.analysis.sandbox import run_sandboxed
from hfcheck.analyzer.facts import ModelFacts, collect_facts
from hfcheck.analyzer.facts.processor import ProcessorFacts, collect_processor_facts
from hfcheck.analyzer.fusions.base import FusionContext
from hfcheck.analyzer.fusions.context import fusion_context
from hfcheck.analyzer.instance import (
    CheckpointNames,
    InstanceError,
    TinyInstance,
    build_structural,
    checkpoint_names,
)
from hfcheck.analyzer.remote.checks import CodeFinding, static_findings
from hfcheck.analyzer.sources import ModelSource
from hfcheck.analyzer.vllm.target import Target, current


@dataclass
class Analysis:
    source: ModelSource
    facts: ModelFacts
    config_object: Any
    instance: TinyInstance | None
    instance_error: str | None
    observations: Observations | None
    transformers_class: type | None
    class_origin: str | None
    timings: dict[str, float] = field(default_factory=dict)
    sandbox: Any = None
    """The sandboxed remote-code run (``--trust-remote-code``), when there was one."""
    checkpoint: CheckpointNames | None = None
    """The causal-LM class's parameter names as vLLM's weight loader meets them."""
    processor: ProcessorFacts | None = None
    """The HF processor vLLM's multimodal path builds (None: the model has no processor side)."""
    code: list[CodeFinding] | None = None
    """Every static finding on the remote code, passes included (None: the model has none);
    the HFC8xx rules report from it."""
    target: Target = field(default_factory=current)
    """The vLLM release, its transformers release and the platform the prediction is for."""

    @property
    def fusion_context(self) -> FusionContext:
        return fusion_context(self.facts)


def resolve_transformers_class(facts: ModelFacts) -> tuple[type | None, str | None]:
    """The class vLLM resolves: ``getattr(transformers, architecture)``; remote classes
    (auto_map) are not imported here, since that would execute them."""
    import transformers

    for arch in facts.architectures:
        cls = getattr(transformers, arch, None)
        if isinstance(cls, type):
            return cls, "transformers"
    if any(k.startswith("AutoModel") for k in facts.auto_map):
        return None, "auto_map"
    return None, None


def analyse(source: ModelSource, trust_remote_code: bool = False, sandbox_timeout: float = 120.0) -> Analysis:
    """Run every stage. Remote classes (vLLM resolves them through ``auto_map`` when the
    architecture is not a transformers class) are only ever built in a sandboxed child
    process, and only with ``trust_remote_code``."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    facts, cfg_obj = collect_facts(source.config, source.code_files)
    processor = collect_processor_facts(source.processor, source.config) if facts.multimodal or source.processor.has_processor_config else None
    timings["facts"] = time.perf_counter() - t0
    cls, origin = resolve_transformers_class(facts)
    instance = observations = sandbox = None
    error = None
    t1 = time.perf_counter()
    if origin == "auto_map" or (cfg_obj is None and facts.auto_map):
        if not trust_remote_code:
            error = "remote code: its classes are not executed without --trust-remote-code"
        elif not source.code_files:
            error = "remote code: its files could not be obtained (see missing code)"
        else:

            sandbox = run_sandboxed(source, sandbox_timeout)
            if sandbox.ok:
                facts = sandbox.facts or facts
                instance, observations = sandbox.instance, sandbox.observations
            else:
                error = f"remote code (sandboxed): {sandbox.error}"
    elif cfg_obj is None:
        error = "no transformers config class for this model_type"
    else:
        try:
            instance = build_structural(facts, cfg_obj)
        except InstanceError as exc:
            error = str(exc)
    timings["instance"] = time.perf_counter() - t1
    if instance is not None and observations is None:
        t2 = time.perf_counter()
        observations = observe(instance.model, fusion_context(facts))
        timings["graph"] = time.perf_counter() - t2
    checkpoint = None
    if instance is not None and sandbox is None:
        t3 = time.perf_counter()
        checkpoint = checkpoint_names(facts, cfg_obj, cls, instance.model)
        timings["checkpoint"] = time.perf_counter() - t3
    return Analysis(source, facts, cfg_obj, instance, error, observations, cls, origin, timings, sandbox, checkpoint, processor,
                    static_findings(source))
