"""Processor files -> ProcessorFacts: what vLLM's multimodal path will find in the HF processor.

vLLM 0.33 ``transformers/multimodal.py`` needs of the processor (each a rule in
``rules/multimodal.py``): to be a ``ProcessorMixin`` (``get_processor``'s type check); an
image, video or audio sub-processor (``_get_supported_modalities``); token counts per item
(``_get_num_multimodal_tokens``, asked at start for the largest image); and text replacement
offsets (``__call__`` reaching ``get_text_with_replacements`` with a ``replace_<modality>_token``
per modality), without which no placeholder can be located.

Three depths, each recorded: the class named by the files (static: a transformers class is
inspected, remote code is read with ``ast`` and never imported); the processor built from the
folder where that works offline (never with remote code); and, built, one real call on a
blank image asking for replacement offsets, which is what vLLM does with every request.

``read_by`` says how the class was read: ``class`` (transformers' class imported and inspected),
``library source`` (transformers' own source read with ``ast``: the class does not import here,
e.g. Mistral 3.1's PixtralProcessor needs torchvision, which only its fast image processor uses),
or ``remote source`` (the repo's code read with ``ast``). What vLLM needs of the class
(ProcessorMixin, sub-processors, ``_get_num_multimodal_tokens``, ``replace_<modality>_token``,
``__call__``) is in its source either way, so a missing optional backend does not leave the
answer open; only the probe (``built``) needs the class to run.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hfcheck.analyzer.sources.processor_files import ProcessorFiles

MODALITIES = ("image", "video", "audio")
SUB_PROCESSORS = {"image": ("image_processor",), "video": ("video_processor",), "audio": ("audio_processor", "feature_extractor")}
"""The attributes vLLM reads for each modality (``_is_image_model`` ...; audio: the first of two)."""

CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")
"""Where vLLM's ``get_processor_config`` looks for ``processor_class``, in its order."""


@dataclass
class ProcessorFacts:
    files: list[str]
    processor_class: str | None
    """The processor class vLLM ends up with (AutoProcessor's resolution)."""
    found_in: str | None
    """Where the class name came from: a file, ``auto_map``, or the model type's mapping."""
    remote: bool = False
    is_processor_mixin: bool | None = None
    sub_processors: list[str] = field(default_factory=list)
    modalities: list[str] = field(default_factory=list)
    counts_tokens: bool | None = None
    """Defines ``_get_num_multimodal_tokens`` (vLLM asks it how many tokens an item takes)."""
    replaces: dict[str, bool] = field(default_factory=dict)
    """Modality -> ``replace_<modality>_token`` is defined (the base raises NotImplementedError)."""
    call_reaches_replacements: bool | None = None
    """``__call__`` is ProcessorMixin's or calls ``get_text_with_replacements`` (or super's)."""
    chat_template: bool = False
    built: bool | None = None
    """None: not tried (remote code, or no folder); False: building failed (``build_error``)."""
    build_error: str | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    """From the built processor: ``num_image_tokens`` for one image, ``offsets`` returned by a
    real call on a blank image, or ``error``."""
    problems: list[str] = field(default_factory=list)
    source_line: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Remote code: where the processor class is defined (file, line)."""
    read_by: str | None = None
    """How the class was read: ``class`` (imported and inspected), ``library source`` (transformers'
    own source read with ``ast``, the class not importable here), ``remote source`` (the repo's
    code read with ``ast``); None: not read (no class named, or its code not found)."""
    read_note: str | None = None
    """Why it was read that way, and from which file, in one line (``library source``: the
    import error or missing backend that kept the class from importing)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _class_name(files: ProcessorFiles, model_config: dict[str, Any]) -> tuple[str | None, str | None, bool]:
    """(class name, where it was found, remote) as vLLM's ``get_processor`` and AutoProcessor
    resolve it: an auto_map ``AutoProcessor`` (remote) wins where vLLM passes trust_remote_code;
    then ``processor_class`` in the files vLLM reads; then the model type's processor."""
    auto = files.auto_map(model_config).get("AutoProcessor")
    if isinstance(auto, str):
        return auto.rpartition(".")[2], "auto_map AutoProcessor", True
    for name in CLASS_FILES:
        value = files.configs.get(name, {}).get("processor_class")
        if isinstance(value, str) and value:
            return value, name, False
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    model_type = model_config.get("model_type")
    mapped = PROCESSOR_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    return (mapped, f"model type {model_type!r}", False) if mapped else (None, None, False)


def collect_processor_facts(files: ProcessorFiles, model_config: dict[str, Any], *, build: bool = True) -> ProcessorFacts | None:
    """None when the model has no processor side at all (no processor files, no processor for
    its model type): a text model's scan is unchanged."""
    name, found_in, remote = _class_name(files, model_config)
    if name is None and not files.has_processor_config:
        return None
    facts = ProcessorFacts(
        files=list(files.present),
        processor_class=name,
        found_in=found_in,
        remote=remote,
        chat_template=any(n.startswith("chat_template") for n in files.present)
        or bool(files.configs.get("tokenizer_config.json", {}).get("chat_template")),
        problems=list(files.problems) + list(files.missing_code),
    )
    if name is None:
        return facts
    if remote:
        _read_remote(facts, files, name)
    else:
        _inspect_class(facts, name)
        if build and files.folder:
            _build_and_probe(facts, files.folder, model_config)
    return facts


def _inspect_class(facts: ProcessorFacts, name: str) -> None:
    import transformers
    from transformers import ProcessorMixin

    try:
        cls = getattr(transformers, name, None)
    except Exception as exc:  # noqa: BLE001 - a processor whose module does not import here (e.g. needs torchvision)
        why = f"it does not import here ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
        if not _read_library_source(facts, name, _library_module(name, None), why):
            facts.problems.append(f"{name} does not import: {why}")
        return
    if not isinstance(cls, type):
        facts.problems.append(f"transformers {transformers.__version__} has no class {name}")
        return
    if "<locals>" in cls.__qualname__:  # transformers' placeholder for a class whose backend (e.g. torchvision) is missing
        why = f"it needs {_missing_backends(cls)}, not installed here (transformers gives a placeholder)"
        if not _read_library_source(facts, name, _library_module(name, cls), why):
            facts.problems.append(f"{name} needs a backend that is not installed here (transformers gives a placeholder)")
        return
    facts.read_by, facts.read_note = "class", f"{name} imported from transformers {transformers.__version__} and inspected"
    facts.is_processor_mixin = issubclass(cls, ProcessorMixin)
    if not facts.is_processor_mixin:
        return
    try:
        attributes = list(cls.get_attributes()) if hasattr(cls, "get_attributes") else list(getattr(cls, "attributes", []))
    except Exception:  # noqa: BLE001 - an __init__ signature inspect cannot read: fall back to the declared list
        attributes = list(getattr(cls, "attributes", []))
    facts.sub_processors = attributes
    facts.modalities = [m for m in MODALITIES if any(a in attributes for a in SUB_PROCESSORS[m])]
    facts.counts_tokens = hasattr(cls, "_get_num_multimodal_tokens")
    facts.replaces = {m: getattr(cls, f"replace_{m}_token", None) is not getattr(ProcessorMixin, f"replace_{m}_token", None) for m in facts.modalities}
    if cls.__call__ is ProcessorMixin.__call__:
        facts.call_reaches_replacements = True
    else:
        try:
            text = inspect.getsource(cls.__call__)
        except (OSError, TypeError):
            text = ""
        facts.call_reaches_replacements = _reaches_replacements(text) if text else None


def _reaches_replacements(source: str) -> bool:
    """Does a ``__call__`` body hand placeholders to ``get_text_with_replacements`` (itself, or
    through ``super().__call__``, ProcessorMixin's, which does)?"""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return "get_text_with_replacements" in source
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get_text_with_replacements":
                return True
            target = node.func.value
            if node.func.attr == "__call__" and isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
                return True
    return False


def _read_remote(facts: ProcessorFacts, files: ProcessorFiles, name: str) -> None:
    """The remote processor class read with ast (never imported): its methods and sub-processors."""
    for path, text in files.code.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                facts.source_line["class"] = (path, node.lineno)
                facts.read_by, facts.read_note = "remote source", f"{name} read with ast from the repo's {path} (remote code is never imported)"
                bases = {_base_name(b) for b in node.bases}
                _read_chain(facts, [(path, node)], "ProcessorMixin" in bases or None)  # another base: not decidable without running it
                return
    facts.problems.append(f"{name}: its remote code is not among the files read")


def _base_name(base: ast.expr) -> str:
    return ast.unparse(base).rpartition(".")[2]


def _read_chain(facts: ProcessorFacts, chain: list[tuple[str, ast.ClassDef]], mixin: bool | None, *, remote: bool = True) -> None:
    """The facts of a class read statically: ``chain`` is the class and the bases it inherits
    from down to ProcessorMixin (subclass first; ``mixin``: whether ProcessorMixin was reached).
    A method counts where any class of the chain defines it, the first definition wins, as in
    Python's lookup. ``remote``: record ``__call__``'s line (remote code: a place in the repo)."""
    facts.is_processor_mixin = mixin
    methods: dict[str, tuple[str, ast.FunctionDef]] = {}
    attributes: list[str] | None = None
    for path, node in chain:
        own = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        for method_name, fn in own.items():
            methods.setdefault(method_name, (path, fn))
        if attributes is None:
            attributes = _declared_attributes(node, own)
    facts.sub_processors = attributes or []
    facts.modalities = [m for m in MODALITIES if any(a in facts.sub_processors for a in SUB_PROCESSORS[m])]
    facts.counts_tokens = "_get_num_multimodal_tokens" in methods
    facts.replaces = {m: f"replace_{m}_token" in methods for m in facts.modalities}
    if "__call__" in methods:
        path, fn = methods["__call__"]
        facts.call_reaches_replacements = _reaches_replacements(ast.unparse(fn))
        if remote:
            facts.source_line["__call__"] = (path, fn.lineno)
    else:
        facts.call_reaches_replacements = True if facts.is_processor_mixin else None


def _declared_attributes(node: ast.ClassDef, methods: dict[str, ast.FunctionDef]) -> list[str] | None:
    """A class's sub-processors as it declares them (an ``attributes`` list, else its ``__init__``'s
    processor / extractor / tokenizer arguments, as ProcessorMixin.get_attributes reads them);
    None where the class declares neither (a base's declaration applies)."""
    for item in node.body:
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "attributes" for t in item.targets):
            if isinstance(item.value, (ast.List, ast.Tuple)):
                return [e.value for e in item.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if "__init__" in methods:
        return [a.arg for a in methods["__init__"].args.args[1:] if any(m in a.arg for m in ("processor", "extractor", "tokenizer"))]
    return None


def _missing_backends(placeholder: type) -> str:
    """The backends transformers' placeholder names (``_backends``), else 'a backend'."""
    backends = getattr(placeholder, "_backends", None)
    names = [str(b) for b in backends] if isinstance(backends, (list, tuple, set, frozenset)) else []
    return " and ".join(names) if names else "a backend"


def _library_module(name: str, placeholder: type | None) -> str | None:
    """The transformers module that defines ``name``, without importing it: the placeholder's
    module, else the lazy top-level module's class-to-module table."""
    module = getattr(placeholder, "__module__", None)
    if isinstance(module, str) and module.startswith("transformers."):
        return module
    table = getattr(sys.modules.get("transformers"), "_class_to_module", None)
    found = table.get(name) if isinstance(table, dict) else None
    return f"transformers.{found}" if isinstance(found, str) else None


def _parse_module(module: str) -> tuple[ast.Module, str] | None:
    """(syntax tree, path relative to site-packages) of an installed module, read as text
    (``find_spec`` imports only the parent packages, which in transformers are lazy)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return tree, module.replace(".", "/") + ".py"


def _imported_from(tree: ast.Module, name: str, module: str) -> str | None:
    """The module a name used in ``module`` comes from: ``module`` itself where it defines the
    class, else the module of its ``from ... import`` (relative imports resolved), at top level
    or under an ``if`` / ``try`` (transformers guards imports by backend)."""
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop(0)
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            try:
                return importlib.util.resolve_name("." * node.level + (node.module or ""), module.rpartition(".")[0]) if node.level else node.module
            except (ImportError, ValueError):
                return None
        if isinstance(node, (ast.If, ast.Try)):
            nodes.extend([*node.body, *getattr(node, "orelse", []), *[n for h in getattr(node, "handlers", []) for n in h.body]])
    return None


MAX_BASES = 8
"""How many processor classes deep ``_library_chain`` follows bases (transformers' go 1-3 deep)."""


def _library_chain(name: str, module: str) -> tuple[list[tuple[str, ast.ClassDef]], bool | None]:
    """The class ``name`` of transformers' ``module`` and the processor bases it inherits from,
    read from source (subclass first), and whether the chain reaches ProcessorMixin (None: a
    base that is not transformers' code, or not found)."""
    chain: list[tuple[str, ast.ClassDef]] = []
    while len(chain) < MAX_BASES:
        parsed = _parse_module(module)
        node = next((n for n in parsed[0].body if isinstance(n, ast.ClassDef) and n.name == name), None) if parsed else None
        if parsed is None or node is None:
            return chain, None
        chain.append((parsed[1], node))
        bases = [_base_name(b) for b in node.bases]
        if "ProcessorMixin" in bases:
            return chain, True
        follow = next(((b, m) for b in bases if (m := _imported_from(parsed[0], b, module)) and m.startswith("transformers.")), None)
        if follow is None:
            return chain, None
        name, module = follow
    return chain, None


def _read_library_source(facts: ProcessorFacts, name: str, module: str | None, why: str) -> bool:
    """Read a transformers processor class from transformers' own source when the class does not
    import here: its module imports a backend only some of its parts use (PixtralProcessor's
    module imports the torchvision image processor for one helper), while what vLLM needs of the
    class is in its source. False where the source is not found (the caller reports why)."""
    import transformers

    chain, mixin = _library_chain(name, module) if module else ([], None)
    if not chain:
        return False
    _read_chain(facts, chain, mixin, remote=False)
    facts.read_by = "library source"
    facts.read_note = (f"{name} read with ast from transformers {transformers.__version__}'s {chain[0][0]}"
                       + (f" (and its bases in {', '.join(dict.fromkeys(p for p, _ in chain[1:]))})" if len(chain) > 1 else "")
                       + f", not imported: {why}")
    return True


PROBE_SIDE = 224
"""The probe image's side: vLLM's smallest dummy side (``_MIN_DUMMY_SIDE``)."""


def image_rows(outputs: Any, counts: Any) -> tuple[int, int] | None:
    """(rows of image data the processor returned, rows vLLM expects from its per-image counts)
    for one image, as ``MultiModalProcessor._get_num_image_patches`` reads them: ``image_grid_thw``
    products, else ``num_image_patches`` from the token counts, else one row; the rows of
    ``pixel_values`` (or ``image_patches``) on the dimension that holds them. None: no tensor."""
    import torch

    grid = outputs.get("image_grid_thw")
    if grid is not None:
        expected = int(grid.prod(-1).sum())
    else:
        patches = getattr(counts, "num_image_patches", None) if counts is not None else None
        expected = int(sum(patches)) if patches else 1
    data = outputs.get("pixel_values", outputs.get("image_patches"))
    if not isinstance(data, torch.Tensor):
        return None
    dim = 1 if data.ndim >= 2 and data.shape[0] != expected and data.shape[1] == expected else 0
    return int(data.shape[dim]), expected


def image_placeholder(processor: Any) -> str:
    """The text that stands for one image in a prompt, as vLLM 0.32/0.33 writes it for the
    transformers backend (``transformers/multimodal.py``, ``MultiModalDummyInputsBuilder.get_dummy_text``):
    Gemma 3's ``boi_token`` (its processor expands it), else ``image_token`` wrapped in
    ``image_start_token`` / ``image_end_token`` where the processor has them (HunYuanVL)."""
    if "gemma3" in type(processor).__name__.lower():
        return processor.boi_token
    return f"{getattr(processor, 'image_start_token', '')}{getattr(processor, 'image_token', '')}{getattr(processor, 'image_end_token', '')}"


def embed_token(processor: Any, replacement: str, model_config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``_get_embed_token_id``: the most frequent token of an item's encoded replacement
    (the smallest id on a tie, as ``torch.mode``) is the one its embeddings go to. Beside it the
    token the model fills with image features (config.json's ``image_token_id`` /
    ``image_token_index``), where the processor's tokenizer knows that id."""

    tokenizer = processor.tokenizer
    counts = Counter(tokenizer.encode(replacement, add_special_tokens=False))
    if not counts:
        return {}
    top = max(counts, key=lambda i: (counts[i], -i))
    out: dict[str, Any] = {"id": top, "token": tokenizer.convert_ids_to_tokens(top), "count": counts[top]}
    features = next((model_config[k] for k in ("image_token_id", "image_token_index")
                     if isinstance(model_config.get(k), int) and not isinstance(model_config.get(k), bool)), None)
    if features is not None and 0 <= features < len(tokenizer):
        out.update(features_id=features, features_token=tokenizer.convert_ids_to_tokens(features))
    return out


def _build_and_probe(facts: ProcessorFacts, folder: str, model_config: dict[str, Any]) -> None:
    """Build the processor from the folder as vLLM does (AutoProcessor, offline, no remote code),
    then ask it what vLLM asks: the token count of one image, and a real call on a blank image
    with its placeholder, for the text replacement offsets."""
    from transformers import AutoProcessor, ProcessorMixin

    try:
        processor = AutoProcessor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - every failure to build is a fact (usually: tokenizer files absent)
        facts.built = False
        facts.build_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}".rstrip(": ")
        return
    facts.built = isinstance(processor, ProcessorMixin)
    if not facts.built:
        facts.build_error = f"AutoProcessor built a {type(processor).__name__}, not a processor (ProcessorMixin)"
        facts.is_processor_mixin = False
        return
    facts.processor_class = type(processor).__name__
    facts.modalities = [m for m in MODALITIES if any(getattr(processor, a, None) is not None for a in SUB_PROCESSORS[m])]
    if "image" not in facts.modalities:
        return
    probe: dict[str, Any] = {}
    side = PROBE_SIDE
    counts = None
    try:
        counts = processor._get_num_multimodal_tokens(image_sizes=[[side, side]])
        probe["num_image_tokens"] = list(counts["num_image_tokens"])
    except Exception as exc:  # noqa: BLE001 - what vLLM's get_max_image_tokens would raise
        probe["count_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    token = getattr(processor, "image_token", None)
    if isinstance(token, str):
        from PIL import Image

        try:
            out = processor(text=f"a {token} b", images=[Image.new("RGB", (side, side))], return_text_replacement_offsets=True,
                            return_tensors="pt")
            offsets = out.get("text_replacement_offsets")
            probe["offsets"] = len(offsets[0]) if offsets is not None and len(offsets) else 0
            if probe["offsets"]:
                probe["embed_token"] = embed_token(processor, offsets[0][0]["replacement"], model_config)
            rows = image_rows(out, counts)
            if rows is not None:
                probe["image_rows"] = list(rows)
        except Exception as exc:  # noqa: BLE001 - what vLLM's _apply_hf_processor_main would raise
            probe["call_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    facts.probe = probe
