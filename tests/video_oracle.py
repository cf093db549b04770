"""The video oracle: what transformers feeds its Qwen models for a clip, as users run it:
``AutoProcessor`` (and ``AutoVideoProcessor``) built from the checkpoint directory, with real
torchvision, in the reference environment (tests/reference_processors.py). Clips are decoded
whole by transformers' ``load_video(backend="pyav")`` and sampled by the processor's own sampler
(``do_sample_frames=True`` at the request's rate), then transformers' ``generate`` runs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.reference_processors import reference_processors


@dataclass(slots=True)
class OracleVideo:
    pixel_values_videos: torch.Tensor
    video_grid_thw: tuple[int, int, int]
    indices: list[int]
    processor: str  # the video processor class transformers built


def oracle_video(data: bytes, model_dir: Path, *, fps: float = 2.0, **video_kwargs) -> OracleVideo:
    """One clip through the checkpoint's video processor, as transformers builds it."""
    out = reference_processors().video(model_dir, [data], fps=fps, **video_kwargs)
    grid = tuple(int(x) for x in out["video_grid_thw"][0].tolist())
    return OracleVideo(out["pixel_values_videos"], grid, [int(i) for i in out["frames_indices"][0]], out["backend"])


def oracle_case_tokens(oracle, case, max_new_tokens: int = 16, *, fps: float = 2.0):
    """transformers' greedy generate for a chat case with videos (and images): the rendered
    template, its images and clips through AutoProcessor, then the model's own generate."""
    from tests.oracle import OracleOutput

    kwargs = _model_kwargs(oracle, case, fps)
    ids = kwargs["input_ids"]
    with torch.inference_mode():
        generated = oracle.model.generate(
            **kwargs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    return OracleOutput(generated.sequences[0, ids.shape[1] :].tolist(), [step[0].float() for step in generated.logits])


def oracle_case_embedding(oracle, case, *, fps: float = 2.0) -> torch.Tensor:
    """transformers' last hidden state at a chat case's last token, normalized, with its clips
    (and images) through AutoProcessor: vLLM's embed pooling."""
    with torch.inference_mode():
        hidden = oracle.model(**_model_kwargs(oracle, case, fps), output_hidden_states=True).hidden_states[-1][0, -1].float()
    return torch.nn.functional.normalize(hidden, dim=-1)


def _model_kwargs(oracle, case, fps: float) -> dict:
    """The model's inputs for a chat case: the rendered template, its images and clips through AutoProcessor."""
    text = oracle.chat_text(case.oracle_messages)
    out = reference_processors().process(oracle.model_dir, text, case.images, case.videos, video_kwargs={"fps": fps})
    ids = out["input_ids"]
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": out["mm_token_type_ids"]}
    names = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    return kwargs | {name: out[name] for name in names if name in out}
