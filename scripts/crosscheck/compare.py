"""Compare /tmp/crosscheck_vllm.json (vLLM's own logic) with /tmp/crosscheck_hfcheck.json.

Run with any python: python scripts/crosscheck/compare.py [VLLM_JSON HFCHECK_JSON] [--all]
Per quantity: how many model types agree on every module, then each disagreement
(model type, module class, vLLM vs hfcheck), deduplicated by (model type, class, values).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

args = [a for a in sys.argv[1:] if not a.startswith("--")]
V_PATH, H_PATH = args[:2] if len(args) >= 2 else ("/tmp/crosscheck_vllm.json", "/tmp/crosscheck_hfcheck.json")
SHOW_ALL = "--all" in sys.argv

V = json.load(open(V_PATH))
H = json.load(open(H_PATH))
types = sorted(k for k in V.keys() & H.keys() if not k.startswith("_"))

print(f"vLLM side: {V['_meta']}  hfcheck side: {H['_meta']}")
print(f"model types compared: {len(types)}")

# --- build errors -----------------------------------------------------------------
both_ok = [t for t in types if not V[t].get("error") and not H[t].get("error")]
err_rows = []
for t in types:
    ve, he = V[t].get("error"), H[t].get("error")
    if ve or he:
        err_rows.append((t, ve, he))
print(f"\nbuild: {len(both_ok)}/{len(types)} model types built on both sides")
for t, ve, he in err_rows:
    print(f"  {t}: vLLM={ve!r}  hfcheck={he!r}")

QUANTITIES = ("structure", "candidates", "chosen", "attention_by_layer", "moe_replaceable", "moe_block_fused", "moe_internal", "moe_scoring", "moe_shared")
agree = {q: 0 for q in QUANTITIES}
applicable = {q: 0 for q in QUANTITIES}
diffs: dict[str, dict[tuple, list[str]]] = {q: defaultdict(list) for q in QUANTITIES}
module_counts = {q: [0, 0] for q in ("candidates", "chosen")}

for t in both_ok:
    v, h = V[t], H[t]
    vm, hm = v["modules"], h["modules"]
    same_structure = list(vm) == list(hm) and all(vm[p]["cls"] == hm[p]["cls"] for p in vm)
    applicable["structure"] += 1
    if same_structure:
        agree["structure"] += 1
    else:
        only_v = [p for p in vm if p not in hm]
        only_h = [p for p in hm if p not in vm]
        cls_diff = [p for p in vm if p in hm and vm[p]["cls"] != hm[p]["cls"]]
        key = (t, f"{len(only_v)} paths only in vLLM side, {len(only_h)} only in hfcheck side, {len(cls_diff)} class differences",
               (only_v[:3], only_h[:3], [(p, vm[p]["cls"], hm[p]["cls"]) for p in cls_diff[:3]]))
        diffs["structure"][key[:2]].append(str(key[2]))
    common = [p for p in vm if p in hm]
    for q in ("candidates", "chosen"):
        applicable[q] += 1
        ok = True
        for p in common:
            a, b = vm[p], hm[p]
            va = a.get(q) if "error" not in a else f"ERROR {a['error']}"
            hb = b.get(q) if "error" not in b else f"ERROR {b['error']}"
            module_counts[q][1] += 1
            if va == hb:
                module_counts[q][0] += 1
                continue
            ok = False
            diffs[q][(t, a["cls"] if a["cls"] == b["cls"] else f"{a['cls']}|{b['cls']}", str(va), str(hb))].append(p)
        agree[q] += ok
    applicable["attention_by_layer"] += 1
    if v["attention_by_layer"] == h["attention_by_layer"]:
        agree["attention_by_layer"] += 1
    else:
        diffs["attention_by_layer"][(t, "-", json.dumps(v["attention_by_layer"]), json.dumps(h["attention_by_layer"]))].append("")
    vmoe, hmoe = v["moe"], h["moe"]
    if not vmoe and not hmoe:
        continue
    for q, field in (("moe_replaceable", "replaceable"), ("moe_block_fused", "fused"), ("moe_internal", "internal"), ("moe_scoring", "scoring"), ("moe_shared", "shared")):
        applicable[q] += 1
        ok = True
        for p in sorted(vmoe.keys() | hmoe.keys()):
            a, b = vmoe.get(p, {}), hmoe.get(p, {})
            va = a.get(field, a.get("error", "MISSING"))
            hb = b.get(field, b.get("error", "MISSING"))
            if va != hb:
                ok = False
                extra = f" [hfcheck: {b.get('reason')}]" if b.get("reason") and q == "moe_internal" else ""
                diffs[q][(t, a.get("block_cls", b.get("block_cls")), str(va), str(hb) + extra)].append(p)
        agree[q] += ok

print("\nAgreement (model types whose every module agrees / model types where the quantity applies):")
for q in QUANTITIES:
    extra = ""
    if q in module_counts:
        extra = f"   (module instances: {module_counts[q][0]}/{module_counts[q][1]})"
    print(f"  {q:20s} {agree[q]:4d}/{applicable[q]:<4d}{extra}")

for q in QUANTITIES:
    if not diffs[q]:
        continue
    print(f"\n== {q}: {len({k[0] for k in diffs[q]})} model types disagree ==")
    for key, paths in sorted(diffs[q].items()):
        t, cls = key[0], key[1]
        rest = key[2:]
        where = f"  ({len(paths)} instance(s), e.g. {paths[0]})" if paths and paths[0] else ""
        if q == "structure":
            print(f"  {t}: {cls}{where}")
            if SHOW_ALL:
                print(f"     {paths[0]}")
        else:
            print(f"  {t:24s} {cls:40s} vLLM={rest[0]}  hfcheck={rest[1]}{where}")
