"""vLLM's ``prompt_logprobs`` in responses (the request field: sampling_request.py): the
response's shape (one entry per prompt token; the first is null, having nothing before it).

Each entry maps token ids to ``{logprob, rank, decoded_token}``: the prompt token itself first,
then the ``prompt_logprobs`` most likely tokens (ranks 1..k), as vLLM reports them. The logprobs
are exact on a prefix-cache hit too: a request that asks for them computes its whole prompt
(services/engine/prompt_logprobs.py).
"""

from __future__ import annotations

from pydantic import BaseModel


class PromptLogprobEntry(BaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobsWire = list[dict[int, PromptLogprobEntry] | None]
