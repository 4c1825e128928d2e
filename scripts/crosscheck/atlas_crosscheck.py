"""``hfcheck scan --cross-check`` over the whole atlas: every causal-LM model type's default
config, analysed by hfcheck and then cross-checked in the same process by vLLM's own code
(``analyzer/analysis/crosscheck.py``) on the same structural instance.

Run with the Python of an environment holding both vLLM 0.33 and hfcheck (CI: .venv-vllm):
    python scripts/crosscheck/atlas_crosscheck.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_atlas.json (or $CROSSCHECK_OUT): per model type, the cross_check block,
or the reason hfcheck could not analyse the type (not a disagreement: vLLM gets no further).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import transformers  # noqa: E402
from common import err, run_over_types  # noqa: E402

from hfcheck.analyzer.analysis.crosscheck import cross_check, installed_vllm_version, summary_line  # noqa: E402
from hfcheck.analyzer.scan import scan  # noqa: E402
from hfcheck.analyzer.sources.model_types import type_source  # noqa: E402

logging.disable(logging.WARNING)
transformers.logging.set_verbosity_error()


def one(mt: str) -> dict:
    try:
        scanned = scan(type_source(mt))
        analysis, report = scanned.analysis, scanned.report
    except Exception as exc:  # noqa: BLE001 - hfcheck refuses the type (exit 2 on the command line)
        return {"analysis_error": err(exc)}
    try:
        cc = cross_check(analysis, report)
    except Exception as exc:  # noqa: BLE001 - a crash of the cross-check itself is a failure of the stage
        return {"verdict": report["verdict"], "cross_check_error": err(exc)}
    return {"verdict": report["verdict"], "cross_check": cc}


def _line(r: dict) -> str:
    if "cross_check" in r:
        return summary_line(r["cross_check"])
    return r.get("cross_check_error") or f"not analysed: {r.get('analysis_error')}"


def main() -> None:
    meta = {"side": "cross_check", "vllm": installed_vllm_version(), "transformers": transformers.__version__}
    run_over_types(one, meta, "/tmp/crosscheck_atlas.json", seconds=180, error_key="cross_check_error", describe=_line)


if __name__ == "__main__":
    main()
