"""vLLM's ``prompt_logprobs`` in responses (the request field: sampling_request.py): the
response's shape (one entry per prompt token; the first is null, having nothing before it).

Each entry maps token ids to ``{logprob, rank, decoded_token}``: the prompt token itself first,
then the ``prompt_logprobs`` most likely tokens (ranks 1..k), as vLLM reports them. The logprobs
are exact on a prefix-cache hit too: a request that asks for them computes its whole prompt
(services/engine/prompt_logprobs.py).
"""

from __future__ import annotations

from pydantic import BaseModel

from services.gateway.pipeline.token_events import PromptLogprobs, finite_logprob, token_name


class PromptLogprobEntry(BaseModel):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobsWire = list[dict[int, PromptLogprobEntry] | None]


def prompt_logprobs_wire(logprobs: PromptLogprobs) -> PromptLogprobsWire:
    out: PromptLogprobsWire = [None]
    for entry in logprobs.entries:
        by_id = {entry.token_id: PromptLogprobEntry(logprob=finite_logprob(entry.logprob), rank=entry.rank, decoded_token=entry.token)}
        for rank, (token_id, token, logprob) in enumerate(entry.top, start=1):
            by_id.setdefault(token_id, PromptLogprobEntry(logprob=finite_logprob(logprob), rank=rank, decoded_token=token))
        out.append(by_id)
    return out


def echoed_logprobs(
    logprobs: PromptLogprobs, as_ids: bool = False
) -> tuple[list[str], list[str], list[float | None], list[dict[str, float] | None]]:
    """The prompt's part of a completion's ``echo`` with ``logprobs``: each prompt token's text,
    its name (its text, or ``token_id:<id>`` with ``as_ids``), its logprob (null for the first)
    and its top tokens by name (itself first, as vLLM)."""
    texts = [logprobs.first_token] + [e.token for e in logprobs.entries]
    names = [token_name(logprobs.first_token_id, logprobs.first_token, as_ids)]
    names += [token_name(e.token_id, e.token, as_ids) for e in logprobs.entries]
    values: list[float | None] = [None] + [finite_logprob(e.logprob) for e in logprobs.entries]
    tops: list[dict[str, float] | None] = [None]
    for name, entry in zip(names[1:], logprobs.entries):
        top = {name: finite_logprob(entry.logprob)}
        for token_id, token, logprob in entry.top:
            top.setdefault(token_name(token_id, token, as_ids), finite_logprob(logprob))
        tops.append(top)
    return texts, names, values, tops
