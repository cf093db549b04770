"""Where a request's pixels go (stages._by_target): each image to the node that will encode it."""

from __future__ import annotations

from protos.gen import pb
from services.engine.sampling_params import SamplingParams
from services.gateway.pipeline.failures import Attempts
from services.gateway.pipeline.request_run import Attempt, PixelTarget, RequestRun
from services.gateway.pipeline.stages import _by_target
from services.router.route import Route
from shared.types import MmHash

LOCAL, SHIPPED, NEW = MmHash("local"), MmHash("shipped"), MmHash("new")


def attempt_for(route: Route) -> Attempt:
    run = RequestRun("req", pb.PromptInput(), SamplingParams(), None, None, False, 0.0, Attempts(max_failures=1))
    return Attempt(run, 0, route, "pre:1", pb.PreprocessResponse())


def test_each_image_s_pixels_go_to_the_node_that_encodes_it():
    route = Route("e:1", "p:1", "d:1", frozenset(), {}, 0.0, local_encode=frozenset({LOCAL}), image_to_source={SHIPPED: "e:2"})
    attempt = attempt_for(route)
    assert _by_target(attempt, [NEW, LOCAL, SHIPPED]) == [
        (attempt.prefill_target(), [LOCAL]),
        # SHIPPED's named holder no longer had it: the route's encoder encodes it with the others.
        (PixelTarget("encoder", "e:1"), [NEW, SHIPPED]),
    ]
    assert _by_target(attempt, []) == []
