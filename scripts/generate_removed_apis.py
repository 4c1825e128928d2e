"""Regenerate analyzer/data/transformers_removed.json: what transformers 5 removed, read off the releases.

The curated table in ``analyzer/remote/removed_apis.py`` names the removals old remote code is
known to hit, each with its replacement and the release it vanished in. It was built from the
fixtures; this table is built from transformers itself: 4.x releases from 4.30 to the last one
(4.57.6, each run in an hfcheck reference environment), then 5.0.0, 5.20.2 and the installed
5.x one; a name is gone between the last surveyed release that has it and the next one (4.x
removed some itself: ``SequenceSummary`` left ``modeling_utils`` before 4.57), over

- every module file of the package (``transformers.modeling_attn_mask_utils``,
  ``transformers.modeling_tf_utils``, ...): present in 4.57, absent now;
- the public names of the modules remote code imports from (the top level, ``utils``,
  ``modeling_utils``, ``pytorch_utils``, ``cache_utils``, ``generation``, ``activations`` and the
  Llama/Mistral/Qwen2 modeling files that code copied from): present in 4.57, absent now.

Usage (from the checkout, with hfcheck's venv): python scripts/generate_removed_apis.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EARLIER = ("4.30.0", "4.36.2", "4.44.0", "4.46.3", "4.51.3")  # names 4.x itself removed (SequenceSummary, gone from modeling_utils in 4.x)
OLD = "4.57.6"
LATER = ("5.0.0", "5.20.2")  # surveyed too: the first release without a name is its gone_in (5.20.2: what vLLM 0.33 pins)
OUT = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "transformers_removed.json"
MODULES = (
    "transformers", "transformers.utils", "transformers.utils.import_utils", "transformers.utils.generic", "transformers.file_utils",
    "transformers.modeling_utils", "transformers.pytorch_utils", "transformers.cache_utils", "transformers.modeling_outputs",
    "transformers.generation", "transformers.generation.utils", "transformers.activations", "transformers.configuration_utils",
    "transformers.modeling_rope_utils", "transformers.modeling_flash_attention_utils", "transformers.integrations",
    "transformers.models.llama.modeling_llama", "transformers.models.mistral.modeling_mistral", "transformers.models.qwen2.modeling_qwen2",
)

SURVEY = r"""
import importlib, json, os, pkgutil, sys, warnings
warnings.filterwarnings("ignore")
import transformers
root = os.path.dirname(transformers.__file__)
modules = []
for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not d.startswith("__")]
    rel = os.path.relpath(dirpath, os.path.dirname(root)).replace(os.sep, ".")
    for f in filenames:
        if f.endswith(".py"):
            modules.append(rel if f == "__init__.py" else f"{rel}.{f[:-3]}")
names, every = {}, {}
for m in json.loads(sys.argv[1]):
    try:
        mod = importlib.import_module(m)
    except Exception:
        continue
    def own(n):  # a transformers API, not a name the module itself imported from elsewhere (typing.Optional, torch)
        try:
            value = getattr(mod, n)
        except Exception:
            return True  # a lazy name that no longer resolves is still a name of transformers
        origin = getattr(value, "__name__", "") if type(value).__name__ == "module" else getattr(value, "__module__", None)
        return origin is None or str(origin).startswith("transformers")
    names[m] = sorted(n for n in dir(mod) if not n.startswith("_") and own(n))
    every[m] = sorted(dir(mod))
print(json.dumps({"version": transformers.__version__, "modules": sorted(modules), "names": names, "every": every}))
"""


def _importable(module: str) -> bool:
    """In this (the newest) release: does the module still import, by file or by alias?"""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def survey(python: str) -> dict:
    out = subprocess.run([python, "-c", SURVEY, json.dumps(MODULES)], capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from hfcheck.shared.environments import EnvSpec, ensure_env

    surveys = [survey(str(ensure_env(EnvSpec(v), log_fn=print).python)) for v in EARLIER + (OLD,) + LATER] + [survey(sys.executable)]
    newest = surveys[-1]

    def gone_in(there, still) -> list[str] | None:
        """[the last surveyed release that has it, the next one surveyed]: it vanished between
        them. ``there``: really present in a release; ``still``: not (yet) gone from the newest."""
        if still(newest):
            return None  # back by the newest release (a deprecated alias restored), or never gone
        last = max((i for i, r in enumerate(surveys[:-1]) if there(r)), default=None)
        return None if last is None else [surveys[last]["version"], surveys[last + 1]["version"]]

    modules: dict[str, list[str]] = {}
    for m in sorted({m for r in surveys[:-1] for m in r["modules"]}):
        if ".models." in m and not m.rpartition(".")[2].startswith("modeling_"):
            continue
        present = lambda r, m=m: m in r["modules"]  # noqa: E731
        if (v := gone_in(present, present)) is not None and not _importable(m):  # no file, and no alias left either
            modules[m] = v
    names: dict[str, dict[str, list[str]]] = {}
    for m, n in sorted({(m, n) for r in surveys[:-1] for m, ns in r["names"].items() for n in ns}):
        there = lambda r, m=m, n=n: n in r["every"].get(m, ())  # noqa: E731
        still = lambda r, m=m, n=n: m not in r["every"] or n in r["every"][m]  # noqa: E731 - a module that no longer imports is the module table's
        if (v := gone_in(there, still)) is not None:
            names.setdefault(m, {})[n] = v
    table = {"last_4x": OLD, "surveyed": [r["version"] for r in surveys], "modules": modules, "names": names}
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(modules)} modules, {sum(map(len, names.values()))} names gone (surveyed {table['surveyed']}) -> {OUT}")


if __name__ == "__main__":
    main()
