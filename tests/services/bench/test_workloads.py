"""The named workloads: deterministic, the requested size, and shaped as their names promise."""

from __future__ import annotations

import pytest

from services.bench.workloads import WORKLOADS, WorkloadSpec, build_workload


def image_urls(request) -> list[str]:
    return [
        p["image_url"]["url"] for m in request.messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"
    ]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_is_deterministic_and_sized(name):
    spec = WorkloadSpec(num_requests=9, image_size=(32, 24), seed=3)
    first, again = build_workload(name, spec), build_workload(name, spec)
    assert len(first) == 9 and [r.messages for r in first] == [r.messages for r in again]
    assert any(r.first_touch for r in first)


def test_shared_images_repeat_each_image_and_mark_its_first_touch():
    requests = build_workload("shared_images", WorkloadSpec(num_requests=8, image_size=(32, 32)))
    urls = [image_urls(r)[0] for r in requests]
    assert len(set(urls)) == 2 and all(urls.count(u) == 4 for u in set(urls))
    assert [r.first_touch for r in requests].count(True) == 2


def test_multi_turn_prompts_extend_the_previous_turn():
    requests = build_workload("multi_turn", WorkloadSpec(num_requests=8, image_size=(32, 32)))
    conversation = requests[0::2]  # two conversations, interleaved
    for earlier, later in zip(conversation, conversation[1:]):
        assert later.messages[: len(earlier.messages)] == earlier.messages


def test_cold_images_never_repeat_and_long_prompts_share_a_system_prompt():
    cold = build_workload("cold_images", WorkloadSpec(num_requests=5, image_size=(32, 32)))
    assert len({image_urls(r)[0] for r in cold}) == 5 and all(r.first_touch for r in cold)
    long = build_workload("long_prompts", WorkloadSpec(num_requests=3))
    assert len({r.messages[0]["content"] for r in long}) == 1 and len({r.messages[1]["content"] for r in long}) == 3


def test_unknown_workload_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown workload 'bogus'"):
        build_workload("bogus", WorkloadSpec(num_requests=1))


def test_video_clips_grow_then_repeat_and_count_their_new_groups():
    import base64
    import io

    import av

    requests = build_workload("video_clips", WorkloadSpec(num_requests=8, image_size=(32, 24)))
    assert [r.new_items for r in requests] == [4, 4, 2, 2, 2, 2, 0, 0]  # 8 frames, +4, +4, again: groups of 2
    frames_of = []
    for request in requests:
        url = request.messages[0]["content"][0]["video_url"]["url"]
        with av.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as clip:
            frames_of.append([f.to_ndarray(format="rgb24") for f in clip.decode(video=0)])
    assert [len(f) for f in frames_of] == [8, 8, 12, 12, 16, 16, 16, 16]
    longest = {len(f): f for f in frames_of}  # a later cut of one recording starts with the earlier cut's frames
    by_recording = [f for f in frames_of if len(f) == 16]
    assert any(all((a == b).all() for a, b in zip(longest[8], whole)) for whole in by_recording)
