"""API keys and tenants: the keys file, key lookup, and the cache isolation a tenant implies."""

from __future__ import annotations

import json

import pytest

from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import Admission
from services.gateway.frontend.openai_api import chat_body, to_chat_request
from services.gateway.frontend.tenants import ApiKeys, Tenant, parse_keys_file


def parse_chat_request(body: object, **options):
    """A raw JSON chat body to pipeline runs, as the Generate API's JSON form takes it."""
    return to_chat_request(chat_body(body, "test"), **options)


ACME, GLOBEX = Tenant("acme"), Tenant("globex")
SHARED_A, SHARED_B = Tenant("a", shared_cache=True), Tenant("b", shared_cache=True)


def test_keys_file_forms_and_lookup(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"sk-1": "acme", "sk-2": {"tenant": "globex", "shared_cache": True}}))
    keys = ApiKeys.from_settings("sk-solo", str(path))
    assert keys.tenant_for("sk-1") == ACME and keys.tenant_for("sk-2") == Tenant("globex", True)
    assert keys.tenant_for("sk-solo") == Tenant("default") and keys.tenant_for("sk-3") is None
    assert ApiKeys.from_settings("", "") is None  # no keys: authentication is off


@pytest.mark.parametrize("content", ["[]", "{}", '{"k": 3}', '{"k": {"shared_cache": true}}', '{"k": "a/b"}', "not json"])
def test_a_bad_keys_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=str(path)):
        parse_keys_file(path)


def test_derived_salts_never_collide_across_tenants_or_with_client_salts():
    salts = [
        ACME.cache_salt(None),
        ACME.cache_salt("x"),
        GLOBEX.cache_salt(None),
        SHARED_A.cache_salt("x"),
        SHARED_A.cache_salt("tenant:acme|"),  # a shared client trying to reach acme's namespace
    ]
    assert len(set(salts)) == len(salts)
    assert SHARED_A.cache_salt(None) is None and SHARED_A.cache_salt("x") == SHARED_B.cache_salt("x")  # the opt-in common scope


def test_requests_carry_the_tenants_salt_and_namespaced_image_uuids():
    body = {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}, "uuid": "cat"}]}],
        "cache_salt": "mine",
    }
    [generation] = parse_chat_request(body, served_names=("tiny",), default_max_tokens=4, tenant=ACME).generations
    assert generation.cache_salt == "tenant:acme|mine"
    assert generation.prompt.chat.messages[0].parts.parts[0].image.uuid == "acme/cat"
    [untouched] = parse_chat_request(body, served_names=("tiny",), default_max_tokens=4).generations
    assert untouched.cache_salt == "mine" and untouched.prompt.chat.messages[0].parts.parts[0].image.uuid == "cat"


def test_admission_refuses_past_its_limit_with_a_rate_limit_error_and_releases_once():
    admission = Admission(max_num_requests=3)
    ticket = admission.admit(2)
    with pytest.raises(GatewayError) as info:
        admission.admit(2)
    error = info.value
    assert error.status == 429 and error.to_json()["error"]["code"] == "rate_limit_exceeded" and error.headers["Retry-After"] == "1"
    ticket.release()
    ticket.release()  # idempotent
    assert admission.num_admitted == 0 and admission.can_admit(3) and not admission.can_admit(4)
