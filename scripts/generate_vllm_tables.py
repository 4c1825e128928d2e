"""Generate ``analyzer/data/vllm/<version>/tables.json`` from one vLLM wheel, without installing it.

Everything hfcheck reads of a vLLM release that is written in vLLM's source is read here,
statically (``ast``; the registry's dict literals are evaluated on their own, nothing of vLLM
is imported), from the wheel ``pip download --no-deps vllm==X`` brings:

- ``pins``: the wheel's own requirements on transformers, torch and huggingface_hub, and the
  newest transformers release on the package index the transformers pin admits (what
  ``pip install vllm==X`` resolves today; ``--transformers-newest`` when the index is not
  reachable);
- ``registry``: native architectures, the ones listed to the transformers backend
  (``_TRANSFORMERS_SUPPORTED_MODELS``: ``--model-impl auto`` serves them through the backend),
  the backend's own classes, the ones vLLM no longer supports (``_PREVIOUSLY_SUPPORTED_MODELS``);
- ``native_hosts``: native classes that build a sub-model through the registry under a fixed
  architecture name (PaliGemma's ``GemmaForCausalLM``), which then resolves like any other;
- ``config_reads`` / ``config_params``: the config keys each native class is written against
  (``vllm.native_fit``), following registry entries in ``vllm.models.*`` packages too;
- ``quantization_methods``: ``QuantizationMethods`` (``get_quantization_config`` raises
  "Unknown quantization method" for any other), and the deprecated ones;
- ``mla_model_types`` and ``mm_prefix_lm_model_types`` (``model_arch_config_convertor.py``);
- ``backend_min_transformers``: the backend's ``check_version(min, feature)`` calls;
- ``sources``: for every file hfcheck models (the transformers backend, and every file a rule
  cites in ``vllm_source``), its sha256 and the line of each class, function, method and
  top-level name, so a rule's citation prints the line of the release predicted for and a
  release drill lists the files that changed.

    python scripts/generate_vllm_tables.py WHEEL_OR_UNPACKED_DIR [--out analyzer/data/vllm]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "analyzer" / "data" / "vllm"
sys.path.insert(0, str(ROOT))

BACKEND = "model_executor/models/transformers"
MODELLED_FILES = (
    "model_executor/models/registry.py",
    "config/model.py",
    "transformers_utils/config.py",
    "transformers_utils/model_arch_config_convertor.py",
    "model_executor/layers/quantization/__init__.py",
    "model_executor/models/utils.py",
    "model_executor/models/interfaces.py",
)
"""Files hfcheck models besides the backend folder and what the rules cite."""
CONDITIONAL = (ast.If, ast.Try, ast.IfExp, ast.BoolOp, ast.ListComp, ast.GeneratorExp, ast.DictComp, ast.SetComp, ast.While)
REGISTRY_TABLES = ("_TEXT_GENERATION_MODELS", "_EMBEDDING_MODELS", "_LATE_INTERACTION_MODELS", "_REWARD_MODELS",
                   "_TOKEN_CLASSIFICATION_MODELS", "_SEQUENCE_CLASSIFICATION_MODELS", "_MULTIMODAL_MODELS",
                   "_SPECULATIVE_DECODING_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS",
                   "_VLLM_MODELS", "_PREVIOUSLY_SUPPORTED_MODELS", "_OOT_SUPPORTED_MODELS")


# --- the wheel ------------------------------------------------------------------------------

def unpack(path: Path, into: Path) -> tuple[Path, Path]:
    """(the ``vllm`` package folder, its ``.dist-info``) of a wheel or an unpacked tree."""
    if path.is_file():
        with zipfile.ZipFile(path) as whl:
            names = [n for n in whl.namelist() if n.endswith(".py") or ".dist-info/" in n]
            whl.extractall(into, names)
        path = into
    package = path / "vllm" if (path / "vllm").is_dir() else path
    infos = sorted(package.parent.glob("vllm*.dist-info"))
    if not infos:
        raise SystemExit(f"no vllm*.dist-info beside {package}")
    return package, infos[0]


def metadata(dist_info: Path) -> tuple[str, str, dict[str, str]]:
    """(distribution name, version, {requirement name: specifier}) from the wheel's METADATA."""
    meta = Parser().parsestr((dist_info / "METADATA").read_text())
    pins: dict[str, str] = {}
    for line in meta.get_all("Requires-Dist") or []:
        if "extra ==" in line:
            continue
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;]*)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2).strip().strip("()")
    return str(meta["Name"]), str(meta["Version"]), pins


def newest_admitted(specifier: str) -> str | None:
    """The newest transformers release on the package index that ``specifier`` admits (pip's
    own answer, nothing installed)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True,
                          timeout=120, check=False)
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if not m:
        return None
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    versions = [Version(v.strip()) for v in m.group(1).split(",")]
    admitted = [v for v in versions if not v.is_prerelease and v in SpecifierSet(specifier)]
    return str(max(admitted)) if admitted else None


# --- the registry ---------------------------------------------------------------------------

def registry_tables(vllm: Path) -> dict[str, dict[str, Any]]:
    """The registry's literal tables, evaluated alone (dict literals and comprehensions over
    each other; nothing imported)."""
    tree = ast.parse((vllm / "model_executor/models/registry.py").read_text())
    body = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            and any(isinstance(t, ast.Name) and t.id in REGISTRY_TABLES for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), "registry.py", "exec"), {"__builtins__": {}}, namespace)  # the literal tables alone
    return namespace


def module_file(vllm: Path, module: str) -> Path | None:
    """The file of a registry module name: ``qwen3`` (model_executor/models) or ``vllm.models.x``."""
    rel = module.removeprefix("vllm.") if module.startswith("vllm.") else f"model_executor/models/{module}"
    base = vllm / rel.replace(".", "/") if module.startswith("vllm.") else vllm / rel
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defining_file(path: Path, name: str, depth: int = 0) -> Path:
    """The file that defines ``name``: ``path`` itself, or the module its ``from .x import name`` names."""
    tree = ast.parse(path.read_text())
    if any(isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name for n in tree.body) or depth > 3:
        return path
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level and any(a.name == name for a in node.names):
            folder = path.parent
            for _ in range(node.level - 1):
                folder = folder.parent
            target = folder / (node.module or "").replace(".", "/")
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if candidate.is_file():
                    return defining_file(candidate, name, depth + 1)
    return path


def _unconditional(node: ast.AST, reads: set[str], names: set[str]) -> None:
    """``config.<key>`` reads and names used in ``node``, outside ``if``/``try``/``getattr``."""
    if isinstance(node, CONDITIONAL):
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
        return
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("config", "hf_config") and isinstance(node.ctx, ast.Load):
        reads.add(node.attr)
    if isinstance(node, ast.Name):
        names.add(node.id)
    for child in ast.iter_child_nodes(node):
        _unconditional(child, reads, names)


def class_config_reads(tree: ast.Module, start: str) -> set[str]:
    """The reads of class ``start`` and of every class or function of the module it reaches
    unconditionally (by name: bases, constructions, helpers): what building it needs."""
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    reads: set[str] = set()
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        names: set[str] = set()
        node = defs[name]
        for part in (node.bases if isinstance(node, ast.ClassDef) else []) + list(node.body):
            _unconditional(part, reads, names)
        todo.extend(names & set(defs))
    return reads


def config_classes(vllm: Path) -> dict[str, list[str]]:
    """model_type -> explicit __init__ parameters of vLLM's own config class for it."""
    registry: dict[str, str] = {}
    for node in ast.walk(ast.parse((vllm / "transformers_utils" / "config.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LazyConfigDict":
            registry = {k.arg: k.value.value for k in node.keywords if k.arg and isinstance(k.value, ast.Constant)}
    params: dict[str, list[str]] = {}
    for path in sorted((vllm / "transformers_utils" / "configs").rglob("*.py")):
        for cls in ast.parse(path.read_text()).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is not None:
                params.setdefault(cls.name, [a.arg for a in init.args.args[1:] + init.args.kwonlyargs])
    return {mt: params[name] for mt, name in sorted(registry.items()) if name in params}


def native_hosts(vllm: Path, models: dict[str, tuple[str, str]], native: list[str]) -> dict[str, list[str]]:
    """Native architecture -> the architecture names its module assigns to a sub-config's
    ``architectures`` before building it through the registry (``init_vllm_registered_model``)."""
    out: dict[str, list[str]] = {}
    for arch in native:
        module, _ = models[arch]
        path = module_file(vllm, module)
        if path is None:
            continue
        text = path.read_text()
        if "init_vllm_registered_model" not in text:
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "architectures" for t in node.targets)
                    and isinstance(node.value, ast.List)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if names:
            out[arch] = sorted(names)
    return out


def registry(vllm: Path) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, list[str]]]:
    tables = registry_tables(vllm)
    models: dict[str, tuple[str, str]] = tables["_VLLM_MODELS"]
    supported = dict(tables["_TRANSFORMERS_SUPPORTED_MODELS"])
    backend = dict(tables["_TRANSFORMERS_BACKEND_MODELS"])
    native = sorted(set(models) - set(supported) - set(backend))
    reads: dict[str, list[str]] = {}
    for arch in native:
        module, cls = models[arch]
        path = module_file(vllm, module)
        if path is not None:
            path = defining_file(path, cls)
            reads[arch] = sorted(class_config_reads(ast.parse(path.read_text()), cls))
    table = {
        "native": native,
        "transformers_supported": {arch: cls for arch, (_, cls) in sorted(supported.items())},
        "transformers_backend_classes": sorted(backend),
        "previously_supported": dict(sorted(tables.get("_PREVIOUSLY_SUPPORTED_MODELS", {}).items())),
        "out_of_tree": dict(sorted(tables.get("_OOT_SUPPORTED_MODELS", {}).items())),
        "native_hosts": native_hosts(vllm, models, native),
    }
    return table, reads, config_classes(vllm)


# --- other tables ---------------------------------------------------------------------------

def string_literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def quantization_methods(vllm: Path) -> dict[str, list[str]]:
    tree = ast.parse((vllm / "model_executor/layers/quantization/__init__.py").read_text())
    methods: list[str] = []
    deprecated: list[str] = []
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
        name = getattr(target, "id", None)
        if name == "QuantizationMethods" and node.value is not None:
            methods = string_literals(node.value)
        elif name == "DEPRECATED_QUANTIZATION_METHODS" and node.value is not None:
            deprecated = string_literals(node.value)
    return {"methods": methods, "deprecated": deprecated}


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def convertor_model_types(vllm: Path) -> dict[str, list[str]]:
    """MLA model types (``is_deepseek_mla``'s first tuple) and the multimodal prefix-LM ones."""
    tree = ast.parse((vllm / "transformers_utils/model_arch_config_convertor.py").read_text())
    mla = _function(tree, "is_deepseek_mla")
    prefix = _function(tree, "is_mm_prefix_lm")
    mla_types: list[str] = []
    if mla is not None:
        first = next((n for n in ast.walk(mla) if isinstance(n, ast.Tuple) and len(n.elts) > 2), None)
        mla_types = string_literals(first) if first is not None else []
    prefix_types: list[str] = []
    if prefix is not None:
        for node in ast.walk(prefix):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MM_PREFIX_LM_MODELS":
                prefix_types = string_literals(node.value)
    return {"mla_model_types": mla_types, "mm_prefix_lm_model_types": prefix_types}


def backend_min_transformers(vllm: Path) -> list[dict[str, Any]]:
    """``check_version("5.18.0", "Aria")`` calls in the backend: (file, line, minimum, feature)."""
    out = []
    for path in sorted((vllm / BACKEND).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "check_version"
                    and len(node.args) == 2 and all(isinstance(a, ast.Constant) for a in node.args)):
                out.append({"file": str(path.relative_to(vllm)), "line": node.lineno, "minimum": node.args[0].value, "feature": node.args[1].value})
    return out


def symbol_lines(tree: ast.Module) -> dict[str, int]:
    """Qualified name -> line of every class, function, method and top-level name."""
    out: dict[str, int] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                out.setdefault(prefix + node.name, node.lineno)
                walk(node.body, prefix + node.name + ".")
            elif not prefix and isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        out.setdefault(target.id, node.lineno)

    walk(tree.body, "")
    return out


def cited_files() -> set[str]:
    """Every vLLM file a rule cites (``Rule.vllm_source``)."""
    from hfcheck.analyzer.rules.registry import RULES

    return {ref.split("::")[0] for rule in RULES for ref in getattr(rule, "vllm_source", ())}


def sources(vllm: Path) -> dict[str, dict[str, Any]]:
    files = {str(p.relative_to(vllm)) for p in (vllm / BACKEND).rglob("*.py")} | set(MODELLED_FILES) | cited_files()
    out: dict[str, dict[str, Any]] = {}
    for rel in sorted(files):
        path = vllm / rel
        if not path.is_file():
            out[rel] = {"sha256": None, "symbols": {}}
            continue
        data = path.read_bytes()
        out[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "symbols": symbol_lines(ast.parse(data))}
    return out


def tables(vllm: Path, dist_info: Path, transformers_newest: str | None = None) -> dict[str, Any]:
    name, version, pins = metadata(dist_info)
    reg, reads, params = registry(vllm)
    transformers_pin = pins.get("transformers", "")
    return {
        "vllm_version": version,
        "distribution": name,
        "generated_by": "scripts/generate_vllm_tables.py",
        "pins": {k: pins.get(k, "") for k in ("transformers", "torch", "huggingface-hub")},
        "transformers_newest": transformers_newest or newest_admitted(transformers_pin),
        "registry": reg,
        "config_reads": reads,
        "config_params": params,
        "quantization": quantization_methods(vllm),
        **convertor_model_types(vllm),
        "backend_min_transformers": backend_min_transformers(vllm),
        "sources": sources(vllm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a vLLM wheel (pip download --no-deps vllm==X) or an unpacked one")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--transformers-newest", default=None, help="the newest transformers the pin admits (default: ask the package index)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vllm, dist_info = unpack(args.wheel, Path(tmp))
        table = tables(vllm, dist_info, args.transformers_newest)
    folder = args.out / table["vllm_version"].split("+")[0]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tables.json").write_text(json.dumps(table, indent=1) + "\n")
    reg = table["registry"]
    print(f"vLLM {table['vllm_version']} ({table['distribution']}): {len(reg['native'])} native, "
          f"{len(reg['transformers_supported'])} listed to the transformers backend, {len(table['config_reads'])} config signatures, "
          f"{len(table['quantization']['methods'])} quantization methods, transformers {table['pins']['transformers']} "
          f"(newest {table['transformers_newest']}) -> {folder / 'tables.json'}")


if __name__ == "__main__":
    main()
