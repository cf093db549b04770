"""The simulated clients: multi-turn chat sessions about images drawn by Zipf popularity.

A session starts with a shared chat-template head (``system_tokens``, the same for every session),
one image's placeholder tokens and a question. Each later turn's prompt is the previous prompt,
the model's reply to it and a new question, and with probability ``new_image_p`` one more image
before the question: the previous turn's blocks are this turn's prefix, as in a real conversation.
Images come from a catalogue of ``catalogue`` images, image k (0-based rank) asked about with
probability proportional to 1 / (k + 1) ** zipf_s.

Everything is drawn from the seed: the session's own generator (seeded by the run's seed and the
session's number) draws its turns, replies and pauses in a fixed order, so every routing policy
sees the same requests whatever order the simulation completes them in. Turns are built one at a
time (a session holds only its current prompt), and the block hashes of a turn extend those of
the previous turn's prompt and reply (shared.hashing.extend_block_hashes), as preprocess and the
decode node derive them.

Token ids are synthetic: the head is ``range(HEAD_ID, ...)``, placeholders are ``IMAGE_PAD``,
questions and replies random ids. Only their hashes matter to the caches and the index.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from shared.hashing import MmSpan, digest_hex, extend_block_hashes
from shared.types import BlockHash, MmHash, PlaceholderRange

IMAGE_PAD = 151_655  # Qwen2-VL's <|image_pad|>; any fixed id would do
HEAD_ID = 151_000
TEXT_IDS = (1_000, 150_000)  # range of the random question and reply token ids


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    sessions: int
    catalogue: int  # distinct images a session may ask about
    session_rate: float  # sessions starting per virtual second (Poisson arrivals)
    zipf_s: float = 1.0
    max_turns: int = 4  # turns per session: uniform in 1..max_turns
    think_s: float = 2.0  # mean pause between a reply and the session's next turn (exponential)
    system_tokens: int = 15  # Qwen2-VL's chat-template head before the first image
    image_tokens: int = 256  # placeholder tokens per image (448x448 on the small model)
    question_tokens: tuple[int, int] = (16, 48)
    answer_tokens: tuple[int, int] = (16, 48)
    new_image_p: float = 0.25
    block_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 0 or self.catalogue < 1 or self.session_rate <= 0 or self.max_turns < 1:
            raise ValueError("sessions >= 0, catalogue >= 1, session_rate > 0 and max_turns >= 1 are required")
        if not 0.0 <= self.new_image_p <= 1.0 or self.zipf_s < 0:
            raise ValueError("new_image_p must be in [0, 1] and zipf_s >= 0")


@dataclass(slots=True)
class Turn:
    session: int
    index: int  # 0-based within the session
    token_ids: list[int]
    images: list[tuple[MmHash, PlaceholderRange]]
    block_hashes: list[BlockHash]  # the prompt's full blocks
    reply_hashes: list[BlockHash]  # the full blocks of prompt + reply: what the decode node holds after it
    num_reply_tokens: int
    think_s: float  # the pause after this turn's reply before the next turn
    last: bool


class ZipfCatalogue:
    """Image identities by popularity rank; ``draw`` samples a rank."""

    def __init__(self, size: int, s: float, seed: int = 0) -> None:
        self.size = size
        self._cumulative = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(size)))
        self._seed = seed

    def draw(self, rng: random.Random) -> int:
        return min(self.size - 1, bisect.bisect_right(self._cumulative, rng.random() * self._cumulative[-1]))

    def mm_hash(self, rank: int) -> MmHash:
        return MmHash(digest_hex(("tessera/simulate-image", self._seed, rank)))


@dataclass(slots=True)
class Session:
    """One conversation, built a turn at a time (``next_turn``)."""

    number: int
    start_s: float
    config: WorkloadConfig
    catalogue: ZipfCatalogue
    rng: random.Random = field(init=False)
    num_turns: int = field(init=False)
    _turn: Turn | None = None
    _tokens: list[int] = field(default_factory=list)  # prompt + reply of the latest turn
    _spans: list[MmSpan] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"simulate/{self.config.seed}/{self.number}")
        self.num_turns = self.rng.randint(1, self.config.max_turns)

    def next_turn(self) -> Turn | None:
        """The session's next turn, None once it has had all of them."""
        index = 0 if self._turn is None else self._turn.index + 1
        if index >= self.num_turns:
            return None
        config, rng = self.config, self.rng
        tokens = self._tokens
        if index == 0:
            tokens.extend(range(HEAD_ID, HEAD_ID + config.system_tokens))
        if index == 0 or rng.random() < config.new_image_p:
            span = MmSpan(self.catalogue.mm_hash(self.catalogue.draw(rng)), PlaceholderRange(len(tokens), config.image_tokens))
            self._spans.append(span)
            tokens.extend([IMAGE_PAD] * config.image_tokens)
        tokens.extend(rng.randint(*TEXT_IDS) for _ in range(rng.randint(*config.question_tokens)))
        prompt = list(tokens)
        previous = self._turn.reply_hashes if self._turn is not None else []
        hashes = extend_block_hashes(previous, prompt, config.block_size, self._spans)
        num_reply = rng.randint(*config.answer_tokens)
        tokens.extend(rng.randint(*TEXT_IDS) for _ in range(num_reply))
        reply_hashes = extend_block_hashes(hashes, tokens, config.block_size, self._spans)
        think = rng.expovariate(1.0 / config.think_s) if config.think_s > 0 else 0.0
        images = [(s.mm_hash, s.placeholder) for s in self._spans]
        self._turn = Turn(self.number, index, prompt, images, hashes, reply_hashes, num_reply, think, index == self.num_turns - 1)
        return self._turn


def sessions(config: WorkloadConfig) -> Iterator[Session]:
    """The run's sessions in order of their start (Poisson arrivals at ``session_rate``)."""
    catalogue = ZipfCatalogue(config.catalogue, config.zipf_s, config.seed)
    arrivals = random.Random(f"simulate/{config.seed}/arrivals")
    start = 0.0
    for number in range(config.sessions):
        start += arrivals.expovariate(config.session_rate)
        yield Session(number, start, config, catalogue)
