"""``hfcheck verify``: prove scan's claims numerically on a tiny random-weight instance, on CPU.

The analyzer predicts, ``verify`` proves, ``porter`` changes a model: three top-level folders
(``analyzer/``, ``verify/``, ``porter/``), shipped as ``hfcheck.analyzer``, ``hfcheck.verify``
and ``hfcheck.porter``. What vLLM does is written once, in the analyzer, and imported here: the
forward rewrite (each fusion pattern's ``rewrite``, ``analyzer.fusions.detect.fused_forward``),
the ``recursive_replace`` walk (``analyzer.analysis.observe``: ``fusion.find_sites`` reads its
observations) and the verdict (``analyzer.report.verdict``: ``cli.attach_proofs``). This package adds
only the applying, the sharding and the comparing.

- ``fusion``: apply each predicted fusion the way vLLM does (forward rewritten with ``ast``,
  merged weights split back, act-and-mul kernels, stacked experts, MLA's fused a-projection,
  vLLM-style RMSNorm) and compare the model output with the unfused model in float32.
- ``tp`` / ``pp`` / ``ep``: shard the same instance per the predicted plan over real
  ``torch.distributed`` (gloo) worker processes and compare with the unsharded output; a
  failed proof names the first module whose output diverges.
- ``runner``: every proof for one analysed model -> ``proofs[{claim, status, max_rel_error, seconds}]``.
- ``cli``: ``hfcheck verify REF`` and ``attach_proofs`` for ``hfcheck scan --verify``.

Nothing here is imported by ``scan``; torch and transformers load only when a proof runs.
"""

from __future__ import annotations

__all__ = ["attach_proofs", "verify_analysis"]


def __getattr__(name: str):
    if name == "attach_proofs":
        from hfcheck.verify.cli import attach_proofs

        return attach_proofs
    if name == "verify_analysis":
        from hfcheck.verify.runner import verify_analysis

        return verify_analysis
    raise AttributeError(name)
