"""Tiny vision-language model folders that real vLLM can serve with an image: random float32
weights and a processor made here (a word-level tokenizer and the PIL variant of the type's
image processor, so neither a download nor torchvision is needed).

The folders are what ``runtime_vlm`` serves on vLLM's CPU build with an image in the prompt and
with text only; greedy tokens are compared with transformers' ``generate`` on the same inputs.
Sizes respect the CPU build's kernels (head_dim 32). One builder per model type, each returns
the image placeholder text a prompt holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hfcheck.analyzer.instance.shrink import CPU_KERNEL_HEAD_DIM, cpu_text_sizes, cpu_vision_sizes

IMAGE_SIDE = 32
PATCH = 16
WORDS = tuple(f"w{i}" for i in range(56)) + ("hello", "world", "a", "b")
PROMPT_WORDS = "hello world a"


def word_tokenizer(special: dict[str, str] | None = None, extra: tuple[str, ...] = ()):
    """A fast word-level tokenizer over ``WORDS`` with pad/unk/bos/eos and the given special
    tokens (``special``: attribute name -> token, e.g. ``{"image_token": "<image>"}``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = special or {}
    base = ["<pad>", "<unk>", "<s>", "</s>"]
    tokens = base + [t for t in (*special.values(), *extra) if t not in base] + list(WORDS)
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    if special:
        kwargs["extra_special_tokens"] = dict(special)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    fast.add_special_tokens({"additional_special_tokens": list(dict.fromkeys((*special.values(), *extra)))})
    return fast


def _save(model_cls: type, config: Any, processor: Any, folder: Path, seed: int) -> None:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(folder)
    torch.manual_seed(seed)
    model_cls(config).eval().save_pretrained(folder)


def _vision_sizes() -> dict[str, Any]:
    return cpu_vision_sizes(IMAGE_SIDE, PATCH)


def write_llava(folder: Path, seed: int = 0, **vision: Any) -> str:
    """LLaVA 1.5's shape: CLIP tower, two-layer projector, Llama language model."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = word_tokenizer(extra=("<image>",))
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIDE}, crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}),
        tokenizer=tokenizer, patch_size=PATCH, vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**_vision_sizes(), projection_dim=2 * CPU_KERNEL_HEAD_DIM, **vision),
        text_config=LlamaConfig(**cpu_text_sizes(len(tokenizer))),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    _save(LlavaForConditionalGeneration, config, processor, folder, seed)
    return "<image>"


def write_gemma3(folder: Path, seed: int = 0, **vision: Any) -> str:
    """Gemma 3's shape: SigLIP tower (pooling head off, as published checkpoints set it unless
    ``vision_use_head=True`` is passed), average-pool projector, Gemma 3 language model with
    sliding and global layers."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    special = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = word_tokenizer(special)
    tokens_per_image = (IMAGE_SIDE // PATCH) ** 2
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}),
        tokenizer=tokenizer, image_seq_length=tokens_per_image,
    )
    text = Gemma3TextConfig(**cpu_text_sizes(len(tokenizer)), sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in special.items()}
    config = Gemma3Config(
        text_config=text, vision_config=SiglipVisionConfig(**{"vision_use_head": False, **_vision_sizes(), **vision}),
        mm_tokens_per_image=tokens_per_image, boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    _save(Gemma3ForConditionalGeneration, config, processor, folder, seed)
    return processor.boi_token


def write_idefics3(folder: Path, seed: int = 0, do_image_splitting: bool = True, **vision: Any) -> str:
    """SmolVLM's shape (Idefics3): a SigLIP-style tower, pixel-shuffle connector, Llama language
    model under ``text_model``; images split into tiles of the tower's size plus a global one, as
    published, or (``do_image_splitting=False``) one global image, for which transformers'
    Idefics3Processor counts no image rows (HFC909)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    extra = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    tokenizer = word_tokenizer(extra=extra)
    tile, scale = 2 * IMAGE_SIDE, 2  # 4 feature tokens a tile: more than the tile's wrapper tokens, as vLLM needs (HFC905)
    seq_len = (tile // PATCH) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(do_image_splitting=do_image_splitting, size={"longest_edge": 2 * tile},
                                                  max_image_size={"longest_edge": tile}),
        tokenizer=tokenizer, image_seq_len=seq_len,
    )
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(**{**_vision_sizes(), "image_size": tile, **vision}),
        text_config=LlamaConfig(**cpu_text_sizes(len(tokenizer))), scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    _save(Idefics3ForConditionalGeneration, config, processor, folder, seed)
    return "<image>"


BUILDERS: dict[str, Callable[..., str]] = {"llava": write_llava, "gemma3": write_gemma3, "idefics3": write_idefics3}
"""Model type -> builder (``folder, seed, **vision_config overrides`` -> the image placeholder text)."""
