"""Many references at once: every causal-LM type of the installed transformers, or any list.

``targets`` says what to analyse (a model type's default config, or a reference), ``worker``
runs each analysis in a child process under a time limit (a hang, an exception or a crash of
the interpreter is one recorded failure, never the end of the sweep), ``cache`` keeps results
keyed by (config hash, code hash, transformers version, hfcheck version), ``atlas`` writes the
markdown summary, ``run`` ties them together and ``cli`` is ``hfcheck sweep``.

Nothing here imports torch or transformers at import time: ``hfcheck --help`` stays fast.
"""

from __future__ import annotations

from hfcheck.sweep.run import SweepResult, failure_reason, instance_ok, sweep

__all__ = ["SweepResult", "failure_reason", "instance_ok", "sweep"]
