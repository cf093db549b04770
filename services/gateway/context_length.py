"""The model's context limit, checked at the gateway as soon as the prompt is tokenized (after the
chat template and the image placeholders' expansion), as vLLM does: a prompt plus ``max_tokens``
beyond ``max_model_len`` is a 400 ``context_length_exceeded`` naming both numbers, before any
prefill or decode node spends work on it. The engines check again (``Engine.check_admissible``)
for callers that reach a node without the gateway."""

from __future__ import annotations

from services.engine.config import EngineConfig
from services.gateway.errors import GatewayError

DEFAULT_MAX_MODEL_LEN = EngineConfig().max_model_len


def check_context_length(num_prompt_tokens: int, max_tokens: int, max_model_len: int, *, param: str) -> None:
    """``param``: what holds the prompt in the request ("messages" or "prompt"), as OpenAI names it."""
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        raise GatewayError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens "
            f"({num_prompt_tokens} in the {param}, {max_tokens} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            code="context_length_exceeded",
            param=param,
        )
