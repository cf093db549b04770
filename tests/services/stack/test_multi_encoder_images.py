"""Exactly-once encoding across nodes, on the real stack: a request whose images are held by two
different nodes (two encoders, or two prefill nodes that encoded them themselves) gets each one's
embeddings shipped by its holder (Route.image_to_source) instead of encoding one of them again,
and its answer is the oracle's."""

from __future__ import annotations

import os
import signal
import time

from services.preprocess.preprocessor import Preprocessor
from tests.factories import chat_case
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.stack_probes import ask, mm_hash_of, oracle_text, png_image, served_holders, stack_env, wait_until

ENCODED = "tessera_encoder_items_encoded_total"
ENCODED_ON_PREFILL = "tessera_prefill_images_encoded_locally_total"
SHIPPED_BY_PREFILL = "tessera_prefill_embeddings_shipped_total"
MAX_IMAGES_TRIED = 12  # each new image lands on either encoder; 12 all on one is a 1-in-2048 chance


def test_images_held_by_two_encoders_are_shipped_by_their_holders_not_encoded_again(tmp_path, repo_root, tiny_model, oracle):
    preprocessor = Preprocessor(tiny_model)
    # Images go to the encoder tier only, so each is held by exactly one encoder.
    stack = launch_stack(tmp_path, repo_root, "--encoders", "2", "--encode-dispatch", "encoder", env=stack_env())
    try:
        index = stack.index(tiny_model.model_id)
        holder_to_image: dict[str, bytes] = {}
        for seed in range(500, 500 + MAX_IMAGES_TRIED):
            image = png_image(seed)
            case = chat_case(image, "What is this?")
            assert ask(stack, case)[0] == oracle_text(oracle, case)
            mm_hash = mm_hash_of(preprocessor, case)
            (holder,) = wait_until(lambda h=mm_hash: served_holders(index, [h])[h], 10)
            holder_to_image.setdefault(holder, image)
            if len(holder_to_image) == 2:
                break
        assert len(holder_to_image) == 2, "every image landed on one encoder"

        # A fresh prefill node holds no embedding: whichever encoder the next route names, the
        # other holds one of its images.
        role, prefill = next((r, i) for r, i in stack.state()["roles"].items() if r.startswith("prefill"))
        node_id = f"prefill@{prefill['grpc_address']}"
        old_epoch = index.live_nodes()[node_id].epoch
        os.kill(prefill["pid"], signal.SIGKILL)

        def registered_again() -> bool:
            now = index.live_nodes().get(node_id)
            return stack.state()["roles"][role]["pid"] != prefill["pid"] and now is not None and now.epoch > old_epoch

        assert wait_until(registered_again, 90, 0.5), "the prefill node was not restarted"
        time.sleep(1.5)  # the gateway's membership lists it again (at least once a second)

        both = chat_case(*holder_to_image.values(), "Which of the two is brighter?")
        before = stack.metrics()[ENCODED]
        assert ask(stack, both)[0] == oracle_text(oracle, both)
        assert stack.metrics()[ENCODED] == before, "an image another encoder held was encoded again"
    finally:
        stop_stack(stack)


def _images_on_two_holders(stack, index, preprocessor, oracle, role: str) -> list[bytes]:
    """Ask about new images one at a time until two different ``role`` nodes hold one each."""
    holder_to_image: dict[str, bytes] = {}
    for seed in range(600, 600 + MAX_IMAGES_TRIED):
        case = chat_case(png_image(seed), "What is this?")
        assert ask(stack, case)[0] == oracle_text(oracle, case)
        mm_hash = mm_hash_of(preprocessor, case)
        (holder,) = wait_until(lambda h=mm_hash: served_holders(index, [h], role)[h], 10)
        holder_to_image.setdefault(holder, png_image(seed))
        if len(holder_to_image) == 2:
            return list(holder_to_image.values())
    raise AssertionError(f"every image landed on one {role} node")


def test_an_image_another_prefill_node_encoded_is_shipped_by_it(tmp_path, repo_root, tiny_model, oracle):
    preprocessor = Preprocessor(tiny_model)
    # Every image is encoded by the prefill node the request lands on, so each is held by one.
    stack = launch_stack(tmp_path, repo_root, "--prefill", "2", "--encode-dispatch", "prefill", env=stack_env())
    try:
        index = stack.index(tiny_model.model_id)
        images = _images_on_two_holders(stack, index, preprocessor, oracle, "prefill")
        both = chat_case(*images, "Which of the two is brighter?")
        before = stack.metrics()
        assert ask(stack, both)[0] == oracle_text(oracle, both)
        after = stack.metrics()
        assert after[ENCODED_ON_PREFILL] == before[ENCODED_ON_PREFILL] and after[ENCODED] == before[ENCODED], "encoded again"
        assert after[SHIPPED_BY_PREFILL] == before.get(SHIPPED_BY_PREFILL, 0.0) + 1
    finally:
        stop_stack(stack)
