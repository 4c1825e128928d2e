"""The layout's one-way arrows, read from the source itself (an ``ast`` walk of every import,
function-level ones included; ``if TYPE_CHECKING:`` imports excluded, they never run):

- no import cycle anywhere in hfcheck: a cycle hides which room stands on which, and a
  function-level import that closes one only postpones the knot;
- no product-code import of a ``_private`` name from another package: a name another room
  needs is public where it lives.

A new cycle or cross-package private import fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    """Module name -> file, from pyproject's package-dir (the card's folders are hfcheck.*)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for package, folder in mapping.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.setdefault(".".join(parts), path)
    return out


MODULES = _modules()


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for sub in ast.walk(node)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in typing_only]


def _absolute(node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            else:
                targets = [a.name for a in node.names]
            for target in filter(None, map(_known, targets)):
                if target != module:
                    graph.add_edge(module, target, line=f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def test_the_layout_is_read_from_the_whole_tree():
    graph = import_graph()
    assert len(MODULES) > 150 and graph.number_of_edges() > 400  # the walk sees the real tree
    assert graph.has_edge("hfcheck.analyzer.analysis", "hfcheck.analyzer.facts")


def test_no_import_cycle():
    graph = import_graph()
    cycles = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            cycles.append(" -> ".join(f"{a} ({graph.edges[a, b]['line']})" for a, b in cycle))
    assert cycles == []


def test_no_private_name_imported_from_another_package():
    crossings = []
    for module, path in MODULES.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _known(_absolute(node, module))
            if target is None:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and _package(target) != _package(module):
                    crossings.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from {target}")
    assert crossings == []


# The rooms, lowest first. A room imports only rooms below it; rooms on one level do not import
# each other. The story this tells: shared machinery (child processes and jobs, reference
# environments, the command conventions) under the analyzer core; real vLLM above the core (it
# asks the scan for predictions); the porter, the proofs and the sweep/atlas above both; the
# dashboard and the entry point on top.
ROOMS = (
    ("shared", 0, ("hfcheck", "hfcheck.command", "hfcheck.environments", "hfcheck.isolation", "hfcheck.packages")),
    ("analyzer core", 1, ("hfcheck.analyzer",)),
    ("real vLLM", 2, ("hfcheck.runtime",)),
    ("porter", 3, ("hfcheck.porter",)),
    ("proofs", 3, ("hfcheck.verify",)),
    ("sweep and atlas", 3, ("hfcheck.analyzer.sweep",)),
    ("dashboard", 4, ("hfcheck.tui",)),
    ("entry point", 5, ("hfcheck.cli", "hfcheck.__main__")),
)


def room_of(module: str) -> tuple[str, int]:
    """The room whose longest prefix names the module (``hfcheck`` alone is the namespace root)."""
    best = None
    for name, level, prefixes in ROOMS:
        for prefix in prefixes:
            matches = module == prefix or (prefix != "hfcheck" and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), name, level)
    assert best is not None, f"{module} is in no room: add it to ROOMS"
    return best[1], best[2]


def test_every_module_is_in_a_room_and_arrows_run_down():
    graph = import_graph()
    upward = []
    for a, b, data in graph.edges(data=True):
        (room_a, level_a), (room_b, level_b) = room_of(a), room_of(b)
        if room_a != room_b and level_b >= level_a:
            upward.append(f"{data['line']}: {room_a} imports {room_b} ({b})")
    assert upward == []
    assert room_of("hfcheck.analyzer.sweep.atlas")[0] == "sweep and atlas"
    assert room_of("hfcheck.isolation.jobs")[0] == "shared"


# Third-party packages that cost start-up time (or are optional): a function imports them
# where they are used, so a command that does not need them never pays for them.
LAZY_PACKAGES = frozenset({
    "torch", "transformers", "vllm", "textual", "rich", "libcst", "networkx", "safetensors", "huggingface_hub", "numpy",
    "ray", "accelerate", "tokenizers", "PIL", "jinja2", "yaml", "mlinter", "platformdirs", "torchvision", "sentencepiece",
    "einops", "scipy", "filelock", "tqdm", "packaging", "requests", "openai", "fastapi", "uvicorn", "multiprocessing",
})
COMMAND_MODULES = ("hfcheck.cli", "hfcheck.porter.cli", "hfcheck.verify.cli", "hfcheck.tui.cli", "hfcheck.analyzer.sweep.cli")
"""Each subcommand's code is imported when it runs: ``--help`` and every command start without the others'."""
RUNS_WITHOUT_HFCHECK = ("hfcheck.porter.reference.child", "hfcheck.porter.reference.record", "hfcheck.porter.reference.gpu_shims",
                        "hfcheck.isolation.fence", "hfcheck.runtime.torchvision_ops_shim")
"""Run in another environment (a 4.x transformers release, vLLM's), where hfcheck may be absent."""


def _top_level(tree: ast.Module) -> set[int]:
    return {id(sub) for node in tree.body for sub in (ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node])
            if isinstance(sub, (ast.Import, ast.ImportFrom))}


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node, module)
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return [a.name for a in node.names]


def _lazy_closure() -> dict[str, frozenset[str]]:
    """hfcheck module -> the lazy packages importing it loads (its top-level imports, transitively)."""
    direct: dict[str, tuple[set[str], set[str]]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level(tree)
        inner, outer = set(), set()
        for node in _runtime_imports(tree):
            if id(node) in top:
                for target in _targets(node, module):
                    known = _known(target)
                    (inner.add(known) if known else outer.add(target.split(".")[0]))
        direct[module] = (inner, outer & LAZY_PACKAGES)
    closure = {}
    for module in MODULES:
        seen, stack, lazy = set(), [module], set()
        while stack:
            m = stack.pop()
            if m in seen or m not in direct:
                continue
            seen.add(m)
            lazy |= direct[m][1]
            stack.extend(direct[m][0])
            stack.append(m.rpartition(".")[0])
        closure[module] = frozenset(lazy)
    return closure


def test_function_level_imports_buy_start_up_time():
    """A function-level import is there for start-up time, never to hide an arrow: it imports a
    lazy package, or an hfcheck module whose own imports load one, or it is a command module's
    subcommand, or it is guarded (try: an optional package). Anything else belongs at the top."""
    closure = _lazy_closure()
    needless = []
    for module, path in MODULES.items():
        if module in RUNS_WITHOUT_HFCHECK or module in COMMAND_MODULES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level(tree)
        guarded = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Try) for sub in ast.walk(node)}
        # a package's ``__getattr__`` loads what it names only when that name is first asked for
        lazy = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for sub in ast.walk(node)}
        for node in _runtime_imports(tree):
            if id(node) in top or id(node) in guarded or id(node) in lazy:
                continue
            for target in _targets(node, module):
                known = _known(target)
                if (known and closure[known]) or (not known and target.split(".")[0] in LAZY_PACKAGES):
                    continue
                needless.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}")
    assert needless == []


def test_what_runs_without_hfcheck_imports_none_of_it():
    """The reference child loads these by path in a 4.x transformers release (the torchvision
    shim is copied into vLLM's environment): an hfcheck import there would fail in that release."""
    for module in RUNS_WITHOUT_HFCHECK:
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        named = [target for node in _runtime_imports(tree) for target in _targets(node, module)]
        assert named and not [t for t in named if t.startswith("hfcheck")], module


def test_the_reference_child_reads_the_job_runners_files():
    """child.py cannot import hfcheck.isolation.jobs: it names the two files by hand, the same names."""
    from hfcheck.isolation.jobs import JOB, RESULT

    text = MODULES["hfcheck.porter.reference.child"].read_text(encoding="utf-8")
    assert f'"{JOB}"' in text and f'"{RESULT}"' in text


def test_every_module_is_in_a_package_the_wheel_ships():
    """A user installs hfcheck from a wheel, not editable: every package must be in the wheel's
    list. A hand-kept list in pyproject once left out remote/checks and port/dataflow (setuptools
    copied them as data with a deprecation warning; a later one drops them, and every scan of
    remote code then fails with ModuleNotFoundError outside a checkout). setup.py now finds the
    packages under each folder package-dir maps: every module's package is in the list it finds,
    and no module lies in a folder without ``__init__.py`` (it would be left out)."""
    import runpy
    from unittest import mock

    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(ROOT / "setup.py"))
    shipped = set(setup.call_args.kwargs["packages"])
    assert {module.rsplit(".", 1)[0] if path.name != "__init__.py" else module for module, path in MODULES.items()} <= shipped
    assert {"hfcheck.analyzer.vllm", "hfcheck.porter.port.codemods", "hfcheck.isolation"} <= shipped
    orphans = [str(path.relative_to(ROOT)) for path in MODULES.values()
               if path.name != "__init__.py" and not (path.parent / "__init__.py").is_file()]
    assert orphans == []
