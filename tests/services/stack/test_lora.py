"""LoRA adapters served as vLLM serves them, on a real multi-process stack (one preprocess node,
two encoders, two prefill and two decode nodes) through the official openai client:
``--enable-lora --lora-modules a=PATH b=PATH --max-loras 2``, adapters made by peft, and vLLM's
runtime endpoints under its switch (VLLM_ALLOW_RUNTIME_LORA_UPDATING=1).

Checked: /v1/models lists each adapter with the base model as its parent; a request names its
adapter by ``model`` and its answer equals transformers' with that adapter merged by peft (greedy
float32), for the base model and both adapters, cold and on a repeat (a prefix hit on the
adapter's own blocks); an adapter never gets another's prefix (cached_tokens 0 on its first
sight of a prompt another adapter computed); an unknown name is a 404. At runtime: an adapter
is loaded on one prefill and one decode node, whose index records then list it, and its requests
route there (no other node is given it) and answer exactly; loading it again, or a directory that
is no adapter, is a 400; once unloaded its name is a 404 again. An adapter that also changes the
vision tower (made by peft on the tower's layers too) is loaded on an encoder as well and answers
exactly; an image is encoded once for the base model and a language-only adapter together, and
once more for the tower adapter (its embeddings are its own). Nodes killed and restarted after a
runtime load lack the adapter: a request naming it has the gateway load it there, and is exact.
Streams on an adapter whose decode node dies migrate and stay exact (the next prefill node
recomputes with the same adapter)."""

from __future__ import annotations

import os
import secrets
import signal

import httpx
import openai
import pytest

from tests.factories import chat_case
from tests.oracle import ReferenceOracle
from tests.peft_adapters import TOWER_TARGETS, make_adapter, merged_model
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import GREEDY, client_for, counter, oracle_text, png
from tests.services.stack.stack_probes import Streams, busiest_decode_node
from tests.services.stack.stack_reset import answers, wait_for


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    made = {name: make_adapter(tiny_model.path, root / name, seed=seed) for name, seed in (("a", 11), ("b", 12), ("c", 13))}
    made["t"] = make_adapter(tiny_model.path, root / "t", seed=14, targets=TOWER_TARGETS)  # the tower too; loaded at runtime
    return made


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory, repo_root, adapters):
    modules = [f"{name}={adapters[name]}" for name in ("a", "b")]  # c and t: loaded at runtime
    running = launch_stack(
        tmp_path_factory.mktemp("lora-stack"),
        repo_root,
        *("--encoders", "2", "--prefill", "2", "--decode", "2"),
        *("--enable-lora", "--max-loras", "2", "--lora-modules", *modules),
        env={**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        internal_secret=secrets.token_hex(16),  # busiest_decode_node asks the nodes directly
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def oracles(tiny_model, adapters):
    found = {"tiny": ReferenceOracle(tiny_model.path)}
    for name, path in adapters.items():
        found[name] = ReferenceOracle(tiny_model.path, load_model=False)
        found[name].model = merged_model(tiny_model.path, path)
    return found


def _ask(stack, model: str, case) -> tuple[str, int]:
    reply = client_for(stack).chat.completions.create(model=model, messages=case.body["messages"], **GREEDY)
    return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens


def test_models_lists_each_adapter_with_its_parent(lora_stack, adapters):
    cards = {card.id: card for card in client_for(lora_stack).models.list().data}
    assert set(cards) == {"tiny", "a", "b"}
    for name, path in list(adapters.items())[:2]:
        card = cards[name].model_dump()
        assert (card["parent"], card["root"]) == ("tiny", str(path))


def test_each_adapter_answers_as_transformers_with_it_merged_and_keeps_its_own_prefix(lora_stack, oracles):
    case = chat_case(png(96, 80, 21), "Describe this picture in a few words.")
    texts = {}
    for model in ("a", "b", "tiny"):  # the same prompt, each model computing its own blocks
        expected, _ = oracle_text(oracles[model], case)
        first, cached_first = _ask(lora_stack, model, case)
        again, cached_again = _ask(lora_stack, model, case)
        assert first == expected and again == expected, model
        assert cached_first == 0, f"{model} reused another model's prefix"
        assert cached_again > 0, f"{model} missed its own prefix"
        texts[model] = expected
    assert len(set(texts.values())) == 3, "an adapter changed nothing"


def test_an_unknown_model_name_is_a_404(lora_stack):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client_for(lora_stack).chat.completions.create(model="c", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def _post(stack, path: str, body: dict) -> httpx.Response:
    return httpx.post(stack.base_url.removesuffix("/v1") + path, json=body, timeout=120)


def test_an_adapter_loaded_at_runtime_serves_exactly_until_unloaded(lora_stack, adapters, oracles, tmp_path):
    # Two adapters on each of the 2 encoder, 2 prefill and 2 decode nodes, their weights in the memory report.
    assert counter(lora_stack, "lora_adapters_served") == 12 and counter(lora_stack, "lora_adapter_bytes") > 0
    loaded = _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(adapters["c"])})
    assert loaded.status_code == 200 and "added successfully" in loaded.text, loaded.text
    assert counter(lora_stack, "lora_adapters_served") == 14  # one prefill node and one decode node took it (no encoder: not on the tower)
    assert "c" in {card.id for card in client_for(lora_stack).models.list().data}
    loads = counter(lora_stack, "gateway_lora_adapter_loads_total")
    for seed in (22, 23, 22):
        case = chat_case(png(80, 96, seed), "What colours are here?")
        assert _ask(lora_stack, "c", case)[0] == oracle_text(oracles["c"], case)[0]
    # Routed to the two nodes holding it: a node without it would have been given it first.
    assert counter(lora_stack, "gateway_lora_adapter_loads_total") == loads
    assert counter(lora_stack, "lora_adapters_served") == 14

    again = _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(adapters["c"])})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    (tmp_path / "empty").mkdir()
    bad = _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "d", "lora_path": str(tmp_path / "empty")})
    assert bad.status_code == 400 and "adapter" in bad.json()["error"]["message"]

    unloaded = _post(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "c"})
    assert unloaded.status_code == 200, unloaded.text
    assert counter(lora_stack, "lora_adapters_served") == 12
    with pytest.raises(openai.NotFoundError):
        _ask(lora_stack, "c", case)
    assert _post(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "c"}).status_code == 404
    assert _ask(lora_stack, "a", case)[0] == oracle_text(oracles["a"], case)[0]  # the others still served


def _tower_runs(stack) -> float:
    return counter(stack, "encoder_items_encoded_total") + counter(stack, "prefill_images_encoded_locally_total")


def test_an_image_is_encoded_once_for_the_base_and_language_adapters_and_once_more_for_a_tower_adapter(lora_stack, adapters, oracles):
    served = counter(lora_stack, "lora_adapters_served")
    loaded = _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "t", "lora_path": str(adapters["t"])})
    assert loaded.status_code == 200, loaded.text
    assert counter(lora_stack, "lora_adapters_served") == served + 3  # a prefill, a decode and an encoder node took it
    case = chat_case(png(88, 72, 70), "What is in this image?")
    runs = _tower_runs(lora_stack)
    for model, tower_runs in (("tiny", 1), ("a", 1), ("t", 2), ("t", 2)):
        text, cached = _ask(lora_stack, model, case)
        assert text == oracle_text(oracles[model], case)[0], model
        assert _tower_runs(lora_stack) == runs + tower_runs, f"{model}: the image's tower runs"
    assert cached > 0, "the tower adapter's repeat is a prefix hit on its own blocks"
    assert _post(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "t"}).status_code == 200


def test_nodes_restarted_after_a_runtime_load_get_the_adapter_when_a_request_needs_it(lora_stack, adapters, oracles):
    assert _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(adapters["c"])}).status_code == 200
    victims = {name: record["pid"] for name, record in lora_stack.state()["roles"].items() if name.startswith(("prefill", "decode"))}
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)  # the launcher restarts each with --lora-modules only: no "c"

    def restarted() -> bool:
        roles = lora_stack.state()["roles"]
        return all(roles[name]["pid"] not in (None, pid) for name, pid in victims.items()) and answers(lora_stack)

    assert wait_for(restarted, 60), lora_stack.log_tail()
    loads = counter(lora_stack, "gateway_lora_adapter_loads_total")
    for seed in (31, 32, 33):
        case = chat_case(png(64, 80, seed), "Name the main colour.")
        assert _ask(lora_stack, "c", case)[0] == oracle_text(oracles["c"], case)[0], seed
    assert counter(lora_stack, "gateway_lora_adapter_loads_total") >= loads + 2  # a prefill and a decode node at least
    assert _post(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "c"}).status_code == 200


def test_encoders_restarted_after_a_tower_adapter_was_loaded_get_it_when_an_image_needs_it(lora_stack, adapters, oracles):
    assert _post(lora_stack, "/v1/load_lora_adapter", {"lora_name": "t", "lora_path": str(adapters["t"])}).status_code == 200
    victims = {name: record["pid"] for name, record in lora_stack.state()["roles"].items() if name.startswith("encoder")}
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)  # restarted with --lora-modules only: no "t"

    def restarted() -> bool:
        roles = lora_stack.state()["roles"]
        return all(roles[name]["pid"] not in (None, pid) for name, pid in victims.items()) and answers(lora_stack)

    assert wait_for(restarted, 60), lora_stack.log_tail()
    loads = counter(lora_stack, "gateway_lora_adapter_loads_total")
    case = chat_case(png(72, 88, 71), "What is in this image?")
    # The encoder's MISSING_ADAPTER comes back through the prefill node naming the encoder, which
    # the gateway then gives the adapter.
    assert _ask(lora_stack, "t", case)[0] == oracle_text(oracles["t"], case)[0]
    assert counter(lora_stack, "gateway_lora_adapter_loads_total") >= loads + 1
    assert _post(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "t"}).status_code == 200


def test_streams_on_an_adapter_migrate_exactly_when_their_decode_node_dies(lora_stack, oracles):
    greedy = {**GREEDY, "max_tokens": 256}
    cases = [chat_case(png(64 + 16 * i, 64, 40 + i), f"Tell me a long story about picture {i}.") for i in range(2)]
    expected = [oracle_text(oracles["a"], case, 256)[0] for case in cases]
    migrations = counter(lora_stack, "gateway_migrations_total")
    streams = Streams(lora_stack, cases, greedy, model="a")
    streams.wait_flowing(1)
    os.kill(busiest_decode_node(lora_stack)["pid"], signal.SIGKILL)
    texts, errors = streams.join()
    assert not errors, (errors, lora_stack.log_tail())
    assert texts == expected
    assert counter(lora_stack, "gateway_migrations_total") > migrations
