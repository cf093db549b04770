"""Beam search, as vLLM's server runs it (its online beam search), over the pipeline.

Each step, every live beam runs as a one-token request that reports the 2w most likely next
tokens with their logprobs (w: the beam width, the request's ``n``). A candidate's score is its
beam's summed logprob plus its own. A candidate that is a stop token (unless ``ignore_eos``)
completes its beam, without the stop token; of the others, the w best go on. After
``max_tokens`` steps the live and completed beams are ranked by summed logprob over
length ** length_penalty, the length counting the prompt (vLLM's rule), and the w best are the
choices, best first. The logprobs are the model's own (log-softmax of the raw logits).

Each step's beam prompt is the prompt's token ids and the beam's tokens, so the prefix cache
serves what the beams share. Text prompts only: a prompt with images or videos is refused, since
its token ids alone do not carry the media.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from protos.gen import pb
from services.engine.sampling_params import SamplingParams
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import check_context_length
from services.gateway.frontend.media_budget import has_media
from services.gateway.frontend.openai_api import ApiRequest, Generation
from services.gateway.frontend.prompt_wire import raw_prompt
from services.gateway.frontend.sampling import BeamSearch
from services.gateway.pipeline.token_events import TokenEvent

# One step: a prompt in, its one-token request's final event out (with the top logprobs).
RunStep = Callable[[pb.PromptInput, SamplingParams], Awaitable[TokenEvent]]


@dataclass(frozen=True, slots=True)
class Beam:
    token_ids: tuple[int, ...]  # generated so far (a completed beam's stop token left out)
    cum_logprob: float
    finish_reason: str | None = None  # "stop": ended on a stop token; None: live, or cut by length


def beam_score(beam: Beam, num_prompt_tokens: int, length_penalty: float) -> float:
    return beam.cum_logprob / max(num_prompt_tokens + len(beam.token_ids), 1) ** length_penalty


def advance(
    beams: list[Beam], candidates: list[list[tuple[int, float]]], search: BeamSearch, stop_ids: frozenset[int]
) -> tuple[list[Beam], list[Beam]]:
    """One step: (the beams that go on, best first; the beams completed by a stop token).
    ``candidates[i]``: beam i's next tokens with their logprobs."""
    going_on, completed = [], []
    for beam, options in zip(beams, candidates):
        for token_id, logprob in options:
            total = beam.cum_logprob + logprob
            if token_id in stop_ids and not search.ignore_eos:
                completed.append(Beam(beam.token_ids, total, "stop"))
            else:
                going_on.append(Beam((*beam.token_ids, token_id), total))
    going_on.sort(key=lambda beam: -beam.cum_logprob)  # stable: ties keep beam, then rank, order
    return going_on[: search.width], completed


def best_beams(beams: list[Beam], completed: list[Beam], num_prompt_tokens: int, search: BeamSearch) -> list[Beam]:
    ranked = sorted([*completed, *beams], key=lambda beam: -beam_score(beam, num_prompt_tokens, search.length_penalty))
    return ranked[: search.width]


async def search_prompt(
    run_step: RunStep, prompt: pb.PromptInput, search: BeamSearch, stop_ids: frozenset[int], max_model_len: int
) -> tuple[tuple[int, ...], list[Beam]]:
    """(the prompt's token ids, its best beams): the first step runs on the prompt as given (its
    template, its truncation), the others on its token ids and each beam's tokens."""
    if has_media(prompt):
        raise GatewayError(400, "beam search serves text prompts; this one has images or videos", param="use_beam_search")
    sampling = SamplingParams(max_tokens=1, temperature=0.0, logprobs=min(2 * search.width, 20))
    first = await run_step(prompt, sampling)
    prompt_ids = first.prompt_token_ids
    max_tokens = search.max_tokens
    if search.fit_max_tokens:
        max_tokens = max(1, min(max_tokens, max_model_len - len(prompt_ids)))
    check_context_length(len(prompt_ids), max_tokens, max_model_len, param="prompt")
    beams, completed, events = [Beam((), 0.0)], [], [first]
    for step in range(max_tokens):
        if step:
            prompts = [raw_prompt([*prompt_ids, *beam.token_ids], []) for beam in beams]
            events = list(await asyncio.gather(*(run_step(p, sampling) for p in prompts)))
        candidates = [[(token_id, logprob) for token_id, _, logprob in event.logprobs[0].top] for event in events]
        beams, done = advance(beams, candidates, search, stop_ids)
        completed += done
        if not beams:
            break
    return prompt_ids, best_beams(beams, completed, len(prompt_ids), search)


async def beam_events(
    request: ApiRequest,
    open_events: Callable[[Generation], AsyncIterator[TokenEvent]],
    detokenize: Callable[[list[int]], Awaitable[str]],
    stop_ids: frozenset[int],
    max_model_len: int,
) -> AsyncIterator[tuple[Generation, TokenEvent]]:
    """Each prompt's search, its prompts at once; then every choice's one final event, choice i
    of a prompt being its i-th best beam."""
    search = request.beam
    assert search is not None

    def stepper(generation: Generation) -> RunStep:
        async def run_step(prompt: pb.PromptInput, sampling: SamplingParams) -> TokenEvent:
            last = None
            async for event in open_events(replace(generation, prompt=prompt, sampling=sampling, fit_max_tokens=False)):
                last = event
            assert last is not None and last.logprobs
            return last

        return run_step

    firsts = {g.prompt_index: g for g in reversed(request.generations)}
    searches = [search_prompt(stepper(g), g.prompt, search, stop_ids, max_model_len) for g in firsts.values()]
    found = dict(zip(firsts, await asyncio.gather(*searches)))
    for generation in request.generations:
        prompt_ids, beams = found[generation.prompt_index]
        beam = beams[min(generation.index - firsts[generation.prompt_index].index, len(beams) - 1)]
        text = await detokenize(list(beam.token_ids)) if beam.token_ids else ""
        event = TokenEvent(
            list(beam.token_ids),
            text,
            True,
            beam.finish_reason or "length",
            prompt_tokens=len(prompt_ids),
            cached_tokens=0,
            prompt_token_ids=prompt_ids,
        )
        yield generation, event
