"""vLLM's ``/v1/chat/completions/batch`` body: a chat completion request whose ``messages`` is a
list of conversations; every other field applies to each conversation alike (how it runs:
frontend/batch_chat.py)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from services.gateway.protocol.sampling_request import MAX_CHOICES
from services.gateway.protocol.wire_base import WireModel

MAX_CONVERSATIONS = MAX_CHOICES  # each is a request on the decode tier, as a choice is


class BatchChatCompletionRequest(WireModel):
    """``messages``: the conversations; every other field is /v1/chat/completions' own."""

    messages: Annotated[list[Annotated[list[dict[str, Any]], Field(min_length=1)]], Field(min_length=1, max_length=MAX_CONVERSATIONS)]
