"""Rewrites a model into one vLLM's transformers backend serves at native speed (issue 6).

(The numerical proofs of scan's claims, ``hfcheck verify``, are not porting: they live in the
top-level ``verify/`` folder, shipped as ``hfcheck.verify``.)

- ``port``: libcst codemods for the remote-code findings, checkpoint conversion, the
  original-vs-ported logit proof and the re-scan (``hfcheck port SRC --out DIR``);
- ``cli``: the ``port`` and ``serve`` subcommands (serving itself, on real vLLM, is
  ``hfcheck.runtime.serve``).
"""
