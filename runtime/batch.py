"""Run real vLLM on a batch of model types, one after another in one process (start-up is paid
once per batch), and record what it did next to hfcheck's prediction for the same folder.

Runs *inside* vLLM's environment (``python -m hfcheck.runtime.batch JOB``, with hfcheck
installed there without dependencies), so the prediction and vLLM see the same transformers.
For each model type:

1. its default config, cut like the analyzer's tiny instance but with head_dim 32 (vLLM's CPU
   attention kernels refuse 16), built as ``AutoModelForCausalLM`` with random float32 weights
   and saved as a model folder;
2. hfcheck's scan of that folder (the prediction);
3. ``vllm.LLM(model=..., model_impl="transformers")``, greedy 4 tokens from fixed token ids,
   with vLLM's log (its own processes included) captured to a file per model;
4. transformers' ``generate`` on the same ids (the expected tokens).

One JSON line per model is appended to the job's output file as soon as it is known, so a
crash or a kill costs one model, and the parent can resume after it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hfcheck.analyzer.facts import collect_facts
from hfcheck.analyzer.instance.shrink import CPU_KERNEL_HEAD_DIM, shrunk_config
from hfcheck.analyzer.vllm.release import installed_is_cpu_build
from hfcheck.isolation.jobs import read_job
from hfcheck.runtime.decisions import RuntimeDecisions, differences, load_error, parse, predicted

MAX_PARAMETERS = 400_000_000  # a structural instance larger than this is not run (memory, time)
TOKENS = 4
PROMPT = [3, 17, 5, 9, 11, 2, 7, 13]
NO_PROCESSOR = re.compile(r"Can't load (image )?processor|Failed to load the processor|Tokenizer has no attribute"
                          r"|Could not import module '\w*Processor'")
"""vLLM builds a multimodal model's processor (tokenizer and image processor) at start, even for
text-only prompts; the random-weight folder has neither, and processors that need torchvision
cannot be imported in the CPU build's environment (``runtime.environment`` removes the PyPI
torchvision, which does not match torch's CPU build), so such a type is not compared."""


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def _output_to(path: Path):
    """fds 1 and 2 (vLLM logs to stdout; its engine processes inherit both) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def context_length(config: dict[str, Any], wanted: int) -> int:
    """The ``max_model_len`` to give vLLM: ``wanted``, or less where the model's positions end
    sooner (vLLM refuses a longer one): config.json's text config, first of its position fields."""
    nested = config.get("text_config")
    text = nested if isinstance(nested, dict) else config
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(wanted, value)
    return wanted


def build_and_predict(model_type: str, folder: Path, row: dict[str, Any], section: str = "causal-lm") -> tuple[Any, RuntimeDecisions] | None:
    """The type's small folder built (``build_folder``) and scanned: the row gets hfcheck's verdict
    and prediction for the CPU build; None, with the row saying why, when no small instance builds."""
    from hfcheck.analyzer.scan import scan

    try:
        model = build_folder(model_type, folder, section)
    except Exception as exc:  # noqa: BLE001 - a type whose small instance does not build is a row
        row.update(status="no-instance", error=_first(exc))
        return None
    report = scan(str(folder)).report
    want = predicted(report, cpu_build=installed_is_cpu_build())
    row.update(verdict=report["verdict"], score=report["score"], predicted=want.to_dict(), blockers=report["blockers"][:3])
    return model, want


def build_folder(model_type: str, folder: Path, section: str = "causal-lm"):
    """The runnable small instance of a model type's default config, saved in ``folder``: its
    causal-LM class, or (``section="pooling"``) its base model, which vLLM pools."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    from hfcheck.analyzer.sources.model_types import POOLING, default_config

    auto = AutoModel if section == POOLING else AutoModelForCausalLM
    config, _ = default_config(model_type, section)
    facts, cfg_obj = collect_facts(config)
    errors = []
    for shrink in ("tiny", "structural"):  # as the analyzer's instance: real widths when small ones are refused
        try:
            small, _ = shrunk_config(facts, cfg_obj, shrink, head_dim=CPU_KERNEL_HEAD_DIM)
            small.architectures = config["architectures"]
            torch.manual_seed(0)
            with torch.device("meta"):
                probe = auto.from_config(small)
            size = sum(p.numel() for p in probe.parameters())
            if size > MAX_PARAMETERS:
                raise ValueError(f"{size / 1e6:.0f} M parameters at this size (over {MAX_PARAMETERS / 1e6:.0f} M)")
            model = auto.from_config(small, dtype=torch.float32).eval()
        except Exception as exc:  # noqa: BLE001 - try the next size
            errors.append(f"{shrink}: {_first(exc)}")
            continue
        model.save_pretrained(folder)
        return model
    raise RuntimeError("; ".join(errors))


def _log_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def attempt(row: dict[str, Any], log_path: Path, run: Callable[[], Any]) -> tuple[Any, Any]:
    """Run vLLM (``run()``, logging into ``log_path``) and record in ``row`` what happened: status
    ``loaded`` or ``refused`` with the error its log names, and the decisions it logged. Returns
    (what ``run`` returned or None, the parsed decisions)."""

    result = None
    try:
        result = run()
        row["status"] = "loaded"
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        row["status"] = "refused"
        row["error"] = load_error(_log_text(log_path)) or _first(exc)
    got = parse(_log_text(log_path))
    row["decisions"] = got.to_dict()
    return result, got


@contextlib.contextmanager
def vllm_engine(log_path: Path, **llm: Any):
    """Real vLLM on a folder (transformers backend, float32, eager; its log, engine processes
    included, into ``log_path``), shut down on leaving. Raises what vLLM raises when it refuses
    the model."""
    from vllm import LLM

    with _output_to(log_path):
        engine = LLM(model_impl="transformers", dtype="float32", enforce_eager=True, seed=0, **llm)
        try:
            yield engine
        finally:
            with contextlib.suppress(Exception):
                engine.llm_engine.engine_core.shutdown()
            del engine
            gc.collect()


def generate_in_vllm(log_path: Path, prompts: list[Any], max_tokens: int, **llm: Any) -> list[list[int]]:
    """Greedy ``max_tokens`` for each prompt from real vLLM (``vllm_engine``)."""
    return [tokens for tokens, _ in generate_with_logprobs(log_path, prompts, max_tokens, 0, **llm)]


def generate_with_logprobs(log_path: Path, prompts: list[Any], max_tokens: int, top: int,
                           **llm: Any) -> list[tuple[list[int], dict[int, float]]]:
    """Greedy ``max_tokens`` for each prompt from real vLLM, with the ``top`` log-probabilities
    vLLM gives its first generated position ({} when ``top`` is 0): a difference too small to
    move a random tiny model's greedy tokens still shows there."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=top or None)
    with vllm_engine(log_path, **llm) as engine:
        out = engine.generate(prompts, params)
        return [(list(o.outputs[0].token_ids),
                 {int(k): float(v.logprob) for k, v in (o.outputs[0].logprobs or [{}])[0].items()} if top else {}) for o in out]


def run_one(model_type: str, work: Path) -> dict[str, Any]:
    import torch


    row: dict[str, Any] = {"model_type": model_type}
    folder = work / model_type
    t0 = time.perf_counter()
    built = build_and_predict(model_type, folder, row)
    if built is None:
        return row
    model, want = built
    log_path = work / f"{model_type}.log"
    ids: list[int] = []

    def run() -> list[int]:  # all of it inside the attempt: any failure here is the model's row
        from vllm.inputs import TokensPrompt

        vocab = model.get_input_embeddings().num_embeddings
        ids.extend(t % vocab for t in PROMPT)
        length = context_length(json.loads((folder / "config.json").read_text(encoding="utf-8")), 64)
        (tokens,) = generate_in_vllm(log_path, [TokensPrompt(prompt_token_ids=ids)], TOKENS, model=str(folder), max_model_len=length,
                                     skip_tokenizer_init=True)
        return tokens

    tokens, got = attempt(row, log_path, run)
    if row["status"] == "refused" and NO_PROCESSOR.search(row["error"]):
        row["status"] = "no-processor"  # the folder's fault, not a decision of vLLM's about the model
    if tokens is not None:
        row["differences"] = differences(got, want)
        with torch.no_grad():
            ids_t = torch.tensor([ids])
            gen = model.generate(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        expected = gen[0, len(ids):].tolist()
        row.update(tokens=tokens, expected=expected, tokens_match=tokens == expected)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def job_loop(run: Callable[[str, Path], dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    """The job loop every runtime batch shares: for each name in the job (``read_job`` of the
    folder ``sys.argv[1]``), say which one runs (the parent reads it when the batch dies), run it,
    and append its row at once; a name whose run raises gets an ``error`` row (``extra`` is added
    to every row)."""
    job = read_job(Path(sys.argv[1]))
    out = Path(job["out"])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory(prefix="hfcheck-runtime-") as tmp:
        for model_type in job["model_types"]:
            with open(job["progress"], "w", encoding="utf-8") as f:
                f.write(model_type)
            try:
                row = run(model_type, Path(tmp))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - one model's failure is its row
                row = {"model_type": model_type, **(extra or {}), "status": "error", "error": _first(exc),
                       "traceback": traceback.format_exc()[-1500:]}
            row["vllm"] = job.get("vllm_version")
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def main() -> None:
    job_loop(run_one)


if __name__ == "__main__":
    main()
