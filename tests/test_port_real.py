"""``hfcheck port`` on real Hub remote code (``../shared/fixtures/remote-real``).

The originals run unmodified in the transformers release their config.json declares (cached
reference environments under ``$HFCHECK_ENV_DIR``); the outputs run in the current one. Random
weights are made by the original code itself (``porter.reference.sample``); nothing comes from
the network but the reference environments' packages (PyPI, built once per machine).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "remote-real"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/fixtures/remote-real is not here")


def port_json(src: Path, out: Path, *extra: str) -> tuple[int, dict]:
    import contextlib
    import io

    from hfcheck.porter.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["port", str(src), "--out", str(out), "--format", "json", *extra])
    return code, json.loads(buf.getvalue())


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def checks(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["proof"]["checks"]}


@pytest.mark.parametrize(
    ("name", "arch", "model_type", "release", "how"),
    [
        ("internlm-20b", "LlamaForCausalLM", "llama", "4.33.1", "vllm-native"),
        ("qwen-7b", "Qwen2ForCausalLM", "qwen2", "4.32.0", "vllm-native"),
        ("falcon-7b-instruct-rw", "FalconForCausalLM", "falcon", "4.27.4", "vllm-native"),
    ],
)
def test_real_remote_code_is_retargeted_and_proven(name, arch, model_type, release, how, tmp_path):
    src = REAL / name
    before = digest(src)
    out = tmp_path / "out"
    code, result = port_json(src, out)
    assert code == 0 and result["status"] == "ported", result["message"]
    assert result["path"] == "retarget" and result["retarget"]["target"] == arch
    # the original ran in the release it declares, not patched
    assert result["reference"]["transformers"] == release and "declared in config.json" in result["reference"]["why"]
    assert result["reference"]["peak_rss_bytes"] < 2 * 1024**3
    got = checks(result)
    for check in ("random weights, eager", "random weights, sdpa"):
        assert got[check]["ok"] and got[check]["max_rel_error"] <= 1e-4 and got[check]["argmax_agreement"] == 1.0
    assert any(n.startswith("greedy generate") and c["ok"] for n, c in got.items())
    # a native folder: the native model_type at full size, no model code left
    config = json.loads((out / "config.json").read_text())
    original = json.loads((src / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [arch] and "auto_map" not in config
    assert not [p.name for p in out.glob("*.py") if p.name.startswith(("modeling_", "modelling_", "configuration_"))]
    from transformers import AutoConfig

    native = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    assert native.hidden_size == original["hidden_size"]
    assert native.num_hidden_layers == original.get("num_hidden_layers", original.get("n_layer"))
    assert native.vocab_size == original["vocab_size"]
    assert result["served"]["how"] == how and result["served"]["command"].startswith(f"vllm serve {out}")
    report = (out / "PORT.md").read_text()
    assert "**Path taken:** retarget" in report and f"transformers {release}" in report and "## How vLLM serves it" in report
    assert digest(src) == before  # the original folder is untouched


def test_qwen_v1_says_where_the_functions_differ(tmp_path):
    code, result = port_json(REAL / "qwen-7b", tmp_path / "out")
    assert code == 0
    notes = " ".join(result["retarget"]["notes"])
    assert "use_logn_attn" in notes and "use_dynamic_ntk" in notes and "8192" in notes
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["max_position_embeddings"] == 8192  # the trained length, where the functions are equal
    assert config["intermediate_size"] == 11008  # Qwen's MLP is half its intermediate_size
    choices = result["retarget"]["choices"]
    assert choices["gate/up"] == "gate=mlp.w2, up=mlp.w1" and "c_attn packed" in choices["q/k/v"]


@pytest.mark.parametrize(("name", "file", "line"), [("mpt-7b", "attention.py", 254), ("baichuan2-13b-chat", "modeling_baichuan.py", None)])
def test_alibi_models_are_refused_naming_the_line(name, file, line, tmp_path):
    out = tmp_path / "out"
    code, result = port_json(REAL / name, out)
    assert code == 1 and result["status"] == "refused" and result["path"] == "refused"
    assert "ALiBi" in result["message"] and "no ALiBi slopes" in result["message"]
    where, added = result["not_ported"]  # where the bias is built, and where the recorded dataflow sees it reach the scores
    assert where["file"] == file and (line is None or where["where"] == f"line {line}")
    assert added["code"] == "HFC803" and "position bias" in added["reason"]
    assert f"{file}:" in result["message"]
    assert not out.exists()  # nothing written


def test_mpt_equal_native_class_is_named_but_not_taken(tmp_path):
    _, result = port_json(REAL / "mpt-7b", tmp_path / "out")
    assert "MptForCausalLM: computes the same function" in result["message"]
    assert "neither natively nor through its transformers backend" in result["message"]


@pytest.fixture(scope="module")
def internlm_sample(tmp_path_factory):
    from hfcheck.porter.reference.sample import write_sample

    return write_sample(REAL / "internlm-20b", tmp_path_factory.mktemp("sample") / "internlm-small")


def test_checkpoint_is_converted_and_proven_on_real_weights(internlm_sample, tmp_path):
    out = tmp_path / "out"
    code, result = port_json(internlm_sample, out)
    assert code == 0 and result["status"] == "ported", result["message"]
    assert result["weights"]["format"] == "safetensors" and result["weights"]["unused"] == []
    real = [c for n, c in checks(result).items() if n.startswith("real weights")]
    assert real and real[0]["ok"] and real[0]["max_rel_error"] <= 1e-4 and real[0]["peak_rss_bytes"] < 2 * 1024**3
    # the output loads with transformers alone and generates
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    gen = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, 6)
    plan = json.loads((out / "weight_plan.json").read_text())
    assert plan["layers"] == 2 and any(r["out"] == "model.layers.{i}.self_attn.q_proj.weight" for r in plan["recipes"])


def test_a_wrong_reading_is_caught_by_the_proof(internlm_sample):
    """Swap gate and up in the proven plan: the logits no longer match."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.compare import compare
    from hfcheck.porter.reference.establish import establish
    from hfcheck.porter.retarget.plan import convert_state
    from hfcheck.porter.retarget.search import build_native
    from hfcheck.porter.retarget.stage import find_retarget

    reference = establish(resolve(str(internlm_sample)))
    outcome = find_retarget(reference)
    assert outcome.found is not None
    plan = [dict(r) for r in outcome.found.plan]
    for r in plan:
        if r["out"].endswith("gate_proj.weight"):
            r["src"] = r["src"].replace("gate_proj", "up_proj")
        elif r["out"].endswith("up_proj.weight"):
            r["src"] = r["src"].replace("up_proj", "gate_proj")
    model = build_native(outcome.found.native_tiny_config)
    model.load_state_dict(convert_state(plan, reference.num_layers, reference.run.state))
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor(reference.input_ids)).logits
    assert not compare(reference.run.logits, logits)["ok"]


def test_truncation_keeps_the_proof_under_budget():
    from hfcheck.analyzer.instance.shrink import TENSOR_BUDGET_BYTES, truncation

    hidden, inter = 5120, 13824
    meta = {f"model.layers.0.{n}": s for n, s in {"q.weight": [hidden, hidden], "k.weight": [hidden, hidden], "v.weight": [hidden, hidden],
                                                   "o.weight": [hidden, hidden], "gate.weight": [inter, hidden], "up.weight": [inter, hidden],
                                                   "down.weight": [hidden, inter]}.items()}
    keep, rows, layer_bytes = truncation(meta, "model.layers", 60, 103168, hidden)
    assert keep == 0 and layer_bytes > TENSOR_BUDGET_BYTES  # 20B: one float32 layer alone is 1.3 GB
    small = {k: [d // 4 for d in v] for k, v in meta.items()}
    keep, rows, _ = truncation(small, "model.layers", 60, 103168, hidden // 4)
    assert keep == 2 and rows == 2048


# --------------------------------------------------------------------------- bad input


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_code_that_does_not_parse_is_one_line_exit_2(tmp_path, capsys):
    from hfcheck.porter.cli import main

    src = _copy(REAL / "internlm-20b", tmp_path / "broken")
    (src / "modeling_internlm.py").write_text((src / "modeling_internlm.py").read_text() + "\ndef broken(:\n")
    assert main(["port", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "modeling_internlm.py:" in err[0] and "does not parse" in err[0]
    assert not (tmp_path / "out").exists()


def test_missing_auto_map_file_is_one_line_exit_2(tmp_path, capsys):
    from hfcheck.porter.cli import main

    src = _copy(REAL / "internlm-20b", tmp_path / "missing")
    (src / "modeling_internlm.py").unlink()
    assert main(["port", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "modeling_internlm" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit", ["version", "import"])
def test_uninstallable_reference_is_one_line_exit_2(edit, tmp_path, capsys, monkeypatch):
    """A declared transformers release that does not exist, or an import no registry has: pip
    is asked (offline here: no index), fails, and the port says so in one line."""
    from hfcheck.porter.cli import main
    from hfcheck.shared.environments import env_root

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: only wheels already on this machine
    src = _copy(REAL / "internlm-20b", tmp_path / "model")
    if edit == "version":
        config = json.loads((src / "config.json").read_text())
        config["transformers_version"] = "4.99.0"
        (src / "config.json").write_text(json.dumps(config))
    else:
        text = (src / "modeling_internlm.py").read_text()
        (src / "modeling_internlm.py").write_text(text.replace("import torch\n", "import torch\nimport hfcheck_no_such_package_anywhere\n", 1))
    before = digest(src)
    assert main(["port", str(src), "--out", str(tmp_path / "out")]) == 2
    text = capsys.readouterr().err
    err = [line for line in text.splitlines() if not line.startswith("port: ")]  # progress lines aside
    assert len(err) == 1 and "reference environment cannot be built" in err[0] and "Traceback" not in text
    assert ("4.99.0" in err[0]) if edit == "version" else ("hfcheck-no-such-package-anywhere" in err[0] or "hfcheck_no_such" in err[0])
    assert not (tmp_path / "out").exists() and digest(src) == before
    assert not list(env_root().glob("transformers-4.99.0-*"))  # no half-built environment left


# --------------------------------------------------------------------------- in-place rewrite by dataflow

NO_POSITION_IDS = {"falcon-7b-instruct-rw"}
"""RefinedWeb's model forward takes no position_ids (its rotary offset comes from its own cache):
vLLM's backend fails to load it, and its positions at a decode step would be wrong anyway."""



@pytest.mark.parametrize(
    ("name", "cls", "region", "what", "also"),
    [
        # hand-written softmax(QK^T)V with shape checks that raise, in forward
        # (its 4.x tuple cache stays; forward and prepare_inputs_for_generation take v5's empty Cache as None)
        # (and what real vLLM needs beyond the attention: AutoModel names the base model, the rotary table covers vLLM's
        # positions, head counts in views are per rank; from_pretrained recomputes the rotary buffers from the recorded arguments)
        ("internlm-20b", "InternLMAttention", (216, 243), "softmax(QK^T)V written by hand",
         ("maps the empty Cache transformers 5's generate passes to None", "AutoModel -> modeling_internlm.InternLMModel",
          "the rotary table also covers position_ids", "take -1 for the head count", "from the arguments it was built with")),
        # a direct SDPA call in the `alibi is None` branch of an if, multi-query k/v kept as [batch*kv, seq, dim]
        # (its packed query_key_value, cut by a helper's view and slices, becomes the .split vLLM fuses)
        ("falcon-7b-instruct-rw", "Attention", (276, 285), "scaled_dot_product_attention at modelling_RW.py:279",
         ("lines 242-245: the cut of self.query_key_value's output -> .split((self.q_size, self.kv_size, self.kv_size), dim=-1)",)),
        # the flash-attention `if` / SDPA / `_attn` helper branches, one region; the flash class it no
        # longer calls is removed, and a function-local import vLLM's environment lacks is guarded
        ("qwen-7b", "QWenAttention", (492, 538), "scaled_dot_product_attention at modeling_qwen.py:528",
         ("removed FlashSelfAttention and self.core_attention_flash", "guarded the import inside a function `from transformers_stream_generator",
          "lines 416-418: the cut of self.c_attn's output -> .split((self.q_size, self.kv_size, self.kv_size), dim=-1)")),
    ],
)
def test_real_attention_is_rewritten_by_dataflow_and_served(name, cls, region, what, also, tmp_path):
    """--path rewrite: the attention region the original's recorded dataflow proves is replaced by
    one interface call; the whole port is proven against the original in its own release and the
    re-scan says vLLM's transformers backend serves it."""
    src = REAL / name
    before = digest(src)
    code, result = port_json(src, tmp_path / "out", "--path", "rewrite")
    if name in NO_POSITION_IDS:
        # proven, but vLLM's backend cannot load it: its model's forward takes no position_ids (HFC816)
        assert code == 1 and result["status"] == "failed" and "position_ids" in result["message"], result["message"]
        assert {r["code"]: r["after"] for r in result["rescan"]}["HFC816"] == "fail"
    else:
        assert code == 0 and result["status"] == "ported" and result["path"] == "rewrite", result["message"]
    assert digest(src) == before
    [change] = [c for c in result["changes"] if c["code"] == "HFC803" and c["where"] == f"{cls}.forward"]
    assert f"replaced lines {region[0]}-{region[1]} ({what}" in change["what"]
    assert not [r for r in result["not_ported"] if r["code"] == "HFC803"]
    for check in ("random weights, eager", "random weights, sdpa"):
        assert checks(result)[check]["ok"] and checks(result)[check]["max_rel_error"] < 1e-4
    if name in NO_POSITION_IDS:
        assert result["served"]["how"] == "not-served" and any("position_ids" in b for b in result["served"]["blockers"])
    else:
        assert result["served"]["how"] == "transformers-backend" and result["served"]["verdict"] in ("runs", "native-speed")
    ported = (tmp_path / "out" / change["file"]).read_text()
    original = (src / change["file"]).read_text().splitlines()
    assert "\n".join(original[region[0] - 1:region[1]]) not in ported
    assert "ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)" in ported
    for text in also:
        assert any(text in c["what"] for c in result["changes"]), text
    # transformers' own linter finds nothing in the ported code that the original did not have
    assert result["lint"]["error"] is None and result["lint"]["original"] and result["lint"]["introduced"] == [], result["lint"]["introduced"]
    rows = {r["code"]: r for r in result["rescan"]}
    if any("the cut of" in text for text in also):  # the packed projection now fuses (vLLM's packed_qkv)
        assert rows["HFC301"]["after"] == "pass" and rows["HFC813"]["after"] == "pass"


@pytest.fixture(scope="module")
def recorded():
    """The reference runs of the real fixtures, with their recorded dataflow (one per model)."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import establish

    cache: dict[str, tuple] = {}

    def get(name: str, files: dict[str, str] | None = None):
        key = name if files is None else f"{name}:{hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()}"
        if key not in cache:
            source = resolve(str(REAL / name))
            if files is not None:
                source.code_files.update(files)
            cache[key] = (source, establish(source))
        return cache[key]

    return get


def _plans(source, reference):
    from hfcheck.porter.rewrite.dataflow import plans

    run = reference.run
    return plans(run.result, run.tensors, source.code_files, reference.input_ids, reference.tiny_config)


def test_qwen_region_spans_the_flash_branch_and_keeps_the_weights_name(recorded):
    """Qwen v1: the core ran in the `else` of the flash-attention `if`, through SDPA; the region is
    that whole `if` plus the head merge, q/k/v are read as they were before it (post-RoPE,
    [batch, seq, heads, dim]) and `attn_weight`, read later for output_attentions, is bound to
    the interface's weights."""
    from hfcheck.porter.rewrite.dataflow import CorePlan

    source, reference = recorded("qwen-7b")
    [plan] = _plans(source, reference)
    assert isinstance(plan, CorePlan) and plan.cls == "QWenAttention"
    lines = source.code_files["modeling_qwen.py"].splitlines()
    assert lines[plan.start_line - 1].strip() == "if (" and "self._merge_heads(" in lines[plan.end_line - 3]
    assert (plan.q, plan.k, plan.v) == ("query.transpose(1, 2)", "key.transpose(1, 2)", "value.transpose(1, 2)")
    assert plan.out == "context_layer" and plan.out_layout == "bsD" and plan.weights == "attn_weight"
    assert plan.mask == "attention_mask" and plan.scaling_init == "self.head_dim**-0.5" and plan.max_rel_error < 1e-6


@pytest.mark.parametrize(
    ("name", "file", "line", "code"),
    [
        ("mpt-7b", "attention.py", 32, "attn_weight = attn_weight + attn_bias"),  # in the helper the attention calls
        ("baichuan2-13b-chat", "modeling_baichuan.py", 196, "attn_weights = attn_weights + attention_mask"),  # ALiBi folded into the mask
    ],
)
def test_dataflow_names_the_position_bias_where_it_is_added(name, file, line, code, recorded):
    from hfcheck.porter.rewrite.dataflow import CoreRefusal

    source, reference = recorded(name)
    [refusal] = _plans(source, reference)
    assert isinstance(refusal, CoreRefusal) and (refusal.file, refusal.line) == (file, line)
    assert f"`{code}`" in refusal.reason and "position bias" in refusal.reason


INTERNLM_QK = "        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)\n"


def test_dataflow_refuses_a_tanh_that_is_not_a_softcap_naming_its_line(recorded):
    """The same real code with a tanh added to the scores (not c * tanh(x / c)): the recorded
    values match no attention vLLM computes, and the refusal names the tanh's line, not a guess."""
    from hfcheck.porter.rewrite.dataflow import CoreRefusal

    text = (REAL / "internlm-20b" / "modeling_internlm.py").read_text()
    assert INTERNLM_QK in text
    edited = text.replace(INTERNLM_QK, INTERNLM_QK + "        attn_weights = attn_weights + torch.tanh(attn_weights)\n")
    source, reference = recorded("internlm-20b", {"modeling_internlm.py": edited})
    [refusal] = _plans(source, reference)
    assert isinstance(refusal, CoreRefusal) and refusal.line == 217 and "not a logit softcap" in refusal.reason


def test_a_logit_softcap_is_kept_through_the_config(tmp_path):
    """The real code with a Gemma-2-style cap after the scale (c * tanh(scores / c), c = 5): the
    region is still attention (proven with the cap), the call passes
    softcap=self.config.attn_logit_softcapping and config.json gets the value vLLM reads; the
    ported class claims no sdpa path (sdpa has no softcap), and the proof holds for eager."""
    import shutil

    src = tmp_path / "capped"
    shutil.copytree(REAL / "internlm-20b", src)
    text = (src / "modeling_internlm.py").read_text()
    (src / "modeling_internlm.py").write_text(text.replace(INTERNLM_QK, INTERNLM_QK + "        attn_weights = torch.tanh(attn_weights / 5.0) * 5.0\n"))
    code, result = port_json(src, tmp_path / "out", "--path", "rewrite")
    assert code == 0 and result["status"] == "ported", result["message"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["attn_logit_softcapping"] == 5.0
    ported = (tmp_path / "out" / "modeling_internlm.py").read_text()
    assert "softcap=self.config.attn_logit_softcapping" in ported and "_supports_sdpa = True" not in ported
    got = checks(result)
    assert got["random weights, eager"]["ok"] and got["random weights, eager"]["max_rel_error"] < 1e-4
    assert got["random weights, sdpa"].get("skipped")
    assert result["served"]["how"] == "transformers-backend"


def test_config_alias_for_the_layer_count_v5_reads(tmp_path):
    """MPT's config stores `n_layers`; transformers 5 reads `config.num_hidden_layers` (generate
    sizes its cache from it). The codemod adds the documented alias; the real config class then
    answers it in the current transformers (a subprocess imports the rewritten file)."""
    import subprocess
    import sys

    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.rewrite.codemods.config_aliases import ConfigAliases
    from hfcheck.porter.rewrite.state import PortState

    source = resolve(str(REAL / "mpt-7b"))
    state = PortState(dict(source.code_files), dict(source.config))
    ConfigAliases().apply(state)
    text = state.files["configuration_mpt.py"]
    assert "attribute_map = {'num_hidden_layers': 'n_layers'}" in text
    (tmp_path / "configuration_mpt.py").write_text(text)
    probe = "from configuration_mpt import MPTConfig; c = MPTConfig(n_layers=3); print(c.num_hidden_layers, c.to_dict()['n_layers'])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "3"]
    falcon = resolve(str(REAL / "falcon-7b-instruct-rw"))  # already maps it: nothing to do
    state = PortState(dict(falcon.code_files), dict(falcon.config))
    ConfigAliases().apply(state)
    assert state.files == falcon.code_files and not state.changes


def test_per_head_packed_rows_are_regrouped_with_the_checkpoint(tmp_path):
    """The real RW code with `multi_query: false` (as RW models without MQA are configured) packs
    query_key_value per head ([heads, 3, head_dim], viewed and indexed by `_split_heads`). The
    recorded values show that order; in place, the cut becomes the `.split((q, kv, kv))` vLLM
    fuses and the checkpoint's rows are reordered to [q | k | v], proven on random weights and
    on a converted checkpoint."""
    import shutil

    from hfcheck.porter.reference.sample import write_sample

    src = tmp_path / "rw-mha"
    shutil.copytree(REAL / "falcon-7b-instruct-rw", src)
    config = json.loads((src / "config.json").read_text())
    config["multi_query"] = False
    (src / "config.json").write_text(json.dumps(config))
    sample = write_sample(src, tmp_path / "rw-mha-small")
    code, result = port_json(sample, tmp_path / "out", "--path", "rewrite")
    # proven; as a port it fails on HFC816 (RWModel.forward names no position_ids), which it says
    assert code == 1 and result["status"] == "failed" and result["path"] == "rewrite" and "position_ids" in result["message"], result["message"]
    [split] = [c for c in result["changes"] if c["code"] == "HFC813" and c["where"] == "Attention.forward"]
    assert "grouped per head" in split["what"] and "reordered to [q | k | v]" in split["what"]
    got = checks(result)
    assert got["random weights, eager"]["ok"] and got["random weights, eager"]["max_rel_error"] < 1e-4
    assert any(name.startswith("real weights") and c["ok"] for name, c in got.items())
    assert result["weights"]["split"] >= 1  # the packed tensors went through the row rule
    rows = {r["code"]: r for r in result["rescan"]}
    assert rows["HFC301"]["after"] == "pass" and rows["HFC816"]["after"] == "fail"
