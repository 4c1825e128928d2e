"""Remote code (``auto_map``), read statically: never imported or executed here.

- ``index.py``: every file of ``source.code_files`` parsed once with ``ast``; ``roles.py`` and
  ``ast_helpers.py`` the shared readings of it (which class is the attention, the MLP...);
  ``removed_apis.py`` the transformers APIs a 4.x-era file may still import;
- ``checks/``: the HFC8xx checks, one module per family, and their runner
  (``checks.static_findings(source)``, cached per code text so every rule and the report share
  one run; ``checks.code_findings(source)``: the report's problems);
- building the model from the remote classes runs only with ``--trust-remote-code``, in the
  analysis's fenced child (``analyzer/analysis/sandbox.py``).
"""

from __future__ import annotations

from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.analyzer.remote.source import has_remote_code

__all__ = ["CodeIndex", "has_remote_code"]
