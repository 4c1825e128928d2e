"""CI gate: fail on any disagreement between hfcheck and vLLM's own logic that is not listed,
with its reason, in known_differences.toml.

Run with any Python >= 3.11:
    python scripts/crosscheck/gate.py VLLM_JSON HFCHECK_JSON [ATLAS_JSON] [--known FILE]

Inputs: vllm_side.py's and hfcheck_side.py's JSON (compared by compare.py, whose report is
printed as it is), and atlas_crosscheck.py's JSON (``--cross-check`` per model type).
Every disagreement gets an id:

    <quantity>:<model type>:<where>     e.g. chosen:mllama:MllamaVisionAttention
                                             moe_block_fused:jamba:JambaSparseMoeBlock
                                             build:gptj:-   (one side builds, the other does not)
                                             cross_check:codegen:attention_by_layer:layer 0
                                             cross_check_error:olmo:-

Exit 0 when every id is listed (listed ids not seen are reported as stale, not failed), 1 when
some are not, 2 on unusable input.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import runpy
import sys

import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KNOWN = os.path.join(HERE, "known_differences.toml")


def load_known(path: str) -> dict[str, str]:
    """id (or glob) -> reason; every entry must give a reason."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    known: dict[str, str] = {}
    for i, entry in enumerate(data.get("difference", [])):
        ident, reason = entry.get("id"), entry.get("reason")
        if not isinstance(ident, str) or not ident.strip():
            raise SystemExit(f"gate: {path}: difference #{i + 1} has no id")
        if not isinstance(reason, str) or not reason.strip():
            raise SystemExit(f"gate: {path}: {ident} has no reason (every known difference says why)")
        known[ident.strip()] = reason.strip()
    return known


def script_differences(vllm_json: str, hfcheck_json: str) -> tuple[list[str], str]:
    """(ids, compare.py's printed report) for the two sides' structural comparison."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = ["compare.py", vllm_json, hfcheck_json]
    try:
        with contextlib.redirect_stdout(out):
            g = runpy.run_path(os.path.join(HERE, "compare.py"), run_name="compare")
    finally:
        sys.argv = argv
    ids = []
    for t, ve, he in g["err_rows"]:
        if bool(ve) != bool(he):  # both failing to build is agreement: vLLM cannot build it either
            ids.append(f"build:{t}:-")
    for q, entries in g["diffs"].items():
        for key in entries:
            ids.append(f"{q}:{key[0]}:-" if q == "structure" else f"{q}:{key[0]}:{key[1]}")
    return sorted(set(ids)), out.getvalue()


def atlas_differences(atlas_json: str) -> tuple[list[str], str]:
    with open(atlas_json) as fh:
        data = json.load(fh)
    ids, lines = [], []
    counts = {"agrees": 0, "differs": 0, "not analysed": 0, "errors": 0}
    for t, r in sorted(data.items()):
        if t.startswith("_"):
            continue
        if "cross_check_error" in r:
            counts["errors"] += 1
            ids.append(f"cross_check_error:{t}:-")
            lines.append(f"  {t}: cross-check failed: {r['cross_check_error']}")
            continue
        cc = r.get("cross_check")
        if cc is None:
            counts["not analysed"] += 1
            continue
        if not cc.get("available"):
            ids.append(f"cross_check_unavailable:{t}:-")
            lines.append(f"  {t}: {cc.get('note')}")
            continue
        counts["agrees" if cc["agrees"] else "differs"] += 1
        for d in cc["differences"]:
            ids.append(f"cross_check:{t}:{d['quantity']}:{d['where']}")
            lines.append(f"  {t}: {d['quantity']} {d['where']}: vLLM={d['vllm']!r} hfcheck={d['hfcheck']!r} (e.g. {d.get('example')})")
    head = (f"--cross-check over the atlas (vLLM {data.get('_meta', {}).get('vllm')}, transformers {data.get('_meta', {}).get('transformers')}): "
            f"{counts['agrees']} model types agree, {counts['differs']} differ, {counts['errors']} cross-check errors, "
            f"{counts['not analysed']} not analysed by hfcheck")
    return sorted(set(ids)), "\n".join([head, *lines])


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    known_path = argv[argv.index("--known") + 1] if "--known" in argv else DEFAULT_KNOWN
    if "--known" in argv:
        args.remove(known_path)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    known = load_known(known_path)
    ids, text = script_differences(args[0], args[1])
    print(text)
    if len(args) > 2:
        more, atlas_text = atlas_differences(args[2])
        print(atlas_text)
        ids += more
    matched: set[str] = set()
    unlisted = []
    for ident in ids:
        hits = [k for k in known if k == ident or fnmatch.fnmatchcase(ident, k)]
        if hits:
            matched.update(hits)
        else:
            unlisted.append(ident)
    print(f"\ngate: {len(ids)} disagreement(s), {len(ids) - len(unlisted)} listed in {os.path.relpath(known_path)}, {len(unlisted)} not listed")
    for k in sorted(set(known) - matched):
        print(f"gate: stale entry (not seen any more; remove it): {k}")
    for ident in unlisted:
        print(f"gate: NOT LISTED: {ident}")
    if unlisted:
        print("gate: FAILED: fix hfcheck, or add each id with its reason to the known-differences file")
        return 1
    print("gate: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
