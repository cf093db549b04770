"""Client media uuids bound to content (services/preprocess/media_uuids.py, image_identity.py):
a uuid sent with other bytes is a conflict and never the first content's work, a uuid alone
stands for its bound content while the binding lives, and two preprocess nodes sharing one
binding store (as they share the index) agree."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess.errors import InvalidRequestError, MediaUuidConflictError, MediaUuidUnboundError
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt import ImageInput, Prompt
from shared.index.types import IndexUnavailableError
from shared.index.uuid_bindings import InProcessBindings
from tests.factories import Video, chat_case, data_url, image_data_url, make_clip, make_image
from tests.fake_clock import FakeClock

TTL = 60.0
CAT = image_data_url(make_image(64, 48, seed=1))
DOG = image_data_url(make_image(64, 48, seed=2))


def image_request(url: str | None, uuid: str | None) -> Prompt:
    image_url = {"url": url} if url is not None else None
    part = {"type": "image_url", "image_url": image_url, **({"uuid": uuid} if uuid is not None else {})}
    return prompt_for_library({"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]})


@pytest.fixture()
def clock():
    return FakeClock()


@pytest.fixture()
def bindings(clock):
    return InProcessBindings(ttl_s=TTL, clock=clock)


@pytest.fixture()
def make_node(tiny_model, bindings):
    """A preprocessor on the shared binding store: one per node."""
    return lambda: Preprocessor(tiny_model, bindings=bindings)


def test_a_uuid_sent_again_with_its_bytes_is_served_without_decoding(make_node, monkeypatch):
    node = make_node()
    first = node.preprocess(image_request(CAT, "cat"))
    decodes = []
    import services.preprocess.image_identity as identity

    monkeypatch.setattr(identity, "decode_image", lambda *a: decodes.append(a))
    other_node = make_node()  # its file memo is empty: the binding names the pixels' hash
    again = other_node.preprocess(image_request(CAT, "cat"))
    assert again.mm_items[0].mm_hash == first.mm_items[0].mm_hash
    assert decodes == []


def test_a_uuid_sent_with_other_bytes_is_a_conflict_and_never_the_first_images_work(make_node):
    node = make_node()
    cat = node.preprocess(image_request(CAT, "pet"))
    with pytest.raises(MediaUuidConflictError) as info:
        node.preprocess(image_request(DOG, "pet"))
    assert "'pet' is bound to other content" in info.value.message and "64x48" in info.value.message
    with pytest.raises(MediaUuidConflictError):
        make_node().preprocess(image_request(DOG, "pet"))  # on another node too
    dog = node.preprocess(image_request(DOG, "dog"))
    assert dog.mm_items[0].mm_hash != cat.mm_items[0].mm_hash
    assert node.uuids.metrics.num_conflicts.value >= 1  # the other node counts its own


def test_a_uuid_alone_stands_for_its_bound_image_while_the_binding_lives(make_node, clock):
    node = make_node()
    with_bytes = node.preprocess(image_request(CAT, "cat"))
    alone = node.preprocess(image_request(None, "cat"))
    assert alone.prompt_token_ids == with_bytes.prompt_token_ids
    assert alone.mm_items[0].mm_hash == with_bytes.mm_items[0].mm_hash and alone.mm_items[0].processor_cache_hit
    clock.now += TTL * 0.9
    node.preprocess(image_request(None, "cat"))  # a use keeps it bound
    clock.now += TTL * 0.9
    node.preprocess(image_request(None, "cat"))
    clock.now += TTL * 1.1
    with pytest.raises(MediaUuidUnboundError, match="not bound to any image.*send the image"):
        node.preprocess(image_request(None, "cat"))
    assert node.preprocess(image_request(DOG, "cat")).mm_items[0].mm_hash != with_bytes.mm_items[0].mm_hash  # free again


def test_a_uuid_never_bound_or_another_tenants_is_a_400_asking_for_the_image(make_node):
    node = make_node()
    node.preprocess(image_request(CAT, "tenant-a/cat"))
    for uuid in ("tenant-b/cat", "never-sent"):
        with pytest.raises(MediaUuidUnboundError) as info:
            node.preprocess(image_request(None, uuid))
        assert info.value.kind.name == "INVALID_REQUEST" and "send the image" in info.value.message


def test_a_uuid_alone_on_a_node_without_the_pixels_asks_for_the_image_again(make_node):
    make_node().preprocess(image_request(CAT, "cat"))
    with pytest.raises(MediaUuidUnboundError, match="no longer cached: send the image again"):
        make_node().preprocess(image_request(None, "cat"))


def test_an_image_with_neither_bytes_nor_uuid_is_refused_at_the_edge_and_here(make_node):
    with pytest.raises(ValidationError, match="may be null only with the uuid"):
        image_request(None, None)
    with pytest.raises(InvalidRequestError, match="no source"):
        make_node().preprocess(Prompt(text="<|vision_start|><|image_pad|><|vision_end|>", images=(ImageInput(),)))


class UnreachableBindings:
    ttl_s = TTL

    def bind(self, key, binding):
        raise IndexUnavailableError("down")

    def resolve(self, key):
        raise IndexUnavailableError("down")

    def close(self):
        pass


def test_with_the_index_unreachable_bytes_are_served_by_their_content_and_a_uuid_alone_is_refused(tiny_model):
    node = Preprocessor(tiny_model, bindings=UnreachableBindings())
    named = node.preprocess(image_request(CAT, "cat"))
    assert named.mm_items[0].mm_hash == node.preprocess(image_request(CAT, None)).mm_items[0].mm_hash
    assert node.uuids.metrics.num_unchecked.value >= 1
    with pytest.raises(MediaUuidUnboundError, match="index is unreachable"):
        node.preprocess(image_request(None, "cat"))


def _clip_case(clip: bytes | None, uuid: str):
    part = {"type": "video_url", "video_url": {"url": data_url(clip, "video/mp4")} if clip is not None else None, "uuid": uuid}
    return prompt_for_library({"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]})


def test_a_clip_uuid_binds_to_its_bytes_like_an_image(make_node):
    node = make_node()
    clip, other = make_clip(8, fps=4, seed=1), make_clip(8, fps=4, seed=2)
    first = node.preprocess(_clip_case(clip, "clip"))
    plain = node.preprocess(chat_case(Video(clip), "What happens?").prompt)
    assert [i.mm_hash for i in first.mm_items] == [i.mm_hash for i in plain.mm_items]  # named by its content
    alone = node.preprocess(_clip_case(None, "clip"))
    assert alone.prompt_token_ids == first.prompt_token_ids and all(i.processor_cache_hit for i in alone.mm_items)
    with pytest.raises(MediaUuidConflictError, match="video uuid 'clip' is bound to other content"):
        node.preprocess(_clip_case(other, "clip"))
    with pytest.raises(MediaUuidUnboundError, match="send the video again"):
        make_node().preprocess(_clip_case(None, "clip"))  # bound, but this node never decoded it
