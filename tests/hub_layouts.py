"""Built-in tiny checkpoints written out as each family's Hub repository lays its model out.

Each layout copies what the real repository ships, in its form rather than our built-ins':
  - qwen2-vl-7b:   flat config (text fields at the top, ``rope_scaling`` of type "mrope"), an
                   untied head, the older weight names, bfloat16, ``min_pixels``/``max_pixels``
                   instead of ``size``, the template in ``chat_template.json``.
  - qwen2.5-vl:    the same vintage's Qwen2.5-VL config (window attention, ``tokens_per_second``),
                   tied head, the template in ``chat_template.json``.
  - qwen3-vl-2b:   transformers 4.57's config (``rope_scaling`` + ``rope_theta``, a vision config
                   typed "qwen3_vl"), one file, tied head, the template inside
                   ``tokenizer_config.json``.
  - qwen3-vl-8b:   untied head, bfloat16 in two shards with an index, ``chat_template.jinja``.
  - qwen3.5-27b:   transformers 4.57's Qwen3.5 config (layer_types spelled out, unread fields for
                   the multi-token prediction head, the state dtype and the output gate, a vision
                   config typed "qwen3_5"), ``mtp.*`` tensors beside the model, bfloat16 in two
                   shards, the Hub's video processor file, ``chat_template.jinja``.
  - qwen3.5-35b-a3b: the same for Qwen3.5-MoE, its experts one tensor per expert and projection.
  - gemma-3-4b-it: the sparse ``text_config`` that leaves heads, head size, KV heads, query
                   scale and vocabulary to Gemma3TextConfig's defaults; the older
                   ``language_model.model.*`` / ``vision_tower.vision_model.*`` names, tied
                   head, bfloat16, a preprocessor config whose RGB conversion and Pan-and-Scan
                   fields are null, ``processor_config.json``, the template in ``chat_template.json``.
The weights are deterministic (tests/ fixtures build each once per session).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.models.registry import resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class HubLayout:
    name: str
    model_type: str
    write: Callable[[Path], None]  # into an empty directory
    pan_and_scan: bool = False  # also served with Pan-and-Scan on


# ---- weights -------------------------------------------------------------------------------


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


def _untied_head(tensors: dict[str, torch.Tensor], embed_name: str, seed: int) -> torch.Tensor:
    """A head of its own, unlike the embedding table: a reader that ties it anyway fails the oracle."""
    embed = tensors[embed_name]
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(embed.shape, generator=generator, dtype=torch.float32) * 0.3


def _save_weights(out: Path, tensors: dict[str, torch.Tensor], *, dtype: torch.dtype, num_shards: int = 1) -> None:
    tensors = {name: t.to(dtype).contiguous() for name, t in sorted(tensors.items())}
    if num_shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    per_shard = -(-len(names) // num_shards)
    weight_map = {}
    for k in range(num_shards):
        file = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
        shard = {name: tensors[name] for name in names[k * per_shard : (k + 1) * per_shard]}
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# ---- tokenizer and template ------------------------------------------------------------------


def _copy_tokenizer(src: Path, out: Path, template_in: str) -> None:
    """The tokenizer files, with the chat template in ``template_in``: "jinja", "json" (the legacy
    processor file) or "tokenizer_config"."""
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    template = (src / "chat_template.jinja").read_text()
    if template_in == "jinja":
        (out / "chat_template.jinja").write_text(template)
    elif template_in == "json":
        (out / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2))
    else:
        config = json.loads((out / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _write_json(path: Path, body: dict) -> None:
    path.write_text(json.dumps(body, indent=2) + "\n")


# ---- Qwen2-VL / Qwen2.5-VL ---------------------------------------------------------------------

QWEN_GENERATION = {"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643], "transformers_version": "4.41.2"}
QWEN2_PREPROCESSOR = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}


def _flat_qwen2_config(builtin: dict, *, model_type: str, tie: bool, vision: dict) -> dict:
    """transformers 4.4x's flat Qwen2-VL config: the text fields at the top level."""
    text = builtin["text_config"]
    rope = text["rope_parameters"]
    return {
        "architectures": ["Qwen2VLForConditionalGeneration" if model_type == "qwen2_vl" else "Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "hidden_act": "silu",
        "hidden_size": text["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": text["intermediate_size"],
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": model_type,
        "num_attention_heads": text["num_attention_heads"],
        "num_hidden_layers": text["num_hidden_layers"],
        "num_key_value_heads": text["num_key_value_heads"],
        "rms_norm_eps": 1e-06,
        "rope_theta": rope["rope_theta"],
        "sliding_window": 32768,
        "tie_word_embeddings": tie,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vision_config": vision,
        "rope_scaling": {"type": "mrope", "mrope_section": list(rope["mrope_section"])},
        "vocab_size": text["vocab_size"],
    }


def write_qwen2_vl_7b(out: Path) -> None:
    src = resolve_model("tiny", progress=lambda _m: None).path
    builtin = json.loads((src / "config.json").read_text())
    vision = builtin["vision_config"]
    hub_vision = {
        "depth": vision["depth"],
        "embed_dim": vision["embed_dim"],
        "mlp_ratio": 4,
        "num_heads": vision["num_heads"],
        "in_chans": 3,
        "hidden_size": vision["hidden_size"],
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
    }
    _write_json(out / "config.json", _flat_qwen2_config(builtin, model_type="qwen2_vl", tie=False, vision=hub_vision))
    tensors = _tensors(src)  # the built-in already has the older names: model.*, visual.*
    tensors["lm_head.weight"] = _untied_head(tensors, "model.embed_tokens.weight", seed=71)
    _save_weights(out, tensors, dtype=torch.bfloat16)
    _write_json(out / "generation_config.json", QWEN_GENERATION)
    _write_json(out / "preprocessor_config.json", QWEN2_PREPROCESSOR)
    _copy_tokenizer(src, out, "json")


def write_qwen2_5_vl(out: Path) -> None:
    """A Qwen2.5-VL model of the tiny built-in's text size, saved in the 3B repository's layout."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from services.models.builtins.weights import fill_deterministic

    src = resolve_model("tiny", progress=lambda _m: None).path
    builtin = json.loads((src / "config.json").read_text())
    hidden = builtin["text_config"]["hidden_size"]
    hub_vision = {
        "depth": 2,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "in_chans": 3,
        "out_hidden_size": hidden,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    }
    raw = _flat_qwen2_config(builtin, model_type="qwen2_5_vl", tie=True, vision=hub_vision)
    _write_json(out / "config.json", raw)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_pretrained(str(out))).to(torch.float32).eval()
    fill_deterministic(model, seed=7, std=0.3)
    # The Hub's names for this vintage: model.* for the text model, visual.* for the tower.
    renamed = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        renamed[name.replace("model.language_model.", "model.").replace("model.visual.", "visual.")] = tensor
    _save_weights(out, renamed, dtype=torch.float32)
    _write_json(out / "generation_config.json", QWEN_GENERATION)
    _write_json(out / "preprocessor_config.json", {**QWEN2_PREPROCESSOR, "processor_class": "Qwen2_5_VLProcessor"})
    _copy_tokenizer(src, out, "json")


# ---- Qwen3-VL ----------------------------------------------------------------------------------


def _qwen3_hub_config(builtin: dict, *, tie: bool) -> dict:
    """transformers 4.57's Qwen3-VL config: rope_scaling + rope_theta, a vision config typed "qwen3_vl"."""
    text = dict(builtin["text_config"])
    rope = dict(text.pop("rope_parameters"))
    text["rope_theta"] = rope.pop("rope_theta")
    text["rope_scaling"] = {"mrope_interleaved": True, "mrope_section": rope["mrope_section"], "rope_type": "default"}
    text.pop("tie_word_embeddings", None)
    text["dtype"] = "bfloat16"
    return {
        **{k: v for k, v in builtin.items() if k not in ("text_config", "vision_config", "dtype")},
        "text_config": text,
        "vision_config": {**builtin["vision_config"], "model_type": "qwen3_vl"},
        "tie_word_embeddings": tie,
        "transformers_version": "4.57.0.dev0",
    }


def _qwen3_layout(out: Path, *, tie: bool, num_shards: int, template_in: str, dtype: torch.dtype) -> None:
    src = resolve_model("qwen3vl-tiny", progress=lambda _m: None).path
    builtin = json.loads((src / "config.json").read_text())
    _write_json(out / "config.json", _qwen3_hub_config(builtin, tie=tie))
    tensors = _tensors(src)
    if not tie:
        tensors["lm_head.weight"] = _untied_head(tensors, "model.language_model.embed_tokens.weight", seed=83)
    _save_weights(out, tensors, dtype=dtype, num_shards=num_shards)
    _write_json(out / "generation_config.json", {**QWEN_GENERATION, "top_k": 20, "top_p": 0.8, "transformers_version": "4.56.0"})
    preprocessor = json.loads((src / "preprocessor_config.json").read_text())
    for name in ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "resample", "rescale_factor"):
        preprocessor.pop(name, None)  # the Hub's file leaves them to the class
    _write_json(out / "preprocessor_config.json", {**preprocessor, "processor_class": "Qwen3VLProcessor"})
    _write_json(out / "video_preprocessor_config.json", QWEN3_VL_HUB_VIDEO)
    _copy_tokenizer(src, out, template_in)


# The Hub's Qwen3-VL video_preprocessor_config.json: it names Qwen3VLVideoProcessor, whose
# sampler and whole-clip pixel budget then apply (a checkpoint without it gets Qwen2VL's).
QWEN3_VL_HUB_VIDEO = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": True,
    "fps": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768,
    "merge_size": 2,
    "min_frames": 4,
    "patch_size": 16,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "return_metadata": False,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "temporal_patch_size": 2,
    "video_processor_type": "Qwen3VLVideoProcessor",
}


def write_qwen3_vl_2b(out: Path) -> None:
    _qwen3_layout(out, tie=True, num_shards=1, template_in="tokenizer_config", dtype=torch.float32)


def write_qwen3_vl_8b(out: Path) -> None:
    _qwen3_layout(out, tie=False, num_shards=2, template_in="jinja", dtype=torch.bfloat16)


# ---- Qwen3.5 -----------------------------------------------------------------------------------


def _qwen3_5_hub_config(builtin: dict) -> dict:
    """The Hub's Qwen3.5 config (written by transformers 4.57): layer_types spelled out, the
    rotary fraction at the text level too, fields transformers does not read (the multi-token
    prediction head, the state dtype, the output gate), eos at the text level, and a vision config
    typed "qwen3_5" (transformers renames it) with an empty DeepStack list."""
    text = dict(builtin["text_config"])
    text.update(
        attn_output_gate=True,
        full_attention_interval=4,
        mamba_ssm_dtype="float32",
        mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False,
        output_gate_type="swish",
        partial_rotary_factor=0.25,
        eos_token_id=151645,
        dtype="bfloat16",
    )
    text.pop("tie_word_embeddings", None)
    vision = {**builtin["vision_config"], "model_type": builtin["model_type"], "deepstack_visual_indexes": []}
    return {
        **{k: v for k, v in builtin.items() if k not in ("text_config", "vision_config", "dtype")},
        "language_model_only": False,
        "text_config": text,
        "vision_config": vision,
        "transformers_version": "4.57.1",
    }


def _qwen3_5_layout(out: Path, builtin_name: str) -> None:
    src = resolve_model(builtin_name, progress=lambda _m: None).path
    builtin = json.loads((src / "config.json").read_text())
    config = _qwen3_5_hub_config(builtin)
    _write_json(out / "config.json", config)
    tensors = _tensors(src)
    # The multi-token prediction head ships beside the model; serving reads none of it.
    hidden = config["text_config"]["hidden_size"]
    generator = torch.Generator().manual_seed(85)
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator)
    tensors["mtp.norm.weight"] = torch.zeros(hidden)
    _save_weights(out, tensors, dtype=torch.bfloat16, num_shards=2)
    _write_json(out / "generation_config.json", {**QWEN_GENERATION, "top_k": 20, "top_p": 0.95, "temperature": 0.6})
    preprocessor = json.loads((src / "preprocessor_config.json").read_text())
    for name in ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "resample", "rescale_factor"):
        preprocessor.pop(name, None)
    _write_json(out / "preprocessor_config.json", {**preprocessor, "processor_class": "Qwen3VLProcessor"})
    _write_json(out / "video_preprocessor_config.json", QWEN3_VL_HUB_VIDEO)
    _copy_tokenizer(src, out, "jinja")


def write_qwen3_5_27b(out: Path) -> None:
    _qwen3_5_layout(out, "qwen3_5-tiny")


def write_qwen3_5_35b_a3b(out: Path) -> None:
    _qwen3_5_layout(out, "qwen3_5-moe-tiny")


# ---- Gemma3 ------------------------------------------------------------------------------------

GEMMA3_PREPROCESSOR = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
}


def gemma3_default_geometry_spec():
    """A tiny Gemma3 whose attention has Gemma3TextConfig's default geometry (8 heads of 256, 4 KV
    heads, query scale 256, the 5:1 sliding pattern), so a config that names none of it is right."""
    from services.models.builtins.gemma3 import BUILTIN_SPECS, FULL, SLIDING, Gemma3Spec

    tiny = BUILTIN_SPECS["gemma3-tiny"]
    fields = {name: getattr(tiny, name) for name in Gemma3Spec.__slots__}
    fields.update(
        name="gemma3-hub-layout",
        seed=4042,
        text_layer_types=(SLIDING,) * 5 + (FULL,),
        text_heads=8,
        text_kv_heads=4,
        text_head_dim=256,
        query_pre_attn_scalar=256,
    )
    return Gemma3Spec(**fields)


def write_gemma_3_4b_it(out: Path) -> None:
    from services.models.builtins.gemma3 import write_checkpoint

    spec = gemma3_default_geometry_spec()
    built = out / "_built"
    built.mkdir()
    write_checkpoint(spec, built, progress=lambda _m: None)
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": [1, 106],
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": spec.mm_tokens_per_image,
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": spec.text_hidden,
            "intermediate_size": spec.text_intermediate,
            "model_type": "gemma3_text",
            "num_hidden_layers": len(spec.text_layer_types),
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": spec.sliding_window,
        },
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "vision_config": {
            "hidden_size": spec.vision_hidden,
            "image_size": spec.vision_image_size,
            "intermediate_size": spec.vision_intermediate,
            "model_type": "siglip_vision_model",
            "num_attention_heads": spec.vision_heads,
            "num_hidden_layers": spec.vision_layers,
            "patch_size": spec.vision_patch_size,
            "vision_use_head": False,
        },
    }
    _write_json(out / "config.json", config)
    _save_weights(out, _tensors(built), dtype=torch.bfloat16)  # already language_model.model.*, vision_tower.vision_model.*
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "eos_token_id": [1, 106],
            "pad_token_id": 0,
            "transformers_version": "4.50.0.dev0",
        },
    )
    size = {"height": spec.vision_image_size, "width": spec.vision_image_size}
    _write_json(out / "preprocessor_config.json", {**GEMMA3_PREPROCESSOR, "image_seq_length": spec.mm_tokens_per_image, "size": size})
    _write_json(out / "processor_config.json", {"image_seq_length": spec.mm_tokens_per_image, "processor_class": "Gemma3Processor"})
    for name in ("special_tokens_map.json", "tokenizer.model", "added_tokens.json"):
        if (built / name).is_file():
            shutil.copy(built / name, out / name)
    _copy_tokenizer(built, out, "json")
    shutil.rmtree(built)


LAYOUTS = {
    layout.name: layout
    for layout in (
        HubLayout("qwen2-vl-7b", "qwen2_vl", write_qwen2_vl_7b),
        HubLayout("qwen2.5-vl", "qwen2_5_vl", write_qwen2_5_vl),
        HubLayout("qwen3-vl-2b", "qwen3_vl", write_qwen3_vl_2b),
        HubLayout("qwen3-vl-8b", "qwen3_vl", write_qwen3_vl_8b),
        HubLayout("qwen3.5-27b", "qwen3_5", write_qwen3_5_27b),
        HubLayout("qwen3.5-35b-a3b", "qwen3_5_moe", write_qwen3_5_35b_a3b),
        HubLayout("gemma-3-4b-it", "gemma3", write_gemma_3_4b_it, pan_and_scan=True),
    )
}


def write_layout(name: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    LAYOUTS[name].write(out)
    return out
