"""``hfcheck serve DIR``: smoke-serve a model folder with a real OpenAI-compatible server.

With vLLM importable and a GPU (``torch.cuda.is_available()``) the server is
``vllm serve DIR --model-impl transformers [--trust-remote-code]``; without, one line says so
and the same end-to-end check runs with ``transformers serve DIR`` on CPU. Either way:

1. the server starts as a subprocess in its own process group (``start_new_session``), its
   output going to a log file;
2. ``GET /health`` is polled until it answers 200 (or the process dies, or the time runs out);
3. one greedy completion is requested (``POST /v1/completions``, ``temperature=0``);
4. the server is stopped, always: SIGTERM to the whole group, SIGKILL after a grace period,
   also when anything fails and on Ctrl-C, and its absence is checked;
5. transformers' own greedy ``generate`` on the same prompt runs in a separate process (model
   code is never imported into hfcheck), and the tokens are compared: the server's token ids
   where it returns them (vLLM ``return_token_ids``), else its text and token count, with
   the text re-encoded by the model's tokenizer.

``transformers serve`` resolves a model class with ``getattr(transformers, architecture)``,
which a remote-code (``auto_map``) model does not have; for those the server is started
through a small launcher that registers the ``auto_map`` class under that name first and
then runs transformers' own CLI unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PROMPT = "the"
SERVED_NAME = "hfcheck-smoke"


@dataclass
class ServeResult:
    ok: bool
    backend: str
    note: str | None
    command: list[str]
    prompt: str
    max_tokens: int
    server_text: str | None = None
    server_token_ids: list[int] | None = None
    server_completion_tokens: int | None = None
    reference_text: str | None = None
    reference_token_ids: list[int] | None = None
    tokens_match: bool = False
    compared: str = ""
    error: str | None = None
    server_stopped: bool = False
    server_pid: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    log_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ServeError(Exception):
    pass


# ---------------------------------------------------------------------- backend choice


def choose_backend(requested: str = "auto") -> tuple[str, str | None]:
    """("vllm" | "transformers", the one-line note when vLLM cannot be used)."""
    if requested == "transformers":
        return "transformers", None
    has_vllm = importlib.util.find_spec("vllm") is not None
    try:
        import torch

        gpu = bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch is a dependency
        gpu = False
    if has_vllm and gpu:
        return "vllm", None
    if requested == "vllm":
        raise ServeError("vLLM was requested but " + ("is not installed" if not has_vllm else "there is no GPU (torch.cuda.is_available() is False)"))
    why = "vLLM is not installed" if not has_vllm else "no GPU (torch.cuda.is_available() is False)"
    return "transformers", f"{why}: smoke-serving with `transformers serve` on CPU instead of `vllm serve --model-impl transformers`"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_dir: str, backend: str, port: int, trust_remote_code: bool, native: bool, max_len: int | None = None) -> list[str]:
    trust = ["--trust-remote-code"] if trust_remote_code else []
    if backend == "vllm":
        vllm = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
        length = str(min(1024, max_len)) if isinstance(max_len, int) and max_len > 0 else "1024"
        return [*vllm, "serve", model_dir, "--model-impl", "transformers", "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", SERVED_NAME, "--max-model-len", length, "--enforce-eager", *trust]
    cli = [sys.executable, "-m", "transformers.cli.transformers"] if native else [sys.executable, "-c", "from hfcheck.porter.serve import launcher_main; launcher_main()"]
    return [*cli, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32",
            "--log-level", "warning", *trust]


def launcher_main() -> None:  # pragma: no cover - runs as the server process (covered by the serve test)
    """``transformers serve`` for an ``auto_map`` model: expose the remote class under the name
    ``config.architectures[0]`` (what transformers' model manager looks up), then run its CLI."""
    args = sys.argv[1:]
    model_dir = args[1]
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    auto_map = config.get("auto_map") or {}
    arch = (config.get("architectures") or [None])[0]
    ref = auto_map.get("AutoModelForCausalLM")
    if arch and ref and not hasattr(transformers, arch):
        cls = get_class_from_dynamic_module(ref.partition("--")[2] if "--" in ref else ref, model_dir, local_files_only=True)
        setattr(transformers, arch, cls)
    from transformers.cli.transformers import main

    sys.argv = ["transformers", *args]
    sys.exit(main())


# ---------------------------------------------------------------------- process control


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> bool:
    """SIGTERM the server's process group, SIGKILL after ``grace``; True when the group is gone."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.1)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _group_alive(proc.pid):
            time.sleep(0.1)
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return not _group_alive(proc.pid) and proc.poll() is not None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id owned by someone else
        return False
    return True


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost: never through a proxy


def _get(url: str, timeout: float) -> int:
    with _OPENER.open(urllib.request.Request(url), timeout=timeout) as r:
        return r.status


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    with _OPENER.open(req, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


# ---------------------------------------------------------------------- the check


def smoke_serve(model_dir: str | os.PathLike, *, prompt: str = DEFAULT_PROMPT, max_tokens: int = 8, backend: str = "auto",
                startup_timeout: float = 300.0, request_timeout: float = 120.0, port: int | None = None, log=None) -> ServeResult:
    """Start a server on ``model_dir``, send one greedy completion, stop the server, compare
    with transformers' greedy ``generate``. ``log`` (optional) receives one-line progress."""
    t_start = time.monotonic()
    model_dir = str(Path(model_dir).expanduser())
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        raise ServeError(f"{model_dir}: no config.json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    remote = bool(config.get("auto_map"))
    name, note = choose_backend(backend)
    if note and log:
        log(note)
    import transformers

    if name == "transformers":
        missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
        if missing:
            raise ServeError(f"`transformers serve` needs {', '.join(missing)}: pip install 'transformers[serving]'")
    native = not remote or hasattr(transformers, (config.get("architectures") or [""])[0] or "")
    port = port or _free_port()
    cmd = server_command(model_dir, name, port, remote, native, config.get("max_position_embeddings"))
    result = ServeResult(False, name, note, cmd, prompt, max_tokens)
    work = Path(tempfile.mkdtemp(prefix="hfcheck-serve-"))
    log_path = work / "server.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    if name == "transformers":
        env["CUDA_VISIBLE_DEVICES"] = ""
    base = f"http://127.0.0.1:{port}"
    proc = None
    response = None
    try:
        if log:
            log(f"starting: {' '.join(cmd)}")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=work)
        result.server_pid = proc.pid
        if log:
            log(f"server pid {proc.pid} (process group {proc.pid})")
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise ServeError(f"the server exited with status {proc.returncode} before it was healthy")
            try:
                if _get(f"{base}/health", 2.0) == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() - t0 > startup_timeout:
                raise ServeError(f"the server was not healthy within {startup_timeout:g} s")
            time.sleep(0.25)
        result.seconds["startup"] = round(time.monotonic() - t0, 2)
        if log:
            log(f"healthy after {result.seconds['startup']} s; requesting {max_tokens} greedy tokens")
        body = {"model": SERVED_NAME if name == "vllm" else model_dir, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if name == "vllm":
            body["return_token_ids"] = True
        t0 = time.monotonic()
        try:
            response = _post(f"{base}/v1/completions", body, request_timeout)
        except urllib.error.HTTPError as exc:
            raise ServeError(f"the completion request failed: HTTP {exc.code} {exc.read()[:300].decode('utf-8', 'replace')}") from None
        result.seconds["request"] = round(time.monotonic() - t0, 2)
    except ServeError as exc:
        result.error = str(exc)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        result.error = f"the server did not answer: {exc}"
    finally:
        if proc is not None:
            result.server_stopped = _stop(proc)
        result.log_tail = _tail(log_path)
    if response is not None:
        choice = (response.get("choices") or [{}])[0]
        result.server_text = choice.get("text")
        result.server_token_ids = choice.get("token_ids")
        result.server_completion_tokens = (response.get("usage") or {}).get("completion_tokens")
        t0 = time.monotonic()
        ref = reference_generate(model_dir, prompt, max_tokens, remote, result.server_text or "")
        result.seconds["reference"] = round(time.monotonic() - t0, 2)
        if ref.get("error"):
            result.error = f"transformers' reference generation failed: {ref['error']}"
        else:
            result.reference_text = ref["text"]
            result.reference_token_ids = ref["token_ids"]
            if result.server_token_ids is not None:
                result.compared = "token ids returned by the server"
                result.tokens_match = list(result.server_token_ids) == list(ref["token_ids"])
            else:
                result.tokens_match = result.server_text == ref["text"] and result.server_completion_tokens == len(ref["token_ids"])
                confirmed = ref.get("reencoded") == ref.get("visible_ids")
                result.compared = "text and completion-token count" + ("; the text re-encodes to the same ids" if confirmed else
                                                                        " (this tokenizer does not round-trip the text to the same ids)")
            if not result.tokens_match and result.error is None:
                result.error = f"the server's greedy tokens differ from transformers' generate ({result.server_text!r} vs {ref['text']!r})"
    with contextlib.suppress(OSError):
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    result.seconds["total"] = round(time.monotonic() - t_start, 2)
    result.ok = result.error is None and result.tokens_match and result.server_stopped
    if not result.server_stopped and result.error is None:
        result.error = "the server process group did not exit"
    return result


# ---------------------------------------------------------------------- reference generation (separate process)


def reference_generate(model_dir: str, prompt: str, max_tokens: int, trust_remote_code: bool, server_text: str, timeout: float = 300.0) -> dict:
    root = Path(tempfile.mkdtemp(prefix="hfcheck-serve-ref-"))
    try:
        (root / "job.json").write_text(json.dumps({"model_dir": model_dir, "prompt": prompt, "max_tokens": max_tokens,
                                                   "trust": trust_remote_code, "server_text": server_text}))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="", HF_MODULES_CACHE=str(root / "modules"))
        proc = subprocess.Popen([sys.executable, "-c", "from hfcheck.porter.serve import reference_main; reference_main()", str(root)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"no result within {timeout:g} s"}
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        try:
            return json.loads((root / "result.json").read_text())
        except (OSError, ValueError):
            lines = (err or b"").decode("utf-8", "replace").strip().splitlines()
            return {"error": lines[-1] if lines else f"exit status {proc.returncode}"}
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def reference_main() -> None:  # pragma: no cover - runs in the child process (covered by the serve test)
    root = Path(sys.argv[-1])
    job = json.loads((root / "job.json").read_text())
    out: dict[str, Any] = {}
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(job["model_dir"], trust_remote_code=job["trust"])
        model = AutoModelForCausalLM.from_pretrained(job["model_dir"], trust_remote_code=job["trust"], dtype=torch.float32).eval()
        inputs = tok(job["prompt"], return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(**inputs, max_new_tokens=job["max_tokens"], do_sample=False, tokenizer=tok)
        new = seq[0, inputs["input_ids"].shape[-1]:].tolist()
        special = set(tok.all_special_ids)
        out = {"token_ids": new, "text": tok.decode(new, skip_special_tokens=True), "visible_ids": [t for t in new if t not in special],
               "reencoded": tok(job["server_text"], add_special_tokens=False)["input_ids"] if job["server_text"] else []}
    except BaseException as exc:  # noqa: BLE001
        out = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"}
    (root / "result.json").write_text(json.dumps(out))


def render_text(result: ServeResult, console=None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    head = Text()
    head.append("SERVED" if result.ok else "SERVE FAILED", style="bold green" if result.ok else "bold red")
    head.append(f"  backend {result.backend}")
    console.print(head)
    console.print(f"server: {' '.join(result.command)}", markup=False)
    s = result.seconds
    if result.server_text is not None:
        console.print(f"prompt {result.prompt!r} -> server {result.server_text!r}; transformers generate {result.reference_text!r}", markup=False)
        console.print(f"tokens {'match' if result.tokens_match else 'DIFFER'} ({result.compared}); "
                      f"startup {s.get('startup', '-')} s, request {s.get('request', '-')} s, reference {s.get('reference', '-')} s, total {s.get('total', '-')} s", markup=False)
    console.print(f"server stopped: {'yes (process group gone)' if result.server_stopped else 'NO'}", markup=False)
    if result.error:
        console.print(Text(f"error: {result.error}", style="red"))
        if result.log_tail:
            console.print(Text(result.log_tail[-1500:], style="dim"))
