"""The ``video_clips`` workload of ``tessera bench``: recordings that grow and repeat, as an agent
looking back at a screen recording sends them.

Each recording is a sequence of synthetic frames at 2 frames per second. Round by round every
recording is sent cut at 8, then 12, then 16 frames, then whole again, in a shuffled order. At
the serving default of 2 sampled frames per second every frame is sampled, so each cut shares
its first temporal groups (2 frames each) with the cut before: a request brings
(its frames - the last cut's frames) / 2 new groups, and a repeat none. Clips are encoded
losslessly, so a frame decodes to the same pixels in every cut.
"""

from __future__ import annotations

import base64
import io
import random

import numpy as np

from services.bench.workloads import BenchRequest, WorkloadSpec, synthetic_image

CUTS = (8, 12, 16, 16)  # frames sent per round; the last round repeats the whole recording
FPS = 2
QUESTION = "What happens in this recording so far?"


def video_clips(spec: WorkloadSpec) -> list[BenchRequest]:
    num_recordings = max(1, -(-spec.num_requests // len(CUTS)))
    width, height = spec.image_size
    recordings = [
        [np.asarray(synthetic_image(width, height, seed=spec.seed * 1000 + 900 + r * 100 + f)) for f in range(CUTS[-1])]
        for r in range(num_recordings)
    ]
    rng = random.Random(spec.seed)
    requests: list[BenchRequest] = []
    previous = 0
    for round_number, cut in enumerate(CUTS):
        order = list(range(num_recordings))
        rng.shuffle(order)
        for r in order:
            url = clip_url(recordings[r][:cut])
            turn = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": QUESTION}]}]
            requests.append(BenchRequest(turn, first_touch=round_number == 0, num_new_items=(cut - previous) // 2))
        previous = cut
    return requests


def clip_url(frames: list[np.ndarray]) -> str:
    """Frames as a lossless H.264 MP4 data URL."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv444p"
        stream.options = {"qp": "0"}
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return "data:video/mp4;base64," + base64.b64encode(buffer.getvalue()).decode()
