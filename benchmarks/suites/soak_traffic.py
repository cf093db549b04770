"""The soak benchmark's traffic: ``concurrency`` async clients, each drawing one kind of work at
a time until the deadline:

  new_image       a never-seen synthetic image (random size and seed): the cold path
  repeated_image  one of a small pool of images: processor, encoder and prefix cache hits
  multi_turn      a 2-4 turn chat about one image, each turn replaying the answers so far
  cancelled       a stream closed after a few tokens: the stack must abort and free the request
  bad             a malformed request (BAD_CASES), which must get a 4xx, never a 5xx

Good requests go through the official ``openai`` client; the bad ones that it cannot express
(invalid JSON, NaN, wrong JSON types) go through httpx on the same connection pool. A request
counts as ok when it completes (or, cancelled, streams its first tokens); a bad request counts
as ok when it gets a 4xx.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import openai

from services.bench.workloads import QUESTIONS, image_url, synthetic_image, user_turn

KIND_WEIGHTS = {"new_image": 0.2, "repeated_image": 0.25, "multi_turn": 0.2, "cancelled": 0.15, "bad": 0.2}


class IncompleteResponseError(Exception):
    """A 200 whose stream or body is not the whole answer asked for."""


@dataclass(slots=True)
class Outcome:
    kind: str  # a KIND_WEIGHTS key
    case: str  # the bad case, or the good request's variant ("stream", "turn 2", ...)
    ok: bool
    start_s: float  # from the run's start
    latency_s: float
    status: int | None = None  # HTTP status, where one came back
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    base_url: str  # .../v1
    model: str
    concurrency: int = 6
    seed: int = 0
    max_tokens: int = 8
    cancel_max_tokens: int = 64  # long enough that closing after a few tokens cuts it short
    num_pool_images: int = 8
    image_sizes: tuple[int, int] = (112, 448)  # side lengths drawn for new images
    request_timeout_s: float = 120.0
    max_prompt_tokens: int = 32768  # the stack's --max-prompt-tokens: the too-long prompt exceeds it
    max_images: int = 16  # the stack's --max-images-per-request


class Client:
    """One async client task's state: its random stream, the shared pool and connections."""

    def __init__(self, config: TrafficConfig, index: int, http: httpx.AsyncClient, pool: list[str], t0: float) -> None:
        self.config = config
        self.rng = random.Random(config.seed * 1000 + index)
        self.http = http
        self.openai = openai.AsyncOpenAI(base_url=config.base_url, api_key="soak", http_client=http, max_retries=0)
        self.pool = pool
        self.t0 = t0
        self.outcomes: list[Outcome] = []

    async def run(self, deadline: float) -> list[Outcome]:
        kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
        while time.monotonic() < deadline:
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "multi_turn":
                await self.conversation(deadline)
            elif kind == "bad":
                name, send = self.rng.choice(list(BAD_CASES.items()))
                await self.bad(name, send)
            else:
                await self.timed(kind, getattr(self, kind))
        return self.outcomes

    async def timed(self, kind: str, call: Callable[[], Awaitable[str]]) -> None:
        started = time.monotonic()
        outcome = Outcome(kind, "", False, started - self.t0, 0.0)
        try:
            outcome.case = await call()
            outcome.ok = True
        except openai.APIStatusError as exc:
            outcome.status, outcome.error = exc.status_code, f"{exc.status_code}: {exc.message}"[:300]
        except (openai.APIError, httpx.HTTPError, IncompleteResponseError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        outcome.latency_s = time.monotonic() - started
        self.outcomes.append(outcome)

    async def new_image(self) -> str:
        size = self.rng.randint(*self.config.image_sizes), self.rng.randint(*self.config.image_sizes)
        url = image_url(synthetic_image(*size, seed=self.rng.getrandbits(48)))
        return await self.complete(user_turn(url, self.rng.choice(QUESTIONS)), stream=True)

    async def repeated_image(self) -> str:
        url = self.rng.choice(self.pool)
        return await self.complete(user_turn(url, self.rng.choice(QUESTIONS)), stream=self.rng.random() < 0.5)

    async def conversation(self, deadline: float) -> None:
        """2-4 turns; each turn is one outcome, and no turn starts after the deadline."""
        messages = user_turn(self.rng.choice(self.pool), self.rng.choice(QUESTIONS))
        for turn in range(self.rng.randint(2, 4)):
            if time.monotonic() >= deadline:
                return
            answer: list[str] = []

            async def one(turn: int = turn, answer: list[str] = answer, messages: list[dict] = messages) -> str:
                stream = self.rng.random() < 0.5
                answer.append(await self.complete(messages, stream=stream, text=True))
                return f"turn {turn + 1}, {'stream' if stream else 'whole'}"

            await self.timed("multi_turn", one)
            if not answer:
                return  # this turn failed: the conversation has no answer to build on
            messages = [*messages, {"role": "assistant", "content": answer[0]}, {"role": "user", "content": self.rng.choice(QUESTIONS)}]

    async def cancelled(self) -> str:
        num_wanted = self.rng.randint(1, 3)
        url = self.rng.choice(self.pool) if self.rng.random() < 0.5 else image_url(synthetic_image(160, 160, seed=self.rng.getrandbits(48)))
        stream = await self.openai.chat.completions.create(
            model=self.config.model,
            messages=user_turn(url, self.rng.choice(QUESTIONS)),
            max_tokens=self.config.cancel_max_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        num_chunks = 0
        async for chunk in stream:  # bounded: cancel_max_tokens chunks at most, and we leave early
            if chunk.choices and chunk.choices[0].delta.content:
                num_chunks += 1
                if num_chunks >= num_wanted:
                    break
        await stream.close()  # drops the connection mid-stream, as a client that gives up does
        if num_chunks == 0:
            raise IncompleteResponseError("the stream ended before its first token")
        return f"closed after {num_chunks} tokens"

    async def complete(self, messages: list[dict], *, stream: bool, text: bool = False) -> str:
        """One chat completion of max_tokens forced tokens; its text if ``text``, else its variant."""
        common = {"model": self.config.model, "messages": messages, "max_tokens": self.config.max_tokens, "temperature": 0}
        common["extra_body"] = {"ignore_eos": True}
        if not stream:
            response = await self.openai.chat.completions.create(**common)
            content = response.choices[0].message.content or ""
            if response.usage is None or response.usage.completion_tokens != self.config.max_tokens:
                raise IncompleteResponseError(f"expected {self.config.max_tokens} tokens, got {response.usage}")
            return content if text else "whole"
        parts: list[str] = []
        num_tokens = 0
        chunks = await self.openai.chat.completions.create(**common, stream=True, stream_options={"include_usage": True})
        async for chunk in chunks:  # bounded: max_tokens content chunks plus the usage chunk
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                num_tokens = chunk.usage.completion_tokens
        if num_tokens != self.config.max_tokens:
            raise IncompleteResponseError(f"expected {self.config.max_tokens} tokens, streamed {num_tokens}")
        return "".join(parts) if text else "stream"

    async def bad(self, name: str, send: Callable[[Client], Awaitable[int]]) -> None:
        started = time.monotonic()
        outcome = Outcome("bad", name, False, started - self.t0, 0.0)
        try:
            outcome.status = await send(self)
            outcome.ok = 400 <= outcome.status < 500
            if not outcome.ok:
                outcome.error = f"got {outcome.status}, expected a 4xx"
        except openai.APIStatusError as exc:
            outcome.status = exc.status_code
            outcome.ok = 400 <= exc.status_code < 500
            if not outcome.ok:
                outcome.error = f"{exc.status_code}: {exc.message}"[:300]
        except (openai.APIError, httpx.HTTPError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        outcome.latency_s = time.monotonic() - started
        self.outcomes.append(outcome)

    async def post_raw(self, content: bytes) -> int:
        response = await self.http.post(
            self.config.base_url + "/chat/completions", content=content, headers={"content-type": "application/json"}
        )
        return response.status_code

    async def create(self, messages: list[dict], **fields) -> int:
        """Through the openai client; a 2xx here is the failure the caller reports."""
        await self.openai.chat.completions.create(**{"model": self.config.model, "messages": messages, "max_tokens": 4, **fields})
        return 200


def _data_url(payload: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(payload).decode()


async def _corrupt_base64(client: Client) -> int:
    return await client.create(user_turn("data:image/png;base64,iVBORw0KGgo%%%not*base64!!", "What is it?"))


async def _not_an_image(client: Client) -> int:
    return await client.create(user_turn(_data_url(client.rng.randbytes(512)), "What is it?"))


async def _truncated_png(client: Client) -> int:
    whole = base64.b64decode(image_url(synthetic_image(96, 96, seed=client.rng.getrandbits(32))).split(",", 1)[1])
    return await client.create(user_turn(_data_url(whole[: len(whole) // 2]), "What is it?"))


async def _too_many_images(client: Client) -> int:
    url = image_url(synthetic_image(28, 28, seed=1))
    content = [{"type": "image_url", "image_url": {"url": url}} for _ in range(client.config.max_images + 1)]
    return await client.create([{"role": "user", "content": [*content, {"type": "text", "text": "Compare them."}]}])


async def _too_long_prompt(client: Client) -> int:
    # Each of these words (after a space) is one token; the margin covers none being merged.
    num_words = client.config.max_prompt_tokens + 512
    words = " ".join(client.rng.choice(("river", "stone", "lantern", "orbit")) for _ in range(num_words))
    return await client.create([{"role": "user", "content": words}])


async def _unknown_model(client: Client) -> int:
    return await client.create([{"role": "user", "content": "Hello"}], model="no-such-model")


async def _zero_max_tokens(client: Client) -> int:
    return await client.create([{"role": "user", "content": "Hello"}], max_tokens=0)


async def _image_in_assistant_turn(client: Client) -> int:
    url = image_url(synthetic_image(56, 56, seed=2))
    turns = [{"role": "user", "content": "Hi"}, *[{**m, "role": "assistant"} for m in user_turn(url, "Here.")]]
    return await client.create([*turns, {"role": "user", "content": "What was it?"}])


async def _nan_temperature(client: Client) -> int:
    # json.dumps writes NaN (not JSON, but what a careless client sends); httpx and openai refuse to.
    body = f'{{"model": "{client.config.model}", "messages": [{{"role": "user", "content": "Hi"}}], "temperature": NaN}}'
    return await client.post_raw(body.encode())


async def _wrong_types(client: Client) -> int:
    body = client.rng.choice(
        (
            '{"messages": "hello"}',
            '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "ten"}',
            '{"messages": [{"role": "user", "content": 42}]}',
            '{"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}',
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": 7}]}]}',
        )
    )
    return await client.post_raw(body.encode())


async def _invalid_json(client: Client) -> int:
    return await client.post_raw(b'{"messages": [{"role": "user", "content": "Hi"}')


BAD_CASES: dict[str, Callable[[Client], Awaitable[int]]] = {
    "corrupt_base64": _corrupt_base64,
    "not_an_image": _not_an_image,
    "truncated_png": _truncated_png,
    "too_many_images": _too_many_images,
    "too_long_prompt": _too_long_prompt,
    "unknown_model": _unknown_model,
    "zero_max_tokens": _zero_max_tokens,
    "image_in_assistant_turn": _image_in_assistant_turn,
    "nan_temperature": _nan_temperature,
    "wrong_types": _wrong_types,
    "invalid_json": _invalid_json,
}


async def run_traffic(config: TrafficConfig, duration_s: float, grace_s: float) -> list[Outcome]:
    """Every client's outcomes. New requests stop at ``duration_s``; requests still running then
    get ``grace_s`` more, after which they are cancelled and reported as failed."""
    limits = httpx.Limits(max_connections=config.concurrency + 4)
    pool = [image_url(synthetic_image(224, 224, seed=config.seed * 1000 + 900 + i)) for i in range(config.num_pool_images)]
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(config.request_timeout_s)) as http:
        t0 = time.monotonic()
        clients = [Client(config, i, http, pool, t0) for i in range(config.concurrency)]
        tasks = [asyncio.create_task(c.run(t0 + duration_s)) for c in clients]
        _, late = await asyncio.wait(tasks, timeout=duration_s + grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    outcomes = [o for c in clients for o in c.outcomes]
    num_late = len(late)
    outcomes += [Outcome("late", "still running after the grace period", False, duration_s, grace_s) for _ in range(num_late)]
    return sorted(outcomes, key=lambda o: o.start_s)
