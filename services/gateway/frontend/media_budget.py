"""The pre-admission media budget: a request's images priced before anything decodes them.

Each request's images are priced in vision tokens from what their headers say (width x height,
read from the first bytes of a data URL or base64 part; nothing is decoded) through the model's
own resize rule (services/models/media_cost.py, fetched once from a preprocess node). An image
whose bytes the gateway does not hold (an http(s) URL, a file, a uuid alone) is priced as a one
megapixel image. The gateway holds at most ``max_media_tokens_per_encoder`` x live encoders of
them in flight, from admission to the request's first token (by then its images are encoded).

Fair by construction: a share of the budget (``reserve_fraction``, a quarter by default) is kept
for small requests, those costing at most a quarter of that share, so at least four of them fit
in it at once. A large request is admitted only while the tokens in flight, its own included,
stay under the budget less the reserve; a small one while they stay under the whole budget. The
large requests in flight therefore never hold more than the budget less the reserve, and a small
request is refused only when other small requests fill the reserve: clients sending large images
back to back cannot starve the small ones.
  * over what is left of the request's share: 429 with Retry-After, at once;
  * larger than any request may ever hold (the budget, less the reserve for a large one): 413
    naming the limit, before any image is decoded.
A clip is priced the same way, from its header: frame count, frame rate and frame size read
from an MP4 / QuickTime file's boxes (clip_header.py; nothing is decoded), through the family's
sampler and resize rule with the request's video settings. A clip whose header the gateway cannot
read (another container, a URL, a uuid alone) is priced as UNKNOWN_CLIP. A request without media
passes free.

Tokens become expected tower seconds at the rate the encoders measured once they started
(services/encoder/calibration.py; the slowest's, asked again every TOWER_RATE_TTL_S): a 429's
Retry-After is how long the encoders need for what is in flight, and the seconds in flight are
exported beside the tokens. The budget itself stays in tokens, which every node agrees on.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator

from PIL import Image

from protos.gen import pb
from services.gateway.errors import GatewayError, rate_limited
from services.gateway.frontend.clip_header import ClipHeader, clip_header
from services.models.media_cost import MediaCosts, media_costs_from_json
from services.preprocess.image_decode import SUPPORTED_FORMATS

# Enough of an encoded image for its header: PNG's IHDR is first, a JPEG's SOF follows its EXIF
# (rarely past this); an image whose size is not in its first bytes is decoded from base64 whole.
HEADER_BYTES = 256 * 1024
UNKNOWN_SIZE = (1024, 1024)  # the price of an image the gateway has no bytes of
UNKNOWN_CLIP = ClipHeader(num_frames=600, fps=30.0, width=640, height=360)  # ... and of a clip: 20 s of 360p
TOWER_RATE_TTL_S = 60.0  # encoders come and go: their measured rate is asked again after this
DEFAULT_RESERVE_FRACTION = 0.25  # of the budget, kept for small requests
SMALL_SHARE = 4  # a small request costs at most 1/SMALL_SHARE of the reserve


def image_size(url: str) -> tuple[int, int] | None:
    """An inline image's (width, height) from its header; None for a URL, a path or an image
    whose header gives no usable size (preprocessing reports a bad one)."""
    if url.startswith(("http://", "https://", "file:", "/")):
        return None
    encoded = url.split(",", 1)[1] if url.startswith("data:") else url
    head = encoded[: HEADER_BYTES // 3 * 4]
    try:
        return bytes_size(base64.b64decode(head)) or (bytes_size(base64.b64decode(encoded)) if len(head) < len(encoded) else None)
    except (binascii.Error, ValueError):
        return None


def bytes_size(data: bytes) -> tuple[int, int] | None:
    """The size an image's header states, or None where it states none worth pricing: an
    unreadable, truncated or lying header, a zero side, or a decompression bomb. None is never a
    verdict: the image is then priced as UNKNOWN_SIZE and the preprocess node, which owns the
    4xx and its message, refuses it. Pricing must never raise: an exception here is a 500 for a
    client's bad bytes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS) as image:
                width, height = image.size
    # PIL's plugins raise many kinds on hostile headers (DecompressionBombError, SyntaxError,
    # struct.error, IndexError, ...): none of them is the gateway's to report.
    except Exception:
        return None
    return (width, height) if width > 0 and height > 0 else None


def prompt_images(prompt: pb.PromptInput) -> Iterator[pb.ImageInput]:
    yield from prompt.images
    if prompt.WhichOneof("prompt") == "chat":
        for message in prompt.chat.messages:
            yield from (part.image for part in message.parts.parts if part.HasField("image"))


def prompt_videos(prompt: pb.PromptInput) -> Iterator[pb.VideoInput]:
    yield from prompt.videos
    if prompt.WhichOneof("prompt") == "chat":
        for message in prompt.chat.messages:
            yield from (part.video for part in message.parts.parts if part.HasField("video"))


def has_media(prompt: pb.PromptInput) -> bool:
    return next(prompt_images(prompt), None) is not None or next(prompt_videos(prompt), None) is not None


def clip_of(video: pb.VideoInput) -> ClipHeader | None:
    """An inline clip's header; None for a URL, a path, a uuid alone or another container."""
    source = video.WhichOneof("source")
    if source == "data":
        return clip_header(video.data)
    if source != "url" or not video.url.startswith("data:"):
        return None
    try:
        return clip_header(base64.b64decode(video.url.split(",", 1)[-1]))
    except (binascii.Error, ValueError):
        return None


def media_tokens(prompts: list[pb.PromptInput], costs: MediaCosts) -> int:
    total = 0
    for prompt in prompts:
        for image in prompt_images(prompt):
            source = image.WhichOneof("source")
            size = image_size(image.url) if source == "url" else bytes_size(image.data) if source == "data" else None
            total += costs.image.image_tokens(*(size or UNKNOWN_SIZE))
        if costs.video is None:
            continue  # the family takes no video: preprocessing refuses it
        options = {field.name: value for field, value in prompt.video_options.ListFields()}
        for video in prompt_videos(prompt):
            clip = clip_of(video) or UNKNOWN_CLIP
            total += costs.video.clip_tokens(clip.num_frames, clip.fps, clip.width, clip.height, options)
    return total


class MediaTicket:
    """Admitted vision tokens; ``release`` returns them (once)."""

    __slots__ = ("_budget", "num_tokens")

    def __init__(self, budget: MediaBudget | None, num_tokens: int) -> None:
        self._budget, self.num_tokens = budget, num_tokens

    def release(self) -> None:
        if self._budget is not None:
            self._budget.num_in_flight -= self.num_tokens
            self._budget = None


class MediaBudget:
    def __init__(
        self,
        tokens_per_encoder: int,
        num_encoders: Callable[[], int],
        fetch_cost_json: Callable[[], Awaitable[str]],
        fetch_tower_rate: Callable[[], Awaitable[float | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
    ) -> None:
        if tokens_per_encoder < 0:
            raise ValueError("max_media_tokens_per_encoder must be >= 0 (0: no budget)")
        if not 0 <= reserve_fraction < 1:
            raise ValueError(f"media_reserve_fraction must be in [0, 1), got {reserve_fraction}")
        self.tokens_per_encoder = tokens_per_encoder
        self.reserve_fraction = reserve_fraction
        self._num_encoders = num_encoders
        self._fetch_cost_json = fetch_cost_json
        self._fetch_tower_rate = fetch_tower_rate
        self._clock = clock
        self._cost: MediaCosts | None = None
        self.seconds_per_token: float | None = None  # the encoders' measured rate, once known
        self._rate_asked_at: float | None = None
        self.num_in_flight = 0
        self.num_refused = 0  # 429s
        self.num_small_refused = 0  # of them, small requests' (the reserve was full)
        self.num_too_large = 0  # 413s

    @property
    def capacity(self) -> int:
        return self.tokens_per_encoder * max(1, self._num_encoders())

    async def admit(self, prompts: list[pb.PromptInput]) -> MediaTicket:
        if not self.tokens_per_encoder or not any(has_media(p) for p in prompts):
            return MediaTicket(None, 0)
        if self._cost is None:  # once; a failure here fails over like any preprocess call
            self._cost = media_costs_from_json(await self._fetch_cost_json())
        await self._refresh_tower_rate()
        return self.take(media_tokens(prompts, self._cost))

    @property
    def tower_seconds_in_flight(self) -> float:
        """Expected vision-tower seconds of the tokens in flight (0 while no rate is known)."""
        return self.num_in_flight * (self.seconds_per_token or 0.0)

    async def _refresh_tower_rate(self) -> None:
        now = self._clock()
        if self._fetch_tower_rate is None or (self._rate_asked_at is not None and now - self._rate_asked_at < TOWER_RATE_TTL_S):
            return
        self._rate_asked_at = now
        self.seconds_per_token = await self._fetch_tower_rate() or self.seconds_per_token

    def _tower_time(self, num_tokens: int) -> str:
        if self.seconds_per_token is None:
            return ""
        return f" (about {num_tokens * self.seconds_per_token:.1f} s of vision tower at the encoders' measured rate)"

    def _retry_after_s(self) -> int | None:
        """How long the encoders need for what is in flight, shared among them; None: unknown."""
        if self.seconds_per_token is None:
            return None
        return max(1, math.ceil(self.tower_seconds_in_flight / max(1, self._num_encoders())))

    @property
    def reserve(self) -> int:
        """The tokens only small requests may take."""
        return math.ceil(self.capacity * self.reserve_fraction)

    def is_small(self, num_tokens: int) -> bool:
        return num_tokens <= self.reserve // SMALL_SHARE

    def take(self, num_tokens: int) -> MediaTicket:
        capacity, reserve = self.capacity, self.reserve
        small = self.is_small(num_tokens)
        limit = capacity if small else capacity - reserve  # what may be in flight once it is admitted
        if num_tokens > limit:
            self.num_too_large += 1
            kept = f", less the {reserve} kept for requests of at most {reserve // SMALL_SHARE}" if reserve else ""
            raise GatewayError(
                413,
                f"the request's images come to about {num_tokens} vision tokens{self._tower_time(num_tokens)}; the gateway admits "
                f"at most {limit} for one request "
                f"(max_media_tokens_per_encoder {self.tokens_per_encoder} x {max(1, self._num_encoders())} encoders{kept}): "
                "send fewer or smaller images",
                code="media_too_large",
            )
        if self.num_in_flight + num_tokens > limit:
            self.num_refused += 1
            self.num_small_refused += small
            in_flight = f"the encoders have {self.num_in_flight} of {capacity} vision tokens in flight"
            if not small and reserve:
                in_flight += f" ({reserve} of them kept for small requests)"
            raise rate_limited(in_flight + self._tower_time(self.num_in_flight), self._retry_after_s())
        self.num_in_flight += num_tokens
        return MediaTicket(self, num_tokens)
