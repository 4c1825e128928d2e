"""The transformers 5 removals old remote code hits: the curated entries and the table read off
the releases (``analyzer/data/transformers_removed.json``), each held against the installed
transformers, and the codemod that ports an import of any of them."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest
import transformers

from hfcheck.analyzer.remote import removed_apis
from hfcheck.analyzer.remote.index import CodeIndex
from hfcheck.porter.rewrite.codemods.removed_apis import RemovedApis
from hfcheck.porter.rewrite.state import PortState

TABLE = removed_apis.generated_table()
INSTALLED = transformers.__version__


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def _gone_here(span: list[str]) -> bool:
    return _release(INSTALLED) >= _release(span[1])


@pytest.mark.parametrize("api", removed_apis.REMOVED, ids=lambda a: a.label)
def test_each_curated_removal_is_gone_from_the_installed_transformers(api):
    """Every curated entry is really absent from the installed transformers (5.24: all of them
    are gone there), and the releases' table agrees wherever it surveyed the module."""
    if _release(INSTALLED) < _release(api.gone_in):
        pytest.skip(f"transformers {INSTALLED} predates the removal ({api.gone_in})")
    assert not removed_apis.still_installed(api)
    if _release(api.last_seen) < _release(TABLE["last_4x"]):
        return  # gone before the last 4.x release the table starts from
    if api.kind == "module":
        assert api.names[0] in TABLE["modules"]
    elif api.kind == "name":
        surveyed = [n.rpartition(".") for n in api.names if n.rpartition(".")[0] in TABLE["names"]]
        assert not surveyed or any(name in TABLE["names"][module] for module, _, name in surveyed), api


@pytest.mark.parametrize("module", sorted(TABLE["names"]))
def test_each_generated_name_is_gone_from_the_installed_transformers(module):
    """Each name the releases show removed from ``module`` (one test per module, every name
    checked) is absent from the installed transformers where the table says it is gone by now."""
    names = set(dir(importlib.import_module(module)))
    present = [n for n, span in TABLE["names"][module].items() if _gone_here(span) and n in names]
    assert present == []
    assert all(removed_apis.match_import(module, n) is not None for n in TABLE["names"][module])


def test_each_generated_module_is_gone_from_the_installed_transformers():
    def importable(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:  # a package above it is gone too
            return False

    still = [m for m, span in TABLE["modules"].items() if _gone_here(span) and importable(m)]
    assert still == []
    assert all(removed_apis.match_import(m, None) is not None for m in TABLE["modules"])
    # a submodule below a removed package is removed with it
    assert removed_apis.match_import("transformers.onnx.some_helper", "OnnxConfig").label == "transformers.onnx"


def test_a_kept_api_is_not_reported():
    assert removed_apis.match_import("transformers.modeling_utils", "PreTrainedModel") is None
    assert removed_apis.match_import("transformers", "AutoConfig") is None
    assert removed_apis.match_import("torch.nn", "Linear") is None


SOURCE = '''\
from transformers.pytorch_utils import find_pruneable_heads_and_indices, prune_linear_layer
from transformers.modeling_utils import PretrainedConfig
from transformers.integrations import replace_8bit_linear
from transformers.utils import TRANSFORMERS_CACHE


class Cfg(PretrainedConfig):
    cache = TRANSFORMERS_CACHE


def prune(layer, index):
    return prune_linear_layer(replace_8bit_linear(layer), index)
'''


def test_the_codemod_ports_any_removed_import():
    """Unused: dropped. Moved to the top level (PretrainedConfig, no longer in modeling_utils): imported from there. Gone
    with no successor the codemod knows (TRANSFORMERS_CACHE, replace_8bit_linear): refused, named,
    left in place. A name that is still there (prune_linear_layer) is kept."""
    state = PortState({"modeling_x.py": SOURCE}, {"model_type": "x"})
    RemovedApis().apply(state)
    text = state.files["modeling_x.py"]
    assert "find_pruneable_heads_and_indices" not in text
    assert "from transformers.pytorch_utils import prune_linear_layer" in text
    assert "from transformers import PretrainedConfig" in text and "modeling_utils" not in text
    refused = {r.reason.split(":")[0] for r in state.refusals}
    assert refused == {"transformers.integrations.replace_8bit_linear", "transformers.utils.TRANSFORMERS_CACHE"}
    assert CodeIndex({"modeling_x.py": text}).files["modeling_x.py"].tree is not None
    whats = [c.what for c in state.changes]
    assert any("dropped the unused import of transformers.pytorch_utils.find_pruneable_heads_and_indices" in w for w in whats)


def test_code_that_exists_only_for_a_removed_api_goes_with_it():
    """Real code: CodeGen2's ONNX export config is built on ``transformers.onnx`` (gone in 5) and
    nothing in the model names it, so it goes with its imports and the config class stays;
    SantaCoder's attention keeps 4.x's head-pruning hook, whose helpers 5 removed with head
    pruning: the hook goes, the rest of the class stays."""
    from pathlib import Path

    published = Path(__file__).parent / "fixtures" / "remote-published"
    codegen = published / "codegen2-1b"
    state = PortState({p.name: p.read_text() for p in codegen.glob("*.py")}, json.loads((codegen / "config.json").read_text()))
    RemovedApis().apply(state)
    text = state.files["configuration_codegen.py"]
    assert "class CodeGenOnnxConfig" not in text and "transformers.onnx" not in text and "class CodeGenConfig(PretrainedConfig)" in text
    santacoder = published / "santacoder"
    state = PortState({p.name: p.read_text() for p in santacoder.glob("*.py")}, json.loads((santacoder / "config.json").read_text()))
    RemovedApis().apply(state)
    text = state.files["modeling_gpt2_mq.py"]
    assert "def prune_heads" not in text and "find_pruneable_heads_and_indices" not in text and "class GPT2MQAttention" in text
    assert "GPT2MQAttention.prune_heads" in {c.where for c in state.changes}


OVERRIDE = '''\
class LM(PreTrainedModel):
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, standardize_cache_format=False):
        model_kwargs["past_key_values"] = self._extract_past_from_model_output(outputs, standardize_cache_format=standardize_cache_format)
        return model_kwargs


class NewerLM(PreTrainedModel):
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        cache_name, cache = self._extract_past_from_model_output(outputs)
        model_kwargs[cache_name] = cache
        return model_kwargs
'''


def test_the_removed_past_extractor_becomes_what_it_returned():
    """GenerationMixin's ``_extract_past_from_model_output`` is gone in 5; 4.x-era overrides of
    ``_update_model_kwargs_for_generation`` call it (ChatGLM2/3 for the cache; GLM-4's, of 4.44,
    unpacks the ``(cache_name, cache)`` pair it returned there). Run on a real outputs object."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    state = PortState({"modeling_x.py": OVERRIDE}, {"model_type": "x"})
    RemovedApis().apply(state)
    text = state.files["modeling_x.py"]
    assert "_extract_past_from_model_output" not in text
    outputs = CausalLMOutputWithPast(past_key_values=((1, 2),))
    namespace: dict = {"PreTrainedModel": object}
    exec(compile(text, "modeling_x.py", "exec"), namespace)
    for cls in ("LM", "NewerLM"):
        kwargs = namespace[cls]()._update_model_kwargs_for_generation(outputs, {})
        assert kwargs == {"past_key_values": ((1, 2),)}, cls
