"""``tessera serve --model org/name``: the checkpoint comes through the Hub's HTTP API (a local
server speaking it: no internet), every role serves the downloaded snapshot exactly as
transformers does, and a second start with HF_HUB_OFFLINE=1 serves it from the cache (download
and the offline cache are also checked in process with ``tessera models download`` in test_hub.py)."""

from __future__ import annotations

import os

from tests.factories import chat_case
from tests.hub_server import HubRepo, HubServer
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for, png

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
REPO = "tessera-test/tiny-vl"


def test_a_hub_checkpoint_is_downloaded_and_served_exactly(tiny_model, oracle, repo_root, tmp_path):
    serve_from_the_hub(tiny_model, oracle, repo_root, tmp_path, then_offline=False)


def test_a_downloaded_checkpoint_is_served_again_offline(tiny_model, oracle, repo_root, tmp_path):
    serve_from_the_hub(tiny_model, oracle, repo_root, tmp_path, then_offline=True)


def serve_from_the_hub(tiny_model, oracle, repo_root, tmp_path, *, then_offline: bool) -> None:
    case = chat_case(png(64, 48, 11), "What is in the picture?")
    expected = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), 8).token_ids
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    (tmp_path / "online").mkdir()
    (tmp_path / "offline").mkdir()
    with HubServer([HubRepo(REPO, tiny_model.path, COMMIT)]) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        running = launch_stack(tmp_path / "online", repo_root, "--model", REPO, env=env)
        try:
            assert_serves_exactly(running, case, expected, oracle)
        finally:
            stop_stack(running)
        assert any(r.startswith("GET /api/models/" + REPO) for r in hub.requests)
    if not then_offline:
        return
    offline = launch_stack(tmp_path / "offline", repo_root, "--model", REPO, env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        assert_serves_exactly(offline, case, expected, oracle)
    finally:
        stop_stack(offline)


def assert_serves_exactly(running, case, expected, oracle) -> None:
    client = client_for(running)
    assert [m.id for m in client.models.list().data] == [REPO]
    reply = client.chat.completions.create(
        model=REPO, messages=case.body["messages"], temperature=0, max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].message.content == oracle.tokenizer.decode(expected, skip_special_tokens=True)
