"""The HTTP edge (FastAPI app) over an in-process fake pipeline: OpenAI error JSON for every
error, server-sent events, the OpenAPI document, draining and body limits. The real stack is
exercised through the same app in tests/services/stack/."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.config import FrontendConfig, ServedModel
from services.gateway.http import probe_routes
from services.gateway.http.app import create_app
from services.gateway.pipeline.token_events import TokenEvent

MESSAGES = [{"role": "user", "content": "hi"}]
PROMPT_IDS = (11, 12, 13, 14, 15, 16, 17)


@dataclass
class FakeMembership:
    roles: tuple[str, ...] = ("preprocess", "encoder", "prefill", "decode")
    index: None = None
    states: dict = field(default_factory=dict)

    def nodes(self, role, exclude=frozenset()):
        return [object()] if role in self.roles else []

    def snapshot(self):
        return self.states

    async def refresh(self):
        """What a listing of the index finds: the nodes registered since (``registered``)."""
        self.num_refreshes = getattr(self, "num_refreshes", 0) + 1
        self.roles = (*self.roles, *getattr(self, "registered", ()))
        self.registered = ()
        return True


@dataclass
class FakePipeline:
    """Streams ``words`` one token each, or fails with ``error`` after ``fail_after`` events."""

    words: tuple[str, ...] = ("Hello", " there", " friend")
    error: GatewayError | None = None
    fail_after: int = 0
    membership: FakeMembership = field(default_factory=FakeMembership)
    router: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(index=None, num_index_failures=0, num_local_encodes=0, num_images_covered=0, block_size=16)
    )
    stages: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(num_cover_fallbacks=0))
    calls: list = field(default_factory=list)
    route_observers: list = field(default_factory=list)
    num_retries: int = 0
    num_migrations: int = 0
    num_busy_refusals: int = 0
    adapter_loads: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(num_loads=0))
    max_model_len: int = 4096

    async def stats(self):
        return []

    async def tower_seconds_per_token(self):
        return None  # no encoder has measured its tower

    async def model_info(self):
        return pb.ModelInfoResponse(eos_token_ids=[0], vocab_size=1000)

    async def run(self, body, sampling, *, cache_salt=None, request_id=None, stream=True, fit_max_tokens=False, lora=None):
        self.calls.append((body, sampling, cache_salt, stream))
        text = ""
        for i, word in enumerate(self.words):
            if self.error is not None and i == self.fail_after:
                raise self.error
            text += word
            finished = i == len(self.words) - 1
            yield TokenEvent(
                [100 + i], text, finished, "stop" if finished else None, prompt_tokens=7, cached_tokens=2, prompt_token_ids=PROMPT_IDS
            )


def gateway_for(pipeline: FakePipeline, served_names=("tiny",), default_max_tokens: int = 16, api_keys=None, **settings):
    """create_app over ``pipeline``: ``settings`` are FrontendConfig's fields, or ServedModel's."""
    model = ServedModel(**{k: settings.pop(k) for k in ("model_root", "tool_parser", "sampling_defaults") if k in settings})
    return create_app(pipeline, FrontendConfig(served_names, default_max_tokens, model, **settings), api_keys=api_keys)


def client_for(pipeline: FakePipeline, **settings) -> tuple[TestClient, object]:
    app, frontend = gateway_for(pipeline, **settings)
    return TestClient(app), frontend.state


def frontend_for(pipeline: FakePipeline, default_max_tokens: int = 16, **settings):
    """The gateway's Frontend over ``pipeline`` (what gRPC Generate is built on), as create_app makes it."""
    return gateway_for(pipeline, default_max_tokens=default_max_tokens, **settings)[1]


def test_the_official_client_gets_completions_and_streams():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    done = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    assert done.choices[0].message.content == "Hello there friend" and done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.prompt_tokens_details.cached_tokens) == (7, 3, 2)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there friend"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert [call[3] for call in pipeline.calls] == [False, True]  # non-streaming asks for first and last events only


# Malformed chat bodies: (raw body, the param the 400 names, text in its message). Every door
# that takes a chat body as JSON runs them (gRPC Generate's request_json too: frontend tests).
MALFORMED_BODIES = [
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature", "finite"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream", "boolean"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2147483648}', "max_tokens", "less than"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}', "seed", "less than"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1', None, "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, None, ""),
    (b"[1, 2]", None, "JSON object"),
]


@pytest.mark.parametrize("raw,param,text", MALFORMED_BODIES)
def test_malformed_requests_get_a_400_in_openai_error_json(raw, param, text):
    http, _ = client_for(FakePipeline())
    response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and text in error["message"]
    if param is not None:
        assert error["param"] == param
    assert http.get("/v1/models").status_code == 200  # the server is unharmed


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    "fields,text",
    [
        ({"stream_options": {"include_usage": True}}, "stream_options can only be set with stream=true"),
        ({"use_beam_search": True, "n": 2, "stop": "x"}, "stop is not supported with beam search"),
        ({"length_penalty": 0.5}, "length_penalty only applies with use_beam_search=true"),
        ({"prompt_logprobs": -1}, "Requested prompt logprobs of 1000, which is greater than max allowed: 20"),
        ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
        ({"prompt_logprobs": -2}, "must be a non-negative integer or -1"),
        ({"prompt_logprobs": 2, "stream": True}, "not available when stream=true"),
    ],
)
def test_fields_whose_meaning_is_not_served_are_refused_never_ignored(route, fields, text):
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    body = {"messages": MESSAGES} if route == "/v1/chat/completions" else {"prompt": "hi"}
    response = http.post(route, json={**body, **fields})
    assert response.status_code == 400 and text in response.json()["error"]["message"], response.text
    assert not pipeline.calls
    # Their defaults, and an empty stream_options without a stream (as vLLM takes it), are fine.
    defaults = {"use_beam_search": False, "prompt_logprobs": None, "return_token_ids": False, "stream_options": {}}
    assert http.post(route, json={**body, **defaults}).status_code == 200


# A value that asks something of each field refused (unserved_fields.py), by endpoint.
ASKING = {
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "bad_words": ["x"],
    "priority": 1,
    "return_token_offsets": True,
    "mm_payload": "base64",
    "return_mm_kwargs": True,
    "watermarking": {"key": 1},
    "repetition_detection": {"window": 3},
    "thinking_token_budget": 10,
    "vllm_xargs": {"a": 1},
    "ec_transfer_params": {"x": 1},
}
CHAT_ASKING = {
    "add_special_tokens": True,
    "reasoning_effort": "low",
    "documents": [{"text": "x"}],
    "chat_template": "{{ 1 }}",
    "media_io_kwargs": {"video": {"num_frames": 2}},
    "return_prompt_text": True,
}
COMPLETION_ASKING = {"add_special_tokens": False, "prompt_embeds": "AAAA", "kv_transfer_params": {"prompt_token_ids": [1]}}


def test_every_vllm_field_not_served_is_refused_by_name_and_its_default_passes():
    from services.gateway.protocol.unserved_fields import CHAT_DEFAULTS, COMPLETION_DEFAULTS, SHARED_DEFAULTS

    assert ASKING.keys() == SHARED_DEFAULTS.keys() and CHAT_ASKING.keys() == CHAT_DEFAULTS.keys()
    assert COMPLETION_ASKING.keys() == COMPLETION_DEFAULTS.keys()
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    for route, body, asking, defaults in (
        ("/v1/chat/completions", {"messages": MESSAGES}, {**ASKING, **CHAT_ASKING}, {**SHARED_DEFAULTS, **CHAT_DEFAULTS}),
        ("/v1/completions", {"prompt": "hi"}, {**ASKING, **COMPLETION_ASKING}, {**SHARED_DEFAULTS, **COMPLETION_DEFAULTS}),
    ):
        for name, value in asking.items():
            response = http.post(route, json={**body, name: value})
            assert response.status_code == 400 and f"{name}=" in response.json()["error"]["message"], (route, name, response.text)
        for idle in zip(*(values + values[:1] * (2 - len(values)) for values in defaults.values())):
            response = http.post(route, json={**body, **dict(zip(defaults, idle))})
            assert response.status_code == 200 and "tessera-ignored-fields" not in response.headers, (route, response.text)
    assert len(pipeline.calls) == 4


def test_chat_echo_starts_the_reply_with_the_continued_assistant_message_and_the_template_is_told():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    messages = [*MESSAGES, {"role": "assistant", "content": "Well,"}]
    extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    reply = client.chat.completions.create(model="tiny", messages=messages, extra_body=extra)
    assert reply.choices[0].message.content == "Well,Hello there friend"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, stream=True, extra_body=extra))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Well,Hello there friend"
    body = pipeline.calls[0][0]
    assert json.loads(body.chat.chat_template_kwargs_json) == {"add_generation_prompt": False, "continue_final_message": True}
    # echo after a user's message echoes nothing; both prompt fields on is a 400 naming them.
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, extra_body={"echo": True}).choices[0].message.content == (
        "Hello there friend"
    )
    both = http.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True})
    assert both.status_code == 400 and "cannot both be true" in both.json()["error"]["message"]


def test_unknown_routes_and_methods_get_openai_errors():
    http, _ = client_for(FakePipeline())
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404 and "no route for GET /v1/nothing" in missing.json()["error"]["message"]
    wrong = http.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["message"]


def test_an_oversized_body_gets_a_413_before_it_is_read():
    http, state = client_for(FakePipeline(), max_body_bytes=1000)
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]})
    response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "limit is 1000" in response.json()["error"]["message"]
    chunked = http.post("/v1/chat/completions", content=iter([body[:600].encode(), body[600:].encode()]))
    assert chunked.status_code == 413 and "over the limit" in chunked.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json={"messages": MESSAGES}).status_code == 200


def test_errors_before_the_first_token_get_their_status_and_later_ones_end_the_stream():
    http, _ = client_for(FakePipeline(error=GatewayError(503, "no live decode node"), fail_after=0))
    early = http.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
    assert early.status_code == 503 and early.json()["error"] == {
        "message": "no live decode node",
        "type": "service_unavailable",
        "param": None,
        "code": None,
    }
    http, _ = client_for(FakePipeline(error=GatewayError(503, "gave up"), fail_after=2))
    late = http.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
    events = [line.removeprefix("data: ") for line in late.text.splitlines() if line.startswith("data: ")]
    assert late.status_code == 200 and json.loads(events[-1])["error"]["message"] == "gave up" and "[DONE]" not in events


def test_a_draining_gateway_refuses_new_requests_and_reports_it():
    http, state = client_for(FakePipeline())
    state.draining = True
    refused = http.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
    assert http.get("/health").status_code == 503 and http.get("/health").json()["status"] == "draining"


def test_health_names_a_role_without_live_nodes():
    http, _ = client_for(FakePipeline(membership=FakeMembership(roles=("preprocess", "encoder", "prefill"))))
    health = http.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "no live decode node"


def test_a_probe_while_a_role_has_no_node_lists_the_nodes_again_at_once_but_not_more_often_than_the_limit(monkeypatch):
    monkeypatch.setattr(probe_routes, "PROBE_REFRESH_S", 3600.0)
    membership = FakeMembership(roles=("preprocess", "encoder", "prefill"))
    http, _ = client_for(FakePipeline(membership=membership))
    assert http.get("/ready").status_code == 503 and membership.num_refreshes == 1
    membership.registered = ("decode",)  # the decode node registers meanwhile
    assert http.get("/health").status_code == 503 and membership.num_refreshes == 1  # within the limit: not listed again
    monkeypatch.setattr(probe_routes, "PROBE_REFRESH_S", 0.0)
    assert http.get("/ready").status_code == 200 and membership.num_refreshes == 2  # found at once, not at the next refresh
    assert http.get("/ready").status_code == 200 and membership.num_refreshes == 2  # ready: no listing


def test_with_a_tier_down_the_gateway_is_live_but_not_ready():
    http, _ = client_for(FakePipeline(membership=FakeMembership(roles=("preprocess", "encoder", "prefill"))))
    assert http.get("/live").status_code == 200
    ready = http.get("/ready")
    assert ready.status_code == 503 and ready.json() == {
        "status": "no live decode node",
        "num_nodes": {"preprocess": 1, "encoder": 1, "prefill": 1, "decode": 0},
    }
    healthy, _ = client_for(FakePipeline())
    assert healthy.get("/ready").status_code == 200 and healthy.get("/live").json() == {"status": "ok"}


def test_requests_and_responses_validate_against_the_served_openapi_document():
    http, _ = client_for(FakePipeline())
    document = http.get("/openapi.json").json()
    assert http.get("/docs").status_code == 200

    def validator(name: str) -> jsonschema.Draft202012Validator:
        schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
        return jsonschema.Draft202012Validator(schema)

    body = {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 3}
    validator("ChatCompletionRequest").validate(body)
    assert not validator("ChatCompletionRequest").is_valid({**body, "temperature": "hot"})
    validator("ChatCompletionResponse").validate(http.post("/v1/chat/completions", json=body).json())
    error = http.post("/v1/chat/completions", json={**body, "n": 30}).json()
    validator("ErrorResponse").validate(error)
    operation = document["paths"]["/v1/chat/completions"]["post"]
    assert {"200", "400", "503"} <= set(operation["responses"])
    validator("CompletionRequest").validate({"prompt": [1, 2, 3], "n": 2})
    completion = http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 3}).json()
    validator("CompletionResponse").validate(completion)


def test_metrics_are_prometheus_text():
    http, _ = client_for(FakePipeline(num_migrations=2))
    http.post("/v1/chat/completions", json={"messages": MESSAGES})
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 99})
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    by_status = {s.labels["status"]: s.value for s in families["tessera_requests"].samples if s.name.endswith("_total")}
    assert by_status == {"200": 1.0, "400": 1.0}
    assert families["tessera_ttft_seconds"].type == "histogram"
    # The gateway's own part of the cluster view, read from its pipeline and router.
    migrations = families["tessera_gateway_migrations"]
    assert migrations.type == "counter" and migrations.samples[0].name == "tessera_gateway_migrations_total"
    assert migrations.samples[0].value == 2.0
    assert families["tessera_gateway_index_breaker_open"].type == "gauge"


def test_the_official_client_gets_text_completions_streamed_and_batched():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    done = client.completions.create(model="tiny", prompt="Once upon", max_tokens=3)
    assert done.object == "text_completion" and done.choices[0].text == "Hello there friend"
    assert pipeline.calls[-1][0] == pb.PromptInput(text="Once upon") and pipeline.calls[-1][1].max_tokens == 3
    batch = client.completions.create(model="tiny", prompt=[[1, 2], [3]], n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3] and batch.usage.prompt_tokens == 14  # two prompts of 7
    assert batch.usage.completion_tokens == 12
    chunks = list(client.completions.create(model="tiny", prompt="Once", stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello there friend"
    assert chunks[-1].usage.completion_tokens == 3


def test_n_choices_stream_side_by_side_and_the_first_runs_alone_until_its_first_token():
    order = []

    class Recording(FakePipeline):
        async def run(self, body, sampling, **kwargs):
            order.append(("start", sampling.seed))
            async for event in super().run(body, sampling, **kwargs):
                order.append(("token", sampling.seed))
                yield event

    http, _ = client_for(Recording())
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, seed=10, stream=True))
    text_by_index = {}
    for c in chunks:
        for choice in c.choices:
            text_by_index[choice.index] = text_by_index.get(choice.index, "") + (choice.delta.content or "")
    assert text_by_index == {0: "Hello there friend", 1: "Hello there friend", 2: "Hello there friend"}
    assert order[:2] == [("start", 10), ("token", 10)]  # choice 0 prefilled before the others started
    assert {seed for kind, seed in order if kind == "start"} == {10, 11, 12}


def test_api_keys_guard_the_v1_routes_and_the_tenant_reaches_the_pipeline():
    from services.gateway.frontend.tenants import ApiKeys, Tenant

    pipeline = FakePipeline()
    http, _ = client_for(pipeline, api_keys=ApiKeys({"sk-acme": Tenant("acme")}))
    missing = http.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = http.get("/v1/models", headers={"Authorization": "Bearer sk-nope"})
    assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]["message"]
    assert http.get("/health").status_code == 200 and http.get("/metrics").status_code == 200  # probes stay open
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="sk-acme", http_client=http)
    assert client.chat.completions.create(model="tiny", messages=MESSAGES).choices[0].message.content == "Hello there friend"
    assert pipeline.calls[-1][2] == "tenant:acme|"  # the server-derived cache salt


def test_past_the_admission_limit_a_request_gets_a_429_with_retry_after():
    http, _ = client_for(FakePipeline(), max_num_requests=2)
    refused = http.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 3})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "requests"
    for _ in range(3):  # admissions are released when requests end, streamed or not
        assert http.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 2}).status_code == 200
        assert http.post("/v1/chat/completions", json={"messages": MESSAGES, "n": 2, "stream": True}).status_code == 200


def test_every_served_model_name_is_listed_and_answers_under_its_own_name():
    app, _ = gateway_for(FakePipeline(), served_names=("qwen2-vl", "default-vlm"), default_max_tokens=4, model_root="/models/qwen2-vl")
    http = TestClient(app)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    assert [(m.id, m.root) for m in client.models.list().data] == [("qwen2-vl", "/models/qwen2-vl"), ("default-vlm", "/models/qwen2-vl")]
    assert client.chat.completions.create(model="default-vlm", messages=MESSAGES).model == "default-vlm"
    missing = http.post("/v1/chat/completions", json={"model": "gpt-4", "messages": MESSAGES})
    assert missing.status_code == 404 and "serves 'qwen2-vl', 'default-vlm'" in missing.json()["error"]["message"]


def test_served_model_names_come_from_the_flag_or_the_model(tiny_model):
    from services.gateway.server import Settings, served_names

    def settings(**kwargs):
        return Settings(index_url="redis://127.0.0.1:1/0", **kwargs)

    assert served_names(settings(served_model_name=" vlm, default ,vlm"), tiny_model) == ("vlm", "default")
    assert served_names(settings(model="tiny"), tiny_model) == ("tiny",)
    checkpoint = dataclasses.replace(tiny_model, builtin=None)  # the same bytes, named by their directory
    assert served_names(settings(model=str(tiny_model.path)), checkpoint) == (tiny_model.name,)
    from services.stack.roles import setting_names

    assert "served_model_name" in setting_names()  # so `tessera serve --served-model-name` exists and passes through


def test_a_gateway_whose_block_size_is_not_the_cluster_s_is_not_ready_and_says_why():
    from shared.index.cluster_config import ClusterConfig
    from shared.index.types import NodeInfo, NodeState

    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    pipeline.membership.states = {
        "prefill@p:1": NodeState(NodeInfo("prefill@p:1", "prefill", "p:1", config=ClusterConfig(16)), 1, 0.0, 0.0)
    }
    assert http.get("/ready").status_code == 200  # the gateway's block_size is 16 too
    pipeline.membership.states["decode@d:1"] = NodeState(NodeInfo("decode@d:1", "decode", "d:1", config=ClusterConfig(32)), 1, 0.0, 0.0)
    ready = http.get("/ready")
    assert ready.status_code == 503 and "block_size 16 is not the cluster's (16, 32)" in ready.json()["status"]


def test_return_token_ids_gives_the_prompts_and_each_choices_ids_streamed_or_not():
    http, _ = client_for(FakePipeline())
    chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "return_token_ids": True}).json()
    assert chat["prompt_token_ids"] == list(PROMPT_IDS) and chat["choices"][0]["token_ids"] == [100, 101, 102]
    plain = http.post("/v1/chat/completions", json={"messages": MESSAGES}).json()
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    text = http.post("/v1/completions", json={"prompt": "hi", "return_token_ids": True}).json()["choices"][0]
    assert text["prompt_token_ids"] == list(PROMPT_IDS) and text["token_ids"] == [100, 101, 102]
    for route, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "hi"})):
        lines = http.post(route, json={**body, "stream": True, "return_token_ids": True}).text.splitlines()
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        ids = [i for c in chunks for choice in c["choices"] for i in (choice.get("token_ids") or [])]
        prompts = [c.get("prompt_token_ids") or choice.get("prompt_token_ids") for c in chunks for choice in c["choices"]]
        assert ids == [100, 101, 102] and [p for p in prompts if p] == [list(PROMPT_IDS)], route


def test_completions_echo_starts_each_choice_with_its_prompt_streamed_or_not():
    http, _ = client_for(FakePipeline())
    body = {"prompt": ["Say", "Tell"], "echo": True, "max_tokens": 3}
    texts = [c["text"] for c in http.post("/v1/completions", json=body).json()["choices"]]
    assert texts == ["SayHello there friend", "TellHello there friend"]
    lines = http.post("/v1/completions", json={**body, "stream": True}).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    streamed = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert [streamed[i] for i in sorted(streamed)] == texts


def test_forced_usage_puts_the_usage_so_far_on_every_chunk_of_every_stream():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline, force_include_usage=True)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True))
    assert chunks and all(c.usage is not None for c in chunks)
    assert [c.usage.completion_tokens for c in chunks if c.choices] == [0, 1, 2, 3] and chunks[-1].choices == []  # the role first
    plain, _ = client_for(FakePipeline())
    unforced = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=plain)
    assert all(c.usage is None for c in unforced.chat.completions.create(model="tiny", messages=MESSAGES, stream=True))


def test_forwarded_prompt_ids_are_the_prompt_and_other_transfer_keys_are_refused():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline)
    forwarded = {"kv_transfer_params": {"prompt_token_ids": [5, 6, 7]}}
    assert http.post("/v1/chat/completions", json={"messages": MESSAGES, **forwarded}).status_code == 200
    assert pipeline.calls[-1][0].token_ids.ids == [5, 6, 7]  # the messages were not rendered
    for params, text in (
        ({"do_remote_decode": True}, "do_remote_decode is not supported"),
        ({"prompt_token_ids": []}, "non-empty list of token ids"),
        ({"prompt_token_ids": [1, True]}, "non-empty list of token ids"),
    ):
        refused = http.post("/v1/chat/completions", json={"messages": MESSAGES, "kv_transfer_params": params})
        assert refused.status_code == 400 and text in refused.json()["error"]["message"]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    with_media = http.post("/v1/chat/completions", json={"messages": [image], **forwarded})
    assert with_media.status_code == 400 and "images or videos" in with_media.json()["error"]["message"]


def test_a_streams_prompt_ids_come_once_on_its_first_chunk():
    http, _ = client_for(FakePipeline())
    lines = http.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True, "return_token_ids": True}).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[0]["prompt_token_ids"] == list(PROMPT_IDS) and all(c.get("prompt_token_ids") is None for c in chunks[1:])


def test_max_logprobs_caps_the_alternatives_and_minus_one_opens_the_vocabulary():
    pipeline = FakePipeline()
    http, _ = client_for(pipeline, max_logprobs=-1)
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 50, "prompt_logprobs": -1}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert (pipeline.calls[-1][1].logprobs, pipeline.calls[-1][1].prompt_logprobs) == (50, 1000)
    capped, _ = client_for(FakePipeline(), max_logprobs=30)
    refused = capped.post("/v1/completions", json={"prompt": "hi", "logprobs": 31})
    assert refused.status_code == 400 and "Requested sample logprobs of 31, which is greater than max allowed: 30" in refused.text
    assert capped.post("/v1/completions", json={"prompt": "hi", "logprobs": 30}).status_code == 200


def test_a_root_path_serves_the_api_under_the_prefix_and_without_it_and_counts_both():
    http, state = client_for(FakePipeline(), root_path="/llm")
    for base in ("http://testserver/v1", "http://testserver/llm/v1"):
        client = openai.OpenAI(base_url=base, api_key="none", http_client=http)
        assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3).choices[0].message.content
    assert http.get("/llm/v1/models").json()["data"][0]["id"] == "tiny"
    assert http.get("/other/v1/models").status_code == 404
    families = text_string_to_metric_families(http.get("/metrics").text)
    requests = next(f for f in families if f.name == "tessera_requests")
    counted = {s.labels["status"]: s.value for s in requests.samples if s.name.endswith("_total")}
    assert counted.get("200") == 2, counted
