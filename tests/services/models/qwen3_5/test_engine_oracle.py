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
    runner = shared_llm.engine.runner
    assert runner.num_state_slots == runner.num_state_snapshots == 256  # the default budget holds them


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


def test_a_repeated_image_comes_from_the_encoder_cache_and_a_prefix_hit_restores_its_state(make_qwen3_5_llm, qwen3_5_oracle):
    """The second turn hits the first turn's prompt up to its last full block, where its state was
    saved; the first turn's image recurs and is not encoded again."""
    image = _png(80, 80, 8)
    first = chat_case(image, "What is this?")
    second = conversation(first, "A pattern.", chat_case(image, "And again?"))
    llm = make_qwen3_5_llm()
    hits = []
    for case in (first, second):
        [result] = llm.generate([case.prompt], GREEDY_12)
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="multi-turn")
        hits.append(result.usage.cached_tokens)
    first_prompt = len(llm.preprocessor.preprocess(first.prompt).prompt_token_ids)
    assert hits == [0, (first_prompt - 1) // 16 * 16]
    assert llm.engine.runner.vision.num_items_encoded == 1


def test_prefix_hits_end_only_where_a_state_was_saved_and_stay_exact(make_qwen3_5_llm, qwen3_5_oracle):
    """Saved states: at each image's last block end, every state_interval_tokens, and at the
    prompt's last full block. A question about the same image after the same text hits up to the
    image's last block end; a repeat of a prompt hits its last full block; another image hits
    nothing past the text before it, which here ends at no state point: no hit at all."""
    block = 16
    image = _png(72, 72, 10)
    intro = "A shared introduction of some length. " * 4
    first, second = chat_case(intro, image, "First question?"), chat_case(intro, image, "Other?")
    llm = make_qwen3_5_llm(block_size=block, state_interval_tokens=64)
    llm.generate([first.prompt], GREEDY_12)
    [item] = llm.preprocessor.preprocess(second.prompt).mm_items
    [result] = llm.generate([second.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, second), context="hit inside the image")
    assert result.usage.cached_tokens == item.placeholder.end // block * block
    [again] = llm.generate([second.prompt], GREEDY_12)
    assert again.token_ids == result.token_ids
    assert again.usage.cached_tokens == (again.usage.prompt_tokens - 1) // block * block
    other = chat_case(intro, _png(72, 72, 11), "Other?")
    [result] = llm.generate([other.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, other), context="another image")
    points = {n for n in range(1, item.placeholder.offset // block + 1) if n % 4 == 0}  # 64-token interval
    assert result.usage.cached_tokens == max(points, default=0) * block
    assert llm.engine.runner.vision.num_items_encoded == 2


def test_the_state_cache_keeps_its_budget(make_qwen3_5_llm):
    """Four snapshots for many prompts: the oldest are evicted, never more are held."""
    llm = make_qwen3_5_llm(num_kv_blocks=256, max_num_seqs=4)
    snapshots = llm.engine.kv.snapshots
    assert snapshots.capacity == 4
    for i in range(6):
        llm.generate([chat_case(f"Prompt number {i} is long enough to fill a block or two of tokens.").prompt], GREEDY_12)
        assert len(snapshots) <= 4
    assert snapshots.num_evictions > 0


def prompt_hashes(prompt) -> list:
    from shared.hashing import MmSpan, block_hashes

    return block_hashes(prompt.prompt_token_ids, 16, [MmSpan(i.mm_hash, i.placeholder) for i in prompt.mm_items])


def test_prefill_hands_the_state_to_decode_with_the_pages(make_qwen3_5_llm, qwen3_5_oracle):
    """As a prefill node and a decode node do: the prompt and its first token on one engine, its KV
    pages and linear-attention state through the wire format, the rest of the answer on another
    engine that never saw the prompt computed. Without the state the decode side refuses it."""
    from services.engine import connector, kv_pages
    from services.engine.engine import RequestRejectedError
    from services.engine.request import MmFeature, Request

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
        features = [MmFeature(i.mm_hash, i.placeholder, i.image.grid_thw, None) for i in prompt.mm_items]  # no pixels, as on the wire
        request = Request(request_id, list(prompt.prompt_token_ids), GREEDY_12, prompt.mrope_positions, prompt.mrope_delta, features)
        decode.engine.outputs.append_token(request, shipped["first"])
        return request

    pages = kv_pages.unpack(*shipped["wire"], num_layers=2, num_state_layers=6)
    assert pages.prefix_blocks == (len(prompt.prompt_token_ids) - 1) // 16 and len(pages.prefix_states) == 6
    connector.import_prefilled(decode.engine, adopted("r"), pages)
    tokens = [shipped["first"]] + [t for out in decode.engine.run_to_completion() for t in out.new_token_ids]
    assert_tokens_match(tokens, _oracle_tokens(qwen3_5_oracle, case), context="prefill -> decode")
    assert decode.engine.num_steps == 11 and decode.engine.runner.vision.num_items_encoded == 0
    # The saved state came along: the decode side serves the prompt's prefix to a peer.
    exported = connector.export_prefix(decode.engine, prompt_hashes(prompt))
    assert exported.num_blocks == pages.prefix_blocks and len(exported.states) == 6

    with pytest.raises(RequestRejectedError, match="state for 0 layers"):
        connector.import_prefilled(decode.engine, adopted("s"), kv_pages.KVPages(pages.layers))
    assert decode.engine.kv.state_slots.num_free == decode.engine.kv.state_slots.num_slots  # nothing held


def test_a_prefix_pulled_from_another_engine_carries_its_state(make_qwen3_5_llm, qwen3_5_oracle):
    """As a prefill node pulls a peer's prefix: the exporter's hit ends at a saved state, which
    travels with the pages (through the wire format); the importer files both and hits them.
    Pages without the state are not filed: they could not resume the linear layers."""
    from services.engine import connector, kv_pages

    case = chat_case(_png(112, 84, 41), "What is shown here?")
    source, puller, bare = make_qwen3_5_llm(), make_qwen3_5_llm(), make_qwen3_5_llm()
    source.generate([case.prompt], GREEDY_12)
    prompt = source.preprocessor.preprocess(case.prompt)
    hashes = prompt_hashes(prompt)
    exported = connector.export_prefix(source.engine, hashes)
    assert exported.num_blocks == (len(prompt.prompt_token_ids) - 1) // 16 and len(exported.states) == 6
    pages = kv_pages.unpack(*kv_pages.pack(exported), num_layers=2, num_state_layers=6)
    assert connector.import_blocks(bare.engine, hashes, kv_pages.KVPages(pages.layers)) == 0
    assert connector.import_blocks(puller.engine, hashes, pages) == exported.num_blocks
    [result] = puller.generate([case.prompt], GREEDY_12)
    assert result.usage.cached_tokens == exported.num_blocks * 16
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3_5_oracle, case), context="pulled prefix")
