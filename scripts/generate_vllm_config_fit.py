"""Add to analyzer/data/vllm_architectures.json what vLLM's native classes expect of a config.

For a native architecture vLLM builds its own class from the config. A Hub repo can carry a
registry name for a *different generation* of the architecture (ChatGLM-6B v1 is
``ChatGLMModel``, the name of vLLM's ChatGLM2/3 class): vLLM then builds the wrong network. The
signature of a generation is the config keys its class is written against, read here from
vLLM's own source with ``ast``:

- ``config_params``: for each model_type vLLM ships its own config class for
  (``transformers_utils/config.py``'s ``_CONFIG_REGISTRY``), that class's explicit ``__init__``
  parameters (vLLM parses the config with it, so absent keys take its defaults silently);
- ``config_reads``: for each native architecture, the ``config.<key>`` reads of its class and of
  what it reaches in its module, not under ``if`` / ``getattr`` (an absent key is an
  AttributeError at load).

Run from the checkout with a vLLM source tree (an unpacked wheel or an installed package):
    python scripts/generate_vllm_config_fit.py /path/to/site-packages/vllm
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "vllm_architectures.json"
CONDITIONAL = (ast.If, ast.Try, ast.IfExp, ast.BoolOp, ast.ListComp, ast.GeneratorExp, ast.DictComp, ast.SetComp, ast.While)


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


def registry_modules(registry: Path) -> dict[str, tuple[str, str]]:
    """architecture -> (module name, class name), from the registry's literal tables."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(ast.parse(registry.read_text())):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and isinstance(value, ast.Tuple) and len(value.elts) == 2
                        and all(isinstance(e, ast.Constant) for e in value.elts)):
                    out[key.value] = (value.elts[0].value, value.elts[1].value)
    return out


def config_classes(vllm: Path) -> dict[str, list[str]]:
    """model_type -> explicit __init__ parameters of vLLM's own config class for it."""
    registry: dict[str, str] = {}
    for node in ast.walk(ast.parse((vllm / "transformers_utils" / "config.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LazyConfigDict":
            registry = {k.arg: k.value.value for k in node.keywords if k.arg and isinstance(k.value, ast.Constant)}
    params: dict[str, list[str]] = {}
    for path in (vllm / "transformers_utils" / "configs").glob("*.py"):
        for cls in ast.parse(path.read_text()).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is not None:
                params[cls.name] = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
    return {mt: params[name] for mt, name in registry.items() if name in params}


def main(vllm: Path) -> None:
    table = json.loads(TABLE.read_text())
    modules = registry_modules(vllm / "model_executor" / "models" / "registry.py")
    reads: dict[str, list[str]] = {}
    for arch in table["native"]:
        module, cls = modules.get(arch, ("", ""))
        path = vllm / "model_executor" / "models" / f"{module}.py"
        if module and path.is_file():
            reads[arch] = sorted(class_config_reads(ast.parse(path.read_text()), cls))
    table["config_reads"] = reads
    table["config_params"] = config_classes(vllm)
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(reads)} architectures, {len(table['config_params'])} vLLM config classes -> {TABLE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
