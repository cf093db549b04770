"""An image URL, the way most OpenAI vision clients send one, through the official client on a
stack started with no allow-list: fetched by default and answered exactly as transformers answers
the same image. The stack's one departure from the defaults is the private-address exception a
loopback image host needs (``TESSERA_PREPROCESS_ALLOW_PRIVATE_IMAGE_ADDRESSES``); without it the
shared stack refuses loopback with a 403 (test_stack_video.py)."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.factories import chat_case
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import GREEDY, client_for, oracle_text, png

PNG = png(72, 60, 17)


class ImageHost(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        found = self.path == "/photos/cat.png"
        body = PNG if found else b"no such image"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "image/png" if found else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def image_host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ImageHost)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def loopback_stack(tmp_path_factory, repo_root):
    env = {**os.environ, "TESSERA_PREPROCESS_ALLOW_PRIVATE_IMAGE_ADDRESSES": "true"}
    running = launch_stack(tmp_path_factory.mktemp("remote-images"), repo_root, env=env)
    yield running
    stop_stack(running)


def test_an_image_url_with_no_allow_list_is_fetched_and_answered_exactly(loopback_stack, image_host, oracle):
    case = chat_case(PNG, "What is in this photo?")
    expected, _ = oracle_text(oracle, case)
    question = {"type": "text", "text": "What is in this photo?"}
    by_url = [{"type": "image_url", "image_url": {"url": image_host + "/photos/cat.png"}}, question]
    reply = client_for(loopback_stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": by_url}], **GREEDY)
    assert reply.choices[0].message.content == expected
    inline = client_for(loopback_stack).chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
    assert inline.choices[0].message.content == expected


def test_a_missing_remote_image_is_a_clear_4xx(loopback_stack, image_host):
    from openai import APIStatusError

    missing = [{"type": "image_url", "image_url": {"url": image_host + "/photos/dog.png"}}, {"type": "text", "text": "?"}]
    with pytest.raises(APIStatusError) as info:
        client_for(loopback_stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": missing}], max_tokens=2)
    assert 400 <= info.value.status_code < 500 and "404" in info.value.message, info.value.message
