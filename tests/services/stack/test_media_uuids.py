"""Client media uuids through the stack, with the official openai client: a uuid names the image
it was first sent with, and nothing else.

Default suite, on the shared stack: a uuid sent again with other bytes is a 409 naming the
conflict (never the first image's answer), a uuid alone is answered as its image, and a uuid
never sent with bytes is a 400 that asks for the image.
On a stack of its own (two preprocess nodes taking turns, two tenants, bindings that
lapse after a few seconds): the same across preprocess nodes, per tenant, and after expiry."""

from __future__ import annotations

import json
import os
import secrets
import time

import pytest
from openai import APIStatusError, OpenAI

from tests.factories import image_data_url, make_image
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

CAT = image_data_url(make_image(64, 48, seed=31))
DOG = image_data_url(make_image(64, 48, seed=32))
BINDING_TTL_S = 4.0


def _ask(client: OpenAI, url: str | None, uuid: str | None, model: str = "tiny") -> str:
    part = {"type": "image_url", "image_url": {"url": url} if url is not None else None}
    if uuid is not None:
        part["uuid"] = uuid
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": "What is in this picture?"}]}],
        temperature=0,
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    return reply.choices[0].message.content


def _status(call) -> APIStatusError:
    with pytest.raises(APIStatusError) as info:
        call()
    return info.value


def test_a_uuid_names_its_first_image_only(stack):
    client, uuid = client_for(stack), f"photo-{secrets.token_hex(4)}"
    cat = _ask(client, CAT, uuid)
    assert _ask(client, None, uuid) == cat  # the uuid alone: its image
    conflict = _status(lambda: _ask(client, DOG, uuid))
    assert conflict.status_code == 409 and f"{uuid!r} is bound to other content (" in conflict.message
    assert "64x48" in conflict.message and "uuid_conflict" in conflict.message
    assert stack.metrics().get("tessera_uuid_conflicts_total", 0.0) >= 1
    assert _ask(client, None, uuid) == cat  # the conflict changed nothing
    unbound = _status(lambda: _ask(client, None, f"never-{uuid}"))
    assert unbound.status_code == 400 and "send the image" in unbound.message
    null_without_uuid = _status(lambda: _ask(client, None, None))
    assert null_without_uuid.status_code == 400 and "uuid" in null_without_uuid.message
    assert _ask(client, DOG, None)  # the stack keeps serving


@pytest.fixture(scope="module")
def tenant_stack(tmp_path_factory, repo_root):
    """Two preprocess nodes taking turns (the gateway's round robin), tenants a and b."""
    directory = tmp_path_factory.mktemp("uuid-tenants")
    keys = directory / "keys.json"
    keys.write_text(json.dumps({"key-a": "a", "key-b": "b"}))
    env = {**os.environ, "TESSERA_PREPROCESS_UUID_BINDING_TTL_S": str(BINDING_TTL_S)}
    running = launch_stack(directory, repo_root, "--preprocess", "2", "--api-keys-file", str(keys), env=env)
    yield running
    stop_stack(running)


def _tenant_client(stack, key: str) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=120)


def test_bindings_hold_across_preprocess_nodes_per_tenant_and_lapse(tenant_stack):
    a, b = _tenant_client(tenant_stack, "key-a"), _tenant_client(tenant_stack, "key-b")
    cat = _ask(a, CAT, "pet")
    for _ in range(2):  # each preprocess node in turn
        assert _ask(a, None, "pet") == cat
        assert _status(lambda: _ask(a, DOG, "pet")).status_code == 409
    assert _status(lambda: _ask(b, None, "pet")).status_code == 400  # another tenant's uuid never resolves
    assert _ask(b, DOG, "pet")  # and tenant b binds its own "pet" freely
    assert _status(lambda: _ask(b, CAT, "pet")).status_code == 409
    time.sleep(BINDING_TTL_S * 1.5)
    assert _status(lambda: _ask(a, None, "pet")).status_code == 400  # lapsed: the image must be sent
    assert _ask(a, DOG, "pet")  # and the uuid is free again
