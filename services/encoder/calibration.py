"""The vision tower's cost per embedding row, measured once, on the compute thread after start-up.

The gateway prices media before admitting them (services/gateway/frontend/media_budget.py) in vision
tokens; this rate turns them into expected tower seconds (its Retry-After and its metrics). It
is measured on this node's own device and weights: one synthetic image of CALIBRATION_SIDE²
through the family's own processor, encoded once to warm the tower up (first-call allocations,
weight packing) and once timed. Neither pass counts as traffic in the node's metrics.
"""

from __future__ import annotations

import time

from PIL import Image

from services.models.family import ImageOptions, VisionEncoder
from services.models.registry import ModelRef

CALIBRATION_SIDE = 448  # a common request size: 256 tokens on the Qwen families


def measure_seconds_per_token(model: ModelRef, vision: VisionEncoder) -> float:
    processed = model.family.image_processor(model.path, ImageOptions()).process(Image.new("RGB", (CALIBRATION_SIDE,) * 2, "gray"))
    counted = vision.num_items_encoded, vision.seconds_encoding
    vision.encode([processed.pixel_values], [processed.grid_thw])
    started = time.perf_counter()
    vision.encode([processed.pixel_values], [processed.grid_thw])
    elapsed = time.perf_counter() - started
    vision.num_items_encoded, vision.seconds_encoding = counted
    return elapsed / max(1, processed.num_tokens)
