"""Model authors' CI: SARIF and GitHub annotations, policy files, the pre-commit hook, the
GitHub Action, the generated check list, and --cross-check when vLLM is absent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import write_model
from jsonschema import Draft4Validator

from hfcheck.analyzer.render.github import render_github
from hfcheck.analyzer.render.sarif import problems, render_sarif
from hfcheck.analyzer.report.policy import DEFAULT_POLICY, PolicyError, load_policy, parse_policy
from hfcheck.analyzer.rules.registry import RULES

ROOT = Path(__file__).resolve().parents[1]
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def blocked(tmp_path_factory):
    """(folder, analysis, report): a small qwen3 whose architecture transformers does not know:
    HFC101 fails (blocker), HFC102 is inconclusive, HFC302 warns (relu has no fused act-and-mul
    kernel: the MLP only merges). TP 8 with 4 heads is only noted: native vLLM refuses it too."""
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    folder = write_model(tmp_path_factory.mktemp("models") / "my-model", "qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         hidden_size=128, intermediate_size=256, num_hidden_layers=2, hidden_act="relu")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MyNewLMForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    analysis = analyse(resolve(str(folder)))
    return folder, analysis, build_report(analysis)


def statuses(report):
    return {c["code"]: c["status"] for c in report["checks"]}


def with_code_findings(report):
    """The report as the remote-code analysis will shape it: code_findings, and checks whose
    details carry file/line (one of them the same finding as a code finding)."""
    out = json.loads(json.dumps(report))
    out["checks"].append({"code": "HFC801", "status": "fail", "impact": "blocker", "message": "ALL_ATTENTION_FUNCTIONS is never used",
                          "remediation": "Dispatch through ALL_ATTENTION_FUNCTIONS", "details": {"file": "modeling_x.py", "line": 42}})
    out["code_findings"] = [
        {"code": "HFC801", "file": "modeling_x.py", "line": 42, "message": "ALL_ATTENTION_FUNCTIONS is never used", "status": "fail"},
        {"code": "HFC899", "file": "sub/configuration_x.py", "line": 7, "message": "a: b, c\nd 100%", "status": "warn"},
    ]
    return out


# --- SARIF --------------------------------------------------------------------------------


def test_sarif_validates_against_the_official_schema(blocked):
    _, _, report = blocked
    log = render_sarif(report, model_dir="models/my-model")
    Draft4Validator.check_schema(SARIF_SCHEMA)
    errors = sorted(Draft4Validator(SARIF_SCHEMA).iter_errors(log), key=str)
    assert not errors, errors[0]
    run = log["runs"][0]
    assert log["version"] == "2.1.0" and run["tool"]["driver"]["name"] == "hfcheck"
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert by_rule["HFC101"]["level"] == "error" and by_rule["HFC302"]["level"] == "warning" and by_rule["HFC102"]["level"] == "note"
    loc = by_rule["HFC101"]["locations"][0]["physicalLocation"]
    assert loc == {"artifactLocation": {"uri": "models/my-model/config.json"}, "region": {"startLine": 1}}
    assert "HFC103" not in by_rule  # info and pass are not results
    assert run["properties"]["verdict"] == "blocked"


def test_sarif_rules_are_the_registry_with_help(blocked):
    log = render_sarif(blocked[2])
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in RULES]
    for descriptor, rule in zip(rules, RULES):
        assert descriptor["help"]["text"] == rule.documentation()
        assert rule.fix in descriptor["help"]["markdown"]
        assert descriptor["shortDescription"]["text"] == rule.what
    for result in log["runs"][0]["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


def test_sarif_locates_code_findings_at_file_and_line(blocked):
    report = with_code_findings(blocked[2])
    log = render_sarif(report, model_dir="my-model")
    assert not list(Draft4Validator(SARIF_SCHEMA).iter_errors(log))
    results = log["runs"][0]["results"]
    located = [(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
               for r in results]
    assert located.count(("HFC801", "my-model/modeling_x.py", 42)) == 1  # check and code finding: one result
    assert ("HFC899", "my-model/sub/configuration_x.py", 7) in located
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert "HFC899" in [r["id"] for r in rules]  # a code the registry does not document still has a rule


def test_sarif_default_model_dir_is_the_folder_as_scanned(blocked, monkeypatch):
    folder, _, report = blocked
    monkeypatch.chdir(folder.parent)
    report = dict(report, model=dict(report["model"], ref=str(folder)))
    uris = {p.file for p in problems(report)}
    assert uris == {"my-model/config.json"}


# --- GitHub annotations ---------------------------------------------------------------------


def test_github_annotations(blocked):
    report = with_code_findings(blocked[2])
    text = render_github(report, model_dir="my-model")
    lines = text.splitlines()
    assert "::error file=my-model/config.json,line=1,title=HFC101 transformers-class-found::" in text
    assert any(line.startswith("::warning file=my-model/config.json,line=1,title=HFC302 glu-fusion::") for line in lines)
    assert any(line.startswith("::notice file=my-model/config.json,line=1,title=HFC102 ") and "inconclusive" in line for line in lines)
    assert sum(line.startswith("::error file=my-model/modeling_x.py,line=42,") for line in lines) == 1
    # message escaping: newline and % in the data; ":" and "," only in properties
    (custom,) = [line for line in lines if "HFC899" in line]
    assert custom == "::warning file=my-model/sub/configuration_x.py,line=7,title=HFC899::a: b, c%0Ad 100%25"
    assert lines[-1].startswith("hfcheck: ") and "BLOCKED" in lines[-1] and "2 errors" in lines[-1]
    for line in lines[:-1]:
        assert re.match(r"^::(error|warning|notice) file=[^,]+,line=\d+,title=[^:]+::.+$", line), line


# --- policy ---------------------------------------------------------------------------------


def test_policy_selection_changes_the_exit_code(blocked, tmp_path):
    _, _, report = blocked
    assert statuses(report)["HFC101"] == "fail"
    assert DEFAULT_POLICY.exit_code(report) == 1

    ignore = tmp_path / "ignore.toml"
    ignore.write_text('ignore = ["HFC101"]\n')
    policy = load_policy(ignore)
    applied = policy.apply(report)
    assert "HFC101" not in statuses(applied) and applied["policy"]["ignored"] == ["HFC101"]
    assert policy.exit_code(applied) == 0
    assert applied["policy"]["score"] == 100 - 5 - 4  # HFC102 inconclusive, HFC302 warning
    assert applied["score"] == report["score"] == 20  # hfcheck's own score is not rewritten
    assert policy.exit_code(applied, fail_under=95) == 1  # the command line's gate wins

    enforce = tmp_path / "enforce.yaml"
    enforce.write_text("hfcheck:\n  enforce: [HFC5*]\n")
    policy = load_policy(enforce)
    applied = policy.apply(report)
    assert policy.exit_code(applied) == 0  # HFC101 still fails, but is not enforced
    levels = {r["ruleId"]: r["level"] for r in render_sarif(applied)["runs"][0]["results"]}
    assert levels["HFC101"] == "warning"
    assert "::warning file=config.json,line=1,title=HFC101" in render_github(applied, model_dir="")

    strict = parse_policy({"enforce": ["HFC1*"], "fail-on": ["inconclusive"]})
    assert strict.exit_code(strict.apply(report)) == 1  # HFC102 is inconclusive
    assert parse_policy({"fail_under": 30}).exit_code(report) == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("ignore = 3\n", "must be a list"),
        ('ignore = ["HFC999"]\n', "unknown check code"),
        ('ignore = ["E501"]\n', "not a check code"),
        ("fail-under = 120\n", "fail-under"),
        ('fail-on = ["pass"]\n', "fail-on"),
        ("enforse = []\n", "unknown key"),
        ("ignore = [\n", "not valid TOML"),
    ],
)
def test_policy_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_policy_file_types(tmp_path):
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.toml")
    other = tmp_path / "policy.ini"
    other.write_text("x")
    with pytest.raises(PolicyError, match=r"\.toml, \.yaml or \.yml"):
        load_policy(other)


# --- pre-commit, GitHub Action, docs --------------------------------------------------------


def test_pre_commit_hooks_parse_and_match_model_files():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert isinstance(hooks, list) and {h["id"] for h in hooks} == {"hfcheck", "hfcheck-system"}
    for hook in hooks:
        assert {"id", "name", "entry", "language"} <= set(hook)
        assert hook["entry"] == "hfcheck scan" and hook["pass_filenames"] is False
        files = re.compile(hook["files"])
        for path in ("config.json", "my-model/config.json", "modeling_foo.py", "m/configuration_foo.py"):
            assert files.search(path), path
        for path in ("generation_config.json", "README.md", "tokenizer.json", "foo_modeling_x.py", "train.py"):
            assert not files.search(path), path


def test_action_parses_and_uploads_sarif():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert {"model-path", "policy", "fail-under", "upload-sarif"} <= set(action["inputs"])
    steps = action["runs"]["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    upload = next(s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif@"))
    assert upload["with"]["sarif_file"] == "${{ inputs.sarif-file }}"
    scripts = [s["run"] for s in steps if "run" in s]
    assert any("--format sarif" in s for s in scripts) and any("--format github" in s for s in scripts)
    for script in scripts:
        assert all(s.get("shell") == "bash" for s in steps if "run" in s)
        check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_checks_doc_is_up_to_date():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_checks_doc.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = (ROOT / "docs" / "checks.md").read_text()
    for rule in RULES:
        assert f"### {rule.code}" in doc


# --- cross-check ----------------------------------------------------------------------------


def test_cross_check_unavailable_without_vllm(blocked, monkeypatch):
    from hfcheck.analyzer.analysis import crosscheck

    _, analysis, report = blocked
    if crosscheck.installed_vllm_version() is None:
        cc = crosscheck.cross_check(analysis, report)
        assert cc == {"available": False, "vllm_version": None, "agrees": None, "differences": [], "note": "cross-check unavailable: vLLM not installed"}
    monkeypatch.setattr(crosscheck, "installed_vllm_version", lambda: "0.34.1")
    cc = crosscheck.cross_check(analysis, report)
    assert not cc["available"] and cc["agrees"] is None and cc["vllm_version"] == "0.34.1"
    assert crosscheck.summary_line(cc) == ("cross-check unavailable for vLLM 0.34.1 (the cross-check reads the code of a modelled release: "
                                           "0.32.0, 0.33.0, 0.34.0)")
    from jsonschema import validate

    validate(cc, crosscheck.CROSS_CHECK_SCHEMA)


def test_crosscheck_gate_fails_on_unlisted_differences(tmp_path):
    def side(chosen):
        return {"_meta": {}, "llama": {"modules": {"mlp": {"cls": "LlamaMLP", "candidates": ["glu"], "chosen": chosen}}, "attention_by_layer": {}, "moe": {}}}

    (tmp_path / "v.json").write_text(json.dumps(side(["glu"])))
    (tmp_path / "h.json").write_text(json.dumps(side([])))
    known = tmp_path / "known.toml"
    gate = [sys.executable, str(ROOT / "scripts" / "crosscheck" / "gate.py"), str(tmp_path / "v.json"), str(tmp_path / "h.json"), "--known", str(known)]
    known.write_text("difference = []\n")
    run = subprocess.run(gate, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "NOT LISTED: chosen:llama:LlamaMLP" in run.stdout
    known.write_text('[[difference]]\nid = "chosen:llama:LlamaMLP"\nreason = "a test"\n')
    assert subprocess.run(gate, capture_output=True, text=True, timeout=120).returncode == 0
    known.write_text('[[difference]]\nid = "chosen:llama:LlamaMLP"\n')
    run = subprocess.run(gate, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "no reason" in (run.stdout + run.stderr)
    # the committed file reads, and every entry has its reason
    committed = subprocess.run([*gate[:4], "--known", str(ROOT / "scripts" / "crosscheck" / "known_differences.toml")], capture_output=True, text=True, timeout=120)
    assert "gate:" in committed.stdout


# --- the command (once `--format sarif|github`, `--policy`, `--cross-check` are wired) --------


def _wired() -> bool:
    from hfcheck.cli import build_parser

    return "--policy" in build_parser()._subparsers._group_actions[0].choices["scan"].format_help()


needs_cli = pytest.mark.skipif(not _wired(), reason="hfcheck scan --format sarif|github / --policy / --cross-check not wired into hfcheck/cli.py yet")


@needs_cli
def test_cli_sarif_github_policy_cross_check(blocked, tmp_path):
    import os

    folder = blocked[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}

    def hfcheck(*args):
        return subprocess.run([sys.executable, "-m", "hfcheck", "scan", str(folder), *args], capture_output=True, text=True, env=env, timeout=300, cwd=folder.parent)

    sarif = hfcheck("--format", "sarif")
    assert sarif.returncode == 1, sarif.stderr
    assert not list(Draft4Validator(SARIF_SCHEMA).iter_errors(json.loads(sarif.stdout)))
    gh = hfcheck("--format", "github")
    assert gh.returncode == 1 and "::error file=" in gh.stdout
    policy = tmp_path / "policy.toml"
    policy.write_text('ignore = ["HFC101"]\n')
    assert hfcheck("--policy", str(policy), "--format", "json").returncode == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("nope = 1\n")
    run = hfcheck("--policy", str(bad))
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    from hfcheck.analyzer.analysis.crosscheck import installed_vllm_version

    if installed_vllm_version() is None:
        run = hfcheck("--cross-check", "--format", "json")
        assert run.stderr.strip().splitlines()[-1] == "cross-check unavailable: vLLM not installed"
        assert json.loads(run.stdout)["cross_check"]["available"] is False


REMOTE_FIXTURES = ROOT / "tests" / "fixtures" / "remote"


@pytest.mark.skipif(not REMOTE_FIXTURES.is_dir(), reason="no remote-code fixtures")
def test_sarif_of_remote_code_models_is_located_in_the_code(monkeypatch):
    """Real remote-code analysis: every located code finding becomes a result at its file:line."""
    from hfcheck.analyzer.analysis import analyse
    from hfcheck.analyzer.report import build_report
    from hfcheck.analyzer.sources import resolve

    monkeypatch.chdir(REMOTE_FIXTURES)
    seen_code = 0
    for folder in sorted(p for p in REMOTE_FIXTURES.iterdir() if (p / "config.json").is_file()):
        report = build_report(analyse(resolve(folder.name)))
        log = render_sarif(report)
        errors = list(Draft4Validator(SARIF_SCHEMA).iter_errors(log))
        assert not errors, (folder.name, errors[0])
        uris = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
                for r in log["runs"][0]["results"]}
        for f in report.get("code_findings") or []:
            if f.get("file") and f.get("line"):
                assert (f"{folder.name}/{f['file']}", f["line"]) in uris
                seen_code += 1
        assert render_github(report).endswith("\n")
    assert seen_code > 0  # the fixtures hold non-compliant code, found at file:line
