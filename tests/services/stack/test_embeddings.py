"""Embeddings and score through a stack, with the official client (services/gateway/frontend/embeddings.py).

Per built-in family, on 1/1/1 and 2/2/2 stacks started with ``--runner both``: embeddings of
text, an image and an image with text equal transformers' last hidden state at the last token,
normalized, within 1e-5, cold, on an encoder-cache hit and on a prefix hit; the image embedded is
then asked about in a chat and its tower ran once in all; /v1/score is the cosine of the two
embeddings. A ``--runner pooling`` stack starts no decode node and refuses generation as vLLM
does; the default (generating) stack refuses embeddings the same way; gRPC Embed equals HTTP. A
sentence-transformers checkpoint pooling MEAN is exact on a stack, computing every row though its
prefix is cached."""

from __future__ import annotations

import base64
import json
import secrets
import shutil

import grpc
import httpx
import pytest
import torch
from openai import NotFoundError
from openai.types import CreateEmbeddingResponse

from protos.gen import pb, rpc
from services.bench.cache_rates import TOWER_RUNS
from services.gateway.frontend.prompt_wire import prompt_from_body
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import ReferenceOracle
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import ask_greedy, client_for, oracle_text

TOLERANCE = 1e-5
FAMILIES = ["tiny", "qwen3vl-tiny", "gemma3-tiny", "qwen3_5-tiny"]
TOPOLOGIES = {"1-1-1": ("1", "1", "1"), "2-2-2": ("2", "2", "2")}  # encoders-prefill-decode
INTRO = "An archive photograph follows; describe what matters in it, briefly. " * 2  # prefix blocks ahead of the image


@pytest.fixture(scope="module", params=[(f, t) for f in FAMILIES for t in TOPOLOGIES], ids=lambda p: f"{p[0]}-{p[1]}")
def embed_stack(request, tmp_path_factory, repo_root):
    from services.models.registry import resolve_model

    family, topology = request.param
    encoders, prefill, decode = TOPOLOGIES[topology]
    model = resolve_model(family, progress=lambda _m: None)
    running = launch_stack(
        tmp_path_factory.mktemp(f"embed-{family}"),
        repo_root,
        *("--model", family, "--encoders", encoders, "--prefill", prefill, "--decode", decode, "--runner", "both"),
    )
    running.served_model = family
    yield running, ReferenceOracle(model.path)
    stop_stack(running)


def _png(seed: int) -> bytes:
    return encode_image(make_image(112, 84, seed=seed))


def _embed(stack, body: dict) -> CreateEmbeddingResponse:
    return client_for(stack).post("/embeddings", cast_to=CreateEmbeddingResponse, body={"model": stack.served_model, **body})


def _expected(oracle: ReferenceOracle, case) -> torch.Tensor:
    text = oracle.chat_text(case.oracle_messages, add_generation_prompt=False)
    return oracle.embedding(oracle.process(text, case.images))


def _close(got: list[float], expected: torch.Tensor) -> float:
    assert len(got) == expected.shape[0]
    return (torch.tensor(got) - expected).abs().max().item()


def _towers(stack) -> float:
    metrics = stack.metrics()
    return sum(metrics.get(name, 0.0) for name in TOWER_RUNS)


def test_embeddings_equal_transformers_cold_on_an_encoder_hit_and_on_a_prefix_hit(embed_stack):
    stack, oracle = embed_stack
    text = "A sentence about the sea and the ships on it."
    raw = client_for(stack).embeddings.create(model=stack.served_model, input=text)  # the client sends base64
    assert _close(raw.data[0].embedding, oracle.embedding(oracle.process(text, []))) <= TOLERANCE
    image = _png(1)
    cases = [chat_case(INTRO, image, "What is here?"), chat_case(INTRO, image, "Which colours?")]
    cases.append(cases[1])
    towers, cached = [], []
    for case in cases:  # cold; the image again (its embeddings cached); the same prompt again (its prefix cached)
        before = _towers(stack)
        reply = _embed(stack, {"messages": case.body["messages"], "encoding_format": "float"})
        assert _close(reply.data[0].embedding, _expected(oracle, case)) <= TOLERANCE
        towers.append(_towers(stack) - before)
        cached.append(reply.usage.model_extra["prompt_tokens_details"]["cached_tokens"])
    assert towers == [1, 0, 0], towers
    assert cached[0] == 0 and 0 < cached[1] <= cached[2], cached  # the intro (and image) blocks; the same, or more
    # The image embedded for retrieval, now asked about in a chat: no tower runs for it again.
    before = _towers(stack)
    chat = chat_case(INTRO, image, "What is here?")
    answer, _ = ask_greedy(stack, chat)
    assert answer == oracle_text(oracle, chat)[0] and _towers(stack) == before


def test_score_is_the_cosine_of_the_two_embeddings(embed_stack):
    stack, _ = embed_stack
    parts = chat_case(_png(2), "a picture of shapes").body["messages"][0]["content"]
    body = {"model": stack.served_model, "queries": "shapes and colours", "documents": ["a sentence about ships", {"content": parts}]}
    scores = httpx.post(stack.base_url + "/score", json=body, timeout=120).json()["data"]
    query = _embed(stack, {"input": "shapes and colours", "encoding_format": "float"}).data[0].embedding
    text = _embed(stack, {"input": "a sentence about ships", "encoding_format": "float"}).data[0].embedding
    image = _embed(stack, {"messages": [{"role": "user", "content": parts}], "encoding_format": "float"}).data[0].embedding
    for entry, document in zip(scores, (text, image)):
        assert abs(entry["score"] - sum(q * d for q, d in zip(query, document))) <= 1e-5  # unit vectors: cosine is the dot


@pytest.fixture(scope="module")
def pooling_stack(tmp_path_factory, repo_root):
    running = launch_stack(tmp_path_factory.mktemp("pooling"), repo_root, "--runner", "pooling", internal_secret=secrets.token_hex(16))
    yield running
    stop_stack(running)


def test_a_pooling_stack_runs_no_decode_node_embeds_and_refuses_generation_as_vllm(pooling_stack, oracle):
    stack = pooling_stack
    assert not any(name.startswith("decode") for name in stack.state()["roles"])
    assert httpx.get(stack.base_url.removesuffix("/v1") + "/ready", timeout=30).json()["num_nodes"] == {
        "preprocess": 1,
        "encoder": 1,
        "prefill": 1,
    }
    case = chat_case(_png(3), "What is here?")
    body = {"messages": case.body["messages"], "encoding_format": "base64", "dimensions": None}
    reply = _embed(stack, {k: v for k, v in body.items() if v is not None})
    values = torch.frombuffer(bytearray(base64.b64decode(reply.data[0].embedding)), dtype=torch.float32)
    assert _close(values.tolist(), _expected(oracle, case)) <= TOLERANCE
    with pytest.raises(NotFoundError, match="does not support Chat Completions API"):
        client_for(stack).chat.completions.create(model="tiny", messages=case.body["messages"], max_tokens=4)
    with pytest.raises(NotFoundError, match="does not support Completions API"):
        client_for(stack).completions.create(model="tiny", prompt="hello", max_tokens=4)
    refused = _embed_error(stack, {"input": "hello", "dimensions": 8})
    assert refused.status_code == 400 and "does not support Matryoshka" in refused.json()["error"]["message"]
    # gRPC: Embed serves the same embedding; Generate is refused.
    prompt = prompt_from_body({"messages": case.body["messages"], "chat_template_kwargs": {"add_generation_prompt": False}})
    with grpc.insecure_channel(stack.generate_address) as channel:
        stub = rpc.GenerateStub(channel)
        typed = stub.Embed(pb.EmbedRequest(prompt=prompt, model="tiny", request_id="e1"), timeout=120)
        with pytest.raises(grpc.RpcError) as refusal:
            list(stub.Generate(pb.GenerateRequest(prompt=prompt, model="tiny"), timeout=60))
    assert typed.request_id == "e1" and typed.usage.prompt_tokens > 0
    assert max(abs(a - b) for a, b in zip(typed.embedding, values.tolist())) <= 1e-6
    assert refusal.value.code() == grpc.StatusCode.NOT_FOUND


def _embed_error(stack, body: dict) -> httpx.Response:
    return httpx.post(stack.base_url + "/embeddings", json={"model": "tiny", **body}, timeout=60)


def test_a_generating_stack_refuses_embeddings_as_vllm(stack):
    refused = _embed_error(stack, {"input": "hello"})
    assert refused.status_code == 404 and refused.json()["error"]["message"] == "The model does not support Embeddings API"


@pytest.fixture(scope="module")
def mean_pooling_stack(tmp_path_factory, repo_root, tiny_model):
    """A sentence-transformers layout over the tiny checkpoint: MEAN pooling, normalized."""
    path = tmp_path_factory.mktemp("st") / "tiny-mean"
    shutil.copytree(tiny_model.path, path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules += [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    modules += [{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    running = launch_stack(tmp_path_factory.mktemp("mean"), repo_root, "--model", str(path), "--runner", "both")
    running.served_model = "tiny-mean"
    yield running
    stop_stack(running)


def test_a_mean_pooling_checkpoint_is_exact_on_a_stack_and_computes_every_row(mean_pooling_stack, oracle):
    stack = mean_pooling_stack
    case = chat_case(INTRO, _png(4), "What is here? Name the shapes, their colours and the light on them, one by one, please.")
    rows = oracle.hidden_states(oracle.process(oracle.chat_text(case.oracle_messages, add_generation_prompt=False), case.images))
    ask_greedy(stack, case)  # a chat caches the conversation's prefix, its image and all
    covered = stack.metrics().get("tessera_gateway_images_covered_total", 0.0)
    for sight in range(2):  # its prefix is cached, yet every row must be computed
        reply = _embed(stack, {"messages": case.body["messages"], "encoding_format": "float"})
        assert _close(reply.data[0].embedding, torch.nn.functional.normalize(rows.mean(dim=0), dim=-1)) <= TOLERANCE, sight
        assert reply.usage.model_extra["prompt_tokens_details"]["cached_tokens"] == 0
    # Routed as computing its whole prompt: no image counted as covered by the cached prefix
    # (its embeddings are needed after all), so no pixel push falls back late.
    assert stack.metrics().get("tessera_gateway_images_covered_total", 0.0) == covered
