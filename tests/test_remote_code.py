"""Remote code: the static HFC8xx checks on hand-written model packages, and the sandbox.

Every finding is asserted: each fixture file marks the lines where a check must report
(`# expect: HFC8xx`), and the static analysis must report exactly those (code, file, line)
and nothing else. The hostile package must never run without --trust-remote-code; with it,
the sandboxed child must not reach the network, start processes or write outside its
folder, and the parent must survive a child that hangs.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write_model

from hfcheck.analyzer.remote import CodeIndex
from hfcheck.analyzer.remote.checks import code_findings, static_findings
from hfcheck.analyzer.remote.checks.imports import unguarded_imports
from hfcheck.analyzer.remote.removed_apis import REMOVED, still_installed
from hfcheck.analyzer.sources import ModelSource, resolve

FIXTURES = Path(__file__).parent / "fixtures" / "remote"
PACKAGES = ("compliant", "legacy", "fused_wqkv", "experts", "two_lists", "hostile")
EXPECT = re.compile(r"#\s*expect:\s*((?:HFC\d{3}\s*)+)$")


def expected(package: str) -> Counter:
    out: Counter = Counter()
    for path in sorted((FIXTURES / package).glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = EXPECT.search(line)
            if match:
                for code in match.group(1).split():
                    out[(code, path.name, number)] += 1
    return out


def found(package: str) -> Counter:
    source = resolve(str(FIXTURES / package))
    return Counter((f["code"], f["file"], f["line"]) for f in code_findings(source))


def by_line(package: str) -> dict[tuple[str, int], dict]:
    source = resolve(str(FIXTURES / package))
    return {(f["code"], f["line"]): f for f in code_findings(source)}


# --------------------------------------------------------------------------- static analysis


@pytest.mark.parametrize("package", PACKAGES)
def test_every_finding_is_annotated_and_every_annotation_found(package):
    assert found(package) == expected(package)


def test_compliant_passes_every_check():
    source = resolve(str(FIXTURES / "compliant"))
    findings = static_findings(source)
    assert code_findings(source) == []
    passed = {f.code for f in findings if f.status == "pass"}
    for code in ("HFC800", "HFC801", "HFC802", "HFC803", "HFC804", "HFC805", "HFC806", "HFC807", "HFC809", "HFC810", "HFC811", "HFC812", *(f"HFC82{i}" for i in range(6))):
        assert code in passed, code


def test_legacy_findings_say_why():
    lines = by_line("legacy")
    assert "softmax(Q K^T) V by hand" in lines[("HFC803", 76)]["message"]
    assert "scaled_dot_product_attention" in lines[("HFC803", 88)]["message"]
    assert lines[("HFC805", 114)]["status"] == "fail"  # no flag and the source test fails
    mask_utils = lines[("HFC811", 14)]
    assert "5.24" in mask_utils["message"] and "5.23" in mask_utils["message"]
    # judged where the code runs: vLLM 0.34.0 pins transformers <5.23, which still has it (a warning),
    # whatever transformers hfcheck itself runs on
    assert mask_utils["status"] == "warn" and "vLLM 0.34.0's transformers >=5.16.1,<5.23.0" in mask_utils["message"]
    assert lines[("HFC811", 13)]["status"] == "fail" and "HybridCache" in lines[("HFC811", 13)]["message"]
    assert lines[("HFC811", 72)]["status"] == "warn"  # a Cache method: fails only when that path runs
    flash = lines[("HFC812", 23)]  # not in vLLM 0.34.0's dependencies, installed here or not
    assert flash["status"] == "fail" and "flash_attn" in flash["message"] and "vLLM 0.34.0's environment" in flash["message"]


def test_blocks_inside_a_sequential_and_einsum_attention_are_found():
    """MixFormer-style code (the ``sequential`` fixture): the decoder blocks are the repeated
    ones inside an ``nn.Sequential`` beside the embedding and the head, their attention is the
    ``mixer`` (class ``MHA``, no "Attention" in its name), computed by hand with two einsums
    whose equations transpose K (no ``.transpose`` call to see)."""
    lines = by_line("sequential")
    assert lines[("HFC801", 53)]["status"] == "fail" and lines[("HFC801", 53)]["message"].startswith("MHA.forward does not dispatch")
    assert lines[("HFC803", 60)]["status"] == "fail" and "softmax(Q K^T) V by hand" in lines[("HFC803", 60)]["message"]
    assert not any(code == "HFC801" and "no attention module found" in f["message"] for (code, _), f in lines.items())


def test_experts_findings_name_the_problem():
    lines = by_line("experts")
    assert "named `experts`" in lines[("HFC808", 91)]["message"]
    assert "2-D parameter" in lines[("HFC808", 109)]["message"]
    assert "weights before indices" in lines[("HFC808", 113)]["message"]


def test_hostile_red_flags_at_import_time_fail_and_in_functions_warn():
    lines = by_line("hostile")
    for code, line in (("HFC820", 32), ("HFC822", 36), ("HFC824", 40), ("HFC821", 45)):
        assert lines[(code, line)]["status"] == "fail", (code, line)
        assert "at import time" in lines[(code, line)]["message"]
    for code, line in (("HFC820", 55), ("HFC823", 60), ("HFC823", 64), ("HFC822", 68), ("HFC824", 72)):
        assert lines[(code, line)]["status"] == "warn", (code, line)


def test_fixtures_match_the_removed_api_table_on_this_transformers():
    """The table's claims about the installed transformers hold (5.24: everything gone)."""
    import transformers

    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    for api in REMOVED:
        gone = tuple(int(x) for x in api.gone_in.split("."))
        assert still_installed(api) == (major_minor < gone), api.label


@pytest.mark.parametrize("package", PACKAGES)
def test_import_scan_matches_transformers_get_imports(package):
    """Our get_imports (with line numbers) agrees with transformers' own on every file."""
    from transformers.dynamic_module_utils import get_imports

    for path in sorted((FIXTURES / package).glob("*.py")):
        index = CodeIndex({path.name: path.read_text()})
        assert sorted(unguarded_imports(index.files[path.name])) == get_imports(path), path.name


def test_no_remote_code_gives_no_findings(tmp_path):
    source = resolve(str(write_model(tmp_path / "qwen3", "qwen3")))
    assert static_findings(source) is None
    assert code_findings(source) == []


def _source(config: dict, files: dict[str, str], missing: tuple[str, ...] = ()) -> ModelSource:
    return ModelSource("x", "local", None, None, config, None, files, missing, None, None)


def test_missing_code_is_inconclusive_and_syntax_errors_fail():
    config = {"model_type": "x", "auto_map": {"AutoModel": "modeling_x.XModel"}}
    missing = _source(config, {}, ("modeling_x.py: not in the HF cache (HF_HUB_OFFLINE=1)",))
    (only,) = code_findings(missing)
    assert only["code"] == "HFC800" and only["status"] == "inconclusive" and "not in the HF cache" in only["message"]
    broken = _source(config, {"modeling_x.py": "import torch\n\ndef f(:\n    pass\n"})
    failures = [f for f in code_findings(broken) if f["code"] == "HFC800"]
    assert failures == [{"code": "HFC800", "file": "modeling_x.py", "line": 3, "message": failures[0]["message"], "status": "fail", "remediation": failures[0]["remediation"]}]


def test_each_family_documents_exactly_the_codes_its_checks_report():
    """analyzer/remote/checks/: one module per check family, the rules documenting its codes
    beside the checks that report them (no code reported in one module, documented in another)."""
    import inspect

    from hfcheck.analyzer.remote import checks
    from hfcheck.analyzer.rules.remote_code import REMOTE_CODE_RULES

    seen: list[str] = []
    for family in checks.FAMILIES:
        documented = {rule.code for rule in family.RULES}
        reported = set(re.findall(r'"(HFC8\d\d)"', inspect.getsource(family)))
        assert documented and reported == documented, (family.__name__, sorted(reported), sorted(documented))
        seen += documented
    assert len(seen) == len(set(seen))
    assert sorted(seen) == [r.code for r in checks.RULES] == [r.code for r in REMOTE_CODE_RULES if r.code != "HFC830"]


def test_rules_document_themselves_and_carry_file_and_line():
    from hfcheck.analyzer.rules.registry import BY_CODE
    from hfcheck.analyzer.rules.remote_code import REMOTE_CODE_RULES

    codes = [rule.code for rule in REMOTE_CODE_RULES]
    assert len(set(codes)) == len(codes) and all(re.fullmatch(r"HFC8\d\d", c) for c in codes)
    assert set(codes) <= set(BY_CODE)  # registered with the other rules
    for rule in REMOTE_CODE_RULES:
        doc = rule.documentation()
        assert rule.code in doc and rule.what and rule.why and rule.example and rule.fix
    legacy = resolve(str(FIXTURES / "legacy"))
    analysis = SimpleNamespace(source=legacy, code=static_findings(legacy))  # as analyse() fills it
    findings = [f for rule in REMOTE_CODE_RULES for f in rule().check(analysis)]
    problems = [f for f in findings if f.status != "pass"]
    assert Counter((f.code, f.details["file"], f.details["line"]) for f in problems) == expected("legacy")
    assert all(f.remediation for f in problems if f.status in ("fail", "warn"))
    plain = SimpleNamespace(source=_source({"model_type": "qwen3"}, {}), code=None)  # no remote code: analyse() leaves it None
    assert [f for rule in REMOTE_CODE_RULES for f in rule().check(plain)] == []


# --------------------------------------------------------------------------- never executed without the flag


def _listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    return server


def _hostile_copy(tmp_path: Path, port: int, hang: bool = False) -> tuple[Path, Path]:
    folder = tmp_path / "hostile"
    shutil.copytree(FIXTURES / "hostile", folder)
    marker = tmp_path / "marker"
    path = folder / "modeling_hostile.py"
    text = path.read_text()
    for old, new in (("PORT = 9", f"PORT = {port}"), ('MARKER = "/nonexistent/hfcheck-hostile-marker"', f"MARKER = {str(marker)!r}"), ("HANG = False", f"HANG = {hang}")):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return folder, marker


def _nothing_connected(server: socket.socket) -> bool:
    try:
        server.accept()
    except BlockingIOError:
        return True
    return False


def test_hostile_code_never_runs_without_the_flag(tmp_path):
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report

    server = _listener()
    try:
        folder, marker = _hostile_copy(tmp_path, server.getsockname()[1])
        source = resolve(str(folder))
        report = build_report(analyse(source))
        findings = code_findings(source)
        assert report["model"]["remote_code"] is True
        assert {("HFC820", 32), ("HFC822", 36), ("HFC824", 40), ("HFC821", 45)} <= {(f["code"], f["line"]) for f in findings}
        assert not marker.exists() and not Path(f"{marker}.shell").exists()
        assert _nothing_connected(server)
        assert os.environ.get("HFCHECK_HOSTILE") is None
        assert not any("hostile" in name for name in sys.modules)
    finally:
        server.close()


# --------------------------------------------------------------------------- the sandbox (--trust-remote-code)


def _fusions(modules) -> dict[str, list[str]]:
    out: dict[str, set] = {}
    for m in modules:
        if m.fusions:
            out.setdefault(m.cls, set()).update(m.fusions)
    return {k: sorted(v) for k, v in out.items()}


def test_sandbox_builds_compliant_like_native_llama(tmp_path):
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.analysis.sandbox import run_sandboxed

    result = run_sandboxed(resolve(str(FIXTURES / "compliant")), timeout=300)
    assert result.ok, (result.error, result.stderr_tail)
    assert result.blocked == []
    assert result.gate_passes is True
    assert result.class_facts["AutoModel"] == {"class": "CompliantModel", "supports_attention_backend": True, "source_gate": True}
    native = analyse(resolve(str(write_model(tmp_path / "llama", "llama"))))
    remote = {k.replace("Compliant", ""): v for k, v in _fusions(result.observations.modules).items()}
    llama = {k.replace("Llama", ""): v for k, v in _fusions(native.observations.modules).items()}
    assert remote == llama == {"Attention": ["qkv"], "MLP": ["glu"], "RMSNorm": ["rms_norm"]}
    assert result.observations.attention_by_layer == {0: ["layers.0.self_attn"]}
    assert result.observations.decoder_module_lists == ["layers"]
    assert result.facts.num_layers == 2 and result.facts.head_dim == 64
    # the skeleton answers the size and memory questions the rules ask of an instance
    model = result.instance.model
    assert type(model).__name__ == "CompliantModel" and result.instance.kept_layers == 1
    assert model.get_submodule("layers.0.mlp.gate_proj").out_features == 512
    assert sum(p.numel() for p in model.parameters()) == 1024 * 256 + 4 * 256 * 256 - 2 * 256 * 128 + 3 * 256 * 512 + 3 * 256


def test_sandbox_confirms_the_unreadable_wqkv_split():
    from hfcheck.analyzer.analysis.sandbox import run_sandboxed

    result = run_sandboxed(resolve(str(FIXTURES / "fused_wqkv")), timeout=300)
    assert result.ok, (result.error, result.stderr_tail)
    attention = next(m for m in result.observations.modules if m.cls == "FusedAttention")
    assert attention.attention and not {"qkv", "packed_qkv"} & set(attention.fusions)
    assert _fusions(result.observations.modules) == {"FusedMLP": ["glu"], "FusedRMSNorm": ["rms_norm"]}


def test_sandbox_blocks_network_processes_and_writes(tmp_path):
    from hfcheck.analyzer.analysis.sandbox import run_sandboxed

    server = _listener()
    try:
        folder, marker = _hostile_copy(tmp_path, server.getsockname()[1])
        result = run_sandboxed(resolve(str(folder)), timeout=300)
        assert result.ok, (result.error, result.stderr_tail)  # the module swallows the refusals and builds
        assert _nothing_connected(server)
        assert not marker.exists() and not Path(f"{marker}.shell").exists()
        kinds = " | ".join(result.blocked)
        assert f"('127.0.0.1', {server.getsockname()[1]})" in kinds
        assert f"write outside the sandbox: '{marker}'" in kinds
        assert "process: os.system" in kinds
        assert os.environ.get("HFCHECK_HOSTILE") is None  # the child's environment, not ours
    finally:
        server.close()


def test_sandbox_kills_a_hanging_child(tmp_path):
    from hfcheck.analyzer.analysis.sandbox import run_sandboxed

    folder, _ = _hostile_copy(tmp_path, 9, hang=True)
    start = time.monotonic()
    result = run_sandboxed(resolve(str(folder)), timeout=15)
    assert result.timed_out and not result.ok and "did not finish within 15 s" in result.error
    assert time.monotonic() - start < 45


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_result_unpickler_refuses_code(tmp_path):
    from hfcheck.analyzer.analysis.sandbox import _read_result

    marker = tmp_path / "pwned"
    path = tmp_path / "result.pkl"
    path.write_bytes(pickle.dumps({"error": None, "observations": _Payload(marker)}))
    outcome = _read_result(path)
    assert isinstance(outcome, str) and "refused" in outcome and "system" in outcome
    assert not marker.exists()


def test_static_failures_become_notes_when_the_built_model_decides():
    from hfcheck.analyzer.remote.checks.pipeline import PipelineModuleLists

    source = resolve(str(FIXTURES / "two_lists"))
    (static,) = PipelineModuleLists().check(SimpleNamespace(source=source, code=static_findings(source)))
    assert static.status == "fail" and static.impact == "parallel"
    built = SimpleNamespace(source=source, code=static_findings(source), sandbox=SimpleNamespace(ok=True), observations=object())
    (noted,) = PipelineModuleLists().check(built)
    assert noted.status == "info" and "HFC601 decides" in noted.message and noted.details["line"] == static.details["line"]


def test_skeleton_rebuild_refuses_malformed_data():
    from hfcheck.analyzer.analysis.sandbox import rebuild

    model = rebuild([("", "Tiny", "module", {}), ("proj", "Linear", "linear", {"in": 4, "out": 8, "bias": False, "dtype": "torch.bfloat16"}),
                     ("w", "Parameter", "param", {"shape": (2, 3, 4), "dtype": "torch.float32"})])
    assert type(model).__name__ == "Tiny" and model.proj.out_features == 8 and model.w.shape == (2, 3, 4) and model.w.is_meta
    for bad in ([], [("a.b", "X", "module", {})], [("", "X", "module", {}), ("p", "P", "param", {"shape": (-1,)})],
                [("", "X", "module", {}), ("l", "L", "linear", {"in": "4", "out": 8})], [("", "X", "exec", {})]):
        with pytest.raises(ValueError):
            rebuild(bad)
