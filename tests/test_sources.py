"""hfcheck.analyzer.sources against real files, a real HF cache layout and a real HTTP endpoint.

No network and no mocks: local folders are built in tmp_path; Hub references run through the
real huggingface_hub code in a subprocess (it reads HF_* variables at import time) against a
hand-built cache in offline mode, or against a tiny Hub-compatible server on 127.0.0.1 set as
HF_ENDPOINT, which answers with the same status codes and X-Error-Code headers as the Hub.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from hfcheck.analyzer.sources import ModelSource, SourceError, bundled_repo_ids, resolve
from hfcheck.analyzer.sources.bundled import BUNDLED_DIR
from hfcheck.analyzer.sources.code_files import MAX_CODE_BYTES

NEMOTRON = Path("/work/shared/fixtures/hub/nvidia__Nemotron-H-56B-Base-8K/config.json")
SHA_MAIN = "a" * 40
SHA_OLD = "b" * 40
SHA_REMOTE = "c" * 40

TINY_CONFIG = {"model_type": "tiny", "architectures": ["TinyForCausalLM"], "hidden_size": 8}


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def assert_one_line(exc: pytest.ExceptionInfo[SourceError]) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


# ---------------------------------------------------------------- local folders


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "my-model"
    write_json(folder / "config.json", TINY_CONFIG)
    return folder


def test_local_good_config(model_dir: Path) -> None:
    write_json(model_dir / "generation_config.json", {"temperature": 0.6})
    source = resolve(str(model_dir))
    assert isinstance(source, ModelSource)
    assert (source.kind, source.repo_id, source.revision, source.note) == ("local", None, None, None)
    assert source.config == TINY_CONFIG
    assert source.generation_config == {"temperature": 0.6}
    assert source.code_files == {} and source.missing_code == ()
    assert source.location == str(model_dir.resolve())


def test_local_relative_and_home_paths(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(model_dir.parent)
    assert resolve("./my-model").config == TINY_CONFIG
    assert resolve("my-model").kind == "local"  # an existing directory wins over a Hub id
    monkeypatch.setenv("HOME", str(model_dir.parent))
    assert resolve("~/my-model").location == str(model_dir.resolve())


def test_local_broken_generation_config_counts_as_absent(model_dir: Path) -> None:
    (model_dir / "generation_config.json").write_text("{nope", encoding="utf-8")
    assert resolve(str(model_dir)).generation_config is None


def test_local_without_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError) as exc:
        resolve(str(tmp_path / "empty"))
    assert "no config.json in" in assert_one_line(exc)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, found a JSON array"),
        ('{"hidden_size": 8}', 'neither "model_type" nor "architectures"'),
    ],
)
def test_local_bad_config(model_dir: Path, content: str, expected: str) -> None:
    (model_dir / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(SourceError) as exc:
        resolve(str(model_dir))
    text = assert_one_line(exc)
    assert expected in text and "config.json" in text


def test_local_config_with_infinity(tmp_path: Path) -> None:
    folder = tmp_path / "nemotron"
    folder.mkdir()
    shutil.copy(NEMOTRON, folder / "config.json")
    source = resolve(str(folder))
    assert source.config["model_type"] == "nemotron_h"
    assert math.isinf(source.config["time_step_limit"][1])
    assert len(source.missing_code) == 2  # its auto_map .py files are not in the folder
    assert all("not found in the model folder" in line for line in source.missing_code)


def _write_remote_code(folder: Path) -> None:
    sentinel = folder.parent / "EXECUTED"
    (folder / "configuration_x.py").write_text("class XConfig: pass\n", encoding="utf-8")
    (folder / "modeling_x.py").write_text(
        f"open({str(sentinel)!r}, 'w').write('ran')\nfrom .utils_x import y\nclass XForCausalLM: pass\n",
        encoding="utf-8",
    )
    (folder / "utils_x.py").write_text("from .deep.helpers import z\ny = 1\n", encoding="utf-8")
    (folder / "deep").mkdir()
    (folder / "deep" / "helpers.py").write_text("from .gone import w\nz = 2\n", encoding="utf-8")


def test_local_auto_map_with_relative_imports(model_dir: Path) -> None:
    _write_remote_code(model_dir)
    config = {
        **TINY_CONFIG,
        "auto_map": {
            "AutoConfig": "configuration_x.XConfig",
            "AutoModel": "modeling_x.XForCausalLM",
            "AutoModelForCausalLM": "modeling_x.XForCausalLM",
            "AutoTokenizer": ["tokenization_x.XTokenizer", None],
        },
    }
    write_json(model_dir / "config.json", config)
    source = resolve(str(model_dir))
    assert set(source.code_files) == {"configuration_x.py", "modeling_x.py", "utils_x.py", "deep/helpers.py"}
    assert "from .utils_x import y" in source.code_files["modeling_x.py"]
    assert source.missing_code == (
        "deep/gone.py: not found in the model folder (imported by deep/helpers.py)",
    )
    assert not (model_dir.parent / "EXECUTED").exists()  # read, never run


def test_local_auto_map_refuses_traversal(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "evil.py").write_text("x = 1\n", encoding="utf-8")
    (model_dir / "modeling_x.py").write_text("from ..evil import x\n", encoding="utf-8")
    config = {
        **TINY_CONFIG,
        "auto_map": {
            "AutoConfig": "../evil.Evil",
            "AutoModel": "/etc/passwd.Evil",
            "AutoModelForCausalLM": "modeling_x.XForCausalLM",
            "AutoModelForMaskedLM": "too.many.dots.Cls",
        },
    }
    write_json(model_dir / "config.json", config)
    source = resolve(str(model_dir))
    assert set(source.code_files) == {"modeling_x.py"}
    lines = "\n".join(source.missing_code)
    assert "../evil.Evil: refused: path traversal" in lines
    assert "/etc/passwd.Evil: refused: absolute path" in lines
    assert "modeling_x.py: import of ..evil: refused: relative import climbs out" in lines
    assert "too.many.dots.Cls: malformed" in lines
    assert len(source.missing_code) == 4


def test_local_symlink_outside_is_refused(model_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.py"
    outside.write_text("TOKEN = 'hf_secret'\n", encoding="utf-8")
    (model_dir / "modeling_x.py").symlink_to(outside)
    (model_dir / "real_config.py").write_text("class C: pass\n", encoding="utf-8")
    (model_dir / "configuration_x.py").symlink_to(model_dir / "real_config.py")  # inside: fine
    config = {**TINY_CONFIG, "auto_map": {"AutoConfig": "configuration_x.C", "AutoModel": "modeling_x.M"}}
    write_json(model_dir / "config.json", config)
    source = resolve(str(model_dir))
    assert source.code_files == {"configuration_x.py": "class C: pass\n"}
    assert len(source.missing_code) == 1
    assert source.missing_code[0].startswith("modeling_x.py: refused: symlink to ")
    assert "hf_secret" not in json.dumps(source.code_files)


def test_local_oversized_code_file_is_refused(model_dir: Path) -> None:
    (model_dir / "modeling_x.py").write_text("#" * (MAX_CODE_BYTES + 1), encoding="utf-8")
    write_json(model_dir / "config.json", {**TINY_CONFIG, "auto_map": {"AutoModel": "modeling_x.M"}})
    source = resolve(str(model_dir))
    assert source.code_files == {}
    assert "over the 5 MB limit" in source.missing_code[0]


@pytest.mark.parametrize(
    "ref", ["./does-not-exist", "../nope/nope", "/no/such/dir", "~/no-such-hfcheck-dir", "~no_such_user_x/m"]
)
def test_path_like_refs_that_are_not_folders(ref: str) -> None:
    with pytest.raises(SourceError) as exc:
        resolve(ref)
    assert "no such directory" in assert_one_line(exc)


def test_file_is_not_a_folder(model_dir: Path) -> None:
    with pytest.raises(SourceError) as exc:
        resolve(str(model_dir / "config.json"))
    assert "not a model folder" in assert_one_line(exc)


@pytest.mark.parametrize("ref", ["a/b/c/d", "bad id!", "org/na--me", "", "   ", "Qwen/Qwen3-4B@"])
def test_invalid_hub_ids(ref: str) -> None:
    with pytest.raises(SourceError) as exc:
        resolve(ref)
    assert_one_line(exc)


def test_bundled_snapshot_folder_matches_repo_ids() -> None:
    ids = bundled_repo_ids()
    assert "Qwen/Qwen3-4B" in ids and "nvidia/Nemotron-H-56B-Base-8K" in ids
    assert (BUNDLED_DIR / "README.md").is_file()


# ---------------------------------------------------------------- Hub through huggingface_hub

_RUNNER = """
import json, sys
from hfcheck.analyzer.sources import resolve, SourceError
out = []
for ref in sys.argv[1:]:
    try:
        s = resolve(ref)
    except SourceError as exc:
        out.append({"error": str(exc)})
    else:
        row = {k: getattr(s, k) for k in ("ref", "kind", "repo_id", "revision", "config",
               "generation_config", "code_files", "missing_code", "location", "note")}
        row["processor"] = {"present": list(s.processor.present), "configs": sorted(s.processor.configs),
                            "code": sorted(s.processor.code), "folder": s.processor.folder}
        out.append(row)
print(json.dumps(out))
"""


def run_resolve(tmp_path: Path, *refs: str, offline: bool = True, endpoint: str | None = None,
                token: str | None = None, cache: Path | None = None) -> list[dict]:
    """resolve() in a fresh interpreter, so huggingface_hub reads these HF_* variables at import."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_CACHE=str(cache or tmp_path / "hub_cache"),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    env["HF_ENDPOINT"] = endpoint or "http://127.0.0.1:9"  # never the real Hub
    if token:
        env["HF_TOKEN"] = token
    done = subprocess.run([sys.executable, "-c", _RUNNER, *refs], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cache_file(cache: Path, repo_id: str, sha: str, name: str, content: str, blob: bool = True) -> None:
    """One file in the cache layout hf_hub_download writes: snapshot symlink -> blobs/<hash>."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    target = repo / "snapshots" / sha / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if not blob:
        target.write_text(content, encoding="utf-8")
        return
    blob_path = repo / "blobs" / hashlib.sha256(content.encode()).hexdigest()
    blob_path.parent.mkdir(parents=True, exist_ok=True)
    blob_path.write_text(content, encoding="utf-8")
    target.symlink_to(os.path.relpath(blob_path, target.parent))


@pytest.fixture
def hf_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "hub_cache"
    refs = cache / "models--acme--tiny" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(SHA_MAIN)
    remote = {**TINY_CONFIG, "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig",
                                          "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}}
    _cache_file(cache, "acme/tiny", SHA_MAIN, "config.json", json.dumps(remote))
    _cache_file(cache, "acme/tiny", SHA_MAIN, "generation_config.json", '{"top_k": 20}')
    _cache_file(cache, "acme/tiny", SHA_MAIN, "modeling_tiny.py", "from .layers import L\n")
    _cache_file(cache, "acme/tiny", SHA_MAIN, "layers.py", "L = 1\n", blob=False)
    _cache_file(cache, "acme/tiny", SHA_OLD, "config.json", json.dumps({**TINY_CONFIG, "hidden_size": 4}))
    return cache


def test_hub_from_cache_offline(tmp_path: Path, hf_cache: Path) -> None:
    main, old, missing_rev = run_resolve(tmp_path, "acme/tiny", f"acme/tiny@{SHA_OLD}", f"acme/tiny@{'d' * 40}")
    assert main["kind"] == "hub" and main["repo_id"] == "acme/tiny"
    assert main["revision"] == SHA_MAIN and main["note"] is None
    assert main["config"]["hidden_size"] == 8 and main["generation_config"] == {"top_k": 20}
    assert main["location"].endswith(f"snapshots/{SHA_MAIN}")
    assert main["code_files"] == {"modeling_tiny.py": "from .layers import L\n", "layers.py": "L = 1\n"}
    assert main["missing_code"] == [
        "configuration_tiny.py: not in the HF cache and the Hub cannot be reached (HF_HUB_OFFLINE=1)"]

    assert old["kind"] == "hub" and old["revision"] == SHA_OLD
    assert old["config"]["hidden_size"] == 4 and old["generation_config"] is None

    assert "cannot reach the Hub (HF_HUB_OFFLINE=1) and no cached or bundled copy of acme/tiny" in missing_rev["error"]


def test_offline_empty_cache_uses_bundled_snapshot(tmp_path: Path) -> None:
    qwen, deepseek, nobody, pinned = run_resolve(
        tmp_path, "Qwen/Qwen3-4B", "deepseek-ai/DeepSeek-V3", "nobody/nothing", "Qwen/Qwen3-4B@v2")
    expected = json.loads((BUNDLED_DIR / "Qwen__Qwen3-4B" / "config.json").read_text())
    assert qwen["kind"] == "bundled" and qwen["repo_id"] == "Qwen/Qwen3-4B" and qwen["config"] == expected
    assert "bundled snapshot of Qwen/Qwen3-4B" in qwen["note"] and "HF_HUB_OFFLINE=1" in qwen["note"]
    assert sorted(deepseek["missing_code"]) == [
        "configuration_deepseek.py: not in the bundled snapshot and the Hub cannot be reached",
        "modeling_deepseek.py: not in the bundled snapshot and the Hub cannot be reached",
    ]
    assert nobody == {"error": "nobody/nothing: cannot reach the Hub (HF_HUB_OFFLINE=1) and no cached or "
                               "bundled copy of nobody/nothing"}
    assert "bundles the default branch only" in pinned["error"]


def test_bundled_lookup_is_case_sensitive(tmp_path: Path) -> None:
    (lower,) = run_resolve(tmp_path, "qwen/qwen3-4b")
    assert "no cached or bundled copy" in lower["error"]


# ---------------------------------------------------------------- a Hub-compatible endpoint


class _FakeHub(BaseHTTPRequestHandler):
    """Answers /<org>/<name>/resolve/<rev>/<file> like huggingface.co does (headers included)."""

    files = {"acme/tiny": {"config.json": json.dumps(TINY_CONFIG), "modeling_tiny.py": "x = 1\n"},
             "acme/gated": {"config.json": json.dumps(TINY_CONFIG)},
             "acme/no-config": {"README.md": "hi"},
             "Qwen/Qwen3-4B": {"config.json": json.dumps({**TINY_CONFIG, "from": "endpoint"})},
             "acme/vlm": {"config.json": json.dumps({**TINY_CONFIG, "architectures": ["LlavaForConditionalGeneration"]}),
                          "preprocessor_config.json": json.dumps({"processor_class": "LlavaProcessor",
                                                                  "auto_map": {"AutoProcessor": "processing_x.XProcessor"}}),
                          "processing_x.py": "class XProcessor:\n    pass\n",
                          "tokenizer.json": "{}",
                          "model.safetensors": "weights: never fetched"}}

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _answer(self, body: bool) -> None:
        parts = unquote(self.path.split("?")[0]).strip("/").split("/")
        repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        if repo_id == "acme/gated" and self.headers.get("authorization") != "Bearer hf_test":
            return self._error(403, "GatedRepo")
        if repo_id not in self.files:
            return self._error(401, "RepoNotFound")
        if revision not in ("main", SHA_REMOTE):
            return self._error(404, "RevisionNotFound")
        if filename not in self.files[repo_id]:
            return self._error(404, "EntryNotFound")
        data = self.files[repo_id][filename].encode()
        self.send_response(200)
        self.send_header("X-Repo-Commit", SHA_REMOTE)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Repo-Commit", SHA_REMOTE)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)


@pytest.fixture(scope="module")
def fake_hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_endpoint_download_then_offline_cache(tmp_path: Path, fake_hub: str) -> None:
    (online,) = run_resolve(tmp_path, "acme/tiny", offline=False, endpoint=fake_hub)
    assert online["kind"] == "hub" and online["revision"] == SHA_REMOTE
    assert online["config"] == TINY_CONFIG and online["generation_config"] is None
    # the download went into the normal cache: offline now serves the same files
    (offline,) = run_resolve(tmp_path, "acme/tiny")
    assert offline["kind"] == "hub" and offline["revision"] == SHA_REMOTE and offline["config"] == TINY_CONFIG


def test_endpoint_processor_files_then_offline_cache(tmp_path: Path, fake_hub: str) -> None:
    # processor configs, their remote code (as text) and the tokenizer come through hf_hub_download;
    # weights never do, and absent processor files are simply absent
    (online,) = run_resolve(tmp_path, "acme/vlm", offline=False, endpoint=fake_hub)
    assert online["processor"]["configs"] == ["preprocessor_config.json"]
    assert online["processor"]["code"] == ["processing_x.py"]
    assert "tokenizer.json" in online["processor"]["present"]
    assert online["processor"]["folder"] == online["location"]
    assert not list((tmp_path / "hub_cache").rglob("model.safetensors"))
    (offline,) = run_resolve(tmp_path, "acme/vlm")
    assert offline["processor"] == online["processor"]


def test_endpoint_errors_are_one_line(tmp_path: Path, fake_hub: str) -> None:
    gated, unknown, bad_rev, no_config = run_resolve(
        tmp_path, "acme/gated", "nobody/nothing", "acme/tiny@nope", "acme/no-config",
        offline=False, endpoint=fake_hub)
    assert gated["error"] == "acme/gated: acme/gated is gated: accept the license on the Hub and set HF_TOKEN"
    assert unknown["error"] == "nobody/nothing: nobody/nothing not found on the Hub (or private: set HF_TOKEN)"
    assert bad_rev["error"] == "acme/tiny@nope: revision 'nope' not found in acme/tiny"
    assert "no config.json in acme/no-config@main on the Hub" in no_config["error"]
    for answer in (gated, unknown, bad_rev, no_config):
        assert "\n" not in answer["error"]


def test_endpoint_honours_hf_token(tmp_path: Path, fake_hub: str) -> None:
    (gated,) = run_resolve(tmp_path, "acme/gated", offline=False, endpoint=fake_hub, token="hf_test")
    assert gated["kind"] == "hub" and gated["config"] == TINY_CONFIG


def test_endpoint_cross_repo_code(tmp_path: Path, fake_hub: str, model_dir: Path) -> None:
    config = {**TINY_CONFIG, "auto_map": {"AutoModel": "acme/tiny--modeling_tiny.M",
                                          "AutoConfig": "nobody/nothing--configuration_x.C"}}
    write_json(model_dir / "config.json", config)
    (local,) = run_resolve(tmp_path, str(model_dir), offline=False, endpoint=fake_hub)
    assert local["kind"] == "local"
    assert local["code_files"] == {"acme/tiny--modeling_tiny.py": "x = 1\n"}
    assert local["missing_code"] == [
        "nobody/nothing--configuration_x.py: nobody/nothing not found on the Hub (or private: set HF_TOKEN)"]


def test_network_failure_falls_back_to_bundled(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # huggingface_hub itself retries with backoff (~20 s) before giving up: one ref only
    (qwen,) = run_resolve(tmp_path, "Qwen/Qwen3-4B", offline=False, endpoint=dead)
    assert qwen["kind"] == "bundled" and qwen["note"].startswith("Hub unreachable (")
    assert "Connection refused" in qwen["note"] or "connect" in qwen["note"].lower()


class _NotAHub(BaseHTTPRequestHandler):
    """A proxy/captive portal: answers 200 to everything, without the Hub's headers."""

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD


def test_endpoint_that_is_not_a_hub(tmp_path: Path, hf_cache: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cached, qwen, nobody = run_resolve(tmp_path, "acme/tiny", "Qwen/Qwen3-4B", "nobody/nothing",
                                           offline=False, endpoint=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert cached["kind"] == "hub" and cached["revision"] == SHA_MAIN  # the cache still serves
    assert cached["missing_code"][0].startswith(
        "configuration_tiny.py: not in the HF cache and the Hub cannot be reached (")
    assert qwen["kind"] == "bundled"
    assert nobody["error"].startswith("nobody/nothing: cannot reach the Hub (")
    assert nobody["error"].endswith("no cached or bundled copy of nobody/nothing")
    assert "\n" not in nobody["error"]
