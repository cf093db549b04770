"""The named workloads of ``tessera bench``: deterministic request lists (fixed seed), each built
to exercise one part of the serving path.

  shared_images  a few images, several questions each, interleaved: the processor, encoder and
                 prefix caches should serve everything after each image's first touch
  multi_turn     conversations that grow one turn at a time (earlier turns replayed with canned
                 answers), interleaved: each turn's prompt extends the previous one's prefix
  long_prompts   long text documents behind one shared system prompt: prefill-bound, and the
                 system prompt is a shared prefix
  cold_images    every request brings a new image: the cold path (decode, preprocess, encode)
  video_clips    recordings sent as they grow, then again (video_workload.py): each temporal
                 group should reach a vision tower once
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image, ImageDraw

QUESTIONS = (
    "What is this?",
    "Describe the colours.",
    "Count the shapes.",
    "What is in the centre?",
    "Name one object.",
    "What mood does it have?",
)
WORDS = "river stone lantern orbit meadow cipher harbor quartz ember willow signal canyon velvet prism tundra".split()


@dataclass(frozen=True, slots=True)
class BenchRequest:
    messages: list[dict]
    first_touch: bool  # the first request to bring its image (or conversation, or document)
    num_new_items: int | None = None  # vision items no earlier request brought; None: one per first touch

    @property
    def new_items(self) -> int:
        return int(self.first_touch) if self.num_new_items is None else self.num_new_items


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    num_requests: int
    image_size: tuple[int, int] = (448, 448)
    seed: int = 0


def image_size(text: str) -> tuple[int, int]:
    """``"448x448"`` -> (448, 448)."""
    width, height = (int(v) for v in text.lower().split("x"))
    return width, height


def build_workload(name: str, spec: WorkloadSpec) -> list[BenchRequest]:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name](spec)[: spec.num_requests]


def shared_images(spec: WorkloadSpec, num_images: int | None = None) -> list[BenchRequest]:
    """``num_images`` images (default: a quarter of the requests), every round asking one
    question of each, in a shuffled order."""
    num_images = num_images or max(1, spec.num_requests // 4)
    images = [image_url(synthetic_image(*spec.image_size, seed=spec.seed * 1000 + i)) for i in range(num_images)]
    rng = random.Random(spec.seed)
    requests: list[BenchRequest] = []
    for round_number in range(-(-spec.num_requests // num_images)):
        order = list(range(num_images))
        rng.shuffle(order)
        for i in order:
            question = QUESTIONS[round_number % len(QUESTIONS)]
            requests.append(BenchRequest(user_turn(images[i], question), first_touch=round_number == 0))
    return requests


def multi_turn(spec: WorkloadSpec) -> list[BenchRequest]:
    num_conversations = max(1, spec.num_requests // 4)
    images = [image_url(synthetic_image(*spec.image_size, seed=spec.seed * 1000 + 500 + i)) for i in range(num_conversations)]
    requests: list[BenchRequest] = []
    histories: list[list[dict]] = [[] for _ in range(num_conversations)]
    for turn in range(-(-spec.num_requests // num_conversations)):
        for c in range(num_conversations):
            question = QUESTIONS[turn % len(QUESTIONS)]
            message = user_turn(images[c], question)[0] if turn == 0 else {"role": "user", "content": question}
            messages = [*histories[c], message]
            requests.append(BenchRequest(messages, first_touch=turn == 0))
            histories[c] = [*messages, {"role": "assistant", "content": f"Answer {turn + 1}: it is a picture of shapes."}]
    return requests


def long_prompts(spec: WorkloadSpec, num_words: int = 300) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    system = {"role": "system", "content": "You are a careful reader. " + " ".join(rng.choice(WORDS) for _ in range(60))}
    requests = []
    for i in range(spec.num_requests):
        document = " ".join(rng.choice(WORDS) for _ in range(num_words))
        requests.append(BenchRequest([system, {"role": "user", "content": f"Document {i}: {document}\nSummarize it."}], first_touch=True))
    return requests


def cold_images(spec: WorkloadSpec) -> list[BenchRequest]:
    return [
        BenchRequest(user_turn(image_url(synthetic_image(*spec.image_size, seed=spec.seed * 1000 + 700 + i)), "Describe this image."), True)
        for i in range(spec.num_requests)
    ]


def video_clips(spec: WorkloadSpec) -> list[BenchRequest]:
    from services.bench.video_workload import video_clips as build  # it imports this module

    return build(spec)


WORKLOADS: dict[str, Callable[[WorkloadSpec], list[BenchRequest]]] = {
    "shared_images": shared_images,
    "multi_turn": multi_turn,
    "long_prompts": long_prompts,
    "cold_images": cold_images,
    "video_clips": video_clips,
}


def user_turn(url: str, question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]}]


def synthetic_image(width: int, height: int, *, seed: int) -> Image.Image:
    """Coloured shapes on a gradient, distinct per seed: something an image processor resizes
    like a photo, without shipping image files."""
    rng = random.Random(seed)
    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        box = (x0, y0, min(width, x0 + rng.randrange(8, max(9, width // 2))), min(height, y0 + rng.randrange(8, max(9, height // 2))))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    return image


def image_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
