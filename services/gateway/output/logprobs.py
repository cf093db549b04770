"""Logprobs in the API's shapes: each output token's (chat: ``logprobs.content``; text completions:
the legacy ``tokens`` / ``token_logprobs`` / ``top_logprobs`` lists), and the prompt's (vLLM's
``prompt_logprobs``: one entry per prompt token, the first null having nothing before it, each
mapping token ids to ``{logprob, rank, decoded_token}``, the prompt token itself first; and a
completion's ``echo`` with logprobs). A token is named by its text, or ``token_id:<id>`` with
``return_tokens_as_token_ids``; a logprob of -inf is reported as the lowest finite float."""

from __future__ import annotations

from services.gateway.pipeline.token_events import PromptLogprobs, TokenLogprob, finite_logprob, token_name
from services.gateway.protocol.completion import CompletionLogprobs
from services.gateway.protocol.prompt_logprobs import PromptLogprobEntry, PromptLogprobsWire
from services.gateway.protocol.responses import ChatLogprobs, ChatTokenLogprob, TopLogprob


def chat_logprobs(logprobs: list[TokenLogprob] | None, num_last: int, as_ids: bool) -> ChatLogprobs | None:
    """The last ``num_last`` output tokens' logprobs; None when none were asked for."""
    if logprobs is None:
        return None
    picked = logprobs[len(logprobs) - num_last :]
    content = []
    for lp in picked:
        name = token_name(lp.token_id, lp.token, as_ids)
        top = [top_logprob(token_name(i, t, as_ids), v) for i, t, v in lp.top]
        content.append(ChatTokenLogprob(token=name, logprob=finite_logprob(lp.logprob), bytes=list(name.encode()), top_logprobs=top))
    return ChatLogprobs(content=content)


def top_logprob(name: str, value: float) -> TopLogprob:
    return TopLogprob(token=name, logprob=finite_logprob(value), bytes=list(name.encode()))


def completion_logprobs(
    logprobs: list[TokenLogprob] | None, text_offsets: list[int], num_last: int, as_ids: bool
) -> CompletionLogprobs | None:
    """The last ``num_last`` output tokens' logprobs, at their offsets in the text; None when none
    were asked for."""
    if logprobs is None:
        return None
    start = len(logprobs) - num_last
    picked = logprobs[start:]
    return CompletionLogprobs(
        tokens=[token_name(lp.token_id, lp.token, as_ids) for lp in picked],
        token_logprobs=[finite_logprob(lp.logprob) for lp in picked],
        top_logprobs=[top_with_sampled(lp, as_ids) for lp in picked],
        text_offset=text_offsets[start:],
    )


def top_with_sampled(logprob: TokenLogprob, as_ids: bool) -> dict[str, float]:
    """The sampled token first, then the most likely ones (k or k + 1 entries), as vLLM and the
    legacy OpenAI API give them."""
    top = {token_name(logprob.token_id, logprob.token, as_ids): finite_logprob(logprob.logprob)}
    for token_id, token, value in logprob.top:
        top.setdefault(token_name(token_id, token, as_ids), finite_logprob(value))
    return top


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
