"""The OpenAI-compatible HTTP API, on the standard library's threading HTTP server (one thread
per connection, HTTP/1.1 keep-alive; streams are server-sent events).

Routes: POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import chunk_json, completion_json, parse_chat_request, usage_json
from services.gateway.pipeline import Pipeline
from services.router.membership import ROUTED_ROLES

MAX_BODY_BYTES = 64 * 1024 * 1024


class GatewayApp:
    def __init__(self, pipeline: Pipeline, *, served_model: str, default_max_tokens: int) -> None:
        self.pipeline = pipeline
        self.served_model = served_model
        self.default_max_tokens = default_max_tokens
        self.metrics = GatewayMetrics()
        self.started = int(time.time())
        self.draining = False
        self._lock = threading.Lock()
        self.num_in_flight = 0

    def enter(self) -> None:
        with self._lock:
            self.num_in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.num_in_flight -= 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    app: GatewayApp  # set on the subclass built by make_server

    def log_message(self, format, *args) -> None:
        pass

    # -- routing --------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path == "/health":
            membership = self.app.pipeline.membership
            missing = [role for role in ROUTED_ROLES if not membership.nodes(role)]
            nodes = [
                {"role": s.info.role, "address": s.info.grpc_address, "node_id": s.info.node_id} for s in membership.snapshot().values()
            ]
            status = "draining" if self.app.draining else ("ok" if not missing else f"no live {', '.join(missing)} node")
            self._json(200 if status == "ok" else 503, {"status": status, "nodes": nodes})
        elif self.path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.app.served_model, "object": "model", "created": self.app.started, "owned_by": "tessera"}],
                },
            )
        elif self.path == "/metrics":
            pipeline = self.app.pipeline
            counters = {f"{role}@{address}": dict(s.counters) for role, address, s in pipeline.stats()}
            counters["gateway@self"] = {
                "gateway_node_failures_total": float(pipeline.num_retries),
                "gateway_migrations_total": float(pipeline.num_migrations),
            }
            self._send(200, self.app.metrics.render(counters).encode(), "text/plain; version=0.0.4")
        else:
            self._error(GatewayError(404, f"no route for GET {self.path}"))

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._error(GatewayError(404, f"no route for POST {self.path}"))
            return
        if self.app.draining:
            self._error(GatewayError(503, "the gateway is draining; retry on another gateway"))
            return
        self.app.enter()
        try:
            self._chat()
        finally:
            self.app.leave()

    def _chat(self) -> None:
        try:
            body = self._read_json()
            chat = parse_chat_request(body, served_model=self.app.served_model, default_max_tokens=self.app.default_max_tokens)
            if chat.stream:
                self._stream(chat)
            else:
                self._complete(chat)
        except GatewayError as exc:
            self._error(exc)

    # -- handlers ---------------------------------------------------------------------------
    def _complete(self, chat) -> None:
        started = time.monotonic()
        final, completion_tokens = None, 0
        for event in self.app.pipeline.run(chat.preprocess_body, chat.sampling, cache_salt=chat.cache_salt, stream=False):
            if final is None:
                self.app.metrics.record_ttft(time.monotonic() - started)
            completion_tokens += len(event.token_ids)
            final = event
        usage = usage_json(final.prompt_tokens, completion_tokens, final.cached_tokens)
        self._json(200, completion_json(self._request_id(), self.app.served_model, final.text, final.finish_reason or "stop", usage))

    def _stream(self, chat) -> None:
        started = time.monotonic()
        events = self.app.pipeline.run(chat.preprocess_body, chat.sampling, cache_salt=chat.cache_salt)
        first = next(events)  # errors before the first token still get a proper status code
        self.app.metrics.record_ttft(time.monotonic() - started)
        rid, model = self._request_id(), self.app.served_model
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.app.metrics.record_request(200)
        sent_text, completion_tokens, last = "", 0, None
        try:
            self._event(chunk_json(rid, model, delta={"role": "assistant", "content": ""}))
            for event in _chain(first, events):
                completion_tokens += len(event.token_ids)
                delta = event.text[len(sent_text) :] if event.text.startswith(sent_text) else event.text
                sent_text = event.text
                if delta or event.finished:
                    self._event(
                        chunk_json(
                            rid,
                            model,
                            delta={"content": delta} if delta else {},
                            finish_reason=event.finish_reason if event.finished else None,
                        )
                    )
                last = event
            if chat.include_usage and last is not None:
                self._event(
                    chunk_json(
                        rid, model, delta={}, usage=usage_json(last.prompt_tokens, completion_tokens, last.cached_tokens), choices=False
                    )
                )
            self._chunk(b"data: [DONE]\n\n")
        except GatewayError as exc:
            self._event(exc.to_json())
        except (BrokenPipeError, ConnectionResetError):
            events.close()  # cancels the decode stream, which frees its KV pages
            return
        self._chunk(b"")

    # -- plumbing ----------------------------------------------------------------------------
    def _request_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    def _read_json(self) -> object:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise GatewayError(413, f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError(400, f"request body is not valid JSON: {exc}") from None

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.path == "/v1/chat/completions":
            self.app.metrics.record_request(status)

    def _error(self, exc: GatewayError) -> None:
        self._json(exc.status, exc.to_json())

    def _event(self, payload: dict) -> None:
        self._chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _chain(first, rest):
    yield first
    yield from rest


def make_server(app: GatewayApp, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
