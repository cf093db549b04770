"""The shared-image workload of the routing benchmark: N images x Q questions, interleaved (every
round asks one question of every image, in a shuffled order; fixed seed), plus warm-up requests
over images outside the workload."""

from __future__ import annotations

import random

from tests.factories import chat_case, encode_image, make_image

QUESTIONS = [
    "What is this?",
    "Describe the colours.",
    "Count the shapes.",
    "What style is it?",
    "Is it a photograph?",
    "What is in the centre?",
    "Name one object.",
    "What mood does it have?",
]


def _question(q: int) -> str:
    text = QUESTIONS[q % len(QUESTIONS)]
    return text if q < len(QUESTIONS) else f"{text} ({q // len(QUESTIONS) + 1})"


def workload(num_images: int, num_questions: int, size: tuple[int, int], seed: int) -> list[list[dict]]:
    """Message lists: round r asks question r of every image, images shuffled per round."""
    images = [encode_image(make_image(*size, seed=100 + i)) for i in range(num_images)]
    rng = random.Random(seed)
    order = []
    for q in range(num_questions):
        permutation = list(range(num_images))
        rng.shuffle(permutation)
        order += [(i, q) for i in permutation]
    return [chat_case(images[i], _question(q)).body["messages"] for i, q in order]


def warmup_messages(count: int, size: tuple[int, int]) -> list[list[dict]]:
    """Images not in the workload, so the measured run starts with cold caches for its images."""
    return [chat_case(encode_image(make_image(*size, seed=9000 + i)), "Describe this image.").body["messages"] for i in range(count)]
