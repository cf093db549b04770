"""Qwen3.5 (tiny built-in, hybrid): greedy float32 output equals transformers' generate token for
token on every in-engine path: text and images, a prompt cut into prefill chunks (each chunk
carries its linear layers' state into the next, through an image too), a batch in flight mixing
prefill chunks and single-token decode rows, state slots reused by later requests, a request
preempted and recomputed from a zero state, and an image repeated from the encoder cache."""

from __future__ import annotations

import pytest

from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, conversation, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match

GREEDY_12 = SamplingParams(max_tokens=12, ignore_eos=True)


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def _oracle_tokens(oracle: ReferenceOracle, case, max_new_tokens: int = 12) -> object:
    return oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), max_new_tokens)


CASES = {
    "text_only": lambda: chat_case("Describe the weather in one sentence."),
    "long_text": lambda: chat_case("Count the words in this sentence, please. " * 12),  # more than one 64-token block
    "one_image_at_start": lambda: chat_case(_png(112, 112, 1), "What is in this image?"),
    "two_images": lambda: chat_case(_png(56, 56, 2), "one", _png(300, 200, 3), "two"),
    "image_in_middle": lambda: chat_case("Look closely at", _png(98, 70, 5), "and tell me what you see."),
}


@pytest.fixture(scope="module")
def shared_llm(qwen3_5_model) -> LLM:
    return LLM(str(qwen3_5_model.path))


def test_the_builtin_is_hybrid_and_keeps_kv_only_for_its_full_attention_layers(shared_llm):
    shape = shared_llm.engine.runner.checkpoint.shape
    assert shape.state is not None and shape.state.layers == (0, 1, 2, 4, 5, 6)
    assert shared_llm.engine.kv.layout.kv_layers == (3, 7)
    assert not shared_llm.engine.config.enable_prefix_caching  # until state is kept at block ends


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_matches_oracle(name, shared_llm, qwen3_5_oracle):
    case = CASES[name]()
    [result] = shared_llm.generate([case.prompt], GREEDY_12)
    inputs = qwen3_5_oracle.process(qwen3_5_oracle.chat_text(case.oracle_messages), case.images)
    assert shared_llm.preprocessor.preprocess(case.prompt).prompt_token_ids == inputs.token_ids
    assert_tokens_match(result.token_ids, qwen3_5_oracle.generate(inputs, 12), context=name)
    assert result.usage.prompt_tokens == len(inputs.token_ids)


def test_an_image_split_across_prefill_chunks_matches_oracle(make_qwen3_5_llm, qwen3_5_oracle):
    """24-token steps cut the text and the 64-token image at unaligned offsets: every chunk starts
    from the state the previous one left."""
    case = chat_case("x " * 7, _png(224, 224, 21), "what is it?")
    llm = make_qwen3_5_llm(max_num_batched_tokens=24)
    [item] = llm.preprocessor.preprocess(case.prompt).mm_items
    assert item.placeholder.offset % 24 != 0 and item.placeholder.length > 2 * 24
    [result] = llm.generate([case.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="image split across chunks")
    assert llm.engine.num_steps >= result.usage.prompt_tokens // 24 + 11


def test_batch_in_flight_with_chunked_prefill_matches_oracle(make_qwen3_5_llm, qwen3_5_oracle):
    """Prefill chunks and decode rows of different requests share steps, each on its own slot."""
    cases = [CASES[name]() for name in ("one_image_at_start", "text_only", "two_images", "long_text", "image_in_middle")]
    llm = make_qwen3_5_llm(max_num_batched_tokens=64)
    results = llm.generate([c.prompt for c in cases], GREEDY_12)
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="batch")
    assert llm.engine.num_steps > 12


def test_slots_freed_by_finished_requests_start_the_next_from_zero(make_qwen3_5_llm, qwen3_5_oracle):
    """Two slots for five requests: each slot serves several requests in turn."""
    cases = [CASES[name]() for name in sorted(CASES)]
    llm = make_qwen3_5_llm(max_num_seqs=2)
    assert llm.engine.kv.state_slots.num_slots == 2
    results = llm.generate([c.prompt for c in cases], GREEDY_12)
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="reused slot")
    assert llm.engine.kv.state_slots.num_free == 2


def test_a_preempted_request_recomputes_from_a_zero_state(make_qwen3_5_llm, qwen3_5_oracle):
    """A pool too small for both prompts' growth: the later request is preempted mid-decode and
    recomputed from its first token; its state must not continue from where it was cut."""
    cases = [CASES["long_text"](), chat_case("Another long prompt to crowd the pool. " * 10)]
    llm = make_qwen3_5_llm(num_kv_blocks=14, block_size=16, max_num_batched_tokens=256)
    results = llm.generate([c.prompt for c in cases], SamplingParams(max_tokens=40, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case, 40), context="preempted")


def test_a_repeated_image_comes_from_the_encoder_cache_and_stays_exact(make_qwen3_5_llm, qwen3_5_oracle):
    image = _png(80, 80, 8)
    first = chat_case(image, "What is this?")
    second = conversation(first, "A pattern.", chat_case(image, "And again?"))
    llm = make_qwen3_5_llm()
    for case in (first, second):
        [result] = llm.generate([case.prompt], GREEDY_12)
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="repeated image")
    assert result.usage.cached_tokens == 0  # no prefix hits for a hybrid model yet
    assert llm.engine.runner.vision.num_items_encoded == 1


def test_prefill_hands_the_state_to_decode_with_the_pages(make_qwen3_5_llm, qwen3_5_oracle):
    """As a prefill node and a decode node do: the prompt and its first token on one engine, its KV
    pages and linear-attention state through the wire format, the rest of the answer on another
    engine that never saw the prompt computed. Without the state the decode side refuses it."""
    from services.engine import connector, kv_pages
    from services.engine.engine import RequestRejectedError
    from services.engine.request import Request

    case = chat_case("Look closely at", _png(98, 70, 5), "and tell me what you see.")
    prefill, decode = make_qwen3_5_llm(), make_qwen3_5_llm()
    prompt = prefill.preprocessor.preprocess(case.prompt)
    shipped = {}

    def ship(request: Request) -> None:
        num_blocks = -(-request.num_prompt_tokens // prefill.engine.config.block_size)
        shipped["wire"] = kv_pages.pack(connector.read_request_pages(prefill.engine, request, num_blocks))
        shipped["first"] = request.output_token_ids[-1]

    prefill.engine.finish_listeners.append(ship)
    prefill.engine.add_request("r", prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    list(prefill.engine.run_to_completion())

    def adopted(request_id: str) -> Request:
        request = Request(request_id, list(prompt.prompt_token_ids), GREEDY_12, prompt.mrope_positions, prompt.mrope_delta)
        decode.engine.outputs.append_token(request, shipped["first"])
        return request

    pages = kv_pages.unpack(*shipped["wire"], num_layers=2, num_state_layers=6)
    connector.import_prefilled(decode.engine, adopted("r"), pages)
    tokens = [shipped["first"]] + [t for out in decode.engine.run_to_completion() for t in out.new_token_ids]
    assert_tokens_match(tokens, _oracle_tokens(qwen3_5_oracle, case), context="prefill -> decode")
    assert decode.engine.num_steps == 11 and decode.engine.runner.vision.num_items_encoded == 0

    with pytest.raises(RequestRejectedError, match="state for 0 layers"):
        connector.import_prefilled(decode.engine, adopted("s"), kv_pages.KVPages(pages.layers))
    assert decode.engine.kv.state_slots.num_free == decode.engine.kv.state_slots.num_slots  # nothing held
