"""v5: what 4.x-era code reads off its config that transformers 5 no longer gives it.

Two idioms, each read where the code has it and rewritten to the 4.x meaning:

- ``config.max_length``, ``config.pad_token_id`` ...: 4.x's ``PretrainedConfig.__init__`` set
  some forty attributes on every config (generation settings, special token ids, ``is_decoder``);
  5's sets none of them, so a config.json without the key fails with "object has no attribute".
  5 also drops the generation parameters (``use_cache``, ``max_length`` ...) from config.json
  while loading. Each read takes what 4.x gave: ``getattr(config, "use_cache", True)`` with
  config.json's value, else 4.x's default (not put back on the config: 5's generate reads a
  config's ``max_length`` as a generation setting changed by hand, and refuses it).
- ``config.rope_scaling``: 4.x kept config.json's value (``None`` or ``{"type": ..., "factor":
  ...}``); 5 standardises it into ``rope_parameters`` and reads it back as ``{"rope_type":
  "default", "rope_theta": ...}`` where config.json had none, adding those two keys to a scaled
  one. Code of the Llama family guards with ``if rope_scaling is None`` and then indexes
  ``["type"]`` (KeyError: 'type'), or validates ``len(rope_scaling) == 2``. Each read goes
  through ``legacy_rope_scaling(config)``, which gives back the 4.x value.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from typing import Any

import libcst as cst
import libcst.matchers as m

from hfcheck.porter.rewrite import cstutil as cu
from hfcheck.porter.rewrite.codemods.base import Codemod, Place, parse, save, set_class_attribute

V4_CONFIG_DEFAULTS: dict[str, Any] = {
    "add_cross_attention": False, "bad_words_ids": None, "begin_suppress_tokens": None, "bos_token_id": None,
    "cross_attention_hidden_size": None, "decoder_start_token_id": None, "diversity_penalty": 0.0, "do_sample": False,
    "early_stopping": False, "encoder_no_repeat_ngram_size": 0, "eos_token_id": None, "exponential_decay_length_penalty": None,
    "finetuning_task": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "is_decoder": False, "length_penalty": 1.0,
    "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 0, "num_beam_groups": 1, "num_beams": 1, "num_return_sequences": 1,
    "output_scores": False, "pad_token_id": None, "prefix": None, "remove_invalid_values": False, "repetition_penalty": 1.0,
    "return_dict_in_generate": False, "sep_token_id": None, "suppress_tokens": None, "task_specific_params": None,
    "temperature": 1.0, "tf_legacy_loss": False, "tie_encoder_decoder": False, "tokenizer_class": None, "top_k": 50, "top_p": 1.0,
    "torchscript": False, "typical_p": 1.0, "use_bfloat16": False,
}
"""The attributes ``PretrainedConfig()`` has in 4.30.0 and 4.46.3 (identical) and not in 5, with
their values there (measured in the reference environments; ``tie_word_embeddings`` and
``pruned_heads`` are left to the tied-weights codemod and the removed-API shims)."""

CONFIG_OBJECT = m.Name("config") | m.Attribute(attr=m.Name("config") | m.Name("_config"))
"""What 4.x code calls its config: ``config``, ``self.config``, ``model._config`` (not ``generation_config``)."""


class _DefaultedReads(cst.CSTTransformer):
    """``<config>.attr`` read (not assigned) -> ``getattr(<config>, "attr", <default>)``."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        super().__init__()
        self.defaults = defaults
        self.read: dict[str, int] = {}

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False  # a store (`self._config.pad_token_id = 0`) stays

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        attr = updated.attr.value
        if attr not in self.defaults or not m.matches(updated.value, CONFIG_OBJECT):
            return updated
        self.read[attr] = self.read.get(attr, 0) + 1
        return cu.template_expr("getattr({owner}, {name}, {default})", owner=updated.value, name=repr(attr),
                                default=repr(self.defaults[attr]))


def generation_keys_dropped() -> set[str]:
    """The config.json keys transformers 5's ``PreTrainedConfig.__init__`` pops as generation
    parameters (``use_cache``, ``max_length`` ...), asked of the installed release."""
    from transformers import GenerationConfig

    return set(GenerationConfig._get_default_generation_params())


class DroppedConfigDefaults(Codemod):
    name = "config-v4-defaults"
    codes = ("v5",)

    def apply(self, state) -> None:
        index = state.index()
        cls = state.config_class(index)
        declared = state.config_defaults()

        def own(key: str) -> bool:  # the config class sets it itself
            return key in declared or (cls is not None and (index.self_assign(cls, key) is not None or index.class_attr(cls, key) is not None))

        defaults: dict[str, tuple[Any, str]] = {}
        for key in generation_keys_dropped():
            if key in state.config and not own(key):
                defaults[key] = (state.config[key], "config.json's value, which transformers 5 drops as a generation parameter")
        for key, value in V4_CONFIG_DEFAULTS.items():
            if key not in state.config and key not in defaults and not own(key):
                defaults[key] = (value, "4.x's PretrainedConfig default, which 5's no longer sets")
        for file, text in list(state.files.items()):
            if not any(f".{k}" in text for k in defaults):
                continue
            reads = _DefaultedReads({k: v for k, (v, _) in defaults.items()})
            module = parse(state, file).visit(reads)
            if not reads.read:
                continue
            save(state, file, module)
            for attr, n in sorted(reads.read.items()):
                value, what = defaults[attr]
                state.change("v5", file, f"config.{attr}", f"{n} read(s) of config.{attr} -> getattr(config, {attr!r}, {value!r}): {what}",
                             "4.x-era code reads it off the config, where transformers 5 leaves no such attribute (\"object has no "
                             "attribute\"); not put back on the config, where 5's generate reads it as a generation setting changed by hand")
        self._for_transformers_bases(state, cls, defaults)

    def _for_transformers_bases(self, state, cls, defaults: dict[str, tuple[Any, str]]) -> None:
        """What transformers' own classes that the remote code subclasses (SantaCoder's blocks are
        ``GPT2Block``) read off the config cannot be rewritten there: the config class gets it as a
        class attribute (config.json still overrides it). Generation parameters other than
        ``use_cache`` are left out: 5's generate refuses a config that carries them."""
        generation = generation_keys_dropped() - {"use_cache"}
        needed = sorted(k for k in _read_by_transformers_bases(state.files) if k in defaults and k not in generation)
        if cls is None or not needed:
            return
        module = parse(state, cls.file)
        for key in needed:
            value, what = defaults[key]
            edited = set_class_attribute(module, cls.name, key, cst.parse_expression(repr(value)), Place.after_last_attribute)
            if edited is None:
                return
            module = edited
            state.change("v5", cls.file, cls.name, f"{key} = {value!r} on the config class: {what}",
                         "transformers' own classes the model subclasses read it off the config (\"object has no attribute\" in 5)")
        save(state, cls.file, module)


def _read_by_transformers_bases(files: dict[str, str]) -> set[str]:
    """The config attributes the transformers modules whose classes the remote code subclasses
    read (``config.x`` / ``self.config.x`` in their source: trusted, installed code)."""
    modules: set[str] = set()
    for text in files.values():
        tree = ast.parse(text)
        imported = {a.asname or a.name: n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.startswith("transformers.models.") for a in n.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                modules |= {imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported}
    read: set[str] = set()
    for name in modules:
        try:
            source = inspect.getsource(importlib.import_module(name))
        except (ImportError, OSError, TypeError):
            continue
        read |= set(re.findall(r"\bconfig\.(\w+)", source))
    return read


SHIM = "legacy_rope_scaling"
SHIM_DEF = cst.parse_statement('''def legacy_rope_scaling(config):
    """config.rope_scaling as transformers 4.x read it: None where config.json set none, else its
    own keys. transformers 5 gives {"rope_type": "default", "rope_theta": ...} there and adds
    those two keys to a scaled one (added by hfcheck port)."""
    scaling = getattr(config, "rope_scaling", None)
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        return None
    legacy = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if "type" in legacy:
        legacy.pop("rope_type", None)
    return legacy
''')


class _RopeScalingReads(cst.CSTTransformer):
    """``<config>.rope_scaling`` read (not assigned) -> ``legacy_rope_scaling(<config>)``; inside
    a config class, ``self.rope_scaling`` too."""

    def __init__(self, config_classes: set[str]) -> None:
        super().__init__()
        self.config_classes = config_classes
        self.classes: list[str] = []
        self.lines = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False  # a store: `self.rope_scaling = rope_scaling` stays

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if updated.attr.value != "rope_scaling":
            return updated
        owner = updated.value
        in_config = bool(self.classes) and self.classes[0] in self.config_classes
        if not (m.matches(owner, CONFIG_OBJECT) or (in_config and m.matches(owner, m.Name("self")))):
            return updated
        self.lines += 1
        return cst.Call(cst.Name(SHIM), [cst.Arg(owner)])


class LegacyRopeScaling(Codemod):
    name = "legacy-rope-scaling"
    codes = ("v5",)

    def apply(self, state) -> None:
        index = state.index()
        config_classes = {c.name for c in index.classes
                          if any(b.rpartition(".")[2] in ("PretrainedConfig", "PreTrainedConfig") for k in index.mro(c) for b in k.bases)}
        for file, text in list(state.files.items()):
            if ".rope_scaling" not in text:
                continue
            reader = _RopeScalingReads(config_classes)
            module = parse(state, file).visit(reader)
            if not reader.lines:
                continue
            if SHIM not in cu.bound_names(module):
                first = next((s.name.value for s in module.body if isinstance(s, cst.ClassDef)), None)
                if first is None:
                    continue
                fn = SHIM_DEF.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
                module = cu.insert_before_class(module, first, [fn])
            save(state, file, module)
            state.change("v5", file, "rope_scaling", f"{reader.lines} read(s) of rope_scaling go through {SHIM}(config)",
                         "transformers 5 reads rope_scaling back as rope parameters ({\"rope_type\": \"default\", ...} where config.json "
                         "had null), so 4.x code testing it for None and indexing [\"type\"] fails with KeyError: 'type'")
