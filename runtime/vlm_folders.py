"""Small vision-language folders for any type, not only the hand-built ones (``tiny_vlm``):
from a type's default config and its processor class (``write_from_defaults``), or behind a
published checkpoint's own processor files (``write_from_published``).

Both cut the model as the runtime needs it (head_dim 32, two-layer towers at small widths,
image and patch sizes kept so the processor still describes the tower) and let transformers'
own forward decide whether processor and model agree on an image's tokens; a type where they
do not is an error that says why, listed in the runtime report rather than left out.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

from hfcheck.analyzer.facts import collect_facts
from hfcheck.analyzer.facts.config_fields import text_config_of
from hfcheck.analyzer.instance.shrink import CPU_KERNEL_HEAD_DIM, shrink_tower, shrunk_config
from hfcheck.runtime.tiny_vlm import IMAGE_SIDE, PROMPT_WORDS, word_tokenizer

MAX_PARAMETERS = 50_000_000
"""A small folder larger than this is not built (its defaults did not shrink)."""
VISION_KEYS = ("vision_config", "vision_tower_config", "visual", "audio_config")
OUTPUT_KEYS = ("out_hidden_size", "projection_dim", "text_hidden_size", "output_hidden_size")
"""Tower fields that are the language model's width (what the tower's last projection writes)."""


def _tower(config: Any) -> Any:
    """The config's first tower sub-config (vision, else audio), or None."""
    return next((getattr(config, k) for k in VISION_KEYS if getattr(config, k, None) is not None and not isinstance(getattr(config, k), (dict, str))), None)


def _processor_classes(model_type: str) -> tuple[type[Any], dict[str, type]]:
    """(processor class, {sub-processor attribute: class}) transformers maps the type to: its
    image processor (the PIL variant where there is one, else torchvision's) and, where the
    processor takes one, its video processor (torchvision)."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    processor = getattr(transformers, name, None) if name else None
    if processor is None:
        raise LookupError(f"{model_type}: no processor class" if not name else f"{model_type}: {name} does not import here")
    wanted = processor.get_attributes() if hasattr(processor, "get_attributes") else ["image_processor", "tokenizer"]
    other = [a for a in wanted if a not in ("image_processor", "video_processor", "tokenizer")]
    if other:
        raise LookupError(f"{model_type}: its processor also needs {', '.join(other)}")
    def pick(entry: Any) -> str | None:  # {"pil": ..., "torchvision": ...} or one name
        return (entry.get("pil") or entry.get("torchvision") or next(iter(entry.values()), None)) if isinstance(entry, dict) else entry

    names = {"image_processor": pick(IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type))}
    if "video_processor" in wanted:
        names["video_processor"] = pick(VIDEO_PROCESSOR_MAPPING_NAMES.get(model_type))
    classes = {}
    for attr, cls_name in names.items():
        cls = getattr(transformers, cls_name, None) if cls_name else None
        if cls is None or "<locals>" in cls.__qualname__:
            mapped = (IMAGE_PROCESSOR_MAPPING_NAMES if attr == "image_processor" else VIDEO_PROCESSOR_MAPPING_NAMES).get(model_type)
            raise LookupError(f"{model_type}: its {attr.replace('_', ' ')} needs torchvision" if isinstance(mapped, dict) and not cls_name else
                              f"{model_type}: no {attr.replace('_', ' ')}" if not cls_name else
                              f"{model_type}: {cls_name} does not import here (it needs torchvision)")
        classes[attr] = cls
    return processor, classes


def _needed_tokens(processor_cls: type[Any]) -> dict[str, str]:
    """Special tokens the processor reads off its tokenizer (``tokenizer.boi_token``), with the
    processor's own default where its signature has one (``image_token="<image>"``)."""

    try:
        source = inspect.getsource(processor_cls)
    except (OSError, TypeError):
        source = ""
    base = {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"}
    names = {n for n in re.findall(r"tokenizer\.(\w+_token)\b", source) if not n.startswith("add_") and n not in base}
    defaults = {name: p.default for name, p in inspect.signature(processor_cls.__init__).parameters.items()
                if name.endswith("_token") and isinstance(p.default, str) and p.default}
    return {name: defaults.get(name, f"<{name}>") for name in sorted(names | set(defaults))}


def _grid_tokens(config: Any) -> int | None:
    """Patches of one image at the tower's own size (config.mm_tokens_per_image where set)."""
    if isinstance(getattr(config, "mm_tokens_per_image", None), int):
        return config.mm_tokens_per_image
    tower = _tower(config)
    side, patch = getattr(tower, "image_size", None), getattr(tower, "patch_size", None)
    return (side // patch) ** 2 if isinstance(side, int) and isinstance(patch, int) and patch else None


def _processor_candidates(processor_cls: type[Any], config: Any) -> list[dict[str, Any]]:
    """Keyword sets to try for the processor's size arguments, from the config (the folder's
    processor and model must agree on how many tokens an image takes; the forward decides)."""

    params = set(inspect.signature(processor_cls.__init__).parameters)
    vision = _tower(config)
    text = config.get_text_config()
    fixed: dict[str, Any] = {}
    for name in params - {"self", "image_processor", "tokenizer", "video_processor", "chat_template", "kwargs"}:
        for holder in (config, vision, text):
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                fixed[name] = value
                break
    side, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    grid = side // patch if isinstance(side, int) and isinstance(patch, int) and patch else None
    counts = [getattr(config, "mm_tokens_per_image", None), getattr(text, "num_image_tokens", None), getattr(config, "num_query_tokens", None),
              grid and grid * grid, grid and (grid // 2) ** 2]
    counts = [c for c in dict.fromkeys(counts) if isinstance(c, int) and c > 0]
    seq_names = [n for n in ("image_seq_length", "num_image_tokens", "image_seq_len") if n in params]
    out = []
    for extra in ((1, 0) if "num_additional_image_tokens" in params else (None,)):
        for count in counts or [None]:
            kwargs = dict(fixed)
            if extra is not None:
                kwargs["num_additional_image_tokens"] = extra
            if count is not None:
                kwargs.update({n: count for n in seq_names if n not in fixed})
            if kwargs not in out:
                out.append(kwargs)
    return out or [{}]


PATCH_FIELDS = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size", "merge_size": "spatial_merge_size"}
"""Image/video processor field -> the tower field it must equal (Qwen2-VL-style patching)."""


def _sized(image_cls: type, side: int | None, tower: Any = None) -> Any:
    """The image (or video) processor at the tower's image side: its default ``size`` and
    ``crop_size`` with every edge it sets (shortest_edge, height/width, longest_edge) at ``side``,
    and its patch fields as the tower has them."""
    default = image_cls()
    kwargs: dict[str, Any] = {}
    for mine, theirs in PATCH_FIELDS.items():
        value = getattr(tower, theirs, None)
        if isinstance(getattr(default, mine, None), int) and isinstance(value, int):
            kwargs[mine] = value
    if not isinstance(side, int):
        return image_cls(**kwargs) if kwargs else default
    for name in ("size", "crop_size"):
        value = getattr(default, name, None)
        if value is None:
            continue
        items = value.items() if hasattr(value, "items") else vars(value).items()
        edges = {k: side for k, v in items if isinstance(v, int) and not isinstance(v, bool) and "pixels" not in k}
        if edges:
            kwargs[name] = edges
    return image_cls(**kwargs)


def _tokens_of(processor: Any) -> dict[str, str]:
    """The processor's special-token attributes (``image_token``, ``boi_token``, ...)."""
    out = {}
    for name in dir(processor):
        if name.endswith("_token") and not name.startswith("_"):
            try:
                value = getattr(processor, name, None)
            except Exception:  # noqa: BLE001 - a property that needs what this tokenizer lacks
                continue
            if isinstance(value, str) and value:
                out[name] = value
    return out


def write_from_defaults(model_type: str, folder: Path, seed: int = 0) -> str:
    """Any image-text-to-text type from its default config and its processor class: the text
    model and the towers cut to small widths (image and patch sizes kept), a word-level tokenizer
    holding the special tokens the processor reads, the config's token ids pointed at them, and
    the processor's size arguments taken from the config, the first set under which
    transformers' own forward accepts an image. Returns the image placeholder vLLM writes
    (``image_placeholder``). Raises when the type's processor cannot be made here (a class that
    needs torchvision where it is missing, a sub-processor other than image and video) or no set
    fits."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from hfcheck.analyzer.facts.processor import image_placeholder
    from hfcheck.analyzer.sources.model_types import VLM, default_config

    processor_cls, subs = _processor_classes(model_type)
    tokenizer = word_tokenizer(_needed_tokens(processor_cls))
    raw, _ = default_config(model_type, VLM)
    config, text, tower, side = _small_config(raw, tokenizer, model_type)
    errors = []
    for joined, kwargs in ((j, k) for j in (False, True) for k in _processor_candidates(processor_cls, config)):
        if joined:  # Qwen2-VL's tower: hidden_size is its merger's output, the language model's width
            if tower is None or getattr(tower, "hidden_size", None) in (None, text.hidden_size):
                break
            tower.hidden_size = text.hidden_size
        try:
            parts = {a: _sized(c, side, tower) for a, c in subs.items()}
            count = next((kwargs[n] for n in ("image_seq_length", "num_image_tokens", "image_seq_len") if n in kwargs), None)
            if getattr(parts["image_processor"], "image_seq_length", 0) is None:  # PaliGemma reads it off the image processor
                parts["image_processor"].image_seq_length = count or _grid_tokens(config)
            processor = processor_cls(tokenizer=tokenizer, **parts, **kwargs)
            for attr, token in _tokens_of(processor).items():
                ident = tokenizer.convert_tokens_to_ids(token)
                for holder in (config, text):
                    for key in (f"{attr}_id", f"{attr}_index"):
                        if isinstance(getattr(holder, key, None), int):
                            setattr(holder, key, ident)
            torch.manual_seed(seed)
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
            placeholder = image_placeholder(processor)
            inputs = processor(text=f"{placeholder} {PROMPT_WORDS}", images=[Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (120, 30, 200))],
                               return_tensors="pt")
            with torch.no_grad():
                model(**inputs)
        except Exception as exc:  # noqa: BLE001 - the next keyword set; all errors are reported together
            errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        processor.save_pretrained(folder)
        model.save_pretrained(folder)
        return placeholder
    raise ValueError(f"{model_type}: no processor arguments fit the small model ({'; '.join(dict.fromkeys(errors))[:400]})")


def _small_config(raw: dict[str, Any], tokenizer: Any, name: str) -> tuple[Any, Any, Any, int | None]:
    """(config, its text config, its tower config, the tower's image side): ``raw`` with the
    text model cut like the analyzer's tiny instance (head_dim 32), the vocabulary the
    tokenizer's, the towers at ``shrink.TOWER_WIDTHS`` (image and patch sizes kept), tower outputs at
    the language model's width (M-RoPE sections are scaled by the shrink itself); pad/bos/eos at the word tokenizer's."""
    import torch
    from transformers import AutoModelForImageTextToText

    facts, cfg = collect_facts(raw)
    config, _ = shrunk_config(facts, cfg, "tiny", head_dim=CPU_KERNEL_HEAD_DIM)
    config.architectures = raw["architectures"]
    text = text_config_of(config)
    text.vocab_size = max(len(tokenizer), 64)
    for key in VISION_KEYS:
        tower = getattr(config, key, None)
        if tower is None or isinstance(tower, (dict, str)):
            continue
        shrink_tower(tower)
    tower = _tower(config)
    side = getattr(tower, "image_size", None)
    side = side[0] if isinstance(side, (list, tuple)) else side
    for holder in (config, text):
        for key, value in (("pad_token_id", 0), ("bos_token_id", 2), ("eos_token_id", 3)):
            if hasattr(holder, key):
                setattr(holder, key, value)
    with torch.device("meta"):
        size = sum(p.numel() for p in AutoModelForImageTextToText.from_config(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{name}: {size / 1e6:.0f} M parameters at small widths (over {MAX_PARAMETERS / 1e6:.0f} M)")
    for key in OUTPUT_KEYS:  # a tower's output feeds the language model: its width
        for holder in (tower, config):
            if holder is not None and isinstance(getattr(holder, key, None), int):
                setattr(holder, key, text.hidden_size)
    return config, text, tower, side


def write_from_published(src: Path, folder: Path, seed: int = 0) -> str:
    """A small model behind a published VLM's own processor files: ``src`` holds the checkpoint's
    config.json, preprocessor / processor configs, tokenizer_config.json and chat template (no
    weights, no vocabulary). The image and video processors are built from their published
    configs, the chat template is the published one, the word-level tokenizer holds every token
    the published tokenizer adds (``<|vision_start|>``, ``<|image_pad|>``, ...), and the config's
    token ids are moved to those tokens' new ids; the model is the published config cut as
    ``_small_config`` cuts it. Returns the image placeholder vLLM writes."""

    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from hfcheck.analyzer.facts.processor import image_placeholder

    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = {int(i): t["content"] for i, t in (tok_cfg.get("added_tokens_decoder") or {}).items()}
    special = {k: v for k, v in tok_cfg.items() if k.endswith("_token") and isinstance(v, str) and k not in ("bos_token", "eos_token", "pad_token", "unk_token")}
    tokenizer = word_tokenizer(special, extra=tuple(added.values()))
    processor_cls, subs = _processor_classes(raw["model_type"])
    config, text, tower, _ = _small_config(raw, tokenizer, raw["model_type"])
    for holder, source in ((config, raw), (text, raw.get("text_config") or raw)):  # token ids: the same tokens, their new ids
        for key, value in source.items():
            if (key.endswith(("_token_id", "_token_index"))) and isinstance(value, int) and value in added and hasattr(holder, key):
                setattr(holder, key, tokenizer.convert_tokens_to_ids(added[value]))
    parts: dict[str, Any] = {"image_processor": AutoImageProcessor.from_pretrained(src, local_files_only=True)}
    if "video_processor" in subs:
        from transformers import AutoVideoProcessor

        parts["video_processor"] = AutoVideoProcessor.from_pretrained(src, local_files_only=True)
    template = None
    for name in ("chat_template.jinja", "chat_template.json"):
        if (src / name).is_file():
            body = (src / name).read_text(encoding="utf-8")
            template = json.loads(body)["chat_template"] if name.endswith(".json") else body
            break

    accepted = set(inspect.signature(processor_cls.__init__).parameters) - {"self", "tokenizer", "chat_template", *parts}
    published = json.loads((src / "processor_config.json").read_text(encoding="utf-8")) if (src / "processor_config.json").is_file() else {}
    kwargs = {k: v for k, v in published.items() if k in accepted}  # patch_size, image_seq_len, ... as published
    processor = processor_cls(tokenizer=tokenizer, chat_template=template or tok_cfg.get("chat_template"), **parts, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), (120, 30, 200))},
                                             {"type": "text", "text": PROMPT_WORDS}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        model(**inputs)  # the published processor's counts fit the small model, or this raises
    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(folder)
    model.save_pretrained(folder)
    return image_placeholder(processor)
