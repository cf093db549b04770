"""A checkpoint's configs as transformers reads them: ``config.json`` through ``AutoConfig`` (so a
field the file leaves out, or sets to null where the class fills it, takes transformers' default),
its end-of-sequence ids through ``GenerationConfig``, and the defaults a model's processor class
passes its image processor on every call.

Family readers map these objects to our dataclasses; they never index the raw JSON for a field
that has a default, so a sparse Hub config reads as transformers reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def load_config(path: Path, model_types: tuple[str, ...]) -> PretrainedConfig:
    """config.json as transformers' config class for its ``model_type``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    if config.model_type not in model_types:
        raise ValueError(f"{path / 'config.json'} is model_type {config.model_type!r}, not one of {', '.join(model_types)}")
    return config


def common_text_fields(text, **given: int) -> dict[str, int | float]:
    """The fields every family's text dataclass takes alike from transformers' text config;
    ``given`` for those a config class lacks (a mixture of experts has no intermediate_size)."""
    return {
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": given["intermediate_size"] if "intermediate_size" in given else text.intermediate_size,
        "num_layers": text.num_hidden_layers,
        "num_heads": text.num_attention_heads,
        "num_kv_heads": text.num_key_value_heads,
        "rms_norm_eps": text.rms_norm_eps,
    }


def eos_token_ids(path: Path, config: PretrainedConfig) -> tuple[int, ...]:
    """The ids generation stops on: generation_config.json's where it names any (chat models stop
    on their turn end there), else those transformers derives from the model config."""
    from transformers import GenerationConfig

    ids = None
    if (path / "generation_config.json").is_file():
        ids = GenerationConfig.from_pretrained(str(path)).eos_token_id
    if ids is None:
        ids = GenerationConfig.from_model_config(config).eos_token_id
    if ids is None:
        ids = getattr(config.get_text_config(decoder=True), "eos_token_id", None)
    return tuple(int(i) for i in ids) if isinstance(ids, list | tuple) else () if ids is None else (int(ids),)


def image_call_kwargs(image_processor, processor_class: type) -> dict[str, object]:
    """The settings transformers' ``processor_class`` passes ``image_processor`` on every call.

    - The processor's own ``images_kwargs`` override the image processor's attributes, whatever
      preprocessor_config.json says (ProcessorMixin._merge_kwargs). That is how Gemma3's processor
      turns the Hub's ``"do_convert_rgb": null`` into True, and why its ``do_pan_and_scan`` is off
      unless the caller asks.
    - A field the file sets to null that the processor does not default takes the image processor
      class's default. Transformers would pass None (a greyscale image then fails to normalise);
      where transformers succeeds the result is the same.
    """
    kind = type(image_processor)
    kwargs: dict[str, object] = {
        name: getattr(kind, name)
        for name in getattr(image_processor.valid_kwargs, "__annotations__", {})
        if getattr(image_processor, name, None) is None and getattr(kind, name, None) is not None
    }
    kwargs.update(getattr(processor_class, "images_kwargs", None) or {})
    return kwargs


def chat_template(path: Path, tokenizer) -> str | None:
    """The chat template transformers renders this checkpoint's conversations with: its
    processor's (``chat_template.json``, the legacy processor file, else ``chat_template.jinja``),
    else the tokenizer's (``chat_template.jinja`` or ``tokenizer_config.json``'s field). A set of
    named templates gives its "default"."""
    from transformers import ProcessorMixin

    processor_dict, _ = ProcessorMixin.get_processor_dict(str(path))
    template = processor_dict.get("chat_template") or tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    return template or None
