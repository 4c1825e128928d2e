"""``hfcheck scan --cross-check`` over the whole atlas: every causal-LM model type's default
config, analysed by hfcheck and then cross-checked in the same process by vLLM's own code
(``analyzer/crosscheck.py``) on the same structural instance.

Run with the Python of an environment holding both vLLM 0.33 and hfcheck (CI: .venv-vllm):
    python scripts/crosscheck/atlas_crosscheck.py [--other-types FILE] [--only a,b]
Writes /tmp/crosscheck_atlas.json (or $CROSSCHECK_OUT): per model type, the cross_check block,
or the reason hfcheck could not analyse the type (not a disagreement: vLLM gets no further).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import transformers  # noqa: E402
from common import common_model_types, err, time_limit  # noqa: E402

from hfcheck.analyzer.crosscheck import cross_check, installed_vllm_version, summary_line  # noqa: E402
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


def main() -> None:
    types = common_model_types()
    if "--only" in sys.argv:
        types = sys.argv[sys.argv.index("--only") + 1].split(",")
    result: dict = {"_meta": {"side": "cross_check", "vllm": installed_vllm_version(), "transformers": transformers.__version__}}
    t0 = time.time()
    for mt in types:
        t = time.time()
        try:
            with time_limit(180):
                result[mt] = one(mt)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result[mt] = {"cross_check_error": err(exc)}
        result[mt]["seconds"] = round(time.time() - t, 2)
        r = result[mt]
        line = summary_line(r["cross_check"]) if "cross_check" in r else (r.get("cross_check_error") or f"not analysed: {r.get('analysis_error')}")
        print(f"{mt:32s} {r['seconds']:6.2f}s {line}", flush=True)
    result["_meta"]["seconds"] = round(time.time() - t0, 1)
    out = os.environ.get("CROSSCHECK_OUT", "/tmp/crosscheck_atlas.json")
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True, default=str)
    print("wrote", out, "in", result["_meta"]["seconds"], "s")


if __name__ == "__main__":
    main()
