"""The reference oracle: transformers' own ``AutoProcessor`` as users run it, with real torchvision
(tests/reference_processors.py, in an environment of its own), and transformers' ``generate``
(greedy, float32), for every family (Qwen2-VL / Qwen2.5-VL, Qwen3-VL, Gemma3).

Every correctness test compares Tessera against this. Comparison rule: token ids must be equal;
at the first divergence the test still passes only if the oracle's top-2 logit margin at that
step is below ``TIE_MARGIN``, i.e. the oracle itself faced a genuine tie.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

TIE_MARGIN = 1e-4


@dataclass(slots=True)
class OracleInputs:
    input_ids: torch.Tensor  # (1, L)
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None  # Qwen2-VL
    mm_token_type_ids: torch.Tensor | None  # Qwen2-VL's; Gemma3 calls them token_type_ids

    @property
    def token_ids(self) -> list[int]:
        return self.input_ids[0].tolist()

    def to(self, device: torch.device) -> OracleInputs:
        """The same inputs on ``device`` (for an oracle model moved there)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return OracleInputs(move(self.input_ids), move(self.pixel_values), move(self.image_grid_thw), move(self.mm_token_type_ids))


@dataclass(slots=True)
class OracleOutput:
    token_ids: list[int]  # generated tokens only
    step_logits: list[torch.Tensor]  # raw logits at each generated step, (vocab,)

    def logprobs(self) -> list[float]:
        return [torch.log_softmax(logits, -1)[t].item() for logits, t in zip(self.step_logits, self.token_ids)]

    def top2_margin(self, step: int) -> float:
        top = torch.topk(self.step_logits[step], 2).values
        return (top[0] - top[1]).item()


class ReferenceOracle:
    def __init__(self, model_dir: Path, *, load_model: bool = True, do_pan_and_scan: bool = False) -> None:
        from transformers import AutoModelForImageTextToText, AutoTokenizer, ProcessorMixin

        self.model_dir = Path(model_dir)
        self.model_type = json.loads((self.model_dir / "config.json").read_text())["model_type"]
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # The processor's chat template (chat_template.json or .jinja) where the checkpoint ships one.
        self.chat_template = ProcessorMixin.get_processor_dict(str(model_dir))[0].get("chat_template")
        self.processor_kwargs: dict = {"do_pan_and_scan": do_pan_and_scan} if self.model_type == "gemma3" else {}
        self.model = None
        if load_model:
            # Qwen2-VL or Qwen2.5-VL, whichever the checkpoint declares.
            self.model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def chat_text(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The processor's template where the checkpoint ships one, else the tokenizer's."""
        template = self.chat_template or self.tokenizer.chat_template
        return self.tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def process(self, text: str, images: list[Image.Image]) -> OracleInputs:
        """The rendered prompt and its images through transformers' AutoProcessor (torchvision)."""
        from tests.reference_processors import reference_processors

        kwargs = self.processor_kwargs if images else {}
        out = reference_processors().process(self.model_dir, text, list(images), **kwargs)
        return OracleInputs(
            input_ids=out["input_ids"],
            pixel_values=out.get("pixel_values"),
            image_grid_thw=out.get("image_grid_thw"),
            mm_token_type_ids=out.get("mm_token_type_ids", out.get("token_type_ids")),
        )

    def rope_index(self, inputs: OracleInputs) -> tuple[torch.Tensor, int]:
        """(3, L) M-RoPE positions and delta, from transformers' model code."""
        assert self.model is not None
        if inputs.image_grid_thw is None:
            length = inputs.input_ids.shape[1]
            return torch.arange(length).view(1, -1).expand(3, -1), 0
        positions, deltas = self.model.model.get_rope_index(
            inputs.input_ids, mm_token_type_ids=inputs.mm_token_type_ids, image_grid_thw=inputs.image_grid_thw
        )
        return positions[:, 0, :], int(deltas[0, 0].item())

    @torch.inference_mode()
    def image_features(self, inputs: OracleInputs) -> torch.Tensor:
        """transformers' own vision tower and merger over the request's images (Qwen families):
        one row per image token, every image in order."""
        assert self.model is not None and inputs.pixel_values is not None
        out = self.model.model.get_image_features(inputs.pixel_values, inputs.image_grid_thw)
        out = out.pooler_output if hasattr(out, "pooler_output") else out
        return torch.cat(list(out)) if isinstance(out, (list, tuple)) else out

    def _model_kwargs(self, inputs: OracleInputs) -> dict:
        kwargs = {"input_ids": inputs.input_ids, "attention_mask": torch.ones_like(inputs.input_ids)}
        if inputs.pixel_values is not None and self.model_type == "gemma3":
            kwargs.update(pixel_values=inputs.pixel_values, token_type_ids=inputs.mm_token_type_ids)
        elif inputs.pixel_values is not None:
            kwargs.update(
                pixel_values=inputs.pixel_values,
                image_grid_thw=inputs.image_grid_thw,
                mm_token_type_ids=inputs.mm_token_type_ids,
            )
        return kwargs

    @torch.inference_mode()
    def prompt_logprobs(self, inputs: OracleInputs) -> torch.Tensor:
        """(L - 1, vocab): row i is the log-softmax of the float32 logits that predict prompt
        token i + 1, from one forward pass over the prompt."""
        assert self.model is not None
        logits = self.model(**self._model_kwargs(inputs)).logits[0, :-1].float()
        return torch.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def hidden_states(self, inputs: OracleInputs) -> torch.Tensor:
        """(L, hidden): transformers' last hidden state (after the final norm) at every prompt position."""
        assert self.model is not None
        return self.model(**self._model_kwargs(inputs), output_hidden_states=True).hidden_states[-1][0].float()

    def embedding(self, inputs: OracleInputs) -> torch.Tensor:
        """The last prompt token's last hidden state, L2-normalized: vLLM's embed pooling."""
        return torch.nn.functional.normalize(self.hidden_states(inputs)[-1], dim=-1)

    @torch.inference_mode()
    def generate(self, inputs: OracleInputs, max_new_tokens: int, **generate_kwargs) -> OracleOutput:
        """Greedy; ``generate_kwargs`` add transformers' logits processors (repetition_penalty)."""
        assert self.model is not None
        kwargs = self._model_kwargs(inputs)
        out = self.model.generate(
            **kwargs,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **generate_kwargs,
        )
        prompt_len = inputs.input_ids.shape[1]
        return OracleOutput(
            token_ids=out.sequences[0, prompt_len:].tolist(),
            step_logits=[step[0].float() for step in out.logits],
        )


def assert_tokens_match(ours: list[int], oracle: OracleOutput, *, context: str = "") -> None:
    """Equal token ids, or a first divergence at a genuine oracle tie (top-2 margin < TIE_MARGIN)."""
    for step, (mine, theirs) in enumerate(zip(ours, oracle.token_ids)):
        if mine != theirs:
            margin = oracle.top2_margin(step)
            assert margin < TIE_MARGIN, (
                f"{context}: diverged from the oracle at step {step}: ours {mine}, oracle {theirs} "
                f"(oracle top-2 margin {margin:.3g} is not a tie)\n ours  ={ours}\n oracle={oracle.token_ids}"
            )
            return
    assert len(ours) == len(oracle.token_ids), f"{context}: length {len(ours)} != oracle {len(oracle.token_ids)}"
