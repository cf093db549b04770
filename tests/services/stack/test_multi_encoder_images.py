"""Exactly-once encoding across encoders, on the real stack: a request whose images are held by
two different encoders gets each one's embeddings shipped from its holder (Route.image_to_encoder)
instead of encoding one of them again on the encoder the route names, and its answer is the
oracle's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from services.preprocess.preprocessor import Preprocessor
from tests.factories import chat_case
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.stack_probes import ask, mm_hash_of, oracle_text, png_image, served_holders, stack_env, wait_until

ENCODED = "tessera_encoder_items_encoded_total"
MAX_IMAGES_TRIED = 12  # each new image lands on either encoder; 12 all on one is a 1-in-2048 chance


@pytest.mark.slow  # its own two-encoder stack and a prefill restart (~60 s)
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
