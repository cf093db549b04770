"""One request's own failure (its sampling) fails that request only: requests batched beside it
finish oracle-equal, and the engine goes on serving."""

from __future__ import annotations

from services.engine.sampling import Sampler, SamplingError
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case
from tests.services.engine.conftest import oracle_tokens

POISON_SEED = 666


class PoisonedSampler(Sampler):
    """Fails as on NaN logits, for requests seeded POISON_SEED (sampled with top_p, so that the
    sampler, not the model runner, samples them)."""

    def _sample_one(self, logits, gumbel, params):
        if params.seed == POISON_SEED:
            raise ValueError("the logits contain NaN")
        return Sampler._sample_one(logits, gumbel, params)


def test_a_poisoned_request_fails_alone_and_its_neighbours_equal_the_oracle(make_llm, oracle):
    llm = make_llm()
    llm.engine.sampler = PoisonedSampler()
    healthy, bystander = chat_case("Describe the weather."), chat_case("Name a colour.")
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    engine = llm.engine
    engine.add_request("healthy", llm.preprocessor.preprocess(healthy.prompt), greedy)
    poisoned = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=POISON_SEED)
    engine.add_request("poisoned", llm.preprocessor.preprocess(chat_case("Hi.").prompt), poisoned)
    engine.add_request("bystander", llm.preprocessor.preprocess(bystander.prompt), greedy)
    tokens: dict[str, list[int]] = {"healthy": [], "poisoned": [], "bystander": []}
    failures = []
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id] += output.new_token_ids
        failures += engine.take_failures()
    assert [(rid, type(error)) for rid, error in failures] == [("poisoned", SamplingError)]
    assert "sampling failed for this request" in str(failures[0][1])
    assert tokens["poisoned"] == [] and "poisoned" not in engine.requests
    assert tokens["healthy"] == oracle_tokens(oracle, healthy, max_new_tokens=8).token_ids
    assert tokens["bystander"] == oracle_tokens(oracle, bystander, max_new_tokens=8).token_ids
    # The engine goes on: its pages were freed, and a new request runs.
    [again] = llm.generate([healthy.prompt], greedy)
    assert again.token_ids == tokens["healthy"]
