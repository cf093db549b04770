"""The wire models of /v1/completions: a raw prompt (text or token ids, no chat template), with
images and videos given vLLM-style in ``multi_modal_data`` and marked in the prompt by the model's
placeholder, one per item (Qwen2-VL: ``<|vision_start|><|image_pad|><|vision_end|>`` in text, the
image token id in token ids, ``<|video_pad|>`` for a video; Gemma3: ``<start_of_image>``, in text
or as its id). A list of
prompts is a batch: each prompt gets ``n`` choices, numbered prompt-major as OpenAI does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from services.gateway.protocol.chat import ImageUuid
from services.gateway.protocol.media_fields import MmProcessorKwargs, VideoRef, needs_source_or_uuid
from services.gateway.protocol.prompt_logprobs import PromptLogprobsWire
from services.gateway.protocol.responses import Usage
from services.gateway.protocol.sampling_request import INT32_MAX, SamplingRequest, check_logprob_token_ids
from services.gateway.protocol.unserved_fields import COMPLETION_DEFAULTS, off, refuse_asked
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

MAX_PROMPTS = 16
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)]


class ImageRef(WireModel):
    url: NonEmptyStr | None = Field(
        None,
        description="a data URL, base64 bytes, or an http(s) URL where the operator allows them; null: the image its uuid names",
    )
    uuid: ImageUuid | None = None

    @model_validator(mode="after")
    def _has_source(self):
        return needs_source_or_uuid(self, self.url, "an image's url")


class MultiModalData(WireModel):
    image: NonEmptyStr | ImageRef | list[NonEmptyStr | ImageRef] | None = Field(None, description="the images, in placeholder order")
    video: NonEmptyStr | VideoRef | list[NonEmptyStr | VideoRef] | None = Field(None, description="the videos, in placeholder order")

    def images(self) -> list[str | ImageRef]:
        return _as_list(self.image)

    def videos(self) -> list[VideoRef]:
        return [VideoRef(url=v) if isinstance(v, str) else v for v in _as_list(self.video)]


def _as_list(value):
    return [] if value is None else value if isinstance(value, list) else [value]


class CompletionRequest(SamplingRequest):
    """/v1/completions: the shared fields (sampling_request.py) and the text completion's own."""

    prompt: (
        NonEmptyStr
        | TokenIds
        | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    multi_modal_data: MultiModalData | None = None
    mm_processor_kwargs: MmProcessorKwargs | None = Field(None, description="the video sampler's and processor's settings")
    max_tokens: int | None = Field(16, ge=0, le=INT32_MAX, description="16 by default, as in OpenAI's API; 0 only with echo")
    echo: bool = Field(
        False, description="each choice's text starts with its prompt (as vLLM: token ids detokenized), and with logprobs its logprobs"
    )
    logprobs: int | None = Field(
        None, ge=-1, description="the sampled token's logprob and this many alternatives (at most --max-logprobs, 20; -1: the vocabulary)"
    )
    suffix: None = Field(None, description="not supported")
    # -- vLLM's, not served: refused unless they ask for nothing (unserved_fields.py)
    add_special_tokens: bool = off("add_special_tokens", COMPLETION_DEFAULTS)
    prompt_embeds: Any = off("prompt_embeds", COMPLETION_DEFAULTS)
    kv_transfer_params: dict[str, Any] | None = off("kv_transfer_params", COMPLETION_DEFAULTS)

    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("prompt") in (None, "", []):
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")  # vLLM's words
        return data

    @model_validator(mode="after")
    def _completion_fields_agree(self) -> CompletionRequest:
        refuse_asked(self, COMPLETION_DEFAULTS)
        check_logprob_token_ids(self, self.num_logprobs())
        if self.logprob_token_ids and self.echo_only:
            raise ValueError(
                "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output tokens are generated."
            )
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 needs echo=true (it scores the prompt and generates nothing)")
        if self.multi_modal_data is not None and len(self.prompts()) != 1:
            raise ValueError("multi_modal_data needs a single prompt (its images fill that prompt's placeholders)")
        return self

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        """As vLLM: ``prompt_logprobs``, or with ``echo`` the logprobs count."""
        if self.prompt_logprobs is not None or not self.echo:
            return self.prompt_logprobs
        return self.logprobs

    @property
    def echo_only(self) -> bool:
        """``echo`` with max_tokens 0: the prompt (and its logprobs) alone, nothing generated."""
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[str | list[int]]:
        """The batch: one entry per prompt."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


# -- responses ---------------------------------------------------------------------------------
class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids (a stream's first chunk of the choice)
    token_ids: list[int] | None = None  # return_token_ids: the choice's (a stream's: the chunk's)
    prompt_logprobs: PromptLogprobsWire | None = None


class CompletionResponse(BaseModel):
    """Also each chunk of a stream (one choice's new text per chunk; the usage chunk has none)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
