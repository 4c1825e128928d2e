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


def knots(graph: nx.DiGraph, where: str) -> list[str]:
    """One cycle of each knot in ``graph``, each edge named by its attribute ``where`` (the import line(s))."""
    found = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            found.append(" -> ".join(f"{a} [{graph.edges[a, b][where]}]" for a, b in cycle))
    return found


def test_no_import_cycle():
    assert knots(import_graph(), "line") == []


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


# The rooms are the folders: every folder holding modules is one room, named by its path, and
# the folders import one another one way only (no two folders in a knot), so each folder is one
# floor of the house. Above that, the six top-level parts stand in this order; a folder's part is
# the first of these path prefixes it lies under. The story this tells: shared machinery (child
# processes and jobs, cached environments, the command conventions) under the analyzer core; real
# vLLM above the core (it asks the scan for predictions); the porter, the proofs and the
# sweep/atlas above both; the dashboard and the entry point on top.
PARTS = (
    ("shared", 0, ("hfcheck/shared", "hfcheck/isolation")),
    ("analyzer core", 1, ("analyzer",)),
    ("real vLLM", 2, ("runtime",)),
    ("porter", 3, ("porter",)),
    ("proofs", 3, ("verify",)),
    ("sweep and atlas", 3, ("sweep",)),
    ("dashboard", 4, ("tui",)),
    ("entry point", 5, ("hfcheck",)),
)


def folder_of(module: str) -> str:
    """The room a module lives in: its folder, as a path from the checkout's root."""
    return MODULES[module].parent.relative_to(ROOT).as_posix()


def part_of(folder: str) -> tuple[str, int]:
    for name, level, prefixes in PARTS:
        if any(folder == p or folder.startswith(p + "/") for p in prefixes):
            return name, level
    raise AssertionError(f"{folder} is under no part: add it to PARTS")


def folder_graph() -> nx.DiGraph:
    """Folder -> the folders its modules import (an edge keeps the import lines that make it)."""
    graph = import_graph()
    folders = nx.DiGraph()
    folders.add_nodes_from({folder_of(m) for m in MODULES})
    for a, b, data in graph.edges(data=True):
        fa, fb = folder_of(a), folder_of(b)
        if fa != fb:
            folders.add_edge(fa, fb)
            folders.edges[fa, fb].setdefault("lines", []).append(f"{data['line']} ({b})")
    return folders


def floors() -> dict[str, int]:
    """Each folder's floor: one above the highest folder it imports (the lowest stand at 0)."""
    folders = folder_graph()
    floor: dict[str, int] = {}
    for folder in reversed(list(nx.topological_sort(folders))):
        floor[folder] = 1 + max((floor[b] for b in folders.successors(folder)), default=-1)
    return floor


def test_no_two_folders_import_each_other():
    """A module placed in the wrong folder shows here: its imports tie two rooms into a knot."""
    assert knots(folder_graph(), "lines") == []


def test_every_folder_is_under_a_part_and_arrows_run_down():
    upward = []
    for a, b, data in folder_graph().edges(data=True):
        (part_a, level_a), (part_b, level_b) = part_of(a), part_of(b)
        if part_a != part_b and level_b >= level_a:
            upward.append(f"{data['lines'][0]}: {part_a} imports {part_b}")
    assert upward == []
    assert part_of("sweep") == ("sweep and atlas", 3) and part_of("hfcheck/isolation")[0] == "shared"


def test_the_house_has_a_floor_per_folder_in_the_order_the_data_flows():
    """The analyzer's data flows source -> facts -> instance -> graph -> fusions -> rules ->
    report: each stands on a lower floor than the next. The graph walk stands above the patterns
    it applies; the static remote-code checks above the rule base and below the rules."""
    floor = floors()
    flow = ["analyzer/sources", "analyzer/facts", "analyzer/instance", "analyzer/analysis", "analyzer/report", "analyzer"]
    assert [floor[f] for f in flow] == sorted(floor[f] for f in flow) and len({floor[f] for f in flow}) == len(flow)
    assert floor["analyzer/graph"] < floor["analyzer/fusions"] < floor["analyzer/analysis"]
    assert floor["analyzer/findings"] < floor["analyzer/remote/checks"] < floor["analyzer/rules"]
    assert floor["porter/reference"] < floor["porter/retarget"] < floor["porter"]
    assert floor["porter/output"] < floor["porter/rewrite"] < floor["porter/rewrite/codemods"] < floor["porter"]
    assert floor["hfcheck"] == max(floor.values())


def test_the_architecture_document_draws_the_house_the_code_draws():
    """docs/architecture.md shows the floors; a move that changes them changes the drawing too."""
    assert draw_house() in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def draw_house() -> str:
    """The house as the code draws it, highest floor first (``python tests/test_layout.py``)."""
    floor = floors()
    lines = []
    for level in sorted(set(floor.values()), reverse=True):
        lines.append(f"{level:2}  " + "  ".join(sorted(f for f, lv in floor.items() if lv == level)))
    return "\n".join(lines)


# Third-party packages that cost start-up time (or are optional): a function imports them
# where they are used, so a command that does not need them never pays for them.
LAZY_PACKAGES = frozenset({
    "torch", "transformers", "vllm", "textual", "rich", "libcst", "networkx", "safetensors", "huggingface_hub", "numpy",
    "ray", "accelerate", "tokenizers", "PIL", "jinja2", "yaml", "mlinter", "platformdirs", "torchvision", "sentencepiece",
    "einops", "scipy", "filelock", "tqdm", "packaging", "requests", "openai", "fastapi", "uvicorn", "multiprocessing",
})
COMMAND_MODULES = ("hfcheck.cli", "hfcheck.porter.cli", "hfcheck.verify.cli", "hfcheck.tui.cli", "hfcheck.sweep.cli")
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


HEAVY = frozenset({
    "torch", "transformers", "vllm", "textual", "ray", "accelerate", "torchvision", "safetensors", "libcst", "tokenizers",
    "numpy", "PIL", "mlinter", "huggingface_hub", "networkx", "jinja2", "yaml", "sentencepiece", "einops", "scipy",
    "openai", "fastapi", "uvicorn", "requests",
})
"""The lazy packages whose import costs a command real time (a second or more, or a server stack)."""
IMPORTS_WHERE_THEY_RUN = {
    "hfcheck.analyzer.analysis.sandbox": "the fenced child imports the analysis after its fence is up",
    "hfcheck.sweep.worker": "a worker process imports the scan after its limits and environment are set",
    "hfcheck.sweep.ray_pool": "a Ray task imports the worker on the Ray node that runs it",
    "hfcheck.tui.scanner": "the dashboard's scanning thread imports the sweep's pools when a scan starts",
    "hfcheck.runtime.batch": "runtime scripts run in vLLM's environment, where the analyzer is asked only in the parent",
    "hfcheck.runtime.pooling": "as runtime.batch",
    "hfcheck.runtime.vlm": "as runtime.batch",
    "hfcheck.runtime.serve": "as runtime.batch",
}
"""The few named places whose function-level imports of hfcheck are about where the code runs."""


def function_level_imports() -> list[tuple[str, str, bool]]:
    """(module, "file:line: target", spares a heavy import) for each function-level import of an
    hfcheck module or a lazy package, outside the command modules and what runs without hfcheck."""
    closure = _lazy_closure()
    found = []
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
                loads = closure[known] if known else frozenset({target.split(".")[0]}) & LAZY_PACKAGES
                spares = bool((loads & HEAVY) - closure[module]) or (not known and bool(loads))
                found.append((module, f"{path.relative_to(ROOT)}:{node.lineno}: {target}", spares))
    return found


def test_function_level_imports_buy_start_up_time():
    """A function-level import is there for start-up time, never to hide an arrow: it loads a
    heavy package (torch, transformers, vLLM...) its module does not already load at import, or
    it is in one of the few named places whose imports are about where the code runs. Anything
    else belongs at the top of the module."""
    found = function_level_imports()
    needless = [where for module, where, spares in found if not spares and module not in IMPORTS_WHERE_THEY_RUN]
    assert needless == []
    own = {where.split(": ")[0] for module, where, _ in found if ": hfcheck." in where}
    assert len(own) <= 45, f"{len(own)} function-level imports of hfcheck's own modules (a few dozen at most)"
    assert set(IMPORTS_WHERE_THEY_RUN) <= set(MODULES)


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
    assert {"hfcheck.analyzer.vllm", "hfcheck.porter.rewrite.codemods", "hfcheck.isolation"} <= shipped
    orphans = [str(path.relative_to(ROOT)) for path in MODULES.values()
               if path.name != "__init__.py" and not (path.parent / "__init__.py").is_file()]
    assert orphans == []


def test_an_analysis_environment_carries_every_top_level_folder():
    """An analysis environment (another transformers release) imports hfcheck from this checkout
    by the packages ANALYSIS_PACKAGES names: a top-level folder missing there fails only in it."""
    from hfcheck.shared.environments import ANALYSIS_PACKAGES

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert sorted(ANALYSIS_PACKAGES) == sorted(mapping)


if __name__ == "__main__":
    print(draw_house())
