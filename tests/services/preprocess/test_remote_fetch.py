"""Remote images against a real HTTP server on loopback: fetched with no allow-list by default,
the allow-list (when set) and the address policy
hold for every redirect, the size limit holds, and a slow image host delays only its own request
(the fetch runs outside the preprocess node's lock)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from protos.gen import pb
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess import errors as E
from services.preprocess.config import PreprocessConfig
from services.preprocess.remote_fetch import FetchPolicy, fetch
from tests.factories import data_url, encode_image, make_image

PNG = encode_image(make_image(40, 30, seed=4))


ARRIVED, RELEASE = threading.Event(), threading.Event()


class ImageHost(BaseHTTPRequestHandler):
    """/img.png, /big.png (over any small limit), /held.png (answered once the test sets
    RELEASE), /to/<path> (a 302 to <path>, which may be a whole URL), /loop (redirects to itself)."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/to/"):
            target = self.path[len("/to/") :]
            self.send_response(302)
            self.send_header("Location", target if "://" in target else "/" + target)
            self.end_headers()
            return
        if self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
            return
        if self.path == "/held.png":
            ARRIVED.set()
            RELEASE.wait(timeout=30)
        body = PNG * 50 if self.path == "/big.png" else PNG
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ImageHost)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"localhost:{server.server_port}"
    server.shutdown()


def policy(**overrides) -> FetchPolicy:
    return FetchPolicy(
        **{"allowed_domains": ("localhost",), "allow_private_addresses": True, "timeout_s": 5, "max_bytes": 10**6, **overrides}
    )


def test_an_allowed_host_is_fetched_and_redirects_on_it_are_followed(host):
    assert fetch(f"http://{host}/img.png", policy()) == PNG
    assert fetch(f"http://{host}/to/img.png", policy()) == PNG


def test_with_no_allow_list_any_host_is_fetched_under_the_address_rule(tiny_model, host):
    """The default (as vLLM): remote media from any host, with no allow-list to configure; only
    the address rule applies (here relaxed for loopback, as an in-cluster image server needs).
    The image fetched equals the same image sent inline."""
    from services.preprocess.preprocessor import Preprocessor

    assert fetch(f"http://{host}/img.png", policy(allowed_domains=())) == PNG
    with pytest.raises(E.ImageSourceNotAllowedError, match="non-public address"):
        fetch(f"http://{host}/img.png", policy(allowed_domains=(), allow_private_addresses=False))
    assert PreprocessConfig().allow_remote_images and PreprocessConfig().allowed_image_domains == ()
    preprocessor = Preprocessor(tiny_model, PreprocessConfig(allow_private_image_addresses=True))

    def one(url: str) -> str:
        message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}
        return preprocessor.preprocess(prompt_for_library({"messages": [message]})).mm_items[0].mm_hash

    assert one(f"http://{host}/img.png") == one(data_url(PNG))


def test_a_host_that_resolves_to_a_private_address_is_refused_unless_allowed(host):
    with pytest.raises(E.ImageSourceNotAllowedError, match="non-public address"):
        fetch(f"http://{host}/img.png", policy(allow_private_addresses=False))
    metadata_service = lambda host, port: ["169.254.169.254"]  # noqa: E731 - what a rebinding DNS would answer
    with pytest.raises(E.ImageSourceNotAllowedError, match="169.254.169.254"):
        fetch("http://localhost/latest/meta-data", policy(allow_private_addresses=False), resolve=metadata_service)


def test_redirects_are_checked_like_the_first_url(host):
    port = host.rpartition(":")[2]
    with pytest.raises(E.ImageSourceNotAllowedError, match="'127.0.0.1' is not on the allowed domain list"):
        fetch(f"http://{host}/to/http://127.0.0.1:{port}/img.png", policy())
    with pytest.raises(E.ImageSourceNotAllowedError, match="http or https"):
        fetch(f"http://{host}/to/file:///etc/passwd", policy())
    with pytest.raises(E.ImageFetchError, match="more than 3 redirects"):
        fetch(f"http://{host}/loop", policy())


def test_the_size_limit_holds_for_remote_images(host):
    with pytest.raises(E.ImageTooLargeError, match="over the limit"):
        fetch(f"http://{host}/big.png", policy(max_bytes=len(PNG) * 10))


def test_a_slow_image_host_does_not_hold_up_other_requests(tiny_model, host):
    """While one request's image host holds its answer, another request is preprocessed to the
    end: the fetch does not run under the node's lock."""
    from services.preprocess.node import PreprocessNode

    config = PreprocessConfig(allow_remote_images=True, allowed_image_domains=("localhost",), allow_private_image_addresses=True)
    node = PreprocessNode(tiny_model, config)

    def request(url: str) -> pb.PromptInput:
        return prompt_for_library(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}]}
        )

    slow = threading.Thread(target=node.preprocess, args=(request(f"http://{host}/held.png"),))
    try:
        slow.start()
        assert ARRIVED.wait(timeout=10), "the held request never reached the image host"
        result = node.preprocess(request(data_url(encode_image(make_image(30, 30, seed=5)))))
        assert len(result.mm_items) == 1 and slow.is_alive()  # done while the other fetch is still held
    finally:
        RELEASE.set()
        slow.join(timeout=10)
        node.close()
