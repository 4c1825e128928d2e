"""What ``hfcheck serve`` sends a vision-language folder: one chat request holding an image and
the prompt, and one with the prompt alone, each compared with transformers' ``generate`` on the
inputs the folder's own processor makes of the same messages.

A multimodal model served from a folder is asked for images through the chat endpoint (the
completions endpoint takes no image), so both sides render the same chat template: the folder's
own, or, where it has none, a minimal one hfcheck writes with the image placeholder vLLM itself
uses (``facts.processor.image_placeholder``) and hands to the server as ``--chat-template``. The
prompt token ids vLLM reports are compared with the processor's, so a difference in the inputs
is told apart from a difference in the model.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SIDE = 64
CHAT_PATH = "/v1/chat/completions"
KINDS = ("image+text", "text")


class ImageError(ValueError):
    """The image asked for cannot be read."""


def serves_images(report: dict[str, Any]) -> bool:
    """The scan found a multimodal model with processor files whose processor takes images, or
    could not build it here (hfcheck's own environment has no torchvision; the reference then
    runs in vLLM's, where it may build): serve it with an image."""
    processor = report.get("processor")
    if not processor or not (report.get("model") or {}).get("multimodal"):
        return False
    return "image" in (processor.get("modalities") or []) if processor.get("built") else True


def image_png(path: str | None = None) -> bytes:
    """PNG bytes of the image to send (lossless, so both sides decode the same pixels): the file
    at ``path`` as RGB, else a fixed ``SIDE`` x ``SIDE`` gradient."""
    from PIL import Image, UnidentifiedImageError

    if path:
        try:
            with Image.open(Path(path).expanduser()) as img:
                image = img.convert("RGB")
        except (OSError, UnidentifiedImageError) as exc:
            raise ImageError(f"--image {path}: not an image that can be read ({getattr(exc, 'strerror', None) or exc})") from None
    else:
        image = Image.new("RGB", (SIDE, SIDE))
        image.putdata([(4 * x, 4 * y, (8 * (x + y)) % 256) for y in range(SIDE) for x in range(SIDE)])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def minimal_template(placeholder: str) -> str:
    """A chat template that writes each message's parts in order, the image as ``placeholder``
    (it iterates over the content, so vLLM passes the parts as they are: its "openai" format)."""
    return ("{%- for message in messages -%}{%- for part in message['content'] -%}"
            "{%- if part['type'] == 'image' -%}" + placeholder.replace("'", "\\'").join(("{{ '", "' }} ")) +
            "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}{%- endfor -%}")


def chat_bodies(model: str, prompt: str, png: bytes, max_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of the two requests: the image and the prompt, then the prompt alone."""
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    contents = ([{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": prompt}], [{"type": "text", "text": prompt}])
    return [(CHAT_PATH, {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True, "return_token_ids": True}) for content in contents]


def response_ids(response: dict[str, Any] | None) -> tuple[list[int] | None, list[int] | None]:
    """(prompt token ids, generated token ids) of a chat response asked with ``return_token_ids``."""
    if not response:
        return None, None
    choice = (response.get("choices") or [{}])[0]
    return response.get("prompt_token_ids"), choice.get("token_ids")


def reference(model_dir: str, prompt: str, png: bytes, max_tokens: int, trust: bool) -> dict[str, Any]:
    """transformers' side, in the reference child: the folder's processor and image-text-to-text
    class, greedy ``generate`` for both messages. Returns the template used when the folder has
    none (``template``: the server gets it too) and, per kind, prompt and generated ids."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hfcheck.analyzer.facts.processor import image_placeholder

    processor = AutoProcessor.from_pretrained(model_dir, trust_remote_code=trust)
    template = None if getattr(processor, "chat_template", None) else minimal_template(image_placeholder(processor))
    model = AutoModelForImageTextToText.from_pretrained(model_dir, trust_remote_code=trust, dtype=torch.float32).eval()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out: dict[str, Any] = {"template": template, "requests": []}
    for kind in KINDS:
        content = ([{"type": "image", "image": image}] if kind == "image+text" else []) + [{"type": "text", "text": prompt}]
        inputs = processor.apply_chat_template([{"role": "user", "content": content}], chat_template=template, add_generation_prompt=True,
                                               tokenize=True, return_dict=True, return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        length = inputs["input_ids"].shape[-1]
        out["requests"].append({"kind": kind, "prompt_ids": inputs["input_ids"][0].tolist(), "token_ids": seq[0, length:].tolist()})
    return out


def compare(reference_requests: list[dict[str, Any]], responses: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per request: vLLM's prompt and generated ids beside transformers'; ``tokens_match``
    only when the prompts are the same ids and so are the tokens."""
    rows = []
    for ref, response in zip(reference_requests, responses, strict=True):
        prompt_ids, token_ids = response_ids(response)
        same_prompt = prompt_ids is not None and list(prompt_ids) == ref["prompt_ids"]
        rows.append({"kind": ref["kind"], "server_prompt_ids": prompt_ids, "reference_prompt_ids": ref["prompt_ids"], "prompts_match": same_prompt,
                     "server_token_ids": token_ids, "reference_token_ids": ref["token_ids"],
                     "tokens_match": same_prompt and token_ids is not None and list(token_ids) == ref["token_ids"]})
    return rows
